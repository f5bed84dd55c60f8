/* spotd: supervise a training command, checkpoint it, keep it durable.
 *
 *   spotd run [OPTIONS] -- COMMAND [ARG...]     (foreground, per job)
 *   spotd --config FILE [OPTIONS]               (systemd service)
 *   spotd --config FILE --check-config          (validate only, -n)
 *
 * main() parses the arguments into the config (the command line beats the
 * file), sets up signals and sd_notify, runs the engine on one libuv loop
 * and requires uv_loop_close() == 0 at the end. */
#include <errno.h>
#include <getopt.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "io/child.h"
#include "engine.h"
#include "jlog.h"
#include "io/jobfrom.h"
#include "core/log.h"
#include "io/proctree.h"
#include "spot-config.h"
#include "spotd.h"
#include "core/util.h"

enum {
  OPT_CONFIG = 'c',
  OPT_CHECK = 'n',
  OPT_HELP = 'h',
  OPT_VERSION = 0x100,
  OPT_EXAMPLE,
};

static const struct option extra_opts[] = {
    {"config", required_argument, NULL, OPT_CONFIG},
    {"check-config", no_argument, NULL, OPT_CHECK},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {"print-config-example", no_argument, NULL, OPT_EXAMPLE},
};

static void
usage(FILE *f)
{
  struct spot_buf b;

  fprintf(f,
          "Usage: spotd run [OPTIONS] -- COMMAND [ARG...]\n"
          "       spotd --config FILE [OPTIONS]\n"
          "\n"
          "Runs a training command, has it checkpoint on a cloud interruption "
          "notice\n"
          "and on a schedule, uploads each checkpoint to S3 and commits it, "
          "and\n"
          "restores the newest committed one before the command starts.\n"
          "\n"
          "  -c, --config FILE          read options from FILE ([spotd] "
          "section)\n"
          "  -n, --check-config         validate the configuration and exit\n"
          "  --print-config-example     print a commented config file\n"
          "  -h, --help                 this help\n"
          "  --version                  print the version\n"
          "\nOptions (also config keys, without the dashes):\n");
  spot_buf_init(&b, 1 << 20);
  if (spot_config_write_help(&b) == 0)
    fputs(spot_buf_str(&b), f);
  spot_buf_fini(&b);
  fprintf(f, "\nThe trainer gets SPOTD_CKPT_DIR, SPOTD_RESUME_DIR (after a "
             "restore),\nSPOTD_JOB, SPOTD_SOCKET and SPOTD_RESTART_COUNT; it "
             "starts with the checkpoint\nsignal ignored, in its own session, "
             "without spotd's systemd variables.\n"
             "Exit status: the trainer's; 0 after SIGTERM with the final "
             "checkpoint committed;\n64 a bad command line; 65 the store's "
             "checkpoints cannot be used; 69 the\nstore or the job lease is "
             "not available, or the last checkpoint could not be\ncommitted; "
             "70 --max-restarts used up; 71 spotd's own failure; 73 the lease"
             "\nlost; 74 a local I/O error at restore; 75 after a handled "
             "preemption (a\ncommitted checkpoint to resume from); 76 after a "
             "notice with nothing\ncommitted; 78 a bad config; 127 the command "
             "could not be started; 128+N\nafter signal N without a final "
             "commit (README \"Exit status\").\n");
}

static void
signal_cb(uv_signal_t *s, int signum)
{
  struct spotd *d = s->data;

  if (signum == SIGHUP) {
    log_info("SIGHUP: configuration reload is not supported while a job "
             "runs; restart the service to apply changes");
    return;
  }
  spotd_on_signal(d, signum);
}

static void
watchdog_cb(uv_timer_t *t)
{
  struct spotd *d = t->data;

  spotd_notify(d, "WATCHDOG=1");
}

static void
close_walk_cb(uv_handle_t *h, void *arg)
{
  (void)arg;
  if (!uv_is_closing(h)) {
    log_err("internal: handle of type %s left open at exit",
            uv_handle_type_name(uv_handle_get_type(h)));
    uv_close(h, NULL);
  }
}

static void
ignore_sigpipe(void)
{
  struct sigaction sa;

  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = SIG_IGN;
  sigemptyset(&sa.sa_mask);
  (void)sigaction(SIGPIPE, &sa, NULL);
}

static int
run_daemon(struct spot_config *cfg, char **argv)
{
  struct spotd d;
  uv_loop_t loop;
  int r;

  memset(&d, 0, sizeof(d));
  d.cfg = cfg;
  d.argv = argv;
  /* Trees, signals and freezes go by pid through /proc: in a pid
   * namespace that kept another's /proc they would reach other
   * processes. */
  r = spot_proc_own();
  if (r == -EXDEV) {
    log_err("/proc is not this pid namespace's (it names other processes "
            "under our pids): refusing to start; mount a /proc of its own "
            "(unshare --mount-proc, a container's own /proc)");
    return SPOTD_EXIT_ERROR;
  }
  if (r < 0)
    log_warn("/proc: %s: the trainer's process tree cannot be followed",
             strerror(-r));
  switch (spot_child_contain_probe()) {
  case SPOT_CHILD_CONTAIN_PIDNS:
    log_info("the trainer runs in a pid namespace of its own: nothing of it "
             "outlives its guard");
    break;
  case SPOT_CHILD_CONTAIN_USERNS:
    log_info("the trainer runs in a pid namespace of its own, in a user "
             "namespace: nothing of it outlives its guard");
    break;
  default:
    log_warn("no pid namespace for the trainer here (unshare refused): its "
             "tree is kept under its guard and spotd only, and its processes "
             "escape when both are killed together (README, \"The "
             "trainer's process tree\")");
    break;
  }
  r = uv_loop_init(&loop);
  if (r < 0) {
    log_err("event loop: %s", uv_strerror(r));
    return SPOTD_EXIT_ERROR;
  }
  d.loop = &loop;
  jlog_start(&d);
  /* A control client gone before its answer (a trainer killed mid
   * request) must be a write error, not SIGPIPE. libuv resets the
   * disposition in every child it spawns. */
  ignore_sigpipe();
  uv_signal_init(&loop, &d.sigterm);
  uv_signal_init(&loop, &d.sigint);
  uv_signal_init(&loop, &d.sighup);
  d.sigterm.data = d.sigint.data = d.sighup.data = &d;
  uv_signal_start(&d.sigterm, signal_cb, SIGTERM);
  uv_signal_start(&d.sigint, signal_cb, SIGINT);
  uv_signal_start(&d.sighup, signal_cb, SIGHUP);
  uv_timer_init(&loop, &d.watchdog);
  d.watchdog.data = &d;
  if (sd_watchdog_enabled(0, &d.watchdog_usec) > 0 && d.watchdog_usec > 0)
    uv_timer_start(&d.watchdog, watchdog_cb, d.watchdog_usec / 2000,
                   d.watchdog_usec / 2000);

  (void)spotd_start(&d); /* closes on failure, the exit status set */
  /* Runs until spotd_close() has closed the engine's handles. The signal
   * handles stay referenced: unref them once closing. */
  while (uv_run(&loop, UV_RUN_ONCE) != 0) {
    if (d.closing) {
      uv_unref((uv_handle_t *)&d.sigterm);
      uv_unref((uv_handle_t *)&d.sigint);
      uv_unref((uv_handle_t *)&d.sighup);
    }
  }
  /* Then the clients the start made (the engine frees them). */
  spotd_free_clients(&d);
  uv_close((uv_handle_t *)&d.sigterm, NULL);
  uv_close((uv_handle_t *)&d.sigint, NULL);
  uv_close((uv_handle_t *)&d.sighup, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_walk(&loop, close_walk_cb, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  r = uv_loop_close(&loop);
  if (r != 0) {
    log_err("internal: event loop not empty at exit: %s", uv_strerror(r));
    jlog_stop();
    return SPOTD_EXIT_ERROR;
  }
  spotd_free(&d);
  log_info("exit status %d", d.eng.exit_code);
  jlog_stop();
  return d.eng.exit_code < 0 ? SPOTD_EXIT_ERROR : d.eng.exit_code;
}

static void
print_example(void)
{
  struct spot_buf b;

  spot_buf_init(&b, 1 << 20);
  spot_config_write_example(&b);
  fputs(spot_buf_str(&b), stdout);
  spot_buf_fini(&b);
}

/* The command line into cfg. Returns -1 to go on, else an exit status. */
static int
parse_options(int argc, char **argv, struct spot_config *cfg,
              const char **config_path, bool *check)
{
  struct option opts[SPOT_CONFIG_MAX_KEYS + 8];
  char err[8192];
  int c;

  if (spot_config_build_options(opts, SPOT_ARRAY_SIZE(opts), extra_opts,
                                SPOT_ARRAY_SIZE(extra_opts)) < 0) {
    fprintf(stderr, "spotd: internal: option table too small\n");
    return SPOTD_EXIT_ERROR;
  }
  opterr = 0;
  while ((c = getopt_long(argc, argv, "+c:nh", opts, NULL)) != -1) {
    const char *key = spot_config_option_key(c);

    if (key != NULL) {
      if (spot_config_set(cfg, key, optarg, err, sizeof(err)) < 0) {
        fprintf(stderr, "spotd: %s\n", err);
        return SPOTD_EXIT_CONFIG; /* a known option with a bad value */
      }
      continue;
    }
    switch (c) {
    case OPT_CONFIG:
      *config_path = optarg;
      break;
    case OPT_CHECK:
      *check = true;
      break;
    case OPT_HELP:
      usage(stdout);
      return 0;
    case OPT_VERSION:
      printf("spotd %s\n", SPOT_VERSION);
      return 0;
    case OPT_EXAMPLE:
      print_example();
      return 0;
    default:
      if (optopt != 0 && optopt < 0x100)
        fprintf(stderr, "spotd: unknown option '-%c'\n", optopt);
      else
        fprintf(stderr, "spotd: unknown option or missing value: '%s'\n",
                argv[optind - 1]);
      fprintf(stderr, "Try 'spotd --help'.\n");
      return SPOTD_EXIT_USAGE;
    }
  }
  return -1;
}

/* --job-from: job and store, when not given, from the instance's own
 * metadata (one generic launch template serves every job). */
static int
job_from(struct spot_config *cfg)
{
  char err[512], *job = NULL, *store = NULL;
  const char *where = "";
  int r;

  if (cfg->job_from == SPOT_JOB_FROM_NONE ||
      (cfg->job != NULL && cfg->store != NULL))
    return 0;
  r = spot_job_from_resolve((enum spot_job_from)cfg->job_from,
                            cfg->metadata_url, &job, &store, &where, err,
                            sizeof(err));
  if (r == 0 && cfg->job == NULL)
    r = spot_config_set(cfg, "job", job, err, sizeof(err));
  if (r == 0 && cfg->store == NULL && store != NULL)
    r = spot_config_set(cfg, "store", store, err, sizeof(err));
  if (r == 0)
    log_info("job-from %s: job=%s store=%s", where, cfg->job,
             cfg->store != NULL ? cfg->store : "(none)");
  else
    fprintf(stderr, "spotd: job-from: %s\n", err);
  free(job);
  free(store);
  return r;
}

/* The config file, then validation. -1 to go on, else an exit status. */
static int
load_config(struct spot_config *cfg, const char *config_path, int argc,
            char **argv, bool run, bool check)
{
  char err[8192];

  if (config_path != NULL &&
      spot_config_load_file(cfg, config_path, err, sizeof(err)) < 0) {
    fprintf(stderr, "%s\n", err);
    return SPOTD_EXIT_CONFIG;
  }
  if (optind < argc && strcmp(argv[optind - 1], "--") != 0 && !run) {
    fprintf(stderr,
            "spotd: unexpected argument '%s' (the training command "
            "goes after '--' with 'spotd run')\n",
            argv[optind]);
    return SPOTD_EXIT_USAGE;
  }
  /* The job or store the instance's metadata should name is missing. */
  if (job_from(cfg) < 0)
    return SPOTD_EXIT_CONFIG;
  if (spot_config_validate(cfg, optind < argc ? 0 : SPOT_CONFIG_NEED_COMMAND,
                           err, sizeof(err)) < 0) {
    fprintf(stderr, "%s\n", err);
    if (optind >= argc && cfg->command == NULL && !check) {
      fprintf(stderr, "spotd: no training command: use 'spotd run [OPTIONS] "
                      "-- COMMAND' or 'command =' in the config\n");
      return SPOTD_EXIT_USAGE;
    }
    return SPOTD_EXIT_CONFIG;
  }
  if (check) {
    printf("configuration OK\n");
    return 0;
  }
  return -1;
}

/* The command after '--', else the config's command. */
static int
run_command(struct spot_config *cfg, int argc, char **argv)
{
  char err[8192];
  char **cmd = NULL;
  int cmdc = 0, status;

  spot_log_set_level(cfg->log_level);
  if (optind < argc)
    return run_daemon(cfg, argv + optind);
  if (spot_config_split_args(cfg->command, &cmd, &cmdc, err, sizeof(err)) < 0) {
    fprintf(stderr, "spotd: command: %s\n", err);
    return SPOTD_EXIT_CONFIG;
  }
  status = run_daemon(cfg, cmd);
  spot_config_free_args(cmd);
  return status;
}

int
main(int argc, char **argv)
{
  struct spot_config *cfg;
  const char *config_path = NULL;
  bool check = false, run = false;
  int status;

  /* The exec shim of lib/io/child.c: spotd re-executed to start a child. */
  if (argc > 1 && strcmp(argv[1], SPOT_CHILD_SHIM_ARG) == 0)
    spot_child_shim_main(argc, argv);
  spot_log_init("spotd", SPOT_LOG_INFO);
  /* Credentials and IMDS tokens live in this process's memory: no core
   * dump, no ptrace or /proc/PID/mem|environ for other processes of the
   * same uid. (exec resets it, so the trainer is unaffected.) */
  (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
#ifdef __GLIBC__
  /* One malloc arena for every thread. A checkpoint's worker and I/O
   * threads each got an arena of their own, and what they had malloc'd
   * (zstd's contexts, curl's handles) stayed touched there once freed:
   * an idle spotd went from 1.9 MiB of its own memory to 5-7 MiB after
   * its first checkpoint. In one arena the store's malloc_trim() gives it
   * back. Those threads malloc little (their buffers are mmap'd), so
   * they do not queue on the arena's lock. */
  (void)mallopt(M_ARENA_MAX, 1);
#endif
  if (argc > 1 && strcmp(argv[1], "run") == 0) {
    run = true;
    argv[1] = argv[0];
    argv++;
    argc--;
  }
  cfg = spot_config_new();
  if (cfg == NULL) {
    fprintf(stderr, "spotd: out of memory\n");
    return SPOTD_EXIT_ERROR;
  }
  status = parse_options(argc, argv, cfg, &config_path, &check);
  if (status < 0)
    status = load_config(cfg, config_path, argc, argv, run, check);
  if (status < 0)
    status = run_command(cfg, argc, argv);
  spot_config_free(cfg);
  return status;
}
