/* spotctl: thin client of spotd and the store commands. */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "core/log.h"
#include "core/util.h"
#include "spot-config.h"
#include "spotctl.h"

static int cmd_help(int argc, char **argv);

/* The command table. Each group lives in its own file. */
static const struct spotctl_cmd commands[] = {
    {"push", "DIR s3://BUCKET/[PREFIX/]JOB", "upload and commit a checkpoint",
     spotctl_cmd_push},
    {"list", "s3://BUCKET/[PREFIX/]JOB", "list the checkpoints of a job",
     spotctl_cmd_list},
    {"restore", "s3://BUCKET/[PREFIX/]JOB DIR",
     "restore a committed checkpoint", spotctl_cmd_restore},
    {"status", "[--json]", "what the running spotd is doing",
     spotctl_cmd_status},
    {"checkpoint", "[--wait]", "ask spotd for a checkpoint now",
     spotctl_cmd_checkpoint},
    {"done", "DIR", "tell spotd a checkpoint folder is complete",
     spotctl_cmd_done},
    {"metrics", "", "the running spotd's metrics (Prometheus text)",
     spotctl_cmd_metrics},
    {"help", "[COMMAND]", "show help", cmd_help},
    {"emulate", "--provider aws|gcp|azure [...]",
     "local metadata service emulator (spotd-emulate)", spotctl_cmd_forward},
    {"relaunch", "--backend exec|slurm|aws|gcp", "ask for new capacity",
     spotctl_cmd_relaunch},
    {"history", "s3://BUCKET/[PREFIX/]JOB [...]",
     "what happened to a job: runs, preemptions, lost work",
     spotctl_cmd_history},
    {"history-event", "s3://BUCKET/[PREFIX/]JOB FILE",
     "write job history events (tests, demos)", spotctl_cmd_history_event},
    {"lease", "s3://BUCKET/[PREFIX/]JOB [...]",
     "take, show or release the "
     "job lease",
     spotctl_cmd_lease},
};

/* Prints "spotctl: MESSAGE" and the trailer (a newline at least) to stderr,
 * returns status. The message often carries strings from the network or
 * the store, so all of it goes through spot_escape() (which leaves text
 * already escaped unchanged): one line, no terminal sequence. */
__attribute__((format(printf, 3, 0), nonnull(2, 3))) static int
vfail(int status, const char *trailer, const char *fmt, va_list ap)
{
  char msg[2048], esc[SPOT_ESCAPE_SIZE(sizeof(msg))];

  vsnprintf(msg, sizeof(msg), fmt, ap);
  fputs("spotctl: ", stderr);
  fputs(spot_escape(msg, esc, sizeof(esc)), stderr);
  fputs(trailer, stderr);
  return status;
}

const char *
spotctl_esc(const char *s)
{
  static char ring[8][SPOT_ESCAPE_SIZE(SPOTCTL_ESC_MAX)];
  static unsigned next;
  char *dst = ring[next++ % 8];

  return spot_escape(s, dst, sizeof(ring[0]));
}

int
spotctl_fail(const char *fmt, ...)
{
  va_list ap;
  int r;

  va_start(ap, fmt);
  r = vfail(SPOTCTL_EXIT_FAIL, "\n", fmt, ap);
  va_end(ap);
  return r;
}

int
spotctl_usage(const char *fmt, ...)
{
  va_list ap;
  int r;

  va_start(ap, fmt);
  r = vfail(SPOTCTL_EXIT_USAGE, "\nTry 'spotctl --help'.\n", fmt, ap);
  va_end(ap);
  return r;
}

int
spotctl_bad_option(const char *cmd, char **argv)
{
  if (optopt != 0 && optopt < 256)
    return spotctl_usage("%s: unknown option '-%c'", cmd, optopt);
  return spotctl_usage("%s: unknown or incomplete option '%s'", cmd,
                       argv[optind - 1]);
}

static void
usage(FILE *f)
{
  fprintf(f, "Usage: spotctl COMMAND [ARGS...]\n\n"
             "Talk to a running spotd, work on the checkpoint store, "
             "relaunch a job.\n\nCommands:\n");
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(commands); i++)
    fprintf(f, "  %-10s %-34s %s\n", commands[i].name, commands[i].args,
            commands[i].summary);
  fprintf(f, "\nEach command takes --help. Exit status: 0 success, 1 failure, "
             "2 usage error.\n");
}

static const struct spotctl_cmd *
find_cmd(const char *name)
{
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(commands); i++)
    if (strcmp(commands[i].name, name) == 0)
      return &commands[i];
  return NULL;
}

static int
cmd_help(int argc, char **argv)
{
  if (argc > 1) {
    const struct spotctl_cmd *c = find_cmd(argv[1]);
    char help[] = "--help";
    char *av[] = {argv[1], help, NULL};

    if (c == NULL)
      return spotctl_usage("unknown command '%s'", argv[1]);
    if (c->run != cmd_help)
      return c->run(2, av);
  }
  usage(stdout);
  return SPOTCTL_EXIT_OK;
}

int
main(int argc, char **argv)
{
  const struct spotctl_cmd *c;

  spot_log_init("spotctl", SPOT_LOG_WARNING);
  /* Credentials and IMDS tokens live in this process's memory: no core
   * dump, no ptrace or /proc/PID/mem|environ for other processes of the
   * same uid. (exec resets it, so the trainer is unaffected.) */
  (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  if (argc < 2) {
    usage(stderr);
    return SPOTCTL_EXIT_USAGE;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    usage(stdout);
    return SPOTCTL_EXIT_OK;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("spotctl %s\n", SPOT_VERSION);
    return SPOTCTL_EXIT_OK;
  }
  c = find_cmd(argv[1]);
  if (c == NULL)
    return spotctl_usage("unknown command '%s'", argv[1]);
  return c->run(argc - 1, argv + 1);
}
