/* The store's pure parts: object keys, phase names, and the argument and
 * config checks that run before any I/O (no network: every call here fails
 * or is answered before a request is made). */
#include "cmocka-compat.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <uv.h>

#include "buf.h"
#include "store.h"

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
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
