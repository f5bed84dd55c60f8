/* lib/ec2.c: the CreateFleet form, the reply parser, error classes, the
 * ClientToken and the relaunch record. No network. */
#include "cmocka-compat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ec2.h"
#include "core/util.h"

static const char *const tag_k[] = {"spotd-job", "spotd-store"};
static const char *const tag_v[] = {"job-1", "s3://b/p q"};

static void
test_form(void **state)
{
  struct spot_ec2_pool pools[2];
  struct spot_ec2_fleet_req q;
  struct spot_buf b;

  memset(pools, 0, sizeof(pools));
  spot_strlcpy(pools[0].type, "c5.large", sizeof(pools[0].type));
  spot_strlcpy(pools[0].subnet, "subnet-1", sizeof(pools[0].subnet));
  spot_strlcpy(pools[0].az, "us-east-1b", sizeof(pools[0].az));
  spot_strlcpy(pools[1].az, "us-east-1c", sizeof(pools[1].az));
  memset(&q, 0, sizeof(q));
  q.client_token = "spotd-00";
  q.lt_name = "tmpl";
  q.pools = pools;
  q.n_pools = 2;
  q.tag_keys = tag_k;
  q.tag_values = tag_v;
  q.n_tags = 2;
  spot_buf_init(&b, 1 << 16);
  assert_int_equal(spot_ec2_fleet_form(&q, &b), 0);
  assert_string_equal(
      spot_buf_str(&b),
      "Action=CreateFleet&Version=2016-11-15&ClientToken=spotd-00"
      "&Type=instant&TargetCapacitySpecification.TotalTargetCapacity=1"
      "&TargetCapacitySpecification.DefaultTargetCapacityType=spot"
      "&SpotOptions.AllocationStrategy=capacity-optimized-prioritized"
      "&LaunchTemplateConfigs.1.LaunchTemplateSpecification."
      "LaunchTemplateName=tmpl"
      "&LaunchTemplateConfigs.1.LaunchTemplateSpecification.Version="
      "%24Default"
      "&LaunchTemplateConfigs.1.Overrides.1.InstanceType=c5.large"
      "&LaunchTemplateConfigs.1.Overrides.1.SubnetId=subnet-1"
      "&LaunchTemplateConfigs.1.Overrides.1.Priority=1"
      "&LaunchTemplateConfigs.1.Overrides.2.AvailabilityZone=us-east-1c"
      "&LaunchTemplateConfigs.1.Overrides.2.Priority=2"
      "&TagSpecification.1.ResourceType=instance"
      "&TagSpecification.1.Tag.1.Key=spotd-job"
      "&TagSpecification.1.Tag.1.Value=job-1"
      "&TagSpecification.1.Tag.2.Key=spotd-store"
      "&TagSpecification.1.Tag.2.Value=s3%3A%2F%2Fb%2Fp%20q");
  /* on-demand, template by id, no override */
  q.on_demand = true;
  q.lt_name = NULL;
  q.lt_id = "lt-1";
  q.lt_version = "3";
  q.n_pools = 0;
  q.n_tags = 0;
  assert_int_equal(spot_ec2_fleet_form(&q, &b), 0);
  assert_non_null(strstr(spot_buf_str(&b), "&OnDemandOptions.Allocation"
                                           "Strategy=prioritized&"));
  assert_non_null(strstr(spot_buf_str(&b), "DefaultTargetCapacityType="
                                           "on-demand"));
  assert_non_null(strstr(spot_buf_str(&b), "LaunchTemplateId=lt-1&"));
  assert_null(strstr(spot_buf_str(&b), "Overrides"));
  assert_null(strstr(spot_buf_str(&b), "SpotOptions"));
  /* exactly one of id and name; a token */
  q.lt_name = "x";
  assert_int_equal(spot_ec2_fleet_form(&q, &b), -EINVAL);
  q.lt_name = q.lt_id = NULL;
  assert_int_equal(spot_ec2_fleet_form(&q, &b), -EINVAL);
  q.lt_id = "lt-1";
  q.client_token = NULL;
  assert_int_equal(spot_ec2_fleet_form(&q, &b), -EINVAL);
  q.client_token = "t";
  q.n_pools = SPOT_EC2_POOLS_MAX + 1;
  assert_int_equal(spot_ec2_fleet_form(&q, &b), -EINVAL);
  spot_buf_fini(&b);
}

/* A reply in the documented shape (CreateFleetResponse, 2016-11-15). */
static const char fleet_reply[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    "<CreateFleetResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">"
    "<requestId>rq-1</requestId><fleetId>fleet-abc</fleetId>"
    "<errorSet><item><launchTemplateAndOverrides>"
    "<launchTemplateSpecification><launchTemplateId>lt-1</launchTemplateId>"
    "<version>1</version></launchTemplateSpecification><overrides>"
    "<instanceType>m5.large</instanceType><availabilityZone>us-east-1b"
    "</availabilityZone><priority>1.0</priority></overrides>"
    "</launchTemplateAndOverrides><lifecycle>spot</lifecycle>"
    "<errorCode>InsufficientInstanceCapacity</errorCode>"
    "<errorMessage>no room &amp; more</errorMessage></item></errorSet>"
    "<fleetInstanceSet><item><launchTemplateAndOverrides><overrides>"
    "<instanceType>c5.large</instanceType><subnetId>subnet-9</subnetId>"
    "<availabilityZone>us-east-1a</availabilityZone></overrides>"
    "</launchTemplateAndOverrides><lifecycle>spot</lifecycle><instanceIds>"
    "<item>i-0abc</item><item>i-0def</item></instanceIds>"
    "<instanceType>c5.large</instanceType></item></fleetInstanceSet>"
    "</CreateFleetResponse>";

static void
test_reply(void **state)
{
  struct spot_ec2_reply *r = calloc(1, sizeof(*r));

  assert_int_equal(spot_ec2_reply_parse(fleet_reply, strlen(fleet_reply), r),
                   0);
  assert_false(r->is_error);
  assert_string_equal(r->fleet_id, "fleet-abc");
  assert_string_equal(r->request_id, "rq-1");
  assert_int_equal(r->n_errors, 1);
  assert_string_equal(r->errors[0].code, "InsufficientInstanceCapacity");
  assert_string_equal(r->errors[0].message, "no room & more");
  assert_string_equal(r->errors[0].pool.type, "m5.large");
  assert_string_equal(r->errors[0].pool.az, "us-east-1b");
  assert_string_equal(r->errors[0].lifecycle, "spot");
  assert_int_equal(r->n_instances, 1);
  assert_string_equal(r->instances[0].instance_id, "i-0abc");
  assert_string_equal(r->instances[0].pool.type, "c5.large");
  assert_string_equal(r->instances[0].pool.subnet, "subnet-9");
  assert_string_equal(r->instances[0].pool.az, "us-east-1a");
  free(r);
}

static void
test_error_doc(void **state)
{
  static const char doc[] =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error>"
      "<Code>UnauthorizedOperation</Code><Message>You are not authorized"
      "</Message></Error></Errors><RequestID>r-9</RequestID></Response>";
  static const char *const bad[] = {
      "",
      "not xml",
      "<Other/>",
      "<Response><Errors/></Response>",
      "<CreateFleetResponse><fleetId>x</fleetId>", /* truncated */
  };
  struct spot_ec2_reply *r = calloc(1, sizeof(*r));

  assert_int_equal(spot_ec2_reply_parse(doc, strlen(doc), r), 0);
  assert_true(r->is_error);
  assert_string_equal(r->code, "UnauthorizedOperation");
  assert_string_equal(r->message, "You are not authorized");
  assert_string_equal(r->request_id, "r-9");
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_int_equal(spot_ec2_reply_parse(bad[i], strlen(bad[i]), r), -EBADMSG);
  free(r);
}

/* A code longer than its field is cut between whole characters, so the
 * relaunch record it goes into can still be written. */
static void
test_long_code(void **state)
{
  struct spot_ec2_reply *r = calloc(1, sizeof(*r));
  struct spot_relaunch_record *rec = calloc(1, sizeof(*rec));
  struct spot_buf b;
  char doc[512], code[80];

  (void)state;
  assert_non_null(r);
  assert_non_null(rec);
  memset(code, 'C', 62);
  memcpy(code + 62, "\xd7\x9e\xd7\x9e", 5); /* 62 + 4 bytes */
  snprintf(doc, sizeof(doc),
           "<Response><Errors><Error><Code>%s</Code></Error></Errors>"
           "</Response>",
           code);
  assert_int_equal(spot_ec2_reply_parse(doc, strlen(doc), r), 0);
  assert_int_equal(strlen(r->code), 62);
  spot_relaunch_record_fail(rec, "m5.large/us-east-1a", r->code, 1);
  spot_buf_init(&b, SPOT_RELAUNCH_RECORD_MAX);
  assert_int_equal(spot_relaunch_record_format(rec, &b), 0);
  spot_buf_fini(&b);
  free(rec);
  free(r);
}

static void
test_classify(void **state)
{
  assert_int_equal(spot_ec2_classify("InsufficientInstanceCapacity"),
                   SPOT_EC2_CLASS_CAPACITY);
  assert_int_equal(spot_ec2_classify("MaxSpotInstanceCountExceeded"),
                   SPOT_EC2_CLASS_CAPACITY);
  assert_int_equal(spot_ec2_classify("Unsupported"), SPOT_EC2_CLASS_CAPACITY);
  assert_int_equal(spot_ec2_classify("RequestLimitExceeded"),
                   SPOT_EC2_CLASS_RETRY);
  assert_int_equal(spot_ec2_classify("UnauthorizedOperation"),
                   SPOT_EC2_CLASS_AUTH);
  assert_int_equal(
      spot_ec2_classify("InvalidLaunchTemplateName.NotFoundException"),
      SPOT_EC2_CLASS_TEMPLATE);
  assert_int_equal(spot_ec2_classify("InvalidLaunchTemplateId.Malformed"),
                   SPOT_EC2_CLASS_TEMPLATE);
  assert_int_equal(spot_ec2_classify("Whatever"), SPOT_EC2_CLASS_OTHER);
  assert_int_equal(spot_ec2_classify(NULL), SPOT_EC2_CLASS_OTHER);
}

static void
test_token(void **state)
{
  char a[64], b[64], c[64];

  assert_int_equal(spot_ec2_client_token("j", "c", "r", 0, a, sizeof(a)), 0);
  assert_int_equal(spot_ec2_client_token("j", "c", "r", 0, b, sizeof(b)), 0);
  assert_string_equal(a, b);
  assert_int_equal(strlen(a), SPOT_EC2_TOKEN_LEN);
  assert_memory_equal(a, "spotd-", 6);
  assert_int_equal(spot_ec2_client_token("j", "c", "r", 1, c, sizeof(c)), 0);
  assert_string_not_equal(a, c);
  /* the parts are separated: ("jc", "") differs from ("j", "c") */
  assert_int_equal(spot_ec2_client_token("jc", "", "r", 0, c, sizeof(c)), 0);
  assert_string_not_equal(a, c);
  assert_int_equal(spot_ec2_client_token("j", "c", "r", 0, c, 38), -ENOSPC);
}

static void
test_record(void **state)
{
  struct spot_relaunch_record *r = calloc(1, sizeof(*r));
  struct spot_relaunch_record *back = calloc(1, sizeof(*back));
  struct spot_buf b;
  char pool[32];

  spot_relaunch_record_fail(r, "m5.large/us-east-1a", "reclaimed", 1000);
  spot_relaunch_record_fail(r, "c5.large/us-east-1b", "Insufficient", 2000);
  spot_relaunch_record_fail(r, "m5.large/us-east-1a", "again", 3000);
  assert_int_equal(r->n_failed, 2);
  assert_string_equal(r->failed[1].code, "again");
  assert_true(spot_relaunch_record_failed(r, "m5.large/us-east-1a", 3000));
  assert_false(spot_relaunch_record_failed(r, "c5.large/us-east-1b", 2001));
  assert_false(spot_relaunch_record_failed(r, "x/y", 0));
  spot_relaunch_record_done(r, "spotd-k", "i-1", "c5.large/us-east-1a", 4000);
  spot_buf_init(&b, SPOT_RELAUNCH_RECORD_MAX);
  assert_int_equal(spot_relaunch_record_format(r, &b), 0);
  assert_int_equal(spot_relaunch_record_parse(b.data, b.len, back, NULL, 0), 0);
  assert_int_equal(back->n_failed, 2);
  assert_int_equal(back->failed[1].at_ms, 3000);
  assert_non_null(spot_relaunch_record_find(back, "spotd-k"));
  assert_string_equal(spot_relaunch_record_find(back, "spotd-k")->instance,
                      "i-1");
  assert_null(spot_relaunch_record_find(back, "spotd-other"));
  /* the oldest goes when full */
  for (int i = 0; i < SPOT_RELAUNCH_FAILED_MAX + 3; i++) {
    snprintf(pool, sizeof(pool), "t/z%d", i);
    spot_relaunch_record_fail(r, pool, "c", 10000 + i);
  }
  assert_int_equal(r->n_failed, SPOT_RELAUNCH_FAILED_MAX);
  assert_string_equal(r->failed[0].pool, "t/z3");
  assert_int_equal(spot_relaunch_record_parse("[]", 2, back, NULL, 0),
                   -EBADMSG);
  assert_int_equal(spot_relaunch_record_parse("{", 1, back, NULL, 0), -EBADMSG);
  /* unknown keys and bad entries are skipped */
  assert_int_equal(spot_relaunch_record_parse(
                       "{\"x\":1,\"failed\":[1,{\"pool\":\"a\"},{\"pool\":"
                       "\"b\",\"code\":\"c\",\"at\":5}]}",
                       strlen("{\"x\":1,\"failed\":[1,{\"pool\":\"a\"},{"
                              "\"pool\":\"b\",\"code\":\"c\",\"at\":5}]}"),
                       back, NULL, 0),
                   0);
  assert_int_equal(back->n_failed, 1);
  assert_string_equal(back->failed[0].pool, "b");
  spot_buf_fini(&b);
  free(r);
  free(back);
}

/* Parses json; on success formats it and parses that back to the same
 * text. Returns the parse's result, err its line. */
static int
round_trip(const char *json, size_t len, char *err, size_t errlen)
{
  struct spot_relaunch_record *r = calloc(1, sizeof(*r));
  struct spot_relaunch_record *back = calloc(1, sizeof(*back));
  struct spot_buf b, b2;
  int rc;

  assert_non_null(r);
  assert_non_null(back);
  err[0] = '\0';
  rc = spot_relaunch_record_parse(json, len, r, err, errlen);
  if (rc == 0) {
    spot_buf_init(&b, SPOT_RELAUNCH_RECORD_MAX);
    spot_buf_init(&b2, SPOT_RELAUNCH_RECORD_MAX);
    assert_int_equal(spot_relaunch_record_format(r, &b), 0);
    assert_int_equal(spot_relaunch_record_parse(b.data, b.len, back, NULL, 0),
                     0);
    assert_int_equal(spot_relaunch_record_format(back, &b2), 0);
    assert_int_equal(b.len, b2.len);
    assert_memory_equal(b.data, b2.data, b.len);
    spot_buf_fini(&b2);
    spot_buf_fini(&b);
  } else {
    assert_int_equal(rc, -EBADMSG);
    assert_true(err[0] != '\0');
    assert_null(strchr(err, '\n'));
  }
  free(back);
  free(r);
  return rc;
}

#define RT(lit, err) round_trip(lit, sizeof(lit) - 1, err, sizeof(err))

/* A record must not parse unless it formats back: a string cut to its
 * field could end inside a UTF-8 character (the fuzzer's find, in the
 * corpus as record-key-cut-utf8). Over-long strings, NUL bytes and
 * invalid UTF-8 are refused with one line. */
static void
test_record_round_trip(void **state)
{
  static const char fuzz_find[] =
      "{\"version\":1,\"failed\":[{\"pool\":\"m0.larffCreateFlfffffffffffffff"
      "fffffff0fffffffffffffffffffffffffffffffffffflaimed\",\"at\":4746}],"
      "\"done\":[{\"key\":\"spotd1.0</priority></over></launchTemplateAst-"
      "\xd7\x9e\",\"at\":400\x00}]}";
  struct spot_relaunch_record *r = calloc(1, sizeof(*r));
  struct spot_buf b;
  char err[256], longs[200], json[400];

  (void)state;
  assert_non_null(r);
  assert_int_equal(RT(fuzz_find, err), -EBADMSG);
  assert_non_null(strstr(err, "NUL byte"));
  /* the key alone, 48 bytes that a 47-byte cut would split */
  assert_int_equal(
      RT("{\"done\":[{\"key\":\"spotd1.0</priority></over></launchTemplateAst-"
         "\xd7\x9e\",\"at\":400}]}",
         err),
      -EBADMSG);
  assert_non_null(strstr(err, "done[0].key"));
  /* the longest pool that fits, and one byte more */
  memset(longs, 'p', sizeof(r->failed[0].pool) - 1);
  longs[sizeof(r->failed[0].pool) - 1] = '\0';
  snprintf(json, sizeof(json), "{\"failed\":[{\"pool\":\"%s\",\"at\":1}]}",
           longs);
  assert_int_equal(round_trip(json, strlen(json), err, sizeof(err)), 0);
  snprintf(json, sizeof(json),
           "{\"failed\":[{\"pool\":\"a\",\"at\":1},{\"pool\":\"%sq\",\"at\":"
           "1}]}",
           longs);
  assert_int_equal(round_trip(json, strlen(json), err, sizeof(err)), -EBADMSG);
  assert_non_null(strstr(err, "failed[1].pool"));
  /* NUL bytes: escaped, raw in a string, raw between tokens */
  assert_int_equal(RT("{\"failed\":[{\"pool\":\"a\\u0000b\",\"at\":1}]}", err),
                   -EBADMSG);
  assert_int_equal(RT("{\"failed\":[{\"pool\":\"a\x00b\",\"at\":1}]}", err),
                   -EBADMSG);
  assert_int_equal(RT("{\"failed\":[{\"pool\":\"a\",\"at\":1\x00}]}", err),
                   -EBADMSG);
  /* invalid UTF-8: a lone continuation byte, a lone surrogate escape */
  assert_int_equal(RT("{\"done\":[{\"key\":\"k\x9e\",\"at\":1}]}", err),
                   -EBADMSG);
  assert_int_equal(RT("{\"done\":[{\"key\":\"k\\ud800\",\"at\":1}]}", err),
                   -EBADMSG);
  /* the error line of broken JSON keeps control bytes out */
  assert_int_equal(RT("{\"x\x01", err), -EBADMSG);
  assert_null(strchr(err, '\x01'));
  /* whole characters that fit pass */
  assert_int_equal(
      RT("{\"done\":[{\"key\":\"\xd7\x9e\",\"instance\":\"i\",\"pool\":\"\xe2"
         "\x82\xac\",\"at\":-9223372036854775808}]}",
         err),
      0);

  /* fail() and done() cut between whole characters, so what they keep
   * formats */
  for (size_t skew = 0; skew < 4; skew++) {
    size_t n = skew;

    memset(longs, 'x', skew); /* moves where the cuts fall */
    while (n + 4 < sizeof(longs)) {
      memcpy(longs + n, "\xf0\x9f\x9a\x80", 4); /* U+1F680 */
      n += 4;
    }
    longs[n] = '\0';
    memset(r, 0, sizeof(*r));
    spot_relaunch_record_fail(r, longs, longs, 1);
    spot_relaunch_record_done(r, longs, longs, longs, 2);
    assert_true(spot_utf8_valid(r->failed[0].pool));
    assert_true(spot_utf8_valid(r->failed[0].code));
    assert_true(spot_utf8_valid(r->done[0].key));
    assert_true(spot_utf8_valid(r->done[0].instance));
    assert_true(strlen(r->failed[0].pool) + 4 > sizeof(r->failed[0].pool) - 1);
    spot_buf_init(&b, SPOT_RELAUNCH_RECORD_MAX);
    assert_int_equal(spot_relaunch_record_format(r, &b), 0);
    assert_int_equal(round_trip(b.data, b.len, err, sizeof(err)), 0);
    spot_buf_fini(&b);
  }
  /* format refuses what JSON cannot carry, rather than failing as if out of
   * memory */
  memset(r, 0, sizeof(*r));
  spot_relaunch_record_fail(r, "a", "c", 1);
  spot_buf_init(&b, SPOT_RELAUNCH_RECORD_MAX);
  r->failed[0].code[0] = '\xd7';
  assert_int_equal(spot_relaunch_record_format(r, &b), -EINVAL);
  memset(r->failed[0].code, 'c', sizeof(r->failed[0].code));
  assert_int_equal(spot_relaunch_record_format(r, &b), -EINVAL);
  spot_buf_fini(&b);
  free(r);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_form),
      cmocka_unit_test(test_reply),
      cmocka_unit_test(test_error_doc),
      cmocka_unit_test(test_long_code),
      cmocka_unit_test(test_classify),
      cmocka_unit_test(test_token),
      cmocka_unit_test(test_record),
      cmocka_unit_test(test_record_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
