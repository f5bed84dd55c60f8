#include "cmocka-compat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h"
#include "core/proto.h"

/* What the callback saw. */
struct seen {
  int n;
  uint64_t ids[16];
  int cmds[16];
  char names[16][32];
  bool wait[16], final[16];
  char dir[16][64];
  const char *args_error[16];
  bool ok[16];
  char error[16][64];
  int stop_at; /* return -ECANCELED on this message (1-based), 0 = never */
};

static int
record_cb(const struct spot_proto_msg *m, void *data)
{
  struct seen *s = data;
  int i = s->n++;

  assert_true(i < 16);
  s->ids[i] = m->id;
  s->cmds[i] = m->cmd;
  s->args_error[i] = m->args_error;
  if (m->kind == SPOT_PROTO_REQUEST) {
    assert_non_null(m->args);
    assert_true(json_is_object(m->args));
    snprintf(s->names[i], sizeof(s->names[i]), "%s", m->cmd_name);
    if (m->cmd == SPOT_PROTO_CMD_CHECKPOINT && m->args_error == NULL)
      s->wait[i] = m->u.checkpoint.wait;
    if (m->cmd == SPOT_PROTO_CMD_CHECKPOINT && m->args_error == NULL)
      s->final[i] = m->u.checkpoint.final;
    if (m->cmd == SPOT_PROTO_CMD_DONE && m->args_error == NULL)
      snprintf(s->dir[i], sizeof(s->dir[i]), "%s", m->u.done.dir);
  } else {
    s->ok[i] = m->ok;
    if (m->ok)
      assert_true(json_is_object(m->result));
    else
      snprintf(s->error[i], sizeof(s->error[i]), "%s", m->error);
  }
  return s->stop_at == s->n ? -ECANCELED : 0;
}

static void
test_cmd_names(void **state)
{
  for (int i = 0; i < SPOT_PROTO_CMD_LAST; i++) {
    const char *n = spot_proto_cmd_name(i);
    assert_non_null(n);
    assert_int_equal(spot_proto_cmd_from_name(n), i);
  }
  assert_null(spot_proto_cmd_name(SPOT_PROTO_CMD_LAST));
  assert_null(spot_proto_cmd_name(-1));
  assert_int_equal(spot_proto_cmd_from_name("reboot"), SPOT_PROTO_CMD_LAST);
}

static void
test_round_trip_and_split_feeds(void **state)
{
  struct spot_buf out;
  struct spot_proto_reader r;
  struct seen s = {0};

  spot_buf_init(&out, 1 << 16);
  assert_int_equal(
      spot_proto_encode_request(&out, 1, SPOT_PROTO_CMD_STATUS, NULL), 0);
  assert_int_equal(spot_proto_encode_checkpoint(&out, 2, true), 0);
  assert_int_equal(spot_proto_encode_done(&out, 3, "/ck/step-100"), 0);
  assert_string_equal(out.data, "{\"v\":1,\"id\":1,\"cmd\":\"status\"}\n"
                                "{\"v\":1,\"id\":2,\"cmd\":\"checkpoint\","
                                "\"args\":{\"wait\":true}}\n"
                                "{\"v\":1,\"id\":3,\"cmd\":\"done\","
                                "\"args\":{\"dir\":\"/ck/step-100\"}}\n");
  /* One byte at a time: every split point. */
  spot_proto_reader_init(&r, SPOT_PROTO_REQUEST);
  for (size_t i = 0; i < out.len; i++) {
    assert_int_equal(spot_proto_feed(&r, out.data + i, 1, record_cb, &s), 0);
    assert_int_equal(spot_proto_reader_pending(&r), out.data[i] != '\n');
  }
  assert_int_equal(s.n, 3);
  assert_int_equal(s.ids[0], 1);
  assert_int_equal(s.cmds[0], SPOT_PROTO_CMD_STATUS);
  assert_int_equal(s.cmds[1], SPOT_PROTO_CMD_CHECKPOINT);
  assert_true(s.wait[1]);
  assert_int_equal(s.cmds[2], SPOT_PROTO_CMD_DONE);
  assert_string_equal(s.dir[2], "/ck/step-100");
  spot_proto_reader_fini(&r);

  /* All at once, with CRLF and blank lines in between. */
  memset(&s, 0, sizeof(s));
  spot_proto_reader_init(&r, SPOT_PROTO_REQUEST);
  {
    static const char text[] =
        "\n\r\n{\"v\":1,\"id\":7,\"cmd\":\"hello\"}\r\n\n"
        "{\"v\":1,\"id\":8,\"cmd\":\"checkpoint\",\"args\":null,"
        "\"extra\":[1,2]}\n{\"v\":1,";
    assert_int_equal(spot_proto_feed(&r, text, strlen(text), record_cb, &s), 0);
  }
  assert_int_equal(s.n, 2);
  assert_int_equal(s.ids[1], 8);
  assert_false(s.wait[1]);
  assert_true(spot_proto_reader_pending(&r));
  assert_int_equal(
      spot_proto_feed(&r, "\"id\":9,\"cmd\":\"status\"}\n", 24, record_cb, &s),
      0);
  assert_int_equal(s.n, 3);
  assert_int_equal(s.ids[2], 9);
  spot_proto_reader_fini(&r);
  spot_buf_fini(&out);
}

static void
test_oversized_line(void **state)
{
  struct spot_proto_reader r;
  struct seen s = {0};
  char *big = malloc(SPOT_PROTO_MAX_LINE + 2);
  static const char head[] =
      "{\"v\":1,\"id\":1,\"cmd\":\"status\",\"args\":{\"pad\":\"";
  static const char tail[] = "\"}}";
  size_t n;

  assert_non_null(big);
  /* Exactly SPOT_PROTO_MAX_LINE bytes before the newline: accepted. */
  memset(big, 'x', SPOT_PROTO_MAX_LINE);
  memcpy(big, head, sizeof(head) - 1);
  memcpy(big + SPOT_PROTO_MAX_LINE - (sizeof(tail) - 1), tail,
         sizeof(tail) - 1);
  big[SPOT_PROTO_MAX_LINE] = '\n';
  spot_proto_reader_init(&r, SPOT_PROTO_REQUEST);
  for (n = 0; n <= SPOT_PROTO_MAX_LINE; n += 1000) {
    size_t k =
        SPOT_PROTO_MAX_LINE + 1 - n < 1000 ? SPOT_PROTO_MAX_LINE + 1 - n : 1000;
    assert_int_equal(spot_proto_feed(&r, big + n, k, record_cb, &s), 0);
  }
  assert_int_equal(s.n, 1);

  /* One more byte, no newline yet: dropped as soon as the cap passes. */
  memset(big, 'x', SPOT_PROTO_MAX_LINE + 1);
  assert_int_equal(spot_proto_feed(&r, big, SPOT_PROTO_MAX_LINE, record_cb, &s),
                   0);
  assert_int_equal(spot_proto_feed(&r, big, 1, record_cb, &s), -EMSGSIZE);
  assert_non_null(strstr(spot_proto_reader_error(&r), "longer than"));
  /* Sticky: the client is to be dropped, nothing more is read. */
  assert_int_equal(spot_proto_feed(&r,
                                   "{\"v\":1,\"id\":2,\"cmd\":\"status\"}\n",
                                   31, record_cb, &s),
                   -EMSGSIZE);
  assert_int_equal(s.n, 1);
  assert_false(spot_proto_reader_pending(&r));
  spot_proto_reader_fini(&r);

  /* In a single feed too. */
  spot_proto_reader_init(&r, SPOT_PROTO_REQUEST);
  assert_int_equal(
      spot_proto_feed(&r, big, SPOT_PROTO_MAX_LINE + 1, record_cb, &s),
      -EMSGSIZE);
  spot_proto_reader_fini(&r);
  free(big);
}

static void
expect_bad(const char *line, enum spot_proto_kind kind, int want,
           const char *msg, int64_t want_id)
{
  struct spot_proto_reader r;
  struct seen s = {0};
  int got;

  spot_proto_reader_init(&r, kind);
  got = spot_proto_feed(&r, line, strlen(line), record_cb, &s);
  if (got != want)
    fail_msg("'%s': got %d, want %d (%s)", line, got, want,
             spot_proto_reader_error(&r));
  assert_int_equal(s.n, 0);
  if (strstr(spot_proto_reader_error(&r), msg) == NULL)
    fail_msg("'%s': error '%s' lacks '%s'", line, spot_proto_reader_error(&r),
             msg);
  assert_int_equal(r.err_id, want_id);
  spot_proto_reader_fini(&r);
}

static void
test_bad_messages(void **state)
{
  const enum spot_proto_kind Q = SPOT_PROTO_REQUEST, A = SPOT_PROTO_RESPONSE;

  expect_bad("garbage\n", Q, -EBADMSG, "invalid JSON", -1);
  expect_bad("{\"v\":1,\"id\":1,\"cmd\":\"status\"\n", Q, -EBADMSG,
             "invalid JSON", -1);
  expect_bad("{\"v\":1,\"id\":1,\"cmd\":\"status\"} {}\n", Q, -EBADMSG,
             "invalid JSON", -1);
  expect_bad("[1,2]\n", Q, -EBADMSG, "JSON object", -1);
  expect_bad("\"status\"\n", Q, -EBADMSG, "invalid JSON", -1);
  expect_bad("{\"id\":1,\"cmd\":\"status\"}\n", Q, -EBADMSG, "'v'", 1);
  expect_bad("{\"v\":\"1\",\"id\":1,\"cmd\":\"status\"}\n", Q, -EBADMSG, "'v'",
             1);
  expect_bad("{\"v\":1,\"cmd\":\"status\"}\n", Q, -EBADMSG, "'id'", -1);
  expect_bad("{\"v\":1,\"id\":-1,\"cmd\":\"status\"}\n", Q, -EBADMSG, "'id'",
             -1);
  expect_bad("{\"v\":1,\"id\":9007199254740992,\"cmd\":\"status\"}\n", Q,
             -EBADMSG, "'id'", -1);
  expect_bad("{\"v\":1,\"id\":1.5,\"cmd\":\"status\"}\n", Q, -EBADMSG, "'id'",
             -1);
  expect_bad("{\"v\":1,\"id\":3}\n", Q, -EBADMSG, "'cmd'", 3);
  expect_bad("{\"v\":1,\"id\":3,\"cmd\":7}\n", Q, -EBADMSG, "'cmd'", 3);
  expect_bad("{\"v\":1,\"id\":3,\"cmd\":\"\"}\n", Q, -EBADMSG, "'cmd'", 3);
  expect_bad("{\"v\":1,\"id\":3,\"cmd\":\"status\",\"args\":[]}\n", Q, -EBADMSG,
             "'args'", 3);
  expect_bad("{\"v\":1,\"v\":1,\"id\":3,\"cmd\":\"status\"}\n", Q, -EBADMSG,
             "invalid JSON", 3);
  expect_bad("{\"v\":1,\"id\":3,\"cmd\":\"st\\u0000atus\"}\n", Q, -EBADMSG,
             "invalid JSON", -1);
  expect_bad("{\"v\":1,\"id\":3,\"cmd\":\"\xff\xfe\"}\n", Q, -EBADMSG,
             "invalid JSON", -1);
  expect_bad("{\"v\":2,\"id\":4,\"cmd\":\"status\"}\n", Q, -EPROTONOSUPPORT,
             "unsupported protocol version 2", 4);
  expect_bad("{\"v\":0,\"id\":5,\"ok\":true}\n", A, -EPROTONOSUPPORT,
             "version 0", 5);
  expect_bad("{\"v\":1,\"id\":5}\n", A, -EBADMSG, "'ok'", 5);
  expect_bad("{\"v\":1,\"id\":5,\"ok\":false}\n", A, -EBADMSG, "'error'", 5);
  expect_bad("{\"v\":1,\"id\":5,\"ok\":true,\"result\":3}\n", A, -EBADMSG,
             "'result'", 5);
  /* A request where a response is expected. */
  expect_bad("{\"v\":1,\"id\":5,\"cmd\":\"status\"}\n", A, -EBADMSG, "'ok'", 5);
}

static void
test_unknown_cmd_and_bad_args(void **state)
{
  static const char text[] =
      "{\"v\":1,\"id\":1,\"cmd\":\"reboot\"}\n"
      "{\"v\":1,\"id\":2,\"cmd\":\"done\"}\n"
      "{\"v\":1,\"id\":3,\"cmd\":\"done\",\"args\":{\"dir\":\"\"}}\n"
      "{\"v\":1,\"id\":4,\"cmd\":\"checkpoint\",\"args\":{\"wait\":\"yes\"}}\n"
      "{\"v\":1,\"id\":5,\"cmd\":\"checkpoint\",\"args\":{\"wait\":false}}\n"
      "{\"v\":1,\"id\":6,\"cmd\":\"checkpoint\",\"args\":{\"final\":1}}\n"
      "{\"v\":1,\"id\":7,\"cmd\":\"checkpoint\",\"args\":{\"final\":true,"
      "\"wait\":true}}\n";
  struct spot_proto_reader r;
  struct seen s = {0};
  struct spot_buf out;

  spot_proto_reader_init(&r, SPOT_PROTO_REQUEST);
  assert_int_equal(spot_proto_feed(&r, text, strlen(text), record_cb, &s), 0);
  spot_buf_init(&out, 256);
  assert_int_equal(spot_proto_encode_checkpoint_final(&out, 8), 0);
  assert_int_equal(spot_proto_feed(&r, out.data, out.len, record_cb, &s), 0);
  spot_buf_fini(&out);
  assert_int_equal(s.n, 8);
  assert_non_null(strstr(s.args_error[5], "'final'"));
  assert_non_null(strstr(s.args_error[6], "'final'"));
  assert_null(s.args_error[7]);
  assert_true(s.final[7]);
  assert_false(s.wait[7]);
  assert_false(s.final[4]);
  assert_int_equal(s.cmds[0], SPOT_PROTO_CMD_LAST);
  assert_string_equal(s.names[0], "reboot");
  assert_non_null(s.args_error[1]);
  assert_non_null(strstr(s.args_error[2], "'dir'"));
  assert_non_null(strstr(s.args_error[3], "'wait'"));
  assert_null(s.args_error[4]);
  assert_false(s.wait[4]);
  spot_proto_reader_fini(&r);
}

static void
test_step(void **state)
{
  static const char text[] =
      "{\"v\":1,\"id\":1,\"cmd\":\"step\",\"args\":{\"step\":1200}}\n"
      "{\"v\":1,\"id\":2,\"cmd\":\"step\",\"args\":{\"step\":-1}}\n"
      "{\"v\":1,\"id\":3,\"cmd\":\"step\",\"args\":{\"step\":\"7\"}}\n"
      "{\"v\":1,\"id\":4,\"cmd\":\"step\"}\n"
      "{\"v\":1,\"id\":5,\"cmd\":\"metrics\"}\n";
  struct spot_proto_reader r;
  struct spot_proto_msg m;
  struct spot_buf out;
  struct seen s = {0};
  json_t *root;
  char err[128];

  spot_proto_reader_init(&r, SPOT_PROTO_REQUEST);
  assert_int_equal(spot_proto_feed(&r, text, strlen(text), record_cb, &s), 0);
  assert_int_equal(s.n, 5);
  assert_int_equal(s.cmds[0], SPOT_PROTO_CMD_STEP);
  assert_null(s.args_error[0]);
  for (int i = 1; i < 4; i++)
    assert_non_null(strstr(s.args_error[i], "'step'"));
  assert_int_equal(s.cmds[4], SPOT_PROTO_CMD_METRICS);
  assert_null(s.args_error[4]);
  spot_proto_reader_fini(&r);

  spot_buf_init(&out, 1024);
  assert_int_equal(spot_proto_encode_step(&out, 9, -1), -EINVAL);
  assert_int_equal(spot_proto_encode_step(&out, 9, 42), 0);
  assert_int_equal(spot_proto_decode(out.data, out.len - 1, SPOT_PROTO_REQUEST,
                                     &root, &m, err, sizeof(err)),
                   0);
  assert_int_equal(m.cmd, SPOT_PROTO_CMD_STEP);
  assert_int_equal(m.u.step.step, 42);
  json_decref(root);
  spot_buf_fini(&out);
}

static void
test_callback_stops(void **state)
{
  static const char text[] = "{\"v\":1,\"id\":1,\"cmd\":\"status\"}\n"
                             "{\"v\":1,\"id\":2,\"cmd\":\"status\"}\n";
  struct spot_proto_reader r;
  struct seen s = {0};

  s.stop_at = 1;
  spot_proto_reader_init(&r, SPOT_PROTO_REQUEST);
  assert_int_equal(spot_proto_feed(&r, text, strlen(text), record_cb, &s),
                   -ECANCELED);
  assert_int_equal(s.n, 1);
  assert_int_equal(spot_proto_feed(&r, text, strlen(text), record_cb, &s),
                   -ECANCELED);
  assert_int_equal(s.n, 1);
  spot_proto_reader_fini(&r);
}

static void
test_responses(void **state)
{
  struct spot_buf out;
  struct spot_proto_reader r;
  struct seen s = {0};
  json_t *res = json_pack("{s:s, s:b}", "name", "step-9", "committed", 1);

  spot_buf_init(&out, 4096);
  assert_int_equal(spot_proto_encode_ok(&out, 10, res), 0);
  assert_int_equal(spot_proto_encode_ok(&out, 11, NULL), 0);
  assert_int_equal(
      spot_proto_encode_error(&out, 12, "unknown command '%s'", "re\"boot\n"),
      0);
  assert_int_equal(spot_proto_encode_error(&out, 13, "%s", "bad \xff utf8"), 0);
  /* Every message is one line. */
  {
    int lines = 0;
    for (size_t i = 0; i < out.len; i++)
      lines += out.data[i] == '\n';
    assert_int_equal(lines, 4);
  }
  assert_non_null(strstr(out.data, "{\"v\":1,\"id\":11,\"ok\":true}\n"));
  spot_proto_reader_init(&r, SPOT_PROTO_RESPONSE);
  assert_int_equal(spot_proto_feed(&r, out.data, out.len, record_cb, &s), 0);
  assert_int_equal(s.n, 4);
  assert_true(s.ok[0]);
  assert_true(s.ok[1]);
  assert_false(s.ok[2]);
  assert_string_equal(s.error[2], "unknown command 're\"boot\n'");
  assert_false(s.ok[3]);
  assert_non_null(strstr(s.error[3], "UTF-8"));
  spot_proto_reader_fini(&r);

  /* Encoder errors. */
  assert_int_equal(spot_proto_encode_ok(&out, SPOT_PROTO_MAX_ID, NULL),
                   -EINVAL);
  assert_int_equal(spot_proto_encode_ok(&out, 1, json_true()), -EINVAL);
  assert_int_equal(
      spot_proto_encode_request(&out, 1, SPOT_PROTO_CMD_LAST, NULL), -EINVAL);
  assert_int_equal(spot_proto_encode_done(&out, 1, ""), -EINVAL);
  assert_int_equal(spot_proto_encode_done(&out, 1, "\xff"), -EINVAL);
  json_decref(res);
  spot_buf_fini(&out);

  /* A full output buffer is left unchanged. */
  spot_buf_init(&out, 40);
  assert_int_equal(
      spot_proto_encode_request(&out, 1, SPOT_PROTO_CMD_STATUS, NULL), 0);
  {
    size_t before = out.len;
    assert_int_equal(
        spot_proto_encode_request(&out, 2, SPOT_PROTO_CMD_STATUS, NULL),
        -E2BIG);
    assert_int_equal(out.len, before);
  }
  spot_buf_fini(&out);

  /* A result too big for one line. */
  {
    char *pad = malloc(SPOT_PROTO_MAX_LINE + 1);
    memset(pad, 'p', SPOT_PROTO_MAX_LINE);
    pad[SPOT_PROTO_MAX_LINE] = '\0';
    res = json_pack("{s:s}", "pad", pad);
    spot_buf_init(&out, 4 * SPOT_PROTO_MAX_LINE);
    assert_int_equal(spot_proto_encode_ok(&out, 1, res), -EMSGSIZE);
    assert_int_equal(out.len, 0);
    spot_buf_fini(&out);
    json_decref(res);
    free(pad);
  }
}

static void
test_decode_one(void **state)
{
  static const char line[] = "{\"v\":1,\"id\":42,\"cmd\":\"hello\"}";
  struct spot_proto_msg m;
  json_t *root = NULL;
  char err[128];

  assert_int_equal(spot_proto_decode(line, strlen(line), SPOT_PROTO_REQUEST,
                                     &root, &m, err, sizeof(err)),
                   0);
  assert_int_equal(m.id, 42);
  assert_int_equal(m.cmd, SPOT_PROTO_CMD_HELLO);
  json_decref(root);
  assert_int_equal(spot_proto_decode("{", 1, SPOT_PROTO_REQUEST, &root, &m, err,
                                     sizeof(err)),
                   -EBADMSG);
}

static void
test_status_round_trip(void **state)
{
  struct spot_proto_status st = {0}, back;
  struct spot_buf out;
  struct spot_proto_msg m;
  json_t *j, *root;
  char err[128];

  st.state = "uploading";
  st.job = "j1";
  st.store = "s3://bkt/p/j1";
  st.provider = "aws";
  st.has_notice = true;
  st.notice.kind = "aws-spot-terminate";
  st.notice.deadline = "2026-12-02T10:13:50Z";
  st.notice.seconds_left = 74;
  st.has_trainer = true;
  st.trainer.pid = 4242;
  st.trainer.uptime_s = 3600;
  st.trainer.restart_count = 2;
  st.trainer.step = 1200;
  st.trainer.steps_per_s = 2.5;
  st.trainer.steps_at_risk = 200;
  st.has_last_commit = true;
  st.last_commit.name = "step-100";
  st.last_commit.time = "2026-12-02T10:00:00Z";
  st.last_commit.age_s = 730;
  st.has_upload = true;
  st.upload.name = "step-110";
  st.upload.bytes_done = 5000000000ull;
  st.upload.bytes_total = 7000000000ull;
  st.upload.rate = 123.5e6;
  st.upload.eta_s = -1;
  st.warnings[0] = "upload cannot finish before the deadline";
  st.n_warnings = 1;
  st.relaunch[0].time = "2026-12-02T10:14:00Z";
  st.relaunch[0].reason = "aws-spot-terminate";
  st.relaunch[0].exit_status = 0;
  st.relaunch[0].ok = true;
  st.n_relaunch = 1;

  j = spot_proto_status_to_json(&st);
  assert_non_null(j);
  spot_buf_init(&out, SPOT_PROTO_MAX_LINE + 1);
  assert_int_equal(spot_proto_encode_ok(&out, 1, j), 0);
  json_decref(j);
  /* Over the wire and back. */
  assert_int_equal(spot_proto_decode(out.data, out.len - 1, SPOT_PROTO_RESPONSE,
                                     &root, &m, err, sizeof(err)),
                   0);
  assert_int_equal(
      spot_proto_status_from_json(m.result, &back, err, sizeof(err)), 0);
  assert_string_equal(back.state, "uploading");
  assert_string_equal(back.provider, "aws");
  assert_true(back.has_notice);
  assert_string_equal(back.notice.kind, "aws-spot-terminate");
  assert_int_equal(back.notice.seconds_left, 74);
  assert_int_equal(back.trainer.pid, 4242);
  assert_int_equal(back.trainer.restart_count, 2);
  assert_int_equal(back.trainer.step, 1200);
  assert_true(back.trainer.steps_per_s > 2.49 &&
              back.trainer.steps_per_s < 2.51);
  assert_int_equal(back.trainer.steps_at_risk, 200);
  assert_string_equal(back.last_commit.name, "step-100");
  assert_int_equal(back.last_commit.age_s, 730);
  assert_int_equal(back.upload.bytes_done, 5000000000ull);
  assert_int_equal(back.upload.bytes_total, 7000000000ull);
  assert_true(back.upload.rate > 123.4e6 && back.upload.rate < 123.6e6);
  assert_int_equal(back.upload.eta_s, -1);
  assert_int_equal(back.n_warnings, 1);
  assert_string_equal(back.warnings[0],
                      "upload cannot finish before the deadline");
  assert_int_equal(back.n_relaunch, 1);
  assert_true(back.relaunch[0].ok);
  json_decref(root);

  /* Nulls for what does not apply. */
  memset(&st, 0, sizeof(st));
  st.state = "running";
  j = spot_proto_status_to_json(&st);
  assert_true(json_is_null(json_object_get(j, "notice")));
  assert_true(json_is_null(json_object_get(j, "upload")));
  assert_int_equal(json_array_size(json_object_get(j, "warnings")), 0);
  assert_int_equal(spot_proto_status_from_json(j, &back, err, sizeof(err)), 0);
  assert_false(back.has_notice);
  assert_false(back.has_upload);
  assert_null(back.job);
  json_decref(j);
  /* A trainer that reported no step: nulls, read back as unknown. */
  st.has_trainer = true;
  st.trainer.pid = 7;
  st.trainer.step = st.trainer.steps_at_risk = -1;
  st.trainer.steps_per_s = -1;
  j = spot_proto_status_to_json(&st);
  assert_true(json_is_null(
      json_object_get(json_object_get(j, "trainer"), "steps_per_s")));
  assert_int_equal(spot_proto_status_from_json(j, &back, err, sizeof(err)), 0);
  assert_int_equal(back.trainer.step, -1);
  assert_int_equal(back.trainer.steps_at_risk, -1);
  assert_true(back.trainer.steps_per_s < 0);
  json_decref(j);
  spot_buf_fini(&out);
}

static void
test_status_bad(void **state)
{
  static const char *const bad[] = {
      "{}",
      "{\"state\":1}",
      "{\"state\":\"x\",\"notice\":3}",
      "{\"state\":\"x\",\"trainer\":{\"pid\":\"1\"}}",
      "{\"state\":\"x\",\"upload\":{\"rate\":\"fast\"}}",
      "{\"state\":\"x\",\"warnings\":\"w\"}",
      "{\"state\":\"x\",\"warnings\":[1]}",
      "{\"state\":\"x\",\"relaunch\":[1]}",
      "{\"state\":\"x\",\"relaunch\":[{\"ok\":1}]}",
      "[]",
  };
  struct spot_proto_status st;
  char err[128];

  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    json_t *j = json_loads(bad[i], 0, NULL);
    assert_non_null(j);
    if (spot_proto_status_from_json(j, &st, err, sizeof(err)) != -EBADMSG)
      fail_msg("accepted %s", bad[i]);
    json_decref(j);
  }
  /* More warnings than the cap: the first ones are kept. */
  {
    json_t *j = json_pack("{s:s}", "state", "x"), *w = json_array();
    for (int i = 0; i < SPOT_PROTO_MAX_WARNINGS + 5; i++)
      json_array_append_new(w, json_string("w"));
    json_object_set_new(j, "warnings", w);
    assert_int_equal(spot_proto_status_from_json(j, &st, err, sizeof(err)), 0);
    assert_int_equal(st.n_warnings, SPOT_PROTO_MAX_WARNINGS);
    json_decref(j);
  }
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cmd_names),
      cmocka_unit_test(test_round_trip_and_split_feeds),
      cmocka_unit_test(test_oversized_line),
      cmocka_unit_test(test_bad_messages),
      cmocka_unit_test(test_unknown_cmd_and_bad_args),
      cmocka_unit_test(test_step),
      cmocka_unit_test(test_callback_stops),
      cmocka_unit_test(test_responses),
      cmocka_unit_test(test_decode_one),
      cmocka_unit_test(test_status_round_trip),
      cmocka_unit_test(test_status_bad),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
