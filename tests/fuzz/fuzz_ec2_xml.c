/* libFuzzer target: the EC2 reply parser (lib/ec2.c) and the relaunch
 * record parser. The first byte picks which, the rest is the body. Checks
 * the invariants relaunch_aws.c relies on, and that what it prints
 * (instance ids, codes, messages) comes out of spot_escape() printable. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/ec2.h"
#include "core/util.h"
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
  /* cut between whole characters: the code goes into the relaunch record */
  if (!spot_utf8_valid(it->code) || !spot_utf8_valid(it->instance_id) ||
      !spot_utf8_valid(it->pool.type) || !spot_utf8_valid(it->pool.az))
    __builtin_trap();
  check_printable(it->code);
  check_printable(it->message);
  check_printable(it->instance_id);
}

/* The relaunch record: whatever parses formats back, and what it formats
 * parses to the same text again; a refusal says why in one line. Strings
 * cut by spot_relaunch_record_fail/done still format. */
static void
check_record(const char *data, size_t size)
{
  struct spot_relaunch_record *r = malloc(sizeof(*r));
  struct spot_relaunch_record *back = malloc(sizeof(*back));
  struct spot_buf b, b2;
  char err[256], s[256];

  if (r == NULL || back == NULL)
    goto out;
  err[0] = '\0';
  if (spot_relaunch_record_parse(data, size, r, err, sizeof(err)) == 0) {
    if (r->n_failed > SPOT_RELAUNCH_FAILED_MAX ||
        r->n_done > SPOT_RELAUNCH_DONE_MAX)
      __builtin_trap();
    spot_buf_init(&b, SPOT_RELAUNCH_RECORD_MAX);
    spot_buf_init(&b2, SPOT_RELAUNCH_RECORD_MAX);
    if (spot_relaunch_record_format(r, &b) != 0)
      __builtin_trap();
    if (spot_relaunch_record_parse(b.data, b.len, back, err, sizeof(err)) != 0)
      __builtin_trap();
    if (spot_relaunch_record_format(back, &b2) != 0 || b.len != b2.len ||
        memcmp(b.data, b2.data, b.len) != 0)
      __builtin_trap();
    spot_buf_fini(&b2);
    spot_buf_fini(&b);
  } else if (err[0] == '\0' || strchr(err, '\n') != NULL) {
    __builtin_trap();
  }
  /* the input as one string, cut to fit the fields */
  memcpy(s, data, size < sizeof(s) - 1 ? size : sizeof(s) - 1);
  s[size < sizeof(s) - 1 ? size : sizeof(s) - 1] = '\0';
  if (spot_utf8_valid(s)) {
    memset(r, 0, sizeof(*r));
    spot_relaunch_record_fail(r, s, s, 1);
    spot_relaunch_record_done(r, s, s, s, 2);
    spot_buf_init(&b, SPOT_RELAUNCH_RECORD_MAX);
    if (spot_relaunch_record_format(r, &b) != 0)
      __builtin_trap();
    spot_buf_fini(&b);
  }
out:
  free(back);
  free(r);
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
      if (!spot_utf8_valid(r->code))
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
    check_record((const char *)data + 1, size - 1);
  }
  return 0;
}
