/* spotd's configuration: one table of options shared by the config file
 * (INI, [spotd] section, `key = value`) and the command line (--key VALUE).
 *
 * Precedence: a key given on the command line (spot_config_set) beats the
 * file (spot_config_load_file), whatever the order of the calls; both beat
 * the defaults that spot_config_new() applies. So the daemon may run its
 * getopt_long loop first, remember --config FILE, and load the file after.
 *
 * File syntax (inih as packaged by Debian, plus our own checks):
 * - `[spotd]` is the only section; keys outside it, other sections, unknown
 *   keys, duplicate keys and bad values are errors.
 * - Whole-line comments start with '#' or ';'. There are no inline
 *   comments: `interval = 60 # x` is an error (the value is "60 # x").
 * - Keys may be spelled with '-' or '_' (`poll-interval`, `poll_interval`).
 * - An empty value (`endpoint =`) unsets a string key (back to its
 *   default); other types need a value.
 * - A line is at most SPOT_CONFIG_MAX_LINE bytes. `command` and `relaunch`
 *   may continue on following lines indented by whitespace; the pieces are
 *   joined with one space. Other keys cannot continue.
 * - Credentials are never read from the file: a key that looks like one
 *   (aws_secret_access_key, *token*, *password*, ...) is refused with a
 *   pointer to the instance role / LoadCredential=, and a world-readable
 *   file holding one is refused outright. World-writable files, files not
 *   owned by root or the running user, and non-regular files are refused.
 * - Every error is reported, not just the first, one per line as
 *   "PATH:LINE: message" (a file-wide problem as "PATH: message").
 *
 * Errors from the functions below go into err (always NUL-terminated when
 * errlen > 0; several errors are separated by '\n'; when err is full the
 * rest are dropped and the last line says how many). */
#ifndef SPOT_CONFIG_H
#define SPOT_CONFIG_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"

/* Longest physical line in the file, newline excluded (inih's fixed
 * 200-byte buffer, newline and NUL included). */
#define SPOT_CONFIG_MAX_LINE 198
/* Largest config file read. */
#define SPOT_CONFIG_MAX_FILE (1024 * 1024)
/* Longest value of any key (command and relaunch after joining). */
#define SPOT_CONFIG_MAX_VALUE 4096
/* Command splitting limit (see spot_config_split_args). */
#define SPOT_CONFIG_MAX_ARGS 256
/* getopt_long() returns SPOT_CONFIG_OPT_BASE + i for the i-th key. */
#define SPOT_CONFIG_OPT_BASE 0x1000
#define SPOT_CONFIG_MAX_KEYS 48

enum spot_config_provider {
  SPOT_CONFIG_PROVIDER_AUTO,
  SPOT_CONFIG_PROVIDER_AWS,
  SPOT_CONFIG_PROVIDER_GCP,
  SPOT_CONFIG_PROVIDER_AZURE,
  SPOT_CONFIG_PROVIDER_NONE,
  SPOT_CONFIG_PROVIDER_LAST,
};

enum spot_config_signal_target {
  SPOT_CONFIG_TARGET_TREE,   /* every process of the trainer's tree */
  SPOT_CONFIG_TARGET_LEADER, /* only the command spotd started */
  SPOT_CONFIG_TARGET_LAST,
};

enum spot_config_compress {
  SPOT_CONFIG_COMPRESS_AUTO, /* zstd; byte grouping for float tensors where it
                                pays */
  SPOT_CONFIG_COMPRESS_ZSTD, /* zstd, never a filter */
  SPOT_CONFIG_COMPRESS_NONE, /* zstd frames of raw blocks: for data that does
                                not compress */
  SPOT_CONFIG_COMPRESS_LAST,
};

enum spot_config_origin {
  SPOT_CONFIG_ORIGIN_DEFAULT,
  SPOT_CONFIG_ORIGIN_FILE,
  SPOT_CONFIG_ORIGIN_CLI,
};

/* Option values. Strings are owned by the config (NULL = not set); read
 * them, never assign them: go through spot_config_set(). Durations are in
 * milliseconds. */
struct spot_config {
  /* the job */
  char *job;
  char *store;   /* s3://BUCKET/PREFIX; the job root is PREFIX/JOB */
  int job_from;  /* enum spot_job_from (jobfrom.h): resolved by main() */
  char *command; /* the training command for `spotd --config` (split it
                    with spot_config_split_args) */
  /* interruption notices */
  int provider; /* enum spot_config_provider */
  char *metadata_url;
  uint64_t poll_interval_ms;
  bool imdsv1; /* AWS: allow IMDSv1 (no token) when IMDSv2 fails */
  char
      *vm_name; /* Azure: this VM's name in scheduled events; NULL = ask IMDS */
  /* the trainer */
  char *ckpt_dir;
  uint64_t interval_ms;        /* 0 = no periodic checkpoints */
  int signal;                  /* signal number */
  int signal_target;           /* enum spot_config_signal_target */
  uint64_t ckpt_timeout_ms;    /* periodic checkpoint wait; 0 = forever */
  uint64_t grace_ms;           /* SIGTERM -> SIGKILL */
  int64_t max_restarts;        /* restarts of a failed trainer, 0 none */
  uint64_t restart_backoff_ms; /* before the first; doubles, capped */
  char *relaunch;
  bool restore; /* restore the newest checkpoint before launch */
  bool overlap; /* upload a requested checkpoint's files while it is written */
  bool follow_symlinks; /* store what a link out of the folder points to */
  bool dedup;           /* reference unchanged frames (store_dedup.c) */
  /* the store */
  int64_t keep;
  int64_t keep_local; /* committed checkpoints kept in ckpt_dir */
  char *endpoint;
  char *region;
  uint64_t part_size;
  int64_t parallel;        /* transfers in flight; 0 = adaptive */
  uint64_t memory;         /* budget of part buffers, bytes */
  uint64_t target_rate;    /* bytes/s to reach; 0 = none */
  uint64_t pack_threshold; /* small files packed below this; 0 = off */
  int compress;            /* enum spot_config_compress */
  int64_t level;           /* zstd level */
  /* multi-node jobs (validate fills them from SLURM_NODEID/SLURM_NNODES
   * when they were not given) */
  int64_t rank;
  int64_t nranks;
  uint64_t rank_wait_ms;
  char *run_id; /* multi-node: this run's id (NULL = from Slurm) */
  bool reshard; /* multi-node: restore every rank's files on a mismatch */
  /* the job lease (lib/io/lease.h; rank 0 only when nranks > 1) */
  uint64_t lease_ttl_ms;
  char *lease_wait;   /* "forever" or a duration: spot_config_lease_wait() */
  bool no_lease_wait; /* refuse at once when another node holds it */
  /* the daemon */
  char *socket;
  char *socket_group; /* group allowed on the socket besides root and our own */
  int log_level;      /* SPOT_LOG_ERR .. SPOT_LOG_DEBUG */
  char *metrics_file; /* NULL: none */
  uint64_t metrics_interval_ms; /* metrics file rewrite period */

  /* Set by spot_config_validate() from store: */
  char *bucket;
  char *prefix; /* without leading/trailing '/', "" when none */

  /* Private to config.c. */
  char *path_;
  unsigned char origin_[SPOT_CONFIG_MAX_KEYS];
  int line_[SPOT_CONFIG_MAX_KEYS];
};

/* restart-backoff's longest wait, unless restart-backoff is longer. */
#define SPOT_CONFIG_BACKOFF_CAP_MS ((uint64_t)300 * 1000)
/* The wait before restart k (1, 2, ...) of a failed trainer: base_ms,
 * doubled for each restart before it, at most SPOT_CONFIG_BACKOFF_CAP_MS
 * or base_ms when that is longer. Pure. */
uint64_t spot_config_restart_backoff_ms(uint64_t base_ms, unsigned k);

/* lease-wait in milliseconds: 0 = forever (the default). 0 or -EINVAL. */
int spot_config_lease_wait(const struct spot_config *cfg, uint64_t *ms);

/* A config holding the defaults, or NULL when out of memory. */
struct spot_config *spot_config_new(void);
void spot_config_free(struct spot_config *cfg);

/* Sets a key from the command line (origin CLI: the file won't override
 * it). key is the long option name without "--" ('_' accepted for '-');
 * value NULL means "true" for a boolean key and is an error otherwise.
 * Returns 0, -ENOENT (unknown key), -EINVAL (bad value), -ENOMEM; err
 * reads "--key: message". */
int spot_config_set(struct spot_config *cfg, const char *key, const char *value,
                    char *err, size_t errlen);

/* Loads PATH after checking it (see above). Returns 0, -EINVAL (content
 * errors), -EPERM (refused for its mode, owner or a credential in a
 * world-readable file), or the negative errno of open/read. */
int spot_config_load_file(struct spot_config *cfg, const char *path, char *err,
                          size_t errlen);
/* The same parser on a buffer, without the file checks (tests, fuzzing).
 * name is used in messages. world_readable makes a credential-looking key
 * refuse the whole buffer with -EPERM, as for a file. */
int spot_config_load_buffer(struct spot_config *cfg, const char *name,
                            const char *data, size_t len, bool world_readable,
                            char *err, size_t errlen);

enum spot_config_validate_flags {
  /* `spotd --config` without `-- CMD`: the command must come from the
   * config. */
  SPOT_CONFIG_NEED_COMMAND = 1 << 0,
};

/* Cross-field checks, after all loading: job and store set, store parses
 * (fills bucket and prefix), command and relaunch split, the socket path
 * fits sun_path. Fills the dynamic defaults: ckpt-dir from
 * $STATE_DIRECTORY (first entry) + "/ckpt" else "./spotd-ckpt", socket
 * from $RUNTIME_DIRECTORY + "/spotd.sock" else "./spotd.sock". Reports
 * every error, each prefixed by where the value came from ("PATH:LINE:",
 * "--key:" or the key name). Returns 0 or -EINVAL. */
int spot_config_validate(struct spot_config *cfg, unsigned flags, char *err,
                         size_t errlen);

/* Where a key's value came from; -ENOENT for an unknown key. */
int spot_config_origin(const struct spot_config *cfg, const char *key);

/* getopt_long support: writes one struct option per key (has_arg
 * required_argument, or optional_argument for booleans so `--imdsv1` alone
 * means true; val = SPOT_CONFIG_OPT_BASE + index), then the n_extra
 * caller's options, then the all-zero terminator. Returns the number of
 * entries written before the terminator, or -ENOBUFS when n is too small
 * (SPOT_CONFIG_MAX_KEYS + n_extra + 1 always suffices). */
int spot_config_build_options(struct option *opts, size_t n,
                              const struct option *extra, size_t n_extra);
/* The key for a getopt_long() return value, or NULL if it is not one of
 * ours. */
const char *spot_config_option_key(int val);

/* `--help` text: every option with its argument, help and default.
 * Appends to b; returns 0 or the spot_buf error. */
int spot_config_write_help(struct spot_buf *b);
/* A commented example file with every key and its default
 * (systemd/spotd.conf is this output). */
int spot_config_write_example(struct spot_buf *b);
/* The effective configuration as a config file, one `key = value` per
 * set key, after a "# from PATH:LINE: key" / "# from --key" comment when
 * not a default (values longer than a line are not wrapped). */
int spot_config_write_effective(const struct spot_config *cfg,
                                struct spot_buf *b);

/* Splits a command line the way `command =` is defined:
 * - words are separated by unquoted spaces and tabs;
 * - '...' is literal; "..." is literal except \" and \\;
 * - outside quotes a backslash takes the next character literally;
 * - quoted and unquoted pieces next to each other form one word, and ""
 *   is an empty word;
 * - there is no shell: no $VAR, ~, globs, pipes or redirections; the
 *   characters | & ; < > ( ) $ ` are refused unless quoted (use
 *   `sh -c '...'` if a shell is wanted).
 * On success *argv is a NULL-terminated malloc'ed vector (free it with
 * spot_config_free_args) and *argc its length (>= 1). Returns 0, -EINVAL
 * with a message (empty command, unterminated quote, trailing backslash,
 * shell syntax, more than SPOT_CONFIG_MAX_ARGS words) or -ENOMEM. */
int spot_config_split_args(const char *s, char ***argv, int *argc, char *err,
                           size_t errlen);
void spot_config_free_args(char **argv);

/* Names for the enums ("aws", "group", ...); "?" when out of range. */
const char *spot_config_provider_name(int provider);
const char *spot_config_signal_target_name(int target);
const char *spot_config_compress_name(int compress);
/* "USR1" for SIGUSR1, or the number in buf. */
const char *spot_config_signal_name(int signo, char *buf, size_t size);

#endif
