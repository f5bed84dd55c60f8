#include "cmocka-compat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/lease_doc.h"

#define NOW INT64_C(1796206430000) /* 2026-12-02T10:13:50Z */
#define GRACE 2000

static const char base[] =
    "{\"format\":\"spotd-lease\",\"version\":1,\"owner\":\"i-0abc/host:42\","
    "\"epoch\":3,\"state\":\"held\",\"ttl_ms\":30000,"
    "\"expires_ms\":1796206460000,\"expires\":\"2026-12-02T10:14:20Z\","
    "\"nonce\":\"9f86d081884c7d65\"}";

static char *
subst(const char *from, const char *to)
{
  const char *p = strstr(base, from);
  size_t n = strlen(base) - strlen(from) + strlen(to) + 1;
  char *s = malloc(n);

  assert_non_null(p);
  assert_non_null(s);
  snprintf(s, n, "%.*s%s%s", (int)(p - base), base, to, p + strlen(from));
  return s;
}

static int
parse_str(const char *json, struct spot_lease_doc *d, char *err, size_t n)
{
  return spot_lease_doc_parse(json, strlen(json), d, err, n);
}

static void
test_parse_valid(void **state)
{
  struct spot_lease_doc d;
  char err[128] = "";

  assert_int_equal(parse_str(base, &d, err, sizeof(err)), 0);
  assert_string_equal(d.owner, "i-0abc/host:42");
  assert_int_equal(d.epoch, 3);
  assert_false(d.released);
  assert_int_equal(d.ttl_ms, 30000);
  assert_true(d.expires_ms == INT64_C(1796206460000));
  assert_string_equal(d.nonce, "9f86d081884c7d65");
}

static void
test_parse_bad(void **state)
{
  static const struct {
    const char *from, *to, *field;
    int err;
  } cases[] = {
      {"\"epoch\":3", "\"epoch\":0", "epoch", -EBADMSG},
      {"\"epoch\":3", "\"epoch\":\"3\"", "epoch", -EBADMSG},
      {"\"epoch\":3", "\"epoch\":3.5", "epoch", -EBADMSG},
      {"\"epoch\":3", "\"epoch\":9007199254740993", "epoch", -EBADMSG},
      {"\"state\":\"held\"", "\"state\":\"gone\"", "state", -EBADMSG},
      {"\"owner\":\"i-0abc/host:42\"", "\"owner\":\"\"", "owner", -EBADMSG},
      {"\"owner\":\"i-0abc/host:42\"", "\"owner\":\"a\\nb\"", "owner",
       -EBADMSG},
      {"\"owner\":\"i-0abc/host:42\"", "\"owner\":\"a\\u0000b\"", "JSON",
       -EBADMSG},
      {"\"format\":\"spotd-lease\"", "\"format\":\"spotd-checkpoint\"",
       "format", -EBADMSG},
      {"\"version\":1", "\"version\":2", "version", -EPROTONOSUPPORT},
      {"\"ttl_ms\":30000", "\"ttl_ms\":0", "ttl_ms", -EBADMSG},
      {"\"expires_ms\":1796206460000", "\"expires_ms\":-1", "expires_ms",
       -EBADMSG},
      {"\"nonce\":\"9f86d081884c7d65\"", "\"nonce\":\"a b\"", "nonce",
       -EBADMSG},
      {",\"nonce\":\"9f86d081884c7d65\"", "", "nonce", -EBADMSG},
      {"\"epoch\":3", "\"epoch\":3,\"epoch\":4", "", -EBADMSG},
  };
  struct spot_lease_doc d;

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char err[128] = "";
    char *s = subst(cases[i].from, cases[i].to);

    memset(&d, 0x5a, sizeof(d));
    assert_int_equal(parse_str(s, &d, err, sizeof(err)), cases[i].err);
    if (strstr(err, cases[i].field) == NULL)
      fail_msg("case %zu: \"%s\" does not name %s", i, err, cases[i].field);
    assert_int_equal(d.epoch, 0x5a5a5a5a5a5a5a5aULL); /* untouched */
    free(s);
  }
  assert_int_equal(parse_str("[]", &d, NULL, 0), -EBADMSG);
  assert_int_equal(parse_str("{", &d, NULL, 0), -EBADMSG);
  assert_int_equal(
      spot_lease_doc_parse(base, SPOT_LEASE_JSON_MAX + 1, &d, NULL, 0), -E2BIG);
}

static void
test_unknown_keys_ignored(void **state)
{
  struct spot_lease_doc d;
  char *s = subst("\"epoch\":3", "\"future\":{\"x\":[1]},\"epoch\":3");

  assert_int_equal(parse_str(s, &d, NULL, 0), 0);
  assert_int_equal(d.epoch, 3);
  free(s);
}

static void
test_encode_roundtrip(void **state)
{
  struct spot_lease_doc d, e;
  char *json = NULL;

  memset(&d, 0, sizeof(d));
  snprintf(d.owner, sizeof(d.owner), "host \"q\" \\ pid 7");
  d.epoch = SPOT_LEASE_EPOCH_MAX;
  d.released = true;
  d.ttl_ms = 1;
  d.expires_ms = NOW;
  snprintf(d.nonce, sizeof(d.nonce), "abc");
  assert_int_equal(spot_lease_doc_encode(&d, &json), 0);
  assert_non_null(strstr(json, "\"expires\":\"2026-12-02T10:13:50Z\""));
  assert_int_equal(parse_str(json, &e, NULL, 0), 0);
  assert_string_equal(e.owner, d.owner);
  assert_true(e.epoch == d.epoch && e.released && e.ttl_ms == 1 &&
              e.expires_ms == NOW);
  assert_string_equal(e.nonce, "abc");
  free(json);

  d.epoch = 0;
  assert_int_equal(spot_lease_doc_encode(&d, &json), -EINVAL);
  d.epoch = 1;
  d.owner[0] = '\0';
  assert_int_equal(spot_lease_doc_encode(&d, &json), -EINVAL);
}

static void
test_judge(void **state)
{
  struct spot_lease_doc d;

  assert_int_equal(parse_str(base, &d, NULL, 0), 0);
  /* absent */
  assert_int_equal(spot_lease_doc_judge(NULL, "me", NULL, NOW, GRACE),
                   SPOT_LEASE_ABSENT);
  assert_int_equal(spot_lease_doc_next_epoch(NULL, SPOT_LEASE_ABSENT), 1);
  /* held by another, before expiry and within the grace */
  assert_int_equal(spot_lease_doc_judge(&d, "me", NULL, NOW, GRACE),
                   SPOT_LEASE_THEIRS);
  assert_int_equal(
      spot_lease_doc_judge(&d, "me", NULL, d.expires_ms + GRACE, GRACE),
      SPOT_LEASE_THEIRS);
  assert_int_equal(spot_lease_doc_next_epoch(&d, SPOT_LEASE_THEIRS), 0);
  assert_true(spot_lease_doc_wait_ms(&d, NOW, GRACE) == 30000 + GRACE + 1);
  /* expired beyond the grace */
  assert_int_equal(
      spot_lease_doc_judge(&d, "me", NULL, d.expires_ms + GRACE + 1, GRACE),
      SPOT_LEASE_EXPIRED);
  assert_int_equal(spot_lease_doc_next_epoch(&d, SPOT_LEASE_EXPIRED), 4);
  assert_int_equal(spot_lease_doc_wait_ms(&d, d.expires_ms + GRACE + 1, GRACE),
                   0);
  /* the same owner id, another incarnation: theirs until it expires */
  assert_int_equal(
      spot_lease_doc_judge(&d, "i-0abc/host:42", "other", NOW, GRACE),
      SPOT_LEASE_THEIRS);
  assert_int_equal(spot_lease_doc_judge(&d, "i-0abc/host:42", "", NOW, GRACE),
                   SPOT_LEASE_THEIRS);
  /* our own write: renew at the same epoch */
  assert_int_equal(spot_lease_doc_judge(&d, "i-0abc/host:42",
                                        "9f86d081884c7d65", NOW, GRACE),
                   SPOT_LEASE_OURS);
  assert_int_equal(spot_lease_doc_next_epoch(&d, SPOT_LEASE_OURS), 3);
  /* another owner with our nonce is not ours */
  assert_int_equal(
      spot_lease_doc_judge(&d, "me", "9f86d081884c7d65", NOW, GRACE),
      SPOT_LEASE_THEIRS);
  /* released: free at once, epoch bumps */
  d.released = true;
  assert_int_equal(spot_lease_doc_judge(&d, "me", NULL, NOW, GRACE),
                   SPOT_LEASE_RELEASED);
  assert_int_equal(spot_lease_doc_next_epoch(&d, SPOT_LEASE_RELEASED), 4);
  assert_int_equal(spot_lease_doc_wait_ms(&d, NOW, GRACE), 0);
  /* epoch overflow */
  d.epoch = SPOT_LEASE_EPOCH_MAX;
  assert_int_equal(spot_lease_doc_next_epoch(&d, SPOT_LEASE_RELEASED), 0);
  assert_string_equal(spot_lease_doc_verdict_name(SPOT_LEASE_EXPIRED),
                      "expired");
}

static void
test_etag(void **state)
{
  char out[64];

  assert_int_equal(spot_lease_doc_etag_bare("\"0cc1\"", out, sizeof(out)), 0);
  assert_string_equal(out, "0cc1");
  assert_int_equal(spot_lease_doc_etag_bare("W/\"0cc1\"", out, sizeof(out)), 0);
  assert_string_equal(out, "0cc1");
  assert_int_equal(spot_lease_doc_etag_bare("0cc1", out, sizeof(out)), 0);
  assert_string_equal(out, "0cc1");
  assert_int_equal(spot_lease_doc_etag_quoted("0cc1", out, sizeof(out)), 0);
  assert_string_equal(out, "\"0cc1\"");
  assert_int_equal(spot_lease_doc_etag_quoted("\"0cc1\"", out, sizeof(out)), 0);
  assert_string_equal(out, "\"0cc1\"");
  assert_int_equal(spot_lease_doc_etag_quoted("0cc1", out, 5), -E2BIG);
  assert_true(spot_lease_doc_etag_same("\"0cc1\"", "0cc1"));
  assert_false(spot_lease_doc_etag_same("\"0cc1\"", "0cc2"));
  assert_false(spot_lease_doc_etag_same("", "\"\""));
  assert_false(spot_lease_doc_etag_same(NULL, "a"));
}

static void
test_order(void **state)
{
  struct spot_latest_order a, b;
  char buf[48];

  assert_int_equal(spot_lease_doc_order_parse("3.17", &a), 0);
  assert_true(a.epoch == 3 && a.seq == 17);
  assert_int_equal(spot_lease_doc_order_parse("0.0", &b), 0);
  assert_true(spot_lease_doc_order_cmp(a, b) > 0);
  assert_true(spot_lease_doc_order_cmp(b, a) < 0);
  assert_int_equal(spot_lease_doc_order_cmp(a, a), 0);
  b.epoch = 4;
  b.seq = 1; /* a newer epoch wins over any sequence */
  assert_true(spot_lease_doc_order_cmp(a, b) < 0);
  spot_lease_doc_order_format(a, buf, sizeof(buf));
  assert_string_equal(buf, "3.17");
  static const char *const bad[] = {"",
                                    "3",
                                    "3.",
                                    ".3",
                                    "03.1",
                                    "3.01",
                                    "-1.2",
                                    "3.2.1",
                                    "a.b",
                                    "3 .1",
                                    "99999999999999999.1"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_int_equal(spot_lease_doc_order_parse(bad[i], &a), -EINVAL);
}

static void
test_owner_valid(void **state)
{
  char big[SPOT_LEASE_OWNER_MAX + 2];

  assert_true(spot_lease_doc_owner_valid("i-0abc/boot-1/host:42"));
  assert_true(spot_lease_doc_owner_valid("with space"));
  assert_false(spot_lease_doc_owner_valid(""));
  assert_false(spot_lease_doc_owner_valid(NULL));
  assert_false(spot_lease_doc_owner_valid("tab\there"));
  memset(big, 'a', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  assert_false(spot_lease_doc_owner_valid(big));
  big[sizeof(big) - 2] = '\0';
  assert_true(spot_lease_doc_owner_valid(big));
}

static void
test_owner_id(void **state)
{
  static const char *const bad[] = {
      "",
      "me",
      "spotctl@host:12",
      "boot/host:12",
      "boot/pidns-x/host:12",
      "boot/pidns-/host:12",
      "/pidns-5/host:12",
      "boot/pidns-5/:12",
      "boot/pidns-5/host:",
      "boot/pidns-5/host:0",
      "boot/pidns-5/host:-3",
      "boot/pidns-5/host:99999999999",
      "boot/pidns-05/host:12",
  };
  struct spot_lease_owner o, p;
  char buf[300];

  (void)state;
  memset(&o, 0, sizeof(o));
  snprintf(o.boot, sizeof(o.boot), "%s",
           "5419a8e5-b68a-450d-a184-33c35b9b394f");
  o.pidns = 4026531836u;
  snprintf(o.host, sizeof(o.host), "%s", "node1");
  o.pid = 14799;
  assert_int_equal(spot_lease_owner_format(NULL, &o, buf, sizeof(buf)), 0);
  assert_string_equal(
      buf, "5419a8e5-b68a-450d-a184-33c35b9b394f/pidns-4026531836/node1:14799");
  assert_int_equal(spot_lease_owner_parse(buf, &p), 0);
  assert_memory_equal(&o, &p, sizeof(o));
  assert_true(spot_lease_doc_owner_valid(buf));
  /* an instance id in front */
  assert_int_equal(spot_lease_owner_format("i-0abc", &o, buf, sizeof(buf)), 0);
  assert_string_equal(buf, "i-0abc/5419a8e5-b68a-450d-a184-33c35b9b394f/"
                           "pidns-4026531836/node1:14799");
  assert_int_equal(spot_lease_owner_parse(buf, &p), 0);
  assert_memory_equal(&o, &p, sizeof(o));
  assert_int_equal(spot_lease_owner_format(NULL, &o, buf, 20), -E2BIG);
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    memset(&p, 0x5a, sizeof(p));
    assert_int_equal(spot_lease_owner_parse(bad[i], &p), -EINVAL);
  }
  /* the dead verdict takes over like an expired one */
  {
    struct spot_lease_doc d;

    memset(&d, 0, sizeof(d));
    d.epoch = 7;
    assert_int_equal(spot_lease_doc_next_epoch(&d, SPOT_LEASE_DEAD), 8);
    assert_string_equal(spot_lease_doc_verdict_name(SPOT_LEASE_DEAD), "dead");
  }
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_valid),
      cmocka_unit_test(test_parse_bad),
      cmocka_unit_test(test_unknown_keys_ignored),
      cmocka_unit_test(test_encode_roundtrip),
      cmocka_unit_test(test_judge),
      cmocka_unit_test(test_etag),
      cmocka_unit_test(test_order),
      cmocka_unit_test(test_owner_valid),
      cmocka_unit_test(test_owner_id),
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
