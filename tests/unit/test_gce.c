/* lib/gce.c: Operation and error documents, classes, the token document,
 * requestId, instance name and the insert body. No network. */
#include "cmocka-compat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/gce.h"

static void
test_op(void **state)
{
  static const char running[] =
      "{\"kind\":\"compute#operation\",\"id\":\"1\",\"name\":\"operation-1\","
      "\"zone\":\"https://www.googleapis.com/compute/v1/projects/p/zones/z\","
      "\"operationType\":\"insert\",\"targetLink\":\"https://x/instances/vm\","
      "\"status\":\"RUNNING\",\"progress\":0}";
  static const char stockout[] =
      "{\"kind\":\"compute#operation\",\"name\":\"operation-2\",\"status\":"
      "\"DONE\",\"error\":{\"errors\":[{\"code\":"
      "\"ZONE_RESOURCE_POOL_EXHAUSTED\",\"message\":\"The zone 'projects/p/"
      "zones/z' does not have enough resources\"}]},"
      "\"httpErrorStatusCode\":503}";
  struct spot_gce_op op;

  assert_int_equal(spot_gce_op_parse(running, strlen(running), &op), 0);
  assert_false(op.is_error);
  assert_string_equal(op.name, "operation-1");
  assert_string_equal(op.status, "RUNNING");
  assert_string_equal(op.target, "https://x/instances/vm");
  assert_string_equal(op.code, "");
  assert_int_equal(spot_gce_op_parse(stockout, strlen(stockout), &op), 0);
  assert_string_equal(op.status, "DONE");
  assert_string_equal(op.code, "ZONE_RESOURCE_POOL_EXHAUSTED");
  assert_int_equal(spot_gce_classify(&op), SPOT_GCE_CLASS_CAPACITY);
  assert_int_equal(spot_gce_op_parse("[]", 2, &op), -EBADMSG);
  assert_int_equal(spot_gce_op_parse("{", 1, &op), -EBADMSG);
  assert_int_equal(spot_gce_op_parse("{\"name\":\"x\"}", 12, &op), -EBADMSG);
}

/* A code longer than its field is cut between whole characters (it goes
 * into the relaunch record, which must stay UTF-8). */
static void
test_long_code(void **state)
{
  struct spot_gce_op op;
  char doc[512], code[128];
  size_t n = sizeof(op.code) - 2; /* the last byte that fits starts a pair */

  (void)state;
  memset(code, 'C', n);
  memcpy(code + n, "\xd7\x9e", 3);
  snprintf(doc, sizeof(doc),
           "{\"name\":\"o\",\"status\":\"DONE\",\"error\":{\"errors\":[{"
           "\"code\":\"%s\"}]}}",
           code);
  assert_int_equal(spot_gce_op_parse(doc, strlen(doc), &op), 0);
  assert_int_equal(strlen(op.code), n);
}

static void
test_error_doc(void **state)
{
  static const struct {
    const char *doc;
    enum spot_gce_class k;
    const char *code;
  } cases[] = {
      {"{\"error\":{\"code\":403,\"message\":\"Required 'compute.instances."
       "create' permission\",\"errors\":[{\"message\":\"m\",\"domain\":"
       "\"global\",\"reason\":\"forbidden\"}],\"status\":"
       "\"PERMISSION_DENIED\"}}",
       SPOT_GCE_CLASS_AUTH, "forbidden"},
      {"{\"error\":{\"code\":429,\"message\":\"Rate Limit Exceeded\","
       "\"errors\":[{\"reason\":\"rateLimitExceeded\"}],\"status\":"
       "\"RESOURCE_EXHAUSTED\"}}",
       SPOT_GCE_CLASS_RETRY, "rateLimitExceeded"},
      {"{\"error\":{\"code\":409,\"message\":\"The resource ... already "
       "exists\",\"errors\":[{\"reason\":\"alreadyExists\"}]}}",
       SPOT_GCE_CLASS_EXISTS, "alreadyExists"},
      {"{\"error\":{\"code\":404,\"message\":\"The referenced "
       "instanceTemplate resource cannot be found.\",\"errors\":[{\"reason\":"
       "\"notFound\"}]}}",
       SPOT_GCE_CLASS_TEMPLATE, "notFound"},
      {"{\"error\":{\"code\":503,\"message\":\"x\",\"errors\":[{\"reason\":"
       "\"ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS\"}]}}",
       SPOT_GCE_CLASS_CAPACITY, "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"},
      {"{\"error\":{\"code\":400,\"message\":\"bad\",\"status\":"
       "\"INVALID_ARGUMENT\"}}",
       SPOT_GCE_CLASS_OTHER, "INVALID_ARGUMENT"},
  };
  struct spot_gce_op op;

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    assert_int_equal(spot_gce_op_parse(cases[i].doc, strlen(cases[i].doc), &op),
                     0);
    assert_true(op.is_error);
    assert_string_equal(op.code, cases[i].code);
    assert_int_equal(spot_gce_classify(&op), cases[i].k);
  }
  assert_int_equal(spot_gce_op_parse("{\"error\":{}}", 12, &op), -EBADMSG);
}

static void
test_token(void **state)
{
  static const char doc[] = "{\"access_token\":\"ya29.abc\",\"expires_in\":"
                            "3599,\"token_type\":\"Bearer\"}";
  char tok[64];

  assert_int_equal(spot_gce_token_parse(doc, strlen(doc), tok, sizeof(tok)), 0);
  assert_string_equal(tok, "ya29.abc");
  assert_int_equal(spot_gce_token_parse(doc, strlen(doc), tok, 5), -EBADMSG);
  assert_int_equal(spot_gce_token_parse("{\"access_token\":\"a\\nb\"}", 23, tok,
                                        sizeof(tok)),
                   -EBADMSG);
  assert_int_equal(spot_gce_token_parse("{}", 2, tok, sizeof(tok)), -EBADMSG);
}

static void
test_ids(void **state)
{
  char a[40], b[40], name[64];

  assert_int_equal(spot_gce_request_id("j", "c", "r", "z1", a, sizeof(a)), 0);
  assert_int_equal(spot_gce_request_id("j", "c", "r", "z1", b, sizeof(b)), 0);
  assert_string_equal(a, b);
  assert_int_equal(strlen(a), 36);
  assert_true(a[8] == '-' && a[13] == '-' && a[14] == '4' && a[18] == '-' &&
              strchr("89ab", a[19]) != NULL && a[23] == '-');
  assert_int_equal(spot_gce_request_id("j", "c", "r", "z2", b, sizeof(b)), 0);
  assert_string_not_equal(a, b);
  assert_int_equal(spot_gce_request_id("j", "c", "r", "z", b, 36), -ENOSPC);
  assert_int_equal(spot_gce_instance_name("My_Job.1", "spotd-0123456789abcdef",
                                          name, sizeof(name)),
                   0);
  assert_string_equal(name, "spotd-my-job-1-89abcdef");
  assert_int_equal(
      spot_gce_instance_name("a-very-long-job-name-that-goes-on-and-on-and-"
                             "on-beyond-sixty-three",
                             "0123456789", name, sizeof(name)),
      0);
  assert_true(strlen(name) <= SPOT_GCE_NAME_MAX);
  assert_string_equal(name + strlen(name) - 9, "-23456789");
}

static void
test_body(void **state)
{
  static const char tmpl[] =
      "{\"name\":\"t\",\"properties\":{\"machineType\":\"n2\",\"metadata\":"
      "{\"items\":[{\"key\":\"startup-script\",\"value\":\"run\"},{\"key\":"
      "\"spotd-job\",\"value\":\"old\"}]}}}";
  struct spot_buf b;

  spot_buf_init(&b, 1 << 16);
  assert_int_equal(
      spot_gce_insert_body("vm", "j1", "s3://b/p", tmpl, strlen(tmpl), &b), 0);
  assert_string_equal(
      spot_buf_str(&b),
      "{\"name\":\"vm\",\"metadata\":{\"items\":[{\"key\":\"startup-script\","
      "\"value\":\"run\"},{\"key\":\"spotd-job\",\"value\":\"j1\"},{\"key\":"
      "\"spotd-store\",\"value\":\"s3://b/p\"}]},\"scheduling\":{"
      "\"provisioningModel\":\"SPOT\",\"instanceTerminationAction\":"
      "\"DELETE\"}}");
  assert_int_equal(spot_gce_insert_body("vm", "j1", NULL, NULL, 0, &b), 0);
  assert_string_equal(spot_buf_str(&b),
                      "{\"name\":\"vm\",\"metadata\":{\"items\":[{\"key\":"
                      "\"spotd-job\",\"value\":\"j1\"}]},\"scheduling\":{"
                      "\"provisioningModel\":\"SPOT\","
                      "\"instanceTerminationAction\":\"DELETE\"}}");
  assert_int_equal(spot_gce_insert_body("vm", "j", NULL, "nope", 4, &b),
                   -EBADMSG);
  spot_buf_fini(&b);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_op),        cmocka_unit_test(test_long_code),
      cmocka_unit_test(test_error_doc), cmocka_unit_test(test_token),
      cmocka_unit_test(test_ids),       cmocka_unit_test(test_body),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
