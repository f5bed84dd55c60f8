/* spotctl: one file per command group, one table in main.c. */
#ifndef SPOTCTL_H
#define SPOTCTL_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#include "io/aws.h"
#include "io/http.h"
#include "io/s3.h"

struct spotctl_cmd {
  const char *name;
  const char *args;    /* synopsis after the name */
  const char *summary; /* one line for `spotctl --help` */
  /* argv[0] is the command name. Returns the process exit status. */
  int (*run)(int argc, char **argv);
};

/* Exit statuses shared by all commands. */
enum {
  SPOTCTL_EXIT_OK = 0,
  SPOTCTL_EXIT_FAIL = 1,  /* the operation failed */
  SPOTCTL_EXIT_USAGE = 2, /* bad command line */
};

/* Prints "spotctl: " + message + newline on stderr, returns
 * SPOTCTL_EXIT_FAIL. */
int spotctl_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* spot_escape() of s into one of 8 static buffers, used in turn: for a
 * string from the network or the store on its way to the terminal (up to
 * SPOTCTL_ESC_MAX bytes of it; eight may share one printf). */
#define SPOTCTL_ESC_MAX 1024
const char *spotctl_esc(const char *s);
int spotctl_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* For getopt_long's '?': names the unknown option (from optopt or
 * argv[optind - 1]) after cmd, as a usage error. */
int spotctl_bad_option(const char *cmd, char **argv);
int spotctl_cmd_status(int argc, char **argv);        /* ctl_cmds.c */
int spotctl_cmd_checkpoint(int argc, char **argv);    /* ctl_cmds.c */
int spotctl_cmd_done(int argc, char **argv);          /* ctl_cmds.c */
int spotctl_cmd_metrics(int argc, char **argv);       /* ctl_cmds.c */
int spotctl_cmd_push(int argc, char **argv);          /* store_cmds.c */
int spotctl_cmd_list(int argc, char **argv);          /* store_cmds.c */
int spotctl_cmd_restore(int argc, char **argv);       /* store_cmds.c */
int spotctl_cmd_relaunch(int argc, char **argv);      /* relaunch.c */
int spotctl_cmd_history(int argc, char **argv);       /* history_cmds.c */
int spotctl_cmd_history_event(int argc, char **argv); /* history_cmds.c */
int spotctl_cmd_lease(int argc, char **argv);         /* lease_cmds.c */
/* forward.c: execs spotd-NAME (NAME: argv[0]) found beside this spotctl
 * or on PATH, with the rest of argv; returns only when that fails. */
int spotctl_cmd_forward(int argc, char **argv);

/* session.c: a loop, the HTTP client, the AWS chain and an S3 client, for
 * the commands that talk to S3. Zero the struct first. */
struct spotctl_s3 {
  uv_loop_t loop;
  bool loop_ready;
  struct spot_http *http;
  struct spot_aws *aws;
  struct spot_s3 *s3;
  bool aws_done, aws_failed; /* aws_failed: the chain found no credentials */
  int aws_err;
  char aws_msg[512];
  char *bucket, *prefix, *job; /* spotctl_s3_open_job() */
};
struct spotctl_s3_options {
  const char *endpoint, *region, *profile; /* NULL: the AWS conventions */
  const char *imds_url;                    /* NULL: the default */
  unsigned max_retries;                    /* 0: the S3 client's default */
};
/* Loop and HTTP client. 0 or negative errno with one line in err. */
int spotctl_s3_open_loop(struct spotctl_s3 *c, char *err, size_t errlen);
/* Then the AWS chain (run to its end on the loop) and the S3 client. 0 or
 * negative errno with one line in err (aws_failed tells the chain's
 * failure apart). */
int spotctl_s3_open_aws(struct spotctl_s3 *c,
                        const struct spotctl_s3_options *o, char *err,
                        size_t errlen);
/* Both; 0, or the exit status after printing the error. */
int spotctl_s3_open(struct spotctl_s3 *c, const struct spotctl_s3_options *o);
/* s3://BUCKET/[PREFIX/]JOB into bucket, prefix and job, then both opens;
 * the store config (when not NULL) gets s3, bucket, prefix and job. 0, or
 * the exit status after printing the error. */
struct spot_store_config;
int spotctl_s3_open_job(struct spotctl_s3 *c, const char *url,
                        const struct spotctl_s3_options *o,
                        struct spot_store_config *cfg);
/* Frees what is open, runs the loop dry and closes it. Idempotent. */
void spotctl_s3_close(struct spotctl_s3 *c);

/* history_plot.c: the timeline of a job into a .png or .svg file. Returns
 * 0 or negative errno with one line in err. Each run is drawn as one
 * solid block of this colour (tests count them). */
#define SPOTCTL_PLOT_RUN_R 47
#define SPOTCTL_PLOT_RUN_G 111
#define SPOTCTL_PLOT_RUN_B 189
/* The lease wait, the restore, a refused start and the crash mark: each a
 * color of its own (the tests count their pixels). */
#define SPOTCTL_PLOT_LEASE_RGB 250, 205, 80
#define SPOTCTL_PLOT_RESTORE_RGB 157, 187, 224
#define SPOTCTL_PLOT_REFUSED_RGB 150, 150, 150
#define SPOTCTL_PLOT_CRASH_RGB 110, 30, 130
/* a restart in place: the trainer down (backoff, restore) */
#define SPOTCTL_PLOT_DOWN_RGB 230, 120, 170
struct spot_hist_summary;
/* history_cmds.c: "3h05m", "6m55s", "12.5s"; "-" when ms < 0. */
const char *spotctl_fmt_dur(long long ms, char *buf, size_t size);
int spotctl_history_plot(const char *path, const char *job,
                         const struct spot_hist_summary *s, char *err,
                         size_t errsize);

#endif
