/* The store's pure parts: object keys, phase names, and the argument and
 * config checks that run before any I/O; and when a cancel's callback runs,
 * against a small S3 stand-in on loopback in this process. */
#include "cmocka-compat.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "buf.h"
#include "http.h"
#include "s3.h"
#include "store.h"
#include "util.h"

static struct spot_store_config
cfg_of(const char *prefix)
{
  struct spot_store_config c;

  memset(&c, 0, sizeof(c));
  c.bucket = "b";
  c.prefix = prefix;
  c.job = "job-1";
  return c;
}

static void
key_is(const struct spot_store_config *c, const char *name, const char *rel,
       const char *want)
{
  struct spot_buf b;

  spot_buf_init(&b, 4096);
  assert_int_equal(spot_store_key(c, name, rel, &b), 0);
  assert_string_equal(spot_buf_str(&b), want);
  spot_buf_fini(&b);
}

static void
test_key_layout(void **state)
{
  struct spot_store_config c = cfg_of("team/runs");

  (void)state;
  /* DESIGN.md: PREFIX/JOB/checkpoints/NAME/<path>.zst, .../MANIFEST.json,
   * PREFIX/JOB/LATEST */
  key_is(&c, "step-100", "model/w.bin.zst",
         "team/runs/job-1/checkpoints/step-100/model/w.bin.zst");
  key_is(&c, "step-100", "MANIFEST.json",
         "team/runs/job-1/checkpoints/step-100/MANIFEST.json");
  key_is(&c, "step-100", "", "team/runs/job-1/checkpoints/step-100/");
  key_is(&c, "step-100", NULL, "team/runs/job-1/checkpoints/step-100/");
  key_is(&c, NULL, "LATEST", "team/runs/job-1/LATEST");
  key_is(&c, NULL, "checkpoints/", "team/runs/job-1/checkpoints/");
  key_is(&c, NULL, NULL, "team/runs/job-1/");
}

static void
test_key_no_prefix(void **state)
{
  struct spot_store_config c = cfg_of("");
  struct spot_store_config n = cfg_of(NULL);

  (void)state;
  key_is(&c, NULL, "LATEST", "job-1/LATEST");
  key_is(&n, NULL, "LATEST", "job-1/LATEST");
  key_is(&n, "a", "x.zst", "job-1/checkpoints/a/x.zst");
}

static void
test_key_resets_and_caps(void **state)
{
  struct spot_store_config c = cfg_of("p");
  struct spot_buf b;
  char big[300];

  (void)state;
  /* the buffer is reset first, not appended to */
  spot_buf_init(&b, 4096);
  assert_int_equal(spot_buf_appends(&b, "junk"), 0);
  assert_int_equal(spot_store_key(&c, "n", "f", &b), 0);
  assert_string_equal(spot_buf_str(&b), "p/job-1/checkpoints/n/f");
  spot_buf_fini(&b);

  /* a key longer than the buffer's cap is an error, never truncated */
  memset(big, 'x', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  spot_buf_init(&b, 64);
  assert_true(spot_store_key(&c, "n", big, &b) < 0);
  spot_buf_fini(&b);
  spot_buf_init(&b, 64);
  assert_int_equal(spot_store_key(&c, "n", "short", &b), 0);
  spot_buf_fini(&b);
}

static void
test_phase_names(void **state)
{
  (void)state;
  assert_string_equal(spot_store_phase_name(SPOT_STORE_PHASE_PLAN), "plan");
  assert_string_equal(spot_store_phase_name(SPOT_STORE_PHASE_TRANSFER),
                      "transfer");
  assert_string_equal(spot_store_phase_name(SPOT_STORE_PHASE_COMMIT), "commit");
  assert_string_equal(spot_store_phase_name(SPOT_STORE_PHASE_RETAIN), "retain");
  assert_string_equal(spot_store_phase_name(SPOT_STORE_PHASE_FINISH), "finish");
  assert_string_equal(spot_store_phase_name(SPOT_STORE_PHASE_LAST), "?");
  assert_string_equal(spot_store_phase_name((enum spot_store_phase) - 1), "?");
}

/* Issue 14.1: setuid/setgid/sticky never restored, no group/other write
 * the umask takes away; the rest of the permission bits kept. */
static void
test_restore_mode(void **state)
{
  (void)state;
  assert_int_equal(spot_store_restore_mode(04755, 022), 0755);
  assert_int_equal(spot_store_restore_mode(06777, 022), 0755);
  assert_int_equal(spot_store_restore_mode(07777, 0), 0777);
  assert_int_equal(spot_store_restore_mode(01777, 002), 0775);
  assert_int_equal(spot_store_restore_mode(0640, 022), 0640);
  assert_int_equal(spot_store_restore_mode(0600, 077), 0600);
  assert_int_equal(spot_store_restore_mode(0666, 077), 0644);
  assert_int_equal(spot_store_restore_mode(0, 022), 0);
  /* the umask read back is the one set */
  {
    mode_t old = umask(027);
    assert_int_equal(spot_store_umask(), 027);
    umask(old);
  }
}

static void
never_cb(const struct spot_store_result *res, void *data)
{
  (void)res;
  (void)data;
  fail_msg("a callback ran after a call that failed");
}

static void
never_list_cb(const struct spot_store_list_result *res, void *data)
{
  (void)res;
  (void)data;
  fail_msg("a callback ran after a call that failed");
}

/* Invalid arguments and configs fail synchronously with -EINVAL, the
 * callback never runs, and nothing is left on the loop. A non-NULL
 * s3 pointer is never dereferenced on these paths. */
static void
test_invalid_args(void **state)
{
  uv_loop_t loop;
  struct spot_store_config c = cfg_of("p");
  struct spot_store_op *op = NULL;
  static const uint64_t bad_parts[] = {1, SPOT_STORE_PART_MIN - 4096,
                                       SPOT_STORE_PART_MAX + 4096,
                                       SPOT_STORE_PART_MIN + 1};

  (void)state;
  assert_int_equal(uv_loop_init(&loop), 0);
  c.s3 = NULL; /* no client */
  assert_int_equal(
      spot_store_push(&loop, &c, "/tmp", "n", NULL, never_cb, NULL, &op),
      -EINVAL);
  assert_int_equal(
      spot_store_restore(&loop, &c, "n", "/tmp/x", NULL, never_cb, NULL, &op),
      -EINVAL);
  assert_int_equal(spot_store_list(&loop, &c, never_list_cb, NULL, &op),
                   -EINVAL);

  c.s3 = (struct spot_s3 *)(void *)&loop; /* never used: checks come first */
  for (size_t i = 0; i < sizeof(bad_parts) / sizeof(bad_parts[0]); i++) {
    c.part_size = bad_parts[i];
    assert_int_equal(
        spot_store_push(&loop, &c, "/tmp", "n", NULL, never_cb, NULL, &op),
        -EINVAL);
  }
  c.part_size = 0;
  c.parallel = 65;
  assert_int_equal(
      spot_store_push(&loop, &c, "/tmp", "n", NULL, never_cb, NULL, &op),
      -EINVAL);
  c.parallel = 0;
  c.workers = 65;
  assert_int_equal(
      spot_store_push(&loop, &c, "/tmp", "n", NULL, never_cb, NULL, &op),
      -EINVAL);
  c.workers = 0;
  c.job = "";
  assert_int_equal(spot_store_list(&loop, &c, never_list_cb, NULL, &op),
                   -EINVAL);
  c.job = "job-1";
  c.bucket = NULL;
  assert_int_equal(spot_store_list(&loop, &c, never_list_cb, NULL, &op),
                   -EINVAL);
  c.bucket = "b";

  /* names: '/', "..", ".", empty; and missing arguments */
  static const char *const bad_names[] = {"a/b", "..",  ".",
                                          "",    "x y", "../etc"};
  for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
    assert_int_equal(spot_store_push(&loop, &c, "/tmp", bad_names[i], NULL,
                                     never_cb, NULL, &op),
                     -EINVAL);
    assert_int_equal(spot_store_restore(&loop, &c, bad_names[i], "/tmp/x", NULL,
                                        never_cb, NULL, &op),
                     -EINVAL);
  }
  /* the default name is DIR's base name: ".." is not a name */
  assert_int_equal(
      spot_store_push(&loop, &c, "/tmp/..", NULL, NULL, never_cb, NULL, &op),
      -EINVAL);
  assert_int_equal(
      spot_store_push(&loop, &c, "/tmp", "n", NULL, NULL, NULL, &op), -EINVAL);
  assert_int_equal(
      spot_store_push(&loop, &c, NULL, "n", NULL, never_cb, NULL, &op),
      -EINVAL);
  assert_int_equal(
      spot_store_restore(&loop, &c, "n", "", NULL, never_cb, NULL, &op),
      -EINVAL);
  assert_int_equal(
      spot_store_restore(NULL, &c, "n", "/x", NULL, never_cb, NULL, &op),
      -EINVAL);

  spot_store_cancel(NULL); /* a no-op */
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* ---- a cancel's callback runs from the loop ---------------------------- */

/* An S3 stand-in on the test's own loop: every request but a PUT gets an
 * empty 404 (no such key, no uploads), a PUT gets no answer at all, and the
 * first PUT's headers call on_put, so a test cancels exactly while a PUT is
 * on the wire. */
struct stand_in {
  uv_tcp_t listener;
  struct sockaddr_in addr;
  void (*on_put)(struct stand_in *si);
  int puts;
  int conns_open;
  uv_tcp_t *conns[8];
  size_t nconns;
};

struct conn {
  uv_tcp_t tcp;
  struct stand_in *si;
  char buf[8192];
  size_t len;
};

static const char not_found[] =
    "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";

static void
alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
  struct conn *c = h->data;

  (void)hint;
  b->base = c->buf + c->len;
  b->len = sizeof(c->buf) - 1 - c->len;
}

static void
conn_closed_cb(uv_handle_t *h)
{
  struct conn *c = h->data;

  c->si->conns_open--;
  free(c);
}

static void
write_cb(uv_write_t *w, int status)
{
  (void)status;
  free(w);
}

static void
read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
  struct conn *c = s->data;
  char *end;

  (void)b;
  if (n < 0) {
    uv_close((uv_handle_t *)s, conn_closed_cb);
    return;
  }
  c->len += (size_t)n;
  c->buf[c->len] = '\0';
  while ((end = strstr(c->buf, "\r\n\r\n")) != NULL) {
    size_t used = (size_t)(end + 4 - c->buf);

    if (strncmp(c->buf, "PUT ", 4) == 0) {
      /* never answered: the PUT stays in flight until cancelled */
      if (c->si->puts++ == 0 && c->si->on_put != NULL)
        c->si->on_put(c->si);
      uv_read_stop(s);
      return;
    }
    uv_write_t *w = malloc(sizeof(*w));
    uv_buf_t out = uv_buf_init((char *)not_found, sizeof(not_found) - 1);

    assert_non_null(w);
    assert_int_equal(uv_write(w, s, &out, 1, write_cb), 0);
    memmove(c->buf, c->buf + used, c->len - used + 1);
    c->len -= used;
  }
  assert_true(c->len < sizeof(c->buf) - 1);
}

static void
accept_cb(uv_stream_t *server, int status)
{
  struct stand_in *si = server->data;
  struct conn *c = calloc(1, sizeof(*c));

  assert_int_equal(status, 0);
  assert_non_null(c);
  c->si = si;
  assert_int_equal(uv_tcp_init(server->loop, &c->tcp), 0);
  c->tcp.data = c;
  si->conns_open++;
  assert_int_equal(uv_accept(server, (uv_stream_t *)&c->tcp), 0);
  assert_true(si->nconns < sizeof(si->conns) / sizeof(si->conns[0]));
  si->conns[si->nconns++] = &c->tcp;
  assert_int_equal(uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb), 0);
}

static void
stand_in_start(uv_loop_t *loop, struct stand_in *si)
{
  int len = sizeof(si->addr);

  assert_int_equal(uv_tcp_init(loop, &si->listener), 0);
  si->listener.data = si;
  assert_int_equal(uv_ip4_addr("127.0.0.1", 0, &si->addr), 0);
  assert_int_equal(
      uv_tcp_bind(&si->listener, (const struct sockaddr *)&si->addr, 0), 0);
  assert_int_equal(
      uv_tcp_getsockname(&si->listener, (struct sockaddr *)&si->addr, &len), 0);
  assert_int_equal(uv_listen((uv_stream_t *)&si->listener, 8, accept_cb), 0);
}

static void
stand_in_stop(struct stand_in *si)
{
  uv_close((uv_handle_t *)&si->listener, NULL);
  for (size_t i = 0; i < si->nconns; i++)
    if (!uv_is_closing((uv_handle_t *)si->conns[i]))
      uv_close((uv_handle_t *)si->conns[i], conn_closed_cb);
}

static int
test_creds(struct spot_creds_provider *p, const struct spot_creds **out)
{
  static const struct spot_creds c = {(char *)"AKIDTEST", (char *)"secret",
                                      NULL, 0};

  (void)p;
  *out = &c;
  return 0;
}

/* One test's world: loop, http, S3 client on the stand-in. */
struct world {
  uv_loop_t loop;
  struct spot_http *http;
  struct spot_s3 *s3;
  struct stand_in si;
  struct spot_creds_provider creds;
  char endpoint[64];
  /* what the test watches */
  struct spot_s3_op *s3op;
  struct spot_store_op *storeop;
  int calls, err;
  int calls_when_cancel_returned;
};

static void
world_init(struct world *w)
{
  struct spot_s3_config sc;

  memset(w, 0, sizeof(*w));
  w->calls_when_cancel_returned = -1;
  assert_int_equal(uv_loop_init(&w->loop), 0);
  stand_in_start(&w->loop, &w->si);
  snprintf(w->endpoint, sizeof(w->endpoint), "http://127.0.0.1:%d",
           ntohs(w->si.addr.sin_port));
  assert_int_equal(spot_http_new(&w->loop, &w->http), 0);
  w->creds.get = test_creds;
  memset(&sc, 0, sizeof(sc));
  sc.endpoint = w->endpoint;
  sc.region = "us-east-1";
  sc.path_style = true;
  sc.creds = &w->creds;
  sc.max_retries = 1;
  assert_int_equal(spot_s3_new(w->http, &sc, &w->s3), 0);
}

static void
world_fini(struct world *w)
{
  spot_s3_free(w->s3);
  spot_http_close(w->http, NULL, NULL);
  stand_in_stop(&w->si);
  assert_int_equal(uv_run(&w->loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(w->si.conns_open, 0);
  assert_int_equal(uv_loop_close(&w->loop), 0);
}

static void
s3_done_cb(const struct spot_s3_result *res, void *data)
{
  struct world *w = data;

  w->calls++;
  w->err = res->err;
  w->s3op = NULL;
  uv_stop(&w->loop);
}

static void
cancel_s3_on_put(struct stand_in *si)
{
  struct world *w = spot_container_of(si, struct world, si);

  assert_non_null(w->s3op);
  spot_s3_cancel(w->s3op);
  w->calls_when_cancel_returned = w->calls;
  spot_s3_cancel(w->s3op); /* again before the callback: nothing more */
}

/* spot_s3_cancel() of a PUT on the wire only queues its callback: it runs
 * once, from the loop, with -ECANCELED. */
static void
test_s3_cancel_runs_callback_from_loop(void **state)
{
  static const char body[] = "hello";
  struct world w;

  (void)state;
  world_init(&w);
  w.si.on_put = cancel_s3_on_put;
  assert_int_equal(spot_s3_put(w.s3, "spotd-test", "k", body, sizeof(body) - 1,
                               0, s3_done_cb, &w, &w.s3op),
                   0);
  uv_run(&w.loop, UV_RUN_DEFAULT); /* until s3_done_cb stops it */
  assert_int_equal(w.si.puts, 1);
  assert_int_equal(w.calls_when_cancel_returned, 0);
  assert_int_equal(w.calls, 1);
  assert_int_equal(w.err, -ECANCELED);
  world_fini(&w);
  assert_int_equal(w.calls, 1);
}

/* spot_s3_free() delivers what it cancels before it returns. */
static void
free_on_put(struct stand_in *si)
{
  struct world *w = spot_container_of(si, struct world, si);

  spot_s3_cancel(w->s3op); /* queued; free must still deliver it */
  spot_s3_free(w->s3);
  w->s3 = NULL;
  w->calls_when_cancel_returned = w->calls;
}

static void
test_s3_free_runs_queued_callbacks(void **state)
{
  static const char body[] = "hello";
  struct world w;

  (void)state;
  world_init(&w);
  w.si.on_put = free_on_put;
  assert_int_equal(spot_s3_put(w.s3, "spotd-test", "k", body, sizeof(body) - 1,
                               0, s3_done_cb, &w, &w.s3op),
                   0);
  uv_run(&w.loop, UV_RUN_DEFAULT);
  assert_int_equal(w.calls_when_cancel_returned, 1);
  assert_int_equal(w.err, -ECANCELED);
  world_fini(&w);
  assert_int_equal(w.calls, 1);
}

static void
push_done_cb(const struct spot_store_result *res, void *data)
{
  struct world *w = data;

  w->calls++;
  w->err = res->err;
  w->storeop = NULL;
  uv_stop(&w->loop);
}

static void
cancel_push_on_put(struct stand_in *si)
{
  struct world *w = spot_container_of(si, struct world, si);

  assert_non_null(w->storeop);
  spot_store_cancel(w->storeop);
  w->calls_when_cancel_returned = w->calls;
}

/* A push whose only request in flight is one PUT, cancelled: before, the
 * PUT's callback ran inside spot_store_cancel() and finished the whole push
 * there, re-entering the caller from its own cancel. */
static void
test_push_cancel_runs_callback_from_loop(void **state)
{
  char dir[] = "/tmp/spotd-test-store-XXXXXX", file[64];
  struct spot_store_config c = cfg_of("");
  struct world w;
  FILE *f;

  (void)state;
  assert_non_null(mkdtemp(dir));
  snprintf(file, sizeof(file), "%s/weights.bin", dir);
  f = fopen(file, "w");
  assert_non_null(f);
  assert_int_equal(fputs("a small checkpoint\n", f) >= 0, 1);
  assert_int_equal(fclose(f), 0);

  world_init(&w);
  w.si.on_put = cancel_push_on_put;
  c.s3 = w.s3;
  c.bucket = "spotd-test";
  c.workers = 1;
  c.parallel = 1;
  assert_int_equal(spot_store_push(&w.loop, &c, dir, "ckpt-1", NULL,
                                   push_done_cb, &w, &w.storeop),
                   0);
  uv_run(&w.loop, UV_RUN_DEFAULT); /* until push_done_cb stops it */
  assert_int_equal(w.si.puts, 1);
  assert_int_equal(w.calls_when_cancel_returned, 0);
  assert_int_equal(w.calls, 1);
  assert_int_equal(w.err, -ECANCELED);
  world_fini(&w);
  assert_int_equal(w.calls, 1);

  assert_int_equal(unlink(file), 0);
  assert_int_equal(rmdir(dir), 0);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_key_layout),
      cmocka_unit_test(test_key_no_prefix),
      cmocka_unit_test(test_key_resets_and_caps),
      cmocka_unit_test(test_phase_names),
      cmocka_unit_test(test_restore_mode),
      cmocka_unit_test(test_invalid_args),
      cmocka_unit_test(test_s3_cancel_runs_callback_from_loop),
      cmocka_unit_test(test_s3_free_runs_queued_callbacks),
      cmocka_unit_test(test_push_cancel_runs_callback_from_loop),
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
