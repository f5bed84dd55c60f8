/* libFuzzer target: the GCE document parsers (lib/gce.c): Operation and
 * error documents, the token document, and the insert body built from a
 * template document. Checks the invariants relaunch_gcp.c relies on, and
 * that what it prints (names, codes, messages) comes out of spot_escape()
 * printable. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/gce.h"
#include "printable.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  const char *p = (const char *)data;
  struct spot_gce_op op;
  struct spot_buf b;
  char tok[128];

  if (spot_gce_op_parse(p, size, &op) == 0) {
    if (!op.is_error && (op.name[0] == '\0' || op.status[0] == '\0'))
      __builtin_trap();
    if ((unsigned)spot_gce_classify(&op) >= SPOT_GCE_CLASS_LAST)
      __builtin_trap();
    check_printable(op.name);
    check_printable(op.status);
    check_printable(op.code);
    check_printable(op.message);
    check_printable(op.api_status);
  }
  if (spot_gce_token_parse(p, size, tok, sizeof(tok)) == 0 &&
      (tok[0] == '\0' || strpbrk(tok, "\r\n ") != NULL))
    __builtin_trap();
  spot_buf_init(&b, 1 << 20);
  if (spot_gce_insert_body("vm", "job", "s3://b/p", p, size, &b) == 0 &&
      strstr(spot_buf_str(&b), "\"spotd-job\"") == NULL)
    __builtin_trap();
  spot_buf_fini(&b);
  return 0;
}
