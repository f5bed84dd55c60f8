/* libFuzzer target: the EC2 reply parser (lib/ec2.c) and the relaunch
 * record parser. The first byte picks which, the rest is the body. Checks
 * the invariants relaunch_aws.c relies on, and that what it prints
 * (instance ids, codes, messages) comes out of spot_escape() printable. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ec2.h"
#include "printable.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
check_item(const struct spot_ec2_item *it)
{
  if (strnlen(it->code, sizeof(it->code)) == sizeof(it->code) ||
      strnlen(it->instance_id, sizeof(it->instance_id)) ==
          sizeof(it->instance_id) ||
      strnlen(it->pool.type, sizeof(it->pool.type)) == sizeof(it->pool.type))
    __builtin_trap();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 1)
    return 0;
  if (data[0] & 1) {
    struct spot_ec2_reply *r = malloc(sizeof(*r));

    if (r == NULL)
      return 0;
    if (spot_ec2_reply_parse((const char *)data + 1, size - 1, r) == 0) {
      if (r->is_error && r->code[0] == '\0')
        __builtin_trap();
      check_printable(r->code);
      check_printable(r->message);
      check_printable(r->fleet_id);
      if (r->n_instances > SPOT_EC2_ITEMS_MAX ||
          r->n_errors > SPOT_EC2_ITEMS_MAX)
        __builtin_trap();
      for (size_t i = 0; i < r->n_instances; i++) {
        check_item(&r->instances[i]);
        if (r->instances[i].instance_id[0] == '\0')
          __builtin_trap();
      }
      for (size_t i = 0; i < r->n_errors; i++)
        check_item(&r->errors[i]);
    }
    free(r);
  } else {
    struct spot_relaunch_record *r = malloc(sizeof(*r));
    struct spot_buf b;

    if (r == NULL)
      return 0;
    if (spot_relaunch_record_parse((const char *)data + 1, size - 1, r) == 0) {
      if (r->n_failed > SPOT_RELAUNCH_FAILED_MAX ||
          r->n_done > SPOT_RELAUNCH_DONE_MAX)
        __builtin_trap();
      /* what we parse we can write back */
      spot_buf_init(&b, SPOT_RELAUNCH_RECORD_MAX);
      if (spot_relaunch_record_format(r, &b) != 0)
        __builtin_trap();
      spot_buf_fini(&b);
    }
    free(r);
  }
  return 0;
}
