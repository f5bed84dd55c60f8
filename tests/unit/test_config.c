#include "cmocka-compat.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/buf.h"
#include "core/config.h"
#include "core/log.h"
#include "core/util.h"

#define LOAD(cfg, text, err)                                                   \
  spot_config_load_buffer((cfg), "t.conf", (text), strlen(text), false, (err), \
                          sizeof(err))

/* Every line of err must start with "t.conf:N: ". Returns the count. */
static int
check_lines(const char *err)
{
  int n = 0;
  const char *p = err;

  while (*p != '\0') {
    const char *nl = strchr(p, '\n');
    size_t len = nl != NULL ? (size_t)(nl - p) : strlen(p);
    int line = 0, used = 0;
    if (sscanf(p, "t.conf:%d: %n", &line, &used) != 1 || used == 0 || line <= 0)
      fail_msg("error line without path:line: '%.*s'", (int)len, p);
    n++;
    p += len + (nl != NULL ? 1 : 0);
  }
  return n;
}

static void
test_defaults(void **state)
{
  struct spot_config *cfg = spot_config_new();

  assert_non_null(cfg);
  assert_null(cfg->job);
  assert_null(cfg->store);
  assert_int_equal(cfg->provider, SPOT_CONFIG_PROVIDER_AUTO);
  assert_int_equal(cfg->poll_interval_ms, 1000);
  assert_int_equal(cfg->interval_ms, 600000);
  assert_int_equal(cfg->signal, SIGRTMIN + 4);
  assert_int_equal(cfg->signal_target, SPOT_CONFIG_TARGET_TREE);
  assert_int_equal(cfg->keep, 3);
  assert_int_equal(cfg->keep_local, 1);
  assert_int_equal(cfg->part_size, 16u << 20);
  assert_int_equal(cfg->parallel, 0);
  assert_int_equal(cfg->memory, 1u << 30);
  assert_int_equal(cfg->target_rate, 0);
  assert_int_equal(cfg->compress, SPOT_CONFIG_COMPRESS_AUTO);
  assert_int_equal(cfg->level, 1);
  assert_int_equal(cfg->grace_ms, 10000);
  assert_int_equal(cfg->ckpt_timeout_ms, 1800000);
  assert_true(cfg->restore);
  assert_false(cfg->imdsv1);
  assert_int_equal(cfg->log_level, SPOT_LOG_INFO);
  assert_int_equal(spot_config_origin(cfg, "keep"), SPOT_CONFIG_ORIGIN_DEFAULT);
  assert_int_equal(spot_config_origin(cfg, "nope"), -ENOENT);
  spot_config_free(cfg);
  spot_config_free(NULL);
}

static void
test_load_good(void **state)
{
  static const char text[] = "\xef\xbb\xbf# a comment\n"
                             "; another\n"
                             "\n"
                             "[spotd]\r\n"
                             "job = run-7\n"
                             "store = s3://bkt/team/\n"
                             "provider = gcp\n"
                             "poll_interval = 500ms\n"
                             "interval = 5m\n"
                             "signal = SIGUSR2\n"
                             "signal-target = leader\n"
                             "keep = 5\n"
                             "keep-local = 2\n"
                             "part-size = 8M\n"
                             "parallel = 6\n"
                             "memory = 64M\n"
                             "target_rate = 500M\n"
                             "compress = none\n"
                             "level = -5\n"
                             "grace = 2s\n"
                             "ckpt-timeout = 0\n"
                             "imdsv1 = yes\n"
                             "restore = off\n"
                             "endpoint = http://127.0.0.1:7480\n"
                             "region = eu-west-1\n"
                             "metadata-url = http://127.0.0.1:9999/\n"
                             "log-level = debug\n"
                             "socket: /tmp/s.sock\n"
                             "command = python3 train.py\n"
                             "   --lr 0.1\n"
                             "\t\"--name=a b\"\n";
  struct spot_config *cfg = spot_config_new();
  char err[1024];
  int r;

  r = LOAD(cfg, text, err);
  if (r != 0)
    fail_msg("load: %d: %s", r, err);
  assert_string_equal(cfg->job, "run-7");
  assert_string_equal(cfg->store, "s3://bkt/team/");
  assert_int_equal(cfg->provider, SPOT_CONFIG_PROVIDER_GCP);
  assert_int_equal(cfg->poll_interval_ms, 500);
  assert_int_equal(cfg->interval_ms, 300000);
  assert_int_equal(cfg->signal, SIGUSR2);
  assert_int_equal(cfg->signal_target, SPOT_CONFIG_TARGET_LEADER);
  assert_int_equal(cfg->keep, 5);
  assert_int_equal(cfg->keep_local, 2);
  assert_int_equal(cfg->part_size, 8u << 20);
  assert_int_equal(cfg->parallel, 6);
  assert_int_equal(cfg->memory, 64u << 20);
  assert_int_equal(cfg->target_rate, 500u << 20);
  assert_int_equal(cfg->compress, SPOT_CONFIG_COMPRESS_NONE);
  assert_int_equal(cfg->level, -5);
  assert_int_equal(cfg->grace_ms, 2000);
  assert_int_equal(cfg->ckpt_timeout_ms, 0);
  assert_true(cfg->imdsv1);
  assert_false(cfg->restore);
  assert_string_equal(cfg->endpoint, "http://127.0.0.1:7480");
  assert_string_equal(cfg->region, "eu-west-1");
  assert_int_equal(cfg->log_level, SPOT_LOG_DEBUG);
  assert_string_equal(cfg->socket, "/tmp/s.sock");
  assert_string_equal(cfg->command, "python3 train.py --lr 0.1 \"--name=a b\"");
  assert_int_equal(spot_config_origin(cfg, "keep"), SPOT_CONFIG_ORIGIN_FILE);

  assert_int_equal(
      spot_config_validate(cfg, SPOT_CONFIG_NEED_COMMAND, err, sizeof(err)), 0);
  assert_string_equal(cfg->bucket, "bkt");
  assert_string_equal(cfg->prefix, "team");
  spot_config_free(cfg);
}

/* Every kind of mistake, each reported with its own line. */
static void
test_all_errors_with_lines(void **state)
{
  static const char text[] = "job = early\n"         /* 1 before [spotd] */
                             "[spotd]\n"             /* 2 */
                             "interval = ten\n"      /* 3 bad duration */
                             "level = 99\n"          /* 4 out of range */
                             "colour = blue\n"       /* 5 unknown key */
                             "just words\n"          /* 6 syntax */
                             "keep = 4\n"            /* 7 ok */
                             "keep = 5\n"            /* 8 duplicate */
                             "provider = ec2\n"      /* 9 bad enum */
                             "signal = KILL\n"       /* 10 */
                             "part-size = 1M\n"      /* 11 */
                             "imdsv1 = maybe\n"      /* 12 */
                             "store = s3://B/x\n"    /* 13 */
                             "job = a/b\n"           /* 14 */
                             "endpoint = ftp://x\n"  /* 15 */
                             "grace = 10 # inline\n" /* 16 */
                             "command = python 'unterminated\n" /* 17 */
                             "parallel = 2\n"                   /* 18 ok */
                             "  continued\n"  /* 19 not multiline */
                             "[other]\n"      /* 20 */
                             "x = 1\n"        /* 21 ignored */
                             "[spotd\n"       /* 22 */
                             "[spotd] junk\n" /* 23 */
                             "=novalue\n";    /* 24 empty key */
  static const int want[] = {1,  3,  4,  5,  6,  8,  9,  10, 11, 12,
                             13, 14, 15, 16, 17, 19, 20, 22, 23, 24};
  struct spot_config *cfg = spot_config_new();
  char err[8192], tag[32];
  int n;

  assert_int_equal(LOAD(cfg, text, err), -EINVAL);
  n = check_lines(err);
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    snprintf(tag, sizeof(tag), "t.conf:%d: ", want[i]);
    if (strstr(err, tag) == NULL)
      fail_msg("no error for line %d in:\n%s", want[i], err);
  }
  assert_int_equal(n, (int)(sizeof(want) / sizeof(want[0])));
  assert_non_null(strstr(err, "t.conf:8: duplicate key 'keep' (first set on "
                              "line 7)"));
  assert_non_null(strstr(err, "t.conf:5: unknown key 'colour'"));
  assert_non_null(strstr(err, "t.conf:20: unknown section [other]"));
  assert_non_null(strstr(err, "t.conf:9: provider: 'ec2' is not one of "
                              "auto|aws|gcp|azure|none"));
  assert_null(strstr(err, "t.conf:21:"));
  spot_config_free(cfg);
}

static void
test_long_lines(void **state)
{
  struct spot_buf b;
  struct spot_config *cfg = spot_config_new();
  char err[1024];
  char pad[300];

  memset(pad, 'x', sizeof(pad) - 1);
  pad[sizeof(pad) - 1] = '\0';
  spot_buf_init(&b, 1 << 20);
  assert_int_equal(spot_buf_printf(&b,
                                   "[spotd]\ncommand = echo %s\n"
                                   "keep = zero\n",
                                   pad),
                   0);
  assert_int_equal(spot_config_load_buffer(cfg, "t.conf", b.data, b.len, false,
                                           err, sizeof(err)),
                   -EINVAL);
  assert_int_equal(check_lines(err), 2);
  assert_non_null(strstr(err, "t.conf:2: line longer than 198 bytes"));
  /* The line count stays right after a long line. */
  assert_non_null(strstr(err, "t.conf:3: keep:"));

  /* The same command split on indented lines is fine. */
  spot_buf_reset(&b);
  assert_int_equal(spot_buf_printf(&b, "[spotd]\ncommand = echo\n"), 0);
  for (int i = 0; i < 20; i++)
    assert_int_equal(spot_buf_printf(&b, "  %.150s\n", pad), 0);
  assert_int_equal(spot_config_load_buffer(cfg, "t.conf", b.data, b.len, false,
                                           err, sizeof(err)),
                   0);
  assert_int_equal(strlen(cfg->command), 4 + 20 * 151);

  /* Beyond SPOT_CONFIG_MAX_VALUE once joined: an error on the key's line. */
  spot_buf_reset(&b);
  assert_int_equal(spot_buf_printf(&b, "[spotd]\n\nrelaunch = echo\n"), 0);
  for (int i = 0; i < 40; i++)
    assert_int_equal(spot_buf_printf(&b, "  %.150s\n", pad), 0);
  assert_int_equal(spot_config_load_buffer(cfg, "t.conf", b.data, b.len, false,
                                           err, sizeof(err)),
                   -EINVAL);
  assert_non_null(strstr(err, "t.conf:3: relaunch: value longer than"));
  assert_int_equal(check_lines(err), 1);
  spot_buf_fini(&b);
  spot_config_free(cfg);
}

static void
test_cli_overrides_file(void **state)
{
  static const char text[] = "[spotd]\njob = from-file\nkeep = 7\n"
                             "interval = 30\n";
  struct spot_config *cfg = spot_config_new();
  char err[512];

  /* CLI first, file after: the CLI value stays. */
  assert_int_equal(spot_config_set(cfg, "job", "from-cli", err, sizeof(err)),
                   0);
  assert_int_equal(spot_config_set(cfg, "interval", "0", err, sizeof(err)), 0);
  assert_int_equal(LOAD(cfg, text, err), 0);
  assert_string_equal(cfg->job, "from-cli");
  assert_int_equal(cfg->interval_ms, 0);
  assert_int_equal(cfg->keep, 7);
  assert_int_equal(spot_config_origin(cfg, "job"), SPOT_CONFIG_ORIGIN_CLI);
  assert_int_equal(spot_config_origin(cfg, "keep"), SPOT_CONFIG_ORIGIN_FILE);
  /* File first, CLI after. */
  assert_int_equal(spot_config_set(cfg, "keep", "9", err, sizeof(err)), 0);
  assert_int_equal(cfg->keep, 9);
  /* A bad value in the file is an error even when the CLI overrides it. */
  assert_int_equal(LOAD(cfg, "[spotd]\njob = no/slash\n", err), -EINVAL);
  assert_non_null(strstr(err, "t.conf:2: job:"));
  assert_string_equal(cfg->job, "from-cli");
  /* CLI errors name the option. */
  assert_int_equal(spot_config_set(cfg, "keep", "x", err, sizeof(err)),
                   -EINVAL);
  assert_non_null(strstr(err, "--keep: 'x' is not an integer"));
  assert_int_equal(spot_config_set(cfg, "nope", "x", err, sizeof(err)),
                   -ENOENT);
  assert_int_equal(spot_config_set(cfg, "imdsv1", NULL, err, sizeof(err)), 0);
  assert_true(cfg->imdsv1);
  assert_int_equal(spot_config_set(cfg, "keep", NULL, err, sizeof(err)),
                   -EINVAL);
  /* An empty string unsets a string key. */
  assert_int_equal(spot_config_set(cfg, "job", "", err, sizeof(err)), 0);
  assert_null(cfg->job);
  spot_config_free(cfg);
}

static void
test_secrets(void **state)
{
  static const char text[] = "[spotd]\njob = j\n"
                             "aws_secret_access_key = AKIAFAKETESTSECRET0123\n"
                             "store = s3://bkt/p\n";
  struct spot_config *cfg = spot_config_new();
  char err[1024];

  assert_int_equal(LOAD(cfg, text, err), -EINVAL);
  assert_non_null(strstr(err, "t.conf:3: 'aws_secret_access_key': "
                              "credentials are never read"));
  assert_non_null(strstr(err, "LoadCredential="));
  /* The value never appears in a message. */
  assert_null(strstr(err, "AKIAFAKETESTSECRET0123"));
  assert_int_equal(spot_config_load_buffer(cfg, "t.conf", text, strlen(text),
                                           true, err, sizeof(err)),
                   -EPERM);
  assert_non_null(strstr(err, "world-readable"));
  assert_null(strstr(err, "AKIAFAKETESTSECRET0123"));
  assert_int_equal(LOAD(cfg, "[spotd]\nsession_token = abc\n", err), -EINVAL);
  /* Credentials in URLs are refused too. */
  assert_int_equal(
      LOAD(cfg, "[spotd]\nendpoint = https://AK:SK@s3.example.com\n", err),
      -EINVAL);
  assert_non_null(strstr(err, "t.conf:2: endpoint: credentials in URLs"));
  assert_null(strstr(err, "SK@"));
  spot_config_free(cfg);
}

static void
write_file(const char *path, const char *text, mode_t mode)
{
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  assert_int_equal(fchmod(fd, mode), 0);
  close(fd);
}

static void
test_load_file_checks(void **state)
{
  char dir[] = "/tmp/spot-test-config-" SPOT_MKTEMP_SUFFIX;
  char path[128], err[1024];
  struct spot_config *cfg = spot_config_new();

  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/spotd.conf", dir);

  write_file(path, "[spotd]\njob = j1\n", 0644);
  assert_int_equal(spot_config_load_file(cfg, path, err, sizeof(err)), 0);
  assert_string_equal(cfg->job, "j1");

  write_file(path, "[spotd]\njob = j1\n", 0666);
  assert_int_equal(spot_config_load_file(cfg, path, err, sizeof(err)), -EPERM);
  assert_non_null(strstr(err, "world-writable"));
  assert_true(strncmp(err, path, strlen(path)) == 0);

  write_file(path, "[spotd]\njob = j1\naws_access_key_id = A\n", 0644);
  assert_int_equal(spot_config_load_file(cfg, path, err, sizeof(err)), -EPERM);
  assert_non_null(strstr(err, "world-readable"));
  write_file(path, "[spotd]\njob = j1\naws_access_key_id = A\n", 0600);
  assert_int_equal(spot_config_load_file(cfg, path, err, sizeof(err)), -EINVAL);

  write_file(path, "[spotd]\nkeep = 0\n", 0600);
  assert_int_equal(spot_config_load_file(cfg, path, err, sizeof(err)), -EINVAL);
  {
    char want[160];
    snprintf(want, sizeof(want), "%s:2: keep:", path);
    assert_non_null(strstr(err, want));
  }
  /* Validation errors point back to the file and line. */
  write_file(path, "[spotd]\njob = j\n\nstore = s3://bkt//x\n", 0600);
  assert_int_equal(spot_config_load_file(cfg, path, err, sizeof(err)), -EINVAL);
  write_file(path,
             "[spotd]\njob = j\n\nsocket = /tmp/"
             "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
             "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.sock\nstore = "
             "s3://bkt/x\n",
             0600);
  assert_int_equal(spot_config_load_file(cfg, path, err, sizeof(err)), 0);
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), -EINVAL);
  {
    char want[160];
    snprintf(want, sizeof(want), "%s:4: socket: ", path);
    assert_non_null(strstr(err, want));
  }

  write_file(path, "[spotd]\njob = j1\n\0keep = 3\n", 0600);
  {
    int fd = open(path, O_WRONLY | O_TRUNC);
    static const char nul[] = "[spotd]\njob = j1\n\0keep = 3\n";
    assert_int_equal(write(fd, nul, sizeof(nul) - 1), (ssize_t)sizeof(nul) - 1);
    close(fd);
  }
  assert_int_equal(spot_config_load_file(cfg, path, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, ":3: NUL byte"));

  assert_int_equal(spot_config_load_file(cfg, dir, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "not a regular file"));
  unlink(path);
  assert_int_equal(spot_config_load_file(cfg, path, err, sizeof(err)), -ENOENT);
  assert_non_null(strstr(err, "cannot open"));
  rmdir(dir);
  spot_config_free(cfg);
}

static void
test_validate(void **state)
{
  struct spot_config *cfg = spot_config_new();
  char err[1024];

  assert_int_equal(
      spot_config_validate(cfg, SPOT_CONFIG_NEED_COMMAND, err, sizeof(err)),
      -EINVAL);
  assert_non_null(strstr(err, "job is required"));
  assert_non_null(strstr(err, "store is required"));
  assert_non_null(strstr(err, "command is required"));

  assert_int_equal(spot_config_set(cfg, "job", "j", err, sizeof(err)), 0);
  assert_int_equal(
      spot_config_set(cfg, "store", "s3://bkt/a/b/", err, sizeof(err)), 0);
  setenv("STATE_DIRECTORY", "/var/lib/spotd:/var/lib/other", 1);
  setenv("RUNTIME_DIRECTORY", "/run/spotd", 1);
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), 0);
  assert_string_equal(cfg->bucket, "bkt");
  assert_string_equal(cfg->prefix, "a/b");
  assert_string_equal(cfg->ckpt_dir, "/var/lib/spotd/ckpt");
  assert_string_equal(cfg->socket, "/run/spotd/spotd.sock");
  spot_config_free(cfg);

  cfg = spot_config_new();
  unsetenv("STATE_DIRECTORY");
  unsetenv("RUNTIME_DIRECTORY");
  assert_int_equal(spot_config_set(cfg, "job", "j", err, sizeof(err)), 0);
  assert_int_equal(spot_config_set(cfg, "store", "s3://bkt", err, sizeof(err)),
                   0);
  assert_int_equal(
      spot_config_set(cfg, "ckpt-dir", "/data/ck", err, sizeof(err)), 0);
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), 0);
  assert_string_equal(cfg->prefix, "");
  assert_string_equal(cfg->ckpt_dir, "/data/ck");
  assert_string_equal(cfg->socket, "./spotd.sock");
  spot_config_free(cfg);
}

/* rank/nranks: defaults from Slurm's environment, the command line wins,
 * rank must be below nranks. */
static void
test_ranks(void **state)
{
  struct spot_config *cfg = spot_config_new();
  char err[1024];

  assert_int_equal(spot_config_set(cfg, "job", "j", err, sizeof(err)), 0);
  assert_int_equal(spot_config_set(cfg, "store", "s3://bkt", err, sizeof(err)),
                   0);
  unsetenv("SLURM_NODEID");
  unsetenv("SLURM_STEP_NUM_NODES");
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), 0);
  assert_int_equal(cfg->rank, 0);
  assert_int_equal(cfg->nranks, 1);
  assert_int_equal(cfg->rank_wait_ms, 60000);

  /* a batch script: node 0 of a 4-node job, no step: one rank */
  setenv("SLURM_NODEID", "0", 1);
  setenv("SLURM_NNODES", "4", 1);
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), 0);
  assert_int_equal(cfg->rank, 0);
  assert_int_equal(cfg->nranks, 1);
  unsetenv("SLURM_NNODES");

  /* srun, one spotd per node */
  setenv("SLURM_NODEID", "3", 1);
  setenv("SLURM_STEP_NUM_NODES", "4", 1);
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), 0);
  assert_int_equal(cfg->rank, 3);
  assert_int_equal(cfg->nranks, 4);

  assert_int_equal(spot_config_set(cfg, "rank", "1", err, sizeof(err)), 0);
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), 0);
  assert_int_equal(cfg->rank, 1);
  assert_int_equal(cfg->nranks, 4);

  setenv("SLURM_STEP_NUM_NODES", "x", 1);
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), -EINVAL);
  assert_non_null(
      strstr(err, "$SLURM_STEP_NUM_NODES: 'x' is not a valid nranks"));
  unsetenv("SLURM_NODEID");
  unsetenv("SLURM_STEP_NUM_NODES");
  spot_config_free(cfg);
  cfg = spot_config_new();
  assert_int_equal(spot_config_set(cfg, "job", "j", err, sizeof(err)), 0);
  assert_int_equal(spot_config_set(cfg, "store", "s3://bkt", err, sizeof(err)),
                   0);

  /* a Kubernetes Indexed Job: the index alone stays one rank; the node
   * count comes only from SPOTD_NRANKS */
  setenv("JOB_COMPLETION_INDEX", "2", 1);
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), 0);
  assert_int_equal(cfg->rank, 0);
  assert_int_equal(cfg->nranks, 1);
  setenv("SPOTD_NRANKS", "3", 1);
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), 0);
  assert_int_equal(cfg->rank, 2);
  assert_int_equal(cfg->nranks, 3);
  setenv("SPOTD_RANK", "1", 1);
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), 0);
  assert_int_equal(cfg->rank, 1);
  unsetenv("SPOTD_RANK");
  setenv("JOB_COMPLETION_INDEX", "3", 1);
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "rank 3 is not below nranks 3"));
  setenv("JOB_COMPLETION_INDEX", "-1", 1);
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), -EINVAL);
  assert_non_null(
      strstr(err, "$JOB_COMPLETION_INDEX: '-1' is not a valid rank"));
  /* Slurm's step variables come first */
  setenv("SLURM_NODEID", "0", 1);
  setenv("SLURM_STEP_NUM_NODES", "2", 1);
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), 0);
  assert_int_equal(cfg->rank, 0);
  assert_int_equal(cfg->nranks, 2);
  unsetenv("SLURM_NODEID");
  unsetenv("SLURM_STEP_NUM_NODES");
  unsetenv("JOB_COMPLETION_INDEX");
  unsetenv("SPOTD_NRANKS");
  assert_int_equal(spot_config_set(cfg, "rank", "1", err, sizeof(err)), 0);

  assert_int_equal(spot_config_set(cfg, "nranks", "1", err, sizeof(err)), 0);
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "rank 1 is not below nranks 1"));
  assert_int_equal(spot_config_set(cfg, "nranks", "1025", err, sizeof(err)),
                   -EINVAL);
  assert_int_equal(spot_config_set(cfg, "rank-wait", "2", err, sizeof(err)), 0);
  assert_int_equal(cfg->rank_wait_ms, 2000);
  spot_config_free(cfg);
}

static void
test_values(void **state)
{
  static const struct {
    const char *key, *value;
    int ok;
  } cases[] = {
      {"interval", "0", 1},
      {"interval", "90", 1},
      {"interval", "90s", 1},
      {"interval", "1500ms", 1},
      {"interval", "2h", 1},
      {"interval", "30d", 1},
      {"interval", "31d", 0},
      {"interval", "-1", 0},
      {"interval", "1.5", 0},
      {"interval", "5x", 0},
      {"interval", "", 0},
      {"poll-interval", "99ms", 0},
      {"poll-interval", "100ms", 1},
      {"signal", "usr2", 1},
      {"signal", "SIGHUP", 1},
      {"signal", "10", 1},
      {"signal", "KILL", 0},
      {"signal", "9", 0},
      {"signal", "19", 0},
      {"signal", "0", 0},
      {"signal", "SIGFOO", 0},
      {"signal", "RTMIN", 1},
      {"signal", "SIGRTMIN+4", 1},
      {"signal", "rtmax-2", 1},
      {"signal", "RTMIN+40", 0},
      {"signal", "RTMIN-1", 0},
      {"signal", "RTMAX+1", 0},
      {"signal", "RTMIN+", 0},
      {"signal-target", "tree", 1},
      {"signal-target", "group", 1},
      {"signal-target", "pgid", 0},
      {"part-size", "5M", 1},
      {"part-size", "128MiB", 1},
      {"part-size", "129M", 0}, /* the store refuses parts over 128 MiB */
      {"part-size", "512MiB", 0},
      {"part-size", "4M", 0},
      {"keep", "10000", 1},
      {"keep", "10001", 0},
      {"level", "-1000", 1},
      {"level", "20", 0},
      {"parallel", "65", 0},
      {"memory", "1M", 1},
      {"memory", "512K", 0},
      {"memory", "2T", 0},
      {"target-rate", "1G", 1},
      {"target-rate", "fast", 0},
      {"restore", "TRUE", 1},
      {"restore", "0", 1},
      {"restore", "y", 0},
      {"region", "us-east-1", 1},
      {"region", "US-EAST", 0},
      {"socket-group", "spot_ops", 1},
      {"socket-group", "a b", 0},
      {"metadata-url", "http://h:1", 1},
      {"metadata-url", "http://", 0},
      {"store", "s3://bkt", 1},
      {"command", "a | b", 0},
      {"log-level", "warning", 1},
      {"log-level", "verbose", 0},
      {"vm-name", "x\ty", 0},
  };
  struct spot_config *cfg = spot_config_new();
  char err[512];

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    int r =
        spot_config_set(cfg, cases[i].key, cases[i].value, err, sizeof(err));
    if ((r == 0) != cases[i].ok)
      fail_msg("%s = '%s': got %d (%s)", cases[i].key, cases[i].value, r,
               r ? err : "");
  }
  assert_int_equal(spot_config_set(cfg, "interval", "1500ms", err, sizeof(err)),
                   0);
  assert_int_equal(cfg->interval_ms, 1500);
  assert_int_equal(spot_config_set(cfg, "signal", "usr2", err, sizeof(err)), 0);
  assert_int_equal(cfg->signal, SIGUSR2);
  assert_int_equal(
      spot_config_set(cfg, "signal", "SIGRTMIN+5", err, sizeof(err)), 0);
  assert_int_equal(cfg->signal, SIGRTMIN + 5);
  {
    char nb[16];

    assert_string_equal(spot_config_signal_name(cfg->signal, nb, sizeof(nb)),
                        "RTMIN+5");
  }
  assert_int_equal(
      spot_config_set(cfg, "signal-target", "group", err, sizeof(err)), 0);
  assert_int_equal(cfg->signal_target, SPOT_CONFIG_TARGET_TREE);
  assert_int_equal(spot_config_set(cfg, "signal", "usr2", err, sizeof(err)), 0);
  spot_config_free(cfg);
}

static void
test_split_args(void **state)
{
  static const struct {
    const char *in;
    const char *out[6];
  } good[] = {
      {"python3 train.py --lr 0.1", {"python3", "train.py", "--lr", "0.1"}},
      {"  a\t b  ", {"a", "b"}},
      {"a \"b c\" 'd e'", {"a", "b c", "d e"}},
      {"--name=\"a b\"x", {"--name=a bx"}},
      {"\"say \\\"hi\\\" \\\\ \\n\"", {"say \"hi\" \\ \\n"}},
      {"a\\ b c", {"a b", "c"}},
      {"'$HOME|x' \"a;b\" \\$", {"$HOME|x", "a;b", "$"}},
      {"a \"\" ''", {"a", "", ""}},
  };
  static const struct {
    const char *in, *msg;
  } bad[] = {
      {"", "empty command"},         {"   ", "empty command"},
      {"a 'b", "unterminated '"},    {"a \"b", "unterminated \""},
      {"a\\", "trailing backslash"}, {"a | b", "shell syntax"},
      {"a > log", "shell syntax"},   {"echo $HOME", "shell syntax"},
      {"a;b", "shell syntax"},       {"a `b`", "shell syntax"},
  };
  char err[256], **argv;
  int argc;

  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    int n = 0;
    assert_int_equal(
        spot_config_split_args(good[i].in, &argv, &argc, err, sizeof(err)), 0);
    while (good[i].out[n] != NULL)
      n++;
    assert_int_equal(argc, n);
    for (int j = 0; j < n; j++)
      assert_string_equal(argv[j], good[i].out[j]);
    assert_null(argv[argc]);
    spot_config_free_args(argv);
  }
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_int_equal(
        spot_config_split_args(bad[i].in, &argv, &argc, err, sizeof(err)),
        -EINVAL);
    if (strstr(err, bad[i].msg) == NULL)
      fail_msg("'%s': error '%s' lacks '%s'", bad[i].in, err, bad[i].msg);
  }
  {
    char many[SPOT_CONFIG_MAX_ARGS * 2 + 8];
    size_t n = 0;
    for (int i = 0; i <= SPOT_CONFIG_MAX_ARGS; i++) {
      many[n++] = 'a';
      many[n++] = ' ';
    }
    many[n] = '\0';
    assert_int_equal(
        spot_config_split_args(many, &argv, &argc, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "more than"));
  }
  spot_config_free_args(NULL);
}

static void
test_getopt(void **state)
{
  struct option opts[SPOT_CONFIG_MAX_KEYS + 4];
  static const struct option extra[] = {
      {"config", required_argument, NULL, 'c'},
      {"help", no_argument, NULL, 'h'},
  };
  char *argv[] = {(char *)"spotd",
                  (char *)"--job",
                  (char *)"j9",
                  (char *)"--imdsv1",
                  (char *)"--keep=4",
                  (char *)"-c",
                  (char *)"/etc/x.conf",
                  (char *)"--restore=no",
                  (char *)"--",
                  (char *)"python3",
                  NULL};
  int argc = 10, c, n;
  struct spot_config *cfg = spot_config_new();
  const char *config = NULL;
  char err[256];

  n = spot_config_build_options(opts, (sizeof(opts) / sizeof(opts[0])), extra,
                                2);
  assert_true(n > 20);
  assert_null(opts[n].name);
  assert_string_equal(opts[n - 1].name, "help");
  assert_int_equal(spot_config_build_options(opts, 5, extra, 2), -ENOBUFS);
  optind = 1;
  while ((c = getopt_long(argc, argv, "+c:h", opts, NULL)) != -1) {
    const char *key = spot_config_option_key(c);
    if (c == 'c') {
      config = optarg;
    } else {
      assert_non_null(key);
      assert_int_equal(spot_config_set(cfg, key, optarg, err, sizeof(err)), 0);
    }
  }
  assert_int_equal(optind, 9 + 0);
  assert_string_equal(argv[optind], "python3");
  assert_string_equal(config, "/etc/x.conf");
  assert_string_equal(cfg->job, "j9");
  assert_true(cfg->imdsv1);
  assert_false(cfg->restore);
  assert_int_equal(cfg->keep, 4);
  assert_null(spot_config_option_key('c'));
  assert_null(spot_config_option_key(SPOT_CONFIG_OPT_BASE + 1000));
  spot_config_free(cfg);
}

static void
test_help_lists_every_option(void **state)
{
  struct option opts[SPOT_CONFIG_MAX_KEYS + 1];
  struct spot_buf b;
  char want[64];
  int n;

  n = spot_config_build_options(opts, (sizeof(opts) / sizeof(opts[0])), NULL,
                                0);
  spot_buf_init(&b, 64 * 1024);
  assert_int_equal(spot_config_write_help(&b), 0);
  for (int i = 0; i < n; i++) {
    snprintf(want, sizeof(want), "  --%s", opts[i].name);
    if (strstr(b.data, want) == NULL)
      fail_msg("--help lacks %s", opts[i].name);
  }
  assert_non_null(strstr(b.data, "Default: 600."));
  assert_non_null(strstr(b.data, "--provider auto|aws|gcp|azure|none"));
  assert_non_null(strstr(b.data, "--imdsv1[=true|false]"));
  /* No line wider than 79 columns. */
  for (const char *p = b.data; *p != '\0';) {
    size_t len = strcspn(p, "\n");
    assert_true(len <= 79);
    p += len + (p[len] == '\n');
  }
  spot_buf_fini(&b);
}

/* The example file is exactly what spot_config_write_example prints, it
 * loads, and every key in it loads once uncommented. */
static void
test_example(void **state)
{
  struct spot_buf b, un;
  struct spot_config *cfg;
  const char *root = getenv("SPOT_SRCDIR");
  char path[4096], err[4096];
  FILE *f;
  char *file;
  size_t n;
  int keys = 0;

  /* fail_msg() does not return; the returns show it to the analyzer. */
  if (root == NULL || root[0] == '\0') {
    fail_msg("SPOT_SRCDIR is not set");
    return;
  }
  spot_buf_init(&b, 256 * 1024);
  assert_int_equal(spot_config_write_example(&b), 0);
  snprintf(path, sizeof(path), "%s/systemd/spotd.conf", root);
  f = fopen(path, "r");
  if (f == NULL) {
    fail_msg("cannot open %s", path);
    return;
  }
  file = calloc(1, 256 * 1024);
  if (file == NULL) {
    fclose(f);
    fail_msg("out of memory");
    return;
  }
  n = fread(file, 1, 256 * 1024 - 1, f);
  fclose(f);
  if (n != b.len || memcmp(file, b.data, n) != 0)
    fail_msg("%s differs from `spotd --print-config-example`", path);
  free(file);

  cfg = spot_config_new();
  assert_int_equal(spot_config_load_buffer(cfg, "t.conf", b.data, b.len, false,
                                           err, sizeof(err)),
                   0);
  spot_config_free(cfg);

  spot_buf_init(&un, 256 * 1024);
  for (const char *p = b.data; *p != '\0';) {
    size_t len = strcspn(p, "\n");
    /* "#key = value" lines (no space after '#') are the keys. */
    if (p[0] == '#' && len > 1 && p[1] != ' ' && memchr(p, '=', len)) {
      assert_int_equal(spot_buf_append(&un, p + 1, len - 1), 0);
      keys++;
    } else {
      assert_int_equal(spot_buf_append(&un, p, len), 0);
    }
    assert_int_equal(spot_buf_append(&un, "\n", 1), 0);
    p += len + (p[len] == '\n');
  }
  assert_true(keys > 20);
  cfg = spot_config_new();
  if (spot_config_load_buffer(cfg, "t.conf", un.data, un.len, false, err,
                              sizeof(err)) != 0)
    fail_msg("uncommented example: %s", err);
  assert_int_equal(
      spot_config_validate(cfg, SPOT_CONFIG_NEED_COMMAND, err, sizeof(err)), 0);
  spot_config_free(cfg);
  spot_buf_fini(&un);
  spot_buf_fini(&b);
}

static void
test_effective_round_trip(void **state)
{
  struct spot_config *a = spot_config_new(), *b = spot_config_new();
  struct spot_buf out;
  char err[1024];

  assert_int_equal(LOAD(a,
                        "[spotd]\njob = j\nstore = s3://bkt/p\n"
                        "interval = 90s\npoll-interval = 250ms\n"
                        "signal = 40\npart-size = 32M\nimdsv1 = on\n",
                        err),
                   0);
  assert_int_equal(spot_config_set(a, "keep", "8", err, sizeof(err)), 0);
  spot_buf_init(&out, 64 * 1024);
  assert_int_equal(spot_config_write_effective(a, &out), 0);
  assert_non_null(strstr(out.data, "# from --keep\nkeep = 8\n"));
  assert_non_null(
      strstr(out.data, "# from t.conf:4: interval\ninterval = 90s\n"));
  if (spot_config_load_buffer(b, "eff.conf", out.data, out.len, false, err,
                              sizeof(err)) != 0)
    fail_msg("%s\n---\n%s", err, out.data);
  assert_int_equal(b->interval_ms, 90000);
  assert_int_equal(b->poll_interval_ms, 250);
  assert_int_equal(b->signal, 40);
  assert_int_equal(b->part_size, 32u << 20);
  assert_int_equal(b->keep, 8);
  assert_true(b->imdsv1);
  assert_string_equal(b->store, "s3://bkt/p");
  spot_buf_fini(&out);
  spot_config_free(a);
  spot_config_free(b);
}

static void
test_error_buffer_cap(void **state)
{
  struct spot_buf in;
  struct spot_config *cfg = spot_config_new();
  char err[200];

  spot_buf_init(&in, 1 << 20);
  assert_int_equal(spot_buf_appends(&in, "[spotd]\n"), 0);
  for (int i = 0; i < 100; i++)
    assert_int_equal(spot_buf_printf(&in, "bogus%d = 1\n", i), 0);
  assert_int_equal(spot_config_load_buffer(cfg, "t.conf", in.data, in.len,
                                           false, err, sizeof(err)),
                   -EINVAL);
  assert_true(strlen(err) < sizeof(err));
  assert_non_null(strstr(err, "t.conf:2: unknown key 'bogus0'"));
  assert_non_null(strstr(err, "more errors)"));
  spot_buf_fini(&in);
  spot_config_free(cfg);
}

/* --restart-backoff: doubles per restart, capped at 300 s unless the base
 * itself is longer; 0 restarts at once. */
static void
test_restart_backoff(void **state)
{
  (void)state;
  assert_int_equal(spot_config_restart_backoff_ms(10000, 1), 10000);
  assert_int_equal(spot_config_restart_backoff_ms(10000, 2), 20000);
  assert_int_equal(spot_config_restart_backoff_ms(10000, 3), 40000);
  assert_int_equal(spot_config_restart_backoff_ms(10000, 5), 160000);
  assert_int_equal(spot_config_restart_backoff_ms(10000, 6), 300000);
  assert_int_equal(spot_config_restart_backoff_ms(10000, 1000), 300000);
  assert_int_equal(spot_config_restart_backoff_ms(0, 7), 0);
  assert_int_equal(spot_config_restart_backoff_ms(600000, 1), 600000);
  assert_int_equal(spot_config_restart_backoff_ms(600000, 9), 600000);
  assert_int_equal(spot_config_restart_backoff_ms(1, 0), 1);
}

/* max-restarts: 0 by default; refused on a multi-node job. */
static void
test_max_restarts(void **state)
{
  struct spot_config *cfg = spot_config_new();
  char err[1024];

  (void)state;
  assert_int_equal(cfg->max_restarts, 0);
  assert_int_equal(cfg->restart_backoff_ms, 10000);
  assert_int_equal(spot_config_set(cfg, "job", "j", err, sizeof(err)), 0);
  assert_int_equal(
      spot_config_set(cfg, "store", "s3://bkt/p", err, sizeof(err)), 0);
  assert_int_equal(spot_config_set(cfg, "max-restarts", "2", err, sizeof(err)),
                   0);
  assert_int_equal(
      spot_config_set(cfg, "restart-backoff", "1500ms", err, sizeof(err)), 0);
  assert_int_equal(cfg->restart_backoff_ms, 1500);
  assert_int_equal(spot_config_set(cfg, "max-restarts", "-1", err, sizeof(err)),
                   -EINVAL);
  assert_int_equal(spot_config_set(cfg, "nranks", "2", err, sizeof(err)), 0);
  assert_int_equal(spot_config_validate(cfg, 0, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "max-restarts 2 needs a one-node job"));
  assert_int_equal(spot_config_set(cfg, "nranks", "1", err, sizeof(err)), 0);
  if (spot_config_validate(cfg, 0, err, sizeof(err)) != 0)
    fail_msg("%s", err);
  assert_int_equal(cfg->max_restarts, 2);
  spot_config_free(cfg);
}

static void
test_names(void **state)
{
  char buf[16];

  assert_string_equal(spot_config_provider_name(SPOT_CONFIG_PROVIDER_AZURE),
                      "azure");
  assert_string_equal(spot_config_provider_name(99), "?");
  assert_string_equal(spot_config_signal_target_name(1), "leader");
  assert_string_equal(spot_config_compress_name(1), "zstd");
  assert_string_equal(spot_config_signal_name(SIGUSR1, buf, sizeof(buf)),
                      "USR1");
  assert_string_equal(spot_config_signal_name(40, buf, sizeof(buf)), "RTMIN+6");
  assert_string_equal(spot_config_signal_name(31, buf, sizeof(buf)), "31");
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_load_good),
      cmocka_unit_test(test_all_errors_with_lines),
      cmocka_unit_test(test_long_lines),
      cmocka_unit_test(test_cli_overrides_file),
      cmocka_unit_test(test_secrets),
      cmocka_unit_test(test_load_file_checks),
      cmocka_unit_test(test_validate),
      cmocka_unit_test(test_ranks),
      cmocka_unit_test(test_values),
      cmocka_unit_test(test_split_args),
      cmocka_unit_test(test_getopt),
      cmocka_unit_test(test_help_lists_every_option),
      cmocka_unit_test(test_example),
      cmocka_unit_test(test_effective_round_trip),
      cmocka_unit_test(test_error_buffer_cap),
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_restart_backoff),
      cmocka_unit_test(test_max_restarts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
