/* The history store's parts that need no server: object keys, the owner,
 * the writer's lifecycle and its failure path (credentials that fail, so
 * no request is ever sent), and the atomic metrics file. */
#include "cmocka-compat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "core/util.h"
#include "io/http.h"
#include "io/s3.h"
#include "io/store/history_store.h"

static void
test_key(void **state)
{
  struct spot_store_config c;
  struct spot_hist_event ev;
  struct spot_buf b;

  memset(&c, 0, sizeof(c));
  c.bucket = "b";
  c.prefix = "team/runs";
  c.job = "job-1";
  spot_buf_init(&b, 4096);
  assert_int_equal(
      spot_hist_event_init(&ev, SPOT_HIST_NOTICE, 1764748800123, "n-1.x", 42),
      0);
  assert_int_equal(spot_history_key(&c, &ev, &b), 0);
  assert_string_equal(
      spot_buf_str(&b),
      "team/runs/job-1/history/1764748800123-n-1.x-000042.json");
  c.prefix = "";
  ev.time_ms = 5;
  assert_int_equal(spot_history_key(&c, &ev, &b), 0);
  assert_string_equal(spot_buf_str(&b),
                      "job-1/history/0000000000005-n-1.x-000042.json");
  ev.owner[0] = '/';
  assert_int_equal(spot_history_key(&c, &ev, &b), -EINVAL);
  spot_buf_fini(&b);
}

static void
test_owner(void **state)
{
  char a[SPOT_HIST_OWNER_MAX + 1], small[8];

  spot_history_default_owner(a, sizeof(a));
  assert_true(spot_hist_owner_valid(a));
  spot_history_default_owner(small, sizeof(small));
  assert_int_equal(strlen(small), sizeof(small) - 1);
}

static int
no_creds(struct spot_creds_provider *p, const struct spot_creds **out)
{
  return -EACCES;
}

struct seen {
  int reports, fails, closed;
  int last_err;
};

static void
report_cb(int err, const char *key, const char *message, void *data)
{
  struct seen *s = data;

  s->reports++;
  s->last_err = err;
  if (err < 0)
    s->fails++;
  assert_non_null(strstr(key, "job-1/history/"));
}

static void
closed_cb(void *data)
{
  ((struct seen *)data)->closed++;
}

/* A writer's surroundings: a loop, HTTP, an S3 client for an endpoint
 * that never answers, and the job's store config. */
struct wfix {
  uv_loop_t loop;
  struct spot_http *http;
  struct spot_s3 *s3;
  struct spot_store_config c;
};

static void
wfix_init(struct wfix *f, struct spot_creds_provider *creds)
{
  struct spot_s3_config sc;

  assert_int_equal(uv_loop_init(&f->loop), 0);
  assert_int_equal(spot_http_new(&f->loop, &f->http), 0);
  memset(&sc, 0, sizeof(sc));
  sc.endpoint = "http://127.0.0.1:1";
  sc.region = "us-east-1";
  sc.path_style = true;
  sc.creds = creds;
  assert_int_equal(spot_s3_new(f->http, &sc, &f->s3), 0);
  memset(&f->c, 0, sizeof(f->c));
  f->c.s3 = f->s3;
  f->c.bucket = "spotd-test";
  f->c.job = "job-1";
}

static void
wfix_fini(struct wfix *f)
{
  spot_s3_free(f->s3);
  spot_http_close(f->http, NULL, NULL);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&f->loop), 0);
}

static void
test_writer_failure_is_reported(void **state)
{
  struct spot_creds_provider creds = {no_creds, NULL};
  struct spot_history_options o;
  struct spot_history *h;
  struct spot_hist_event ev;
  struct seen seen;
  struct wfix f;

  wfix_init(&f, &creds);
  memset(&o, 0, sizeof(o));
  memset(&seen, 0, sizeof(seen));
  o.owner = "bad/owner";
  assert_int_equal(spot_history_new(&f.loop, &f.c, &o, report_cb, &seen, &h),
                   -EINVAL);
  o.owner = "node-a";
  o.queue_max = 2;
  assert_int_equal(spot_history_new(&f.loop, &f.c, &o, report_cb, &seen, &h),
                   0);
  assert_string_equal(spot_history_owner(h), "node-a");

  assert_int_equal(spot_history_event_init(h, &ev, SPOT_HIST_RUN_START), 0);
  assert_int_equal(ev.seq, 0);
  assert_true(ev.time_ms > 1700000000000);
  assert_int_equal(spot_history_emit(h, &ev), 0);
  assert_int_equal(spot_history_event_init(h, &ev, SPOT_HIST_CHECKPOINT), 0);
  assert_int_equal(ev.seq, 1);
  assert_int_equal(spot_history_emit(h, &ev), 0);
  /* Without credentials nothing can be written: a report each, never a
   * failed emit. */
  assert_int_equal(seen.reports, 2);
  assert_int_equal(seen.fails, 2);
  ev.time_ms = -1;
  assert_int_equal(spot_history_emit(h, &ev), -EINVAL);

  assert_int_equal(spot_history_close(h, 1000, closed_cb, &seen), 0);
  assert_int_equal(spot_history_close(h, 1000, closed_cb, &seen), -EALREADY);
  assert_int_equal(spot_history_emit(h, &ev), -ESHUTDOWN);
  uv_run(&f.loop, UV_RUN_DEFAULT);
  assert_int_equal(seen.closed, 1);
  wfix_fini(&f);
}

static int
some_creds(struct spot_creds_provider *p, const struct spot_creds **out)
{
  static char ak[] = "AKIDEXAMPLE", sk[] = "secret";
  static const struct spot_creds c = {ak, sk, NULL, 0};

  (void)p;
  *out = &c;
  return 0;
}

/* Progress events while one is being written (the endpoint does not
 * answer yet): a newer one replaces the one waiting, so a trainer that
 * reports every step never fills the queue nor pushes other events out. */
static void
test_progress_coalesces(void **state)
{
  struct spot_creds_provider creds = {some_creds, NULL};
  struct spot_history_options o;
  struct spot_history *h;
  struct spot_hist_event ev;
  struct seen seen;
  struct wfix f;

  (void)state;
  wfix_init(&f, &creds);
  memset(&o, 0, sizeof(o));
  memset(&seen, 0, sizeof(seen));
  o.owner = "node-a";
  o.queue_max = 2;
  o.replace_progress = true;
  assert_int_equal(spot_history_new(&f.loop, &f.c, &o, report_cb, &seen, &h),
                   0);
  for (int step = 1; step <= 5; step++) {
    assert_int_equal(spot_history_event_init(h, &ev, SPOT_HIST_PROGRESS), 0);
    ev.step = step;
    assert_int_equal(spot_history_emit(h, &ev), 0);
  }
  /* The first is in flight, the newest waits: nothing was dropped. */
  assert_int_equal(seen.reports, 0);
  assert_int_equal(spot_history_close(h, 0, closed_cb, &seen), 0);
  uv_run(&f.loop, UV_RUN_DEFAULT);
  assert_int_equal(seen.closed, 1);
  /* the one in flight and the one waiting, each cancelled once */
  assert_int_equal(seen.reports, 2);
  wfix_fini(&f);
}

static void
test_metrics_file(void **state)
{
  char dir[] = "/tmp/spot-metrics-" SPOT_MKTEMP_SUFFIX;
  char path[256], buf[64];
  struct stat st;
  FILE *f;
  size_t n;

  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/spotd.prom", dir);
  assert_int_equal(spot_metrics_write_file(path, "a 1\n"), 0);
  assert_int_equal(spot_metrics_write_file(path, "b 2\n"), 0);
  f = fopen(path, "r");
  assert_non_null(f);
  n = fread(buf, 1, sizeof(buf) - 1, f);
  buf[n] = '\0';
  fclose(f);
  assert_string_equal(buf, "b 2\n");
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0644);
  snprintf(path, sizeof(path), "%s/missing/spotd.prom", dir);
  assert_int_equal(spot_metrics_write_file(path, "x"), -ENOENT);
  spot_rm_tree(dir);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_key),
      cmocka_unit_test(test_owner),
      cmocka_unit_test(test_writer_failure_is_reported),
      cmocka_unit_test(test_progress_coalesces),
      cmocka_unit_test(test_metrics_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
