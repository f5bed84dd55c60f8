/* Fuzzes every metadata parser (AWS, GCP, Azure) and both date layouts.
 * The first byte picks the parser; the rest is the body. Checks the
 * documented contract: 0 with a filled, terminated notice, 1, or a
 * negative errno, and out-parameters untouched on error. */
#include <assert.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/notice.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
check(const struct spot_notice *n, size_t count)
{
  for (size_t i = 0; i < count; i++) {
    assert(memchr(n[i].id, '\0', sizeof(n[i].id)) != NULL);
    assert(memchr(n[i].reason, '\0', sizeof(n[i].reason)) != NULL);
    assert(memchr(n[i].detail, '\0', sizeof(n[i].detail)) != NULL);
    assert(n[i].reason[0] != '\0');
    assert((unsigned)n[i].kind < SPOT_NOTICE_LAST);
  }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  const int64_t now = 1796206430000LL;
  struct spot_notice n[4];
  size_t count = 99;
  int64_t inc = -7, ms = -7;
  char *s;
  const char *body;
  int r;

  if (size < 1)
    return 0;
  body = (const char *)data + 1;
  size--;
  memset(n, 0, sizeof(n));
  switch (data[0] % 9) {
  case 0:
    r = spot_meta_aws_parse_instance_action(body, size, now, n);
    count = 1;
    break;
  case 1:
    r = spot_meta_aws_parse_rebalance(body, size, now, n);
    count = 1;
    break;
  case 2:
    r = spot_meta_aws_parse_maintenance(body, size, now, n, 4, &count);
    break;
  case 3:
    r = spot_meta_aws_parse_lifecycle(body, size, now, n);
    count = 1;
    break;
  case 4:
    r = spot_meta_gcp_parse_preempted(body, size, now, n);
    count = 1;
    break;
  case 5:
    r = spot_meta_gcp_parse_maintenance(body, size, now, n);
    count = 1;
    break;
  case 6:
    r = spot_meta_azure_parse(body, size, (data[0] & 0x80) ? NULL : "vm0", now,
                              n, 4, &count, &inc);
    assert(r >= 0 || inc == -7); /* incarnation only on 0 and 1 */
    break;
  default:
    /* the date layouts need a C string */
    s = malloc(size + 1);
    if (s == NULL)
      return 0;
    memcpy(s, body, size);
    s[size] = '\0';
    r = data[0] % 9 == 7 ? spot_time_parse_aws_event(s, &ms)
                         : spot_time_parse_rfc1123(s, &ms);
    assert(r == 0 || (r < 0 && ms == -7));
    free(s);
    return 0;
  }
  assert(r == 0 || r == 1 || r == -EINVAL || r == -E2BIG);
  if (r == 0) {
    assert(count >= 1 && count <= 4);
    check(n, count);
  } else if (data[0] % 9 == 2 || data[0] % 9 == 6) {
    assert(count == 99); /* untouched unless 0 */
  }
  return 0;
}
