/* libFuzzer target: the job lease parser (spot_lease_doc_parse in
 * lib/lease_doc.c). Checks what lease.c relies on: on success every field
 * is in range and printable, and the document encodes and parses back to
 * the same values; on failure the output is untouched and err says why. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/lease_doc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int
printable(const char *s, int space_ok)
{
  if (*s == '\0')
    return 0;
  for (; *s != '\0'; s++)
    if ((unsigned char)*s < (space_ok ? 0x20 : 0x21) ||
        (unsigned char)*s > 0x7e)
      return 0;
  return 1;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct spot_lease_doc d, e;
  char err[256];
  char *json = NULL;

  memset(&d, 0x5a, sizeof(d));
  err[0] = '\0';
  if (spot_lease_doc_parse((const char *)data, size, &d, err, sizeof(err)) !=
      0) {
    if (err[0] == '\0' || d.epoch != 0x5a5a5a5a5a5a5a5aULL)
      __builtin_trap();
    return 0;
  }
  if (!printable(d.owner, 1) || !printable(d.nonce, 0) || d.epoch < 1 ||
      d.epoch > SPOT_LEASE_EPOCH_MAX || d.ttl_ms < 1 ||
      d.ttl_ms > SPOT_LEASE_TTL_MAX_MS || d.expires_ms < 0)
    __builtin_trap();
  if (spot_lease_doc_encode(&d, &json) != 0)
    __builtin_trap();
  if (spot_lease_doc_parse(json, strlen(json), &e, NULL, 0) != 0 ||
      strcmp(e.owner, d.owner) != 0 || strcmp(e.nonce, d.nonce) != 0 ||
      e.epoch != d.epoch || e.released != d.released || e.ttl_ms != d.ttl_ms ||
      e.expires_ms != d.expires_ms)
    __builtin_trap();
  free(json);
  (void)spot_lease_doc_judge(&d, "me", d.nonce, 0, 2000);
  /* the owner id names a holder process: whatever parses formats back
   * to the same text (no instance: the parse keeps the last segments) */
  {
    struct spot_lease_owner o, p;
    char buf[SPOT_LEASE_OWNER_MAX + 64];

    if (spot_lease_owner_parse(d.owner, &o) == 0) {
      if (o.pid < 1 || o.boot[0] == '\0' || o.host[0] == '\0' ||
          spot_lease_owner_format(NULL, &o, buf, sizeof(buf)) != 0 ||
          spot_lease_owner_parse(buf, &p) != 0 ||
          memcmp(&o, &p, sizeof(o)) != 0)
        __builtin_trap();
      if (strlen(buf) > strlen(d.owner) ||
          strcmp(d.owner + strlen(d.owner) - strlen(buf), buf) != 0)
        __builtin_trap();
    }
  }
  return 0;
}
