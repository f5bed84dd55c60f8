/* The store's pure parts: object keys, phase names, and the argument and
 * config checks that run before any I/O; and when a cancel's callback runs,
 * against a small S3 stand-in on loopback in this process. */
#include "cmocka-compat.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ftw.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "core/buf.h"
#include "core/util.h"
#include "io/http.h"
#include "io/s3.h"
#include "io/s3_internal.h"
#include "io/store/store.h"
#include "s3_stand_in.h"

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
  /* README "Store layout" (a push puts its attempt folder in front of
   * the path it passes): PREFIX/JOB/checkpoints/NAME/<path>.zst,
   * .../MANIFEST.json, PREFIX/JOB/LATEST */
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

static char push_msg[1024];

static void
push_msg_cb(const struct spot_store_result *res, void *data)
{
  snprintf(push_msg, sizeof(push_msg), "%s", res->message);
  push_done_cb(res, data);
}

static void
cancel_push_on_put(struct stand_in *si)
{
  struct world *w = spot_container_of(si, struct world, si);

  assert_non_null(w->storeop);
  spot_store_cancel(w->storeop);
  w->calls_when_cancel_returned = w->calls;
}

/* Starts a push of dir as "ckpt-1" to w's stand-in with workers coders and
 * one transfer at a time; cb ends it. */
static void
start_push(struct world *w, struct spot_store_config *c, const char *dir,
           unsigned workers, spot_store_cb cb)
{
  c->s3 = w->s3;
  c->bucket = "spotd-test";
  c->workers = workers;
  c->parallel = 1;
  assert_int_equal(
      spot_store_push(&w->loop, c, dir, "ckpt-1", NULL, cb, w, &w->storeop), 0);
}

/* Pushes dir; the first PUT cancels it (w->si.on_put = cancel_push_on_put):
 * one PUT, the callback once, -ECANCELED, and never from inside the
 * cancel. */
static void
push_cancelled_at_put(struct world *w, struct spot_store_config *c,
                      const char *dir, unsigned workers)
{
  start_push(w, c, dir, workers, push_done_cb);
  uv_run(&w->loop, UV_RUN_DEFAULT); /* until push_done_cb stops it */
  assert_int_equal(w->si.puts, 1);
  assert_int_equal(w->calls_when_cancel_returned, 0);
  assert_int_equal(w->calls, 1);
  assert_int_equal(w->err, -ECANCELED);
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
  push_cancelled_at_put(&w, &c, dir, 1);
  world_fini(&w);
  assert_int_equal(w.calls, 1);

  assert_int_equal(unlink(file), 0);
  assert_int_equal(rmdir(dir), 0);
}

static uv_thread_t loop_thread;
static bool sent_off_loop;

static void
off_loop_hook(const char *headers, size_t len, void *data)
{
  uv_thread_t self = uv_thread_self();

  (void)headers;
  (void)len;
  (void)data;
  if (!uv_thread_equal(&self, &loop_thread))
    sent_off_loop = true; /* only the one PUT: no race on the flag */
}

/* The same with the part's PUT on an I/O thread (SPOT_IO_THREADS=3, a
 * 3 MiB body that does not compress) and 4 workers: the cancel reaches
 * the lane, the push's callback still comes from the loop, once, and
 * closing leaves no handle nor thread behind (world_fini). */
static void
test_push_cancel_on_lane(void **state)
{
  char dir[] = "/tmp/spotd-test-store-XXXXXX", file[64];
  struct spot_store_config c = cfg_of("");
  struct world w;
  unsigned char *data;
  size_t n = (size_t)3 << 20;
  FILE *f;

  (void)state;
  assert_non_null(mkdtemp(dir));
  snprintf(file, sizeof(file), "%s/weights.bin", dir);
  data = malloc(n);
  assert_non_null(data);
  for (size_t i = 0; i < n; i++) /* xorshift: zstd gains nothing */
    data[i] = (unsigned char)((i * 2654435761u) >> 13 ^ (i >> 7) * 40503u);
  f = fopen(file, "w");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
  free(data);

  assert_int_equal(setenv("SPOT_IO_THREADS", "3", 1), 0);
  world_init(&w);
  assert_int_equal(unsetenv("SPOT_IO_THREADS"), 0);
  loop_thread = uv_thread_self();
  spot__s3_set_request_hook(w.s3, off_loop_hook, NULL);
  w.si.on_put = cancel_push_on_put;
  c.compress = SPOT_STORE_COMPRESS_NEVER;
  push_cancelled_at_put(&w, &c, dir, 4);
  assert_true(sent_off_loop);
  world_fini(&w);
  assert_int_equal(w.calls, 1);

  assert_int_equal(unlink(file), 0);
  assert_int_equal(rmdir(dir), 0);
}

static int
rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

#define WALK_DIRS 40
#define WALK_FILES_PER_DIR 100

/* A push cancelled while its walk runs on the pool: the walk grows (and
 * moves) op->files on a worker, so the cancel must leave that list alone.
 * Before, the cancel read op->files for transfers to stop while the worker
 * reallocated it (ThreadSanitizer: a data race; a use after free when the
 * array moved under the loop). The test waits, through inotify, until the
 * walk has opened a folder halfway through the tree, then cancels. */
static void
test_push_cancel_during_walk(void **state)
{
  char dir[] = "/tmp/spotd-test-store-XXXXXX", path[128];
  struct spot_store_config c = cfg_of("");
  struct world w;
  int ino, seen = 0;

  (void)state;
  assert_non_null(mkdtemp(dir));
  for (int d = 0; d < WALK_DIRS; d++) {
    snprintf(path, sizeof(path), "%s/d%02d", dir, d);
    assert_int_equal(mkdir(path, 0700), 0);
    for (int i = 0; i < WALK_FILES_PER_DIR; i++) {
      FILE *f;

      snprintf(path, sizeof(path), "%s/d%02d/f%03d", dir, d, i);
      f = fopen(path, "w");
      assert_non_null(f);
      assert_int_equal(fclose(f), 0);
    }
  }
  ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  assert_true(ino >= 0);
  assert_true(inotify_add_watch(ino, dir, IN_OPEN | IN_ONLYDIR) >= 0);

  world_init(&w);
  start_push(&w, &c, dir, 2, push_done_cb);
  /* The walk opens the folders in readdir order: wait for the half. */
  while (seen < WALK_DIRS / 2) {
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    struct pollfd pfd = {.fd = ino, .events = POLLIN};
    ssize_t n;

    assert_int_equal(poll(&pfd, 1, 60000), 1);
    n = read(ino, buf, sizeof(buf));
    assert_true(n > 0);
    for (char *p = buf; p < buf + n;) {
      const struct inotify_event *ev = (const struct inotify_event *)p;

      if ((ev->mask & IN_ISDIR) != 0 && ev->len > 0)
        seen++;
      p += sizeof(*ev) + ev->len;
    }
  }
  spot_store_cancel(w.storeop);
  uv_run(&w.loop, UV_RUN_DEFAULT); /* until push_done_cb stops it */
  assert_int_equal(w.calls, 1);
  assert_int_equal(w.err, -ECANCELED);
  assert_int_equal(w.si.puts, 0);
  world_fini(&w);
  assert_int_equal(w.calls, 1);

  assert_int_equal(close(ino), 0);
  assert_int_equal(nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS), 0);
}

/* A push whose walk fails (a symlink out of the folder) cancelled at the
 * same time: the walk's failure is written on a pool worker while the
 * cancel writes its own on the loop. Before, both wrote the op's error
 * and message unguarded (ThreadSanitizer: a data race; the message could
 * mix the two). Either may come first; the message is one of them whole. */
static void
test_push_cancel_while_walk_fails(void **state)
{
  char dir[] = "/tmp/spotd-test-store-XXXXXX", path[128];
  struct spot_store_config c = cfg_of("");
  struct world w;

  (void)state;
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/out", dir);
  assert_int_equal(symlink("/etc/hostname", path), 0);

  world_init(&w);
  start_push(&w, &c, dir, 1, push_msg_cb);
  spot_store_cancel(w.storeop);
  uv_run(&w.loop, UV_RUN_DEFAULT); /* until push_msg_cb stops it */
  assert_int_equal(w.calls, 1);
  if (w.err == -ECANCELED)
    assert_string_equal(push_msg, "cancelled");
  else
    assert_non_null(strstr(push_msg, "out: a symlink to '/etc/hostname'"));
  world_fini(&w);

  assert_int_equal(unlink(path), 0);
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
      cmocka_unit_test(test_push_cancel_on_lane),
      cmocka_unit_test(test_push_cancel_during_walk),
      cmocka_unit_test(test_push_cancel_while_walk_fails),
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
