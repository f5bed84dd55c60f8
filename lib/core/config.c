/* The option table and its three readers: defaults, the INI file (inih)
 * and the command line. See config.h for the rules. */
#include "core/config.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <ini.h>

#include "core/codec.h"
#include "core/log.h"
#include "core/s3url.h"
#include "core/util.h"

enum type {
  T_STRING,
  T_INT,      /* int64_t in [min, max] */
  T_SIZE,     /* uint64_t bytes in [min, max], K/M/G suffixes */
  T_BOOL,     /* bool */
  T_ENUM,     /* int: the value of the matching enum_val */
  T_DURATION, /* uint64_t milliseconds in [min, max] */
  T_SIGNAL,   /* int signal number */
};

enum key_flags {
  F_REQUIRED = 1 << 0,  /* validate() insists */
  F_MULTILINE = 1 << 1, /* may continue on indented lines */
};

struct enum_val {
  const char *name;
  int value;
};

typedef int (*check_fn)(const char *v, char *err, size_t errlen);

struct key_def {
  const char *key;
  enum type type;
  size_t off;
  const char *metavar;
  const char *def;      /* default, as it would be written in the file */
  const char *def_help; /* shown when the default is computed elsewhere */
  const char *example;  /* example value for the example file */
  int64_t min, max;
  const struct enum_val *enums;
  check_fn check;
  unsigned flags;
  const char *help;
};

static const struct enum_val provider_vals[] = {
    {"auto", SPOT_CONFIG_PROVIDER_AUTO}, {"aws", SPOT_CONFIG_PROVIDER_AWS},
    {"gcp", SPOT_CONFIG_PROVIDER_GCP},   {"azure", SPOT_CONFIG_PROVIDER_AZURE},
    {"none", SPOT_CONFIG_PROVIDER_NONE}, {NULL, 0},
};

static const struct enum_val job_from_vals[] = {
    {"none", 0}, {"auto", 1}, {"aws-tag", 2}, {"gcp-metadata", 3}, {NULL, 0},
};

static const struct enum_val target_vals[] = {
    {"tree", SPOT_CONFIG_TARGET_TREE},
    {"group", SPOT_CONFIG_TARGET_TREE}, /* the name before the tree */
    {"leader", SPOT_CONFIG_TARGET_LEADER},
    {NULL, 0},
};

static const struct enum_val compress_vals[] = {
    {"auto", SPOT_CONFIG_COMPRESS_AUTO},
    {"zstd", SPOT_CONFIG_COMPRESS_ZSTD},
    {"none", SPOT_CONFIG_COMPRESS_NONE},
    {NULL, 0},
};

static const struct enum_val log_vals[] = {
    {"err", SPOT_LOG_ERR},       {"warning", SPOT_LOG_WARNING},
    {"notice", SPOT_LOG_NOTICE}, {"info", SPOT_LOG_INFO},
    {"debug", SPOT_LOG_DEBUG},   {NULL, 0},
};

/* Signals a trainer may be asked to checkpoint with. */
static const struct enum_val signal_vals[] = {
    {"USR1", SIGUSR1}, {"USR2", SIGUSR2},   {"HUP", SIGHUP},
    {"INT", SIGINT},   {"TERM", SIGTERM},   {"QUIT", SIGQUIT},
    {"ALRM", SIGALRM}, {"WINCH", SIGWINCH}, {"URG", SIGURG},
    {"PWR", SIGPWR},   {"CONT", SIGCONT},   {NULL, 0},
};

static int check_job(const char *v, char *err, size_t errlen);
static int check_store(const char *v, char *err, size_t errlen);
static int check_url(const char *v, char *err, size_t errlen);
static int check_args(const char *v, char *err, size_t errlen);
static int check_region(const char *v, char *err, size_t errlen);
static int check_group(const char *v, char *err, size_t errlen);
static int check_lease_wait(const char *v, char *err, size_t errlen);

#define OFF(f) offsetof(struct spot_config, f)
#define MS(s) ((int64_t)(s)*1000)
#define MIB(n) ((int64_t)(n) << 20)

/* The table. Order is the order of --help and of the example file. */
static const struct key_def keys[] = {
    {"job", T_STRING, OFF(job), "ID", NULL, NULL, "my-job", 0, 0, NULL,
     check_job, F_REQUIRED,
     "Job identity; names the job's folder in the store (1 to 128 letters, "
     "digits, '.', '_' or '-')."},
    {"store", T_STRING, OFF(store), "s3://BUCKET/PREFIX", NULL, NULL,
     "s3://my-bucket/spotd", 0, 0, NULL, check_store, F_REQUIRED,
     "Where checkpoints go; the job root is PREFIX/JOB."},
    {"job-from", T_ENUM, OFF(job_from), NULL, "none", NULL, NULL, 0, 0,
     job_from_vals, NULL, 0,
     "Take job and store (when not given) from this instance's metadata "
     "before starting: the instance tags spotd-job and spotd-store in "
     "AWS IMDS (aws-tag), the GCE instance attributes of those names "
     "(gcp-metadata), or whichever answers (auto)."},
    {"command", T_STRING, OFF(command), "CMD", NULL, "none",
     "python3 train.py --lr 0.1", 0, 0, NULL, check_args, F_MULTILINE,
     "The training command for `spotd --config` (`spotd run -- CMD` "
     "overrides it). Split into words like a shell without expansions: "
     "spaces separate words, '...' and \"...\" quote, a backslash escapes "
     "the next character; | & ; < > ( ) $ ` must be quoted (use "
     "sh -c '...' for a shell). Long commands continue on indented lines."},
    {"provider", T_ENUM, OFF(provider), NULL, "auto", NULL, NULL, 0, 0,
     provider_vals, NULL, 0, "Which interruption notice to watch."},
    {"metadata-url", T_STRING, OFF(metadata_url), "URL", NULL, "the provider's",
     "http://169.254.169.254", 0, 0, NULL, check_url, 0,
     "Base URL of the metadata service (emulators, tests)."},
    {"poll-interval", T_DURATION, OFF(poll_interval_ms), "SEC", "1", NULL, NULL,
     100, MS(3600), NULL, NULL, 0,
     "Metadata poll period (GCP uses a long poll). Seconds, or a number "
     "with a unit: 500ms, 2s, 1m."},
    {"imdsv1", T_BOOL, OFF(imdsv1), NULL, "false", NULL, NULL, 0, 0, NULL, NULL,
     0,
     "AWS: fall back to IMDSv1 (no session token) when IMDSv2 is "
     "unavailable."},
    {"vm-name", T_STRING, OFF(vm_name), "NAME", NULL,
     "asked from the metadata service", "my-vm", 0, 0, NULL, NULL, 0,
     "Azure: this VM's name in scheduled events."},
    {"ckpt-dir", T_STRING, OFF(ckpt_dir), "DIR", NULL,
     "$STATE_DIRECTORY/ckpt or ./spotd-ckpt", "/var/lib/spotd/ckpt", 0, 0, NULL,
     NULL, 0,
     "Where the trainer writes checkpoints (SPOTD_CKPT_DIR), one "
     "subdirectory each."},
    {"interval", T_DURATION, OFF(interval_ms), "SEC", "600", NULL, NULL, 0,
     MS(30 * 86400), NULL, NULL, 0,
     "Ask for a checkpoint this often even without a notice (0 = never)."},
    {"signal", T_SIGNAL, OFF(signal), "SIG", "RTMIN+4", NULL, NULL, 0, 0, NULL,
     NULL, 0,
     "Signal asking a trainer without the Python helper to checkpoint "
     "(exported as SPOTD_SIGNAL, a number): RTMIN+N, RTMAX-N, USR1, USR2, "
     "HUP, INT, TERM, QUIT, ALRM, WINCH, URG, PWR, CONT (SIG prefix "
     "optional) or a number; never KILL or STOP. Only processes that catch "
     "it get it."},
    {"signal-target", T_ENUM, OFF(signal_target), NULL, "tree", NULL, NULL, 0,
     0, target_vals, NULL, 0,
     "Send the signal to every process of the trainer's tree that catches "
     "it (tree; group is the same), or only to the command spotd started "
     "(leader)."},
    {"ckpt-timeout", T_DURATION, OFF(ckpt_timeout_ms), "SEC", "1800", NULL,
     NULL, 0, MS(7 * 86400), NULL, NULL, 0,
     "Stop waiting for a requested periodic checkpoint after this long and "
     "warn; 0 waits forever. After a notice its deadline rules instead."},
    {"grace", T_DURATION, OFF(grace_ms), "SEC", "10", NULL, NULL, 0, MS(3600),
     NULL, NULL, 0,
     "Time between SIGTERM and SIGKILL when stopping the trainer; cut short "
     "to end before a notice's deadline."},
    {"max-restarts", T_INT, OFF(max_restarts), "N", "0", NULL, NULL, 0, 1000,
     NULL, NULL, 0,
     "Start the trainer again when it fails on its own (a non-zero status "
     "or a signal, not during a stop), at most N times, each from the "
     "newest committed checkpoint; then exit 70. 0: spotd exits with the "
     "trainer's status. One node only (nranks 1)."},
    {"restart-backoff", T_DURATION, OFF(restart_backoff_ms), "SEC", "10", NULL,
     NULL, 0, MS(3600), NULL, NULL, 0,
     "Wait before restarting a failed trainer: SEC before the first "
     "restart, twice the previous wait before each next one, at most 300 s "
     "(or SEC when it is longer)."},
    {"relaunch", T_STRING, OFF(relaunch), "CMD", NULL, "none",
     "spotctl relaunch --backend slurm", 0, 0, NULL, check_args, F_MULTILINE,
     "Run after the final checkpoint is committed, with SPOTD_JOB, "
     "SPOTD_STORE, SPOTD_CHECKPOINT, SPOTD_REASON and SPOTD_DEADLINE set. "
     "Split like command."},
    {"restore", T_BOOL, OFF(restore), NULL, "true", NULL, NULL, 0, 0, NULL,
     NULL, 0,
     "Restore the newest committed checkpoint before launching the "
     "trainer (SPOTD_RESUME_DIR)."},
    {"overlap", T_BOOL, OFF(overlap), NULL, "true", NULL, NULL, 0, 0, NULL,
     NULL, 0,
     "Upload the files of a checkpoint spotd asked for while the trainer "
     "still writes it (each once it stops changing); the commit still waits "
     "for SPOTD_COMPLETE and uploads again what changed since. false: upload "
     "only after the marker (trainers that rewrite files in place)."},
    {"dedup", T_BOOL, OFF(dedup), NULL, "false", NULL, NULL, 0, 0, NULL, NULL,
     0,
     "Upload only the bytes that changed since the job's newest checkpoint: "
     "files are stored in frames of 1 MiB with their SHA-256, and a frame "
     "LATEST's checkpoint already holds is referenced, not sent (a "
     "fine-tune with a frozen base). Single node; a checkpoint is then "
     "uploaded once complete (no overlap). false: every checkpoint is "
     "uploaded whole."},
    {"follow-symlinks", T_BOOL, OFF(follow_symlinks), NULL, "false", NULL, NULL,
     0, 0, NULL, NULL, 0,
     "Upload the regular file a symlink in a checkpoint points to when the "
     "link leaves the checkpoint folder (an absolute link, or ../ out of "
     "it). false: such a checkpoint is never committed, with one line "
     "naming the link; relative links inside the folder are stored as "
     "links either way."},
    {"keep", T_INT, OFF(keep), "N", "3", NULL, NULL, 1, 10000, NULL, NULL, 0,
     "Committed checkpoints kept in the store."},
    {"keep-local", T_INT, OFF(keep_local), "N", "1", NULL, NULL, 1, 10000, NULL,
     NULL, 0,
     "Checkpoints kept in the checkpoint folder: the newest committed and "
     "the N-1 newest before it. Each takes its full size on the local "
     "disk."},
    {"endpoint", T_STRING, OFF(endpoint), "URL", NULL,
     "AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, or the regional AWS endpoint",
     "http://127.0.0.1:7480", 0, 0, NULL, check_url, 0,
     "S3 endpoint. Path-style addressing is used for custom endpoints; TLS "
     "is always verified for https."},
    {"region", T_STRING, OFF(region), "REGION", NULL,
     "AWS_REGION, AWS_DEFAULT_REGION, the profile, or IMDS", "us-east-1", 0, 0,
     NULL, check_region, 0, "S3 region (signing)."},
    {"part-size", T_SIZE, OFF(part_size), "SIZE", "16M", NULL, NULL,
     (int64_t)SPOT_PART_MIN, (int64_t)SPOT_PART_MAX, NULL, NULL, 0,
     "Multipart part size, one zstd frame each (K, M, G suffixes; 5M to "
     "128M, a multiple of 4K)."},
    {"parallel", T_INT, OFF(parallel), "N", "0", NULL, NULL, 0, 64, NULL, NULL,
     0,
     "Transfers in flight: 0 = adaptive (more while the throughput grows, "
     "fewer on 503 SlowDown, within memory; an upload after a notice starts "
     "at 32, a periodic one at 4); N = exactly N. Compressing threads are "
     "one per core (at most 64, within memory) either way."},
    {"memory", T_SIZE, OFF(memory), "SIZE", "1G", NULL, NULL,
     (int64_t)SPOT_MEMORY_MIN, (int64_t)1 << 40, NULL, NULL, 0,
     "Budget of part buffers for one upload or restore (K, M, G suffixes): "
     "the compressing threads' parts and one compressed part per transfer "
     "in flight. The default suits a training node (well under 1 % of its "
     "RAM); what does not fit lowers the transfers in flight."},
    {"target-rate", T_SIZE, OFF(target_rate), "RATE", "0", NULL, NULL, 0,
     (int64_t)1 << 40, NULL, NULL, 0,
     "Bytes per second an upload or restore aims at (K, M, G suffixes: "
     "500M = 500 MiB/s; 0 = as fast as it goes): no more transfers once "
     "reached, e.g. to leave the NIC to training."},
    {"pack-threshold", T_SIZE, OFF(pack_threshold), "SIZE", "1M", NULL, NULL, 0,
     (int64_t)SPOT_PART_MAX, NULL, NULL, 0,
     "Files smaller than this (and than a part) are packed together into "
     "a few objects (0 = one object per file)."},
    {"compress", T_ENUM, OFF(compress), NULL, "auto", NULL, NULL, 0, 0,
     compress_vals, NULL, 0,
     "auto: zstd, with byte grouping for float tensors where it pays; "
     "zstd: zstd only; none: stored in raw zstd blocks (already compressed "
     "data)."},
    {"level", T_INT, OFF(level), "N", "1", NULL, NULL, -1000, 19, NULL, NULL, 0,
     "zstd level (-1000 to 19; 1 suits checkpoints, negative is faster)."},
    {"rank", T_INT, OFF(rank), "K", "0", NULL, NULL, 0, 1023, NULL, NULL, 0,
     "Multi-node jobs: this node's rank, 0 to nranks - 1 ($SLURM_NODEID "
     "inside an srun job step when the key is not given; else, with "
     "$SPOTD_NRANKS set, $SPOTD_RANK or $JOB_COMPLETION_INDEX)."},
    {"nranks", T_INT, OFF(nranks), "N", "1", NULL, NULL, 1, 1024, NULL, NULL, 0,
     "Multi-node jobs: nodes running one spotd each and sharing job and "
     "store ($SLURM_STEP_NUM_NODES inside an srun job step when the key is "
     "not given, else $SPOTD_NRANKS; a batch script is one node). With more "
     "than 1, each rank uploads its files under rank-K/ and rank 0 commits "
     "once every rank's part is in the store."},
    {"rank-wait", T_DURATION, OFF(rank_wait_ms), "SEC", "60", NULL, NULL, 100,
     MS(86400), NULL, NULL, 0,
     "Multi-node jobs: how long rank 0 waits for the other ranks' parts, "
     "and the others for rank 0's commit."},
    {"run-id", T_STRING, OFF(run_id), "ID", NULL,
     "$SLURM_JOB_ID.$SLURM_RESTART_COUNT, else the RESTARTS count", "42.1", 0,
     0, NULL, NULL, 0,
     "Multi-node jobs: names this run of the job (the same on every rank) "
     "for the job-wide notice and the relaunch-once marker; a requeued run "
     "needs a new one."},
    {"reshard", T_BOOL, OFF(reshard), NULL, "false", NULL, NULL, 0, 0, NULL,
     NULL, 0,
     "Multi-node jobs: when the newest commit was made by another number of "
     "ranks, restore every rank's files into each node instead of refusing "
     "to start."},
    {"lease-ttl", T_DURATION, OFF(lease_ttl_ms), "SEC", "60", NULL, NULL, MS(3),
     MS(3600), NULL, NULL, 0,
     "The job lease's lifetime: spotd renews it every third of this while "
     "it runs; a node that died without releasing it is taken over this "
     "long after its last renewal."},
    {"lease-wait", T_STRING, OFF(lease_wait), "SEC|forever", NULL, "forever",
     "forever", 0, 0, NULL, check_lease_wait, 0,
     "How long to wait for the job lease another node holds before giving "
     "up (exit 69); `spotctl status` names the holder meanwhile."},
    {"no-lease-wait", T_BOOL, OFF(no_lease_wait), NULL, "false", NULL, NULL, 0,
     0, NULL, NULL, 0,
     "Refuse at once (exit 69, naming the holder and its expiry) when "
     "another node holds the job lease."},
    {"socket", T_STRING, OFF(socket), "PATH", NULL,
     "$RUNTIME_DIRECTORY/spotd.sock or ./spotd.sock", "/run/spotd/spotd.sock",
     0, 0, NULL, NULL, 0, "Control socket (spotctl), mode 0660."},
    {"socket-group", T_STRING, OFF(socket_group), "GROUP", NULL, "none",
     "spotd", 0, 0, NULL, check_group, 0,
     "Group whose members may use the control socket, besides root and "
     "spotd's own user and group."},
    {"log-level", T_ENUM, OFF(log_level), NULL, "info", NULL, NULL, 0, 0,
     log_vals, NULL, 0, "Most verbose level logged."},
    {"metrics-file", T_STRING, OFF(metrics_file), "PATH", NULL, "none",
     "/var/lib/prometheus/node-exporter/spotd.prom", 0, 0, NULL, NULL, 0,
     "Prometheus text file (node_exporter's textfile collector) spotd "
     "rewrites atomically every metrics-interval and at exit."},
    {"metrics-interval", T_DURATION, OFF(metrics_interval_ms), "SEC", "15",
     NULL, NULL, 100, MS(3600), NULL, NULL, 0,
     "How often the metrics file is rewritten."},
};

#define N_KEYS (sizeof(keys) / sizeof(keys[0]))
_Static_assert(sizeof(keys) / sizeof(keys[0]) <= SPOT_CONFIG_MAX_KEYS,
               "raise SPOT_CONFIG_MAX_KEYS");

union value {
  int64_t i;
  uint64_t u;
  bool b;
  int e;
};

/* ---- error collection ------------------------------------------------ */

struct errs {
  char *buf;
  size_t size;
  size_t len;
  int n;
  int dropped;
};

#define ERRS_RESERVE 32 /* room kept for "\n(N more errors)" */

static void
errs_init(struct errs *e, char *buf, size_t size)
{
  e->buf = buf;
  e->size = size;
  e->len = 0;
  e->n = 0;
  e->dropped = 0;
  if (buf != NULL && size > 0)
    buf[0] = '\0';
}

static void __attribute__((format(printf, 2, 3)))
errs_add(struct errs *e, const char *fmt, ...)
{
  char line[600];
  size_t n, need;
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  e->n++;
  if (e->buf == NULL || e->size == 0) {
    e->dropped++;
    return;
  }
  n = strlen(line);
  need = (e->len > 0 ? 1 : 0) + n + 1;
  if (e->len + need + ERRS_RESERVE > e->size && e->len > 0) {
    e->dropped++;
    return;
  }
  if (e->len > 0)
    e->buf[e->len++] = '\n';
  /* The first message always goes in, truncated if need be. */
  e->len += spot_strlcpy(e->buf + e->len, line, e->size - e->len);
  if (e->len >= e->size)
    e->len = e->size - 1;
}

static void
errs_finish(struct errs *e)
{
  if (e->dropped > 0 && e->buf != NULL && e->len > 0 &&
      e->len + ERRS_RESERVE <= e->size)
    snprintf(e->buf + e->len, e->size - e->len, "\n(%d more errors)",
             e->dropped);
}

static int __attribute__((format(printf, 3, 4)))
fail(char *err, size_t errlen, const char *fmt, ...)
{
  va_list ap;

  va_start(ap, fmt);
  spot_vset_err(err, errlen, fmt, ap);
  va_end(ap);
  return -EINVAL;
}

/* ---- value checks ---------------------------------------------------- */

static int
check_job(const char *v, char *err, size_t errlen)
{
  return spot_s3_url_check_job(v, err, errlen);
}

static int
check_store(const char *v, char *err, size_t errlen)
{
  char *b, *p;
  int r = spot_s3_url_parse(v, &b, &p, err, errlen);

  if (r < 0)
    return r;
  free(b);
  free(p);
  return 0;
}

static int
check_url(const char *v, char *err, size_t errlen)
{
  const char *host, *end;

  if (strncmp(v, "http://", 7) == 0)
    host = v + 7;
  else if (strncmp(v, "https://", 8) == 0)
    host = v + 8;
  else
    return fail(err, errlen, "'%.200s' is not an http:// or https:// URL", v);
  end = host + strcspn(host, "/?#");
  if (end == host)
    return fail(err, errlen, "'%.200s' has no host", v);
  if (memchr(host, '@', (size_t)(end - host)) != NULL)
    return fail(err, errlen,
                "credentials in URLs are not accepted; spotd "
                "uses the instance role, the AWS_* environment, ~/.aws or "
                "LoadCredential=");
  for (const char *p = v; *p != '\0'; p++)
    if (isspace((unsigned char)*p))
      return fail(err, errlen, "URL contains whitespace");
  return 0;
}

static int
check_args(const char *v, char *err, size_t errlen)
{
  char **argv = NULL;
  int argc;
  int r = spot_config_split_args(v, &argv, &argc, err, errlen);

  if (r < 0)
    return r;
  spot_config_free_args(argv);
  return 0;
}

static int
check_region(const char *v, char *err, size_t errlen)
{
  size_t n = strlen(v);

  if (n > 64)
    return fail(err, errlen, "region longer than 64 characters");
  for (size_t i = 0; i < n; i++)
    if (!((v[i] >= 'a' && v[i] <= 'z') || (v[i] >= '0' && v[i] <= '9') ||
          v[i] == '-'))
      return fail(err, errlen, "region '%s' may only contain a-z, 0-9 and '-'",
                  v);
  return 0;
}

static int
check_group(const char *v, char *err, size_t errlen)
{
  size_t n = strlen(v);

  if (n > 32)
    return fail(err, errlen, "group name longer than 32 characters");
  for (size_t i = 0; i < n; i++)
    if (!(isalnum((unsigned char)v[i]) || v[i] == '_' || v[i] == '-' ||
          v[i] == '.'))
      return fail(err, errlen, "'%s' is not a valid group name", v);
  return 0;
}

/* ---- parsing values -------------------------------------------------- */

static const struct key_def *
find_key(const char *name, size_t *idx)
{
  char norm[64];
  size_t n = strlen(name);

  if (n >= sizeof(norm))
    return NULL;
  for (size_t i = 0; i <= n; i++)
    norm[i] = name[i] == '_' ? '-' : (char)tolower((unsigned char)name[i]);
  for (size_t i = 0; i < N_KEYS; i++)
    if (strcmp(keys[i].key, norm) == 0) {
      if (idx != NULL)
        *idx = i;
      return &keys[i];
    }
  return NULL;
}

/* Keys that look like credentials: refused with a pointer to where
 * credentials do belong. */
static bool
looks_secret(const char *name)
{
  static const char *const words[] = {
      "secret",     "password",  "passwd", "token",       "credential",
      "access-key", "accesskey", "key-id", "private-key", "api-key",
  };
  char norm[128];
  size_t n = strlen(name);

  if (n >= sizeof(norm))
    n = sizeof(norm) - 1;
  for (size_t i = 0; i < n; i++)
    norm[i] = name[i] == '_' ? '-' : (char)tolower((unsigned char)name[i]);
  norm[n] = '\0';
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(words); i++)
    if (strstr(norm, words[i]) != NULL)
      return true;
  return false;
}

static int
parse_bool(const char *v, bool *out)
{
  static const char *const yes[] = {"true", "yes", "on", "1"};
  static const char *const no[] = {"false", "no", "off", "0"};

  for (size_t i = 0; i < SPOT_ARRAY_SIZE(yes); i++) {
    if (strcasecmp(v, yes[i]) == 0) {
      *out = true;
      return 0;
    }
    if (strcasecmp(v, no[i]) == 0) {
      *out = false;
      return 0;
    }
  }
  return -EINVAL;
}

/* "90", "90s", "500ms", "5m", "2h", "1d" -> milliseconds. */
static int
parse_duration(const char *v, uint64_t *out)
{
  char *end;
  unsigned long long n;
  uint64_t mult;

  if (*v < '0' || *v > '9')
    return -EINVAL;
  errno = 0;
  n = strtoull(v, &end, 10);
  if (errno == ERANGE)
    return -ERANGE;
  if (*end == '\0' || strcmp(end, "s") == 0)
    mult = 1000;
  else if (strcmp(end, "ms") == 0)
    mult = 1;
  else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0)
    mult = 60 * 1000;
  else if (strcmp(end, "h") == 0)
    mult = 3600 * 1000;
  else if (strcmp(end, "d") == 0)
    mult = 86400 * 1000;
  else
    return -EINVAL;
  if (n > UINT64_MAX / mult)
    return -ERANGE;
  *out = n * mult;
  return 0;
}

static void
fmt_duration(uint64_t ms, char *buf, size_t size)
{
  if (ms == 0)
    snprintf(buf, size, "0");
  else if (ms % 86400000 == 0)
    snprintf(buf, size, "%" PRIu64 "d", ms / 86400000);
  else if (ms % 3600000 == 0)
    snprintf(buf, size, "%" PRIu64 "h", ms / 3600000);
  else if (ms % 60000 == 0)
    snprintf(buf, size, "%" PRIu64 "m", ms / 60000);
  else if (ms % 1000 == 0)
    snprintf(buf, size, "%" PRIu64 "s", ms / 1000);
  else
    snprintf(buf, size, "%" PRIu64 "ms", ms);
}

static void
fmt_size(uint64_t n, char *buf, size_t size)
{
  if (n != 0 && n % (1u << 30) == 0)
    snprintf(buf, size, "%" PRIu64 "G", n >> 30);
  else if (n != 0 && n % (1u << 20) == 0)
    snprintf(buf, size, "%" PRIu64 "M", n >> 20);
  else if (n != 0 && n % 1024 == 0)
    snprintf(buf, size, "%" PRIu64 "K", n >> 10);
  else
    snprintf(buf, size, "%" PRIu64, n);
}

static int
parse_signal(const char *v, int *out)
{
  const char *name = v;
  int64_t n;

  if (spot_parse_int64(v, 1, SIGRTMAX, &n) == 0) {
    if (n == SIGKILL || n == SIGSTOP)
      return -EINVAL;
    *out = (int)n;
    return 0;
  }
  if (strncasecmp(name, "SIG", 3) == 0)
    name += 3;
  if (strncasecmp(name, "RTMIN", 5) == 0 ||
      strncasecmp(name, "RTMAX", 5) == 0) {
    bool min = strncasecmp(name, "RTMIN", 5) == 0;
    const char *off = name + 5;

    n = 0;
    if (*off != '\0' &&
        (*off != (min ? '+' : '-') || spot_parse_int64(off + 1, 0, 64, &n) < 0))
      return -EINVAL;
    n = min ? SIGRTMIN + n : SIGRTMAX - n;
    if (n < SIGRTMIN || n > SIGRTMAX)
      return -EINVAL;
    *out = (int)n;
    return 0;
  }
  for (size_t i = 0; signal_vals[i].name != NULL; i++)
    if (strcasecmp(name, signal_vals[i].name) == 0) {
      *out = signal_vals[i].value;
      return 0;
    }
  return -EINVAL;
}

static void
enum_list(const struct enum_val *ev, char *buf, size_t size)
{
  size_t len = 0;

  buf[0] = '\0';
  for (size_t i = 0; ev[i].name != NULL && len < size; i++)
    len += (size_t)snprintf(buf + len, size - len, "%s%s", i > 0 ? "|" : "",
                            ev[i].name);
}

/* Parses v for k into *out. A T_STRING is only checked: set_value() copies
 * it. Message without any location prefix in err. */
static int
parse_value(const struct key_def *k, const char *v, union value *out, char *err,
            size_t errlen)
{
  char a[32], b[32];
  int r;

  if (v == NULL) {
    if (k->type != T_BOOL)
      return fail(err, errlen, "needs a value");
    out->b = true;
    return 0;
  }
  if (strlen(v) > SPOT_CONFIG_MAX_VALUE)
    return fail(err, errlen, "value longer than %d bytes",
                SPOT_CONFIG_MAX_VALUE);
  for (const char *p = v; *p != '\0'; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      return fail(err, errlen, "control character in the value");
  if (*v == '\0' && k->type != T_STRING)
    return fail(err, errlen, "empty value");

  switch (k->type) {
  case T_STRING:
    if (*v != '\0' && k->check != NULL) {
      r = k->check(v, err, errlen);
      if (r < 0)
        return r;
    }
    return 0;
  case T_INT:
    if (spot_parse_int64(v, k->min, k->max, &out->i) < 0)
      return fail(err, errlen,
                  "'%.64s' is not an integer between %" PRId64 " and %" PRId64,
                  v, k->min, k->max);
    return 0;
  case T_SIZE:
    if (spot_parse_size(v, &out->u) < 0 || out->u < (uint64_t)k->min ||
        out->u > (uint64_t)k->max) {
      fmt_size((uint64_t)k->min, a, sizeof(a));
      fmt_size((uint64_t)k->max, b, sizeof(b));
      return fail(err, errlen,
                  "'%.64s' is not a size between %s and %s (K, M, G "
                  "suffixes)",
                  v, a, b);
    }
    return 0;
  case T_BOOL:
    if (parse_bool(v, &out->b) < 0)
      return fail(err, errlen,
                  "'%.64s' is not a boolean (true/false, yes/no, on/off, "
                  "1/0)",
                  v);
    return 0;
  case T_ENUM:
    for (size_t i = 0; k->enums[i].name != NULL; i++)
      if (strcmp(v, k->enums[i].name) == 0) {
        out->e = k->enums[i].value;
        return 0;
      }
    {
      char list[128];
      enum_list(k->enums, list, sizeof(list));
      return fail(err, errlen, "'%.64s' is not one of %s", v, list);
    }
  case T_DURATION:
    if (parse_duration(v, &out->u) < 0 || out->u < (uint64_t)k->min ||
        out->u > (uint64_t)k->max) {
      fmt_duration((uint64_t)k->min, a, sizeof(a));
      fmt_duration((uint64_t)k->max, b, sizeof(b));
      return fail(err, errlen,
                  "'%.64s' is not a duration between %s and %s (seconds, "
                  "or a number with ms, s, m, h or d)",
                  v, a, b);
    }
    return 0;
  case T_SIGNAL:
    if (parse_signal(v, &out->e) < 0)
      return fail(err, errlen,
                  "'%.64s' is not a usable signal (RTMIN+N, USR1, USR2, "
                  "HUP, INT, TERM, ... or a number; not KILL or STOP)",
                  v);
    return 0;
  }
  return fail(err, errlen, "internal error: bad type");
}

static void
assign(struct spot_config *cfg, const struct key_def *k, union value *v)
{
  char *field = (char *)cfg + k->off;

  switch (k->type) {
  case T_STRING: /* stored by set_value() */
    break;
  case T_INT:
    *(int64_t *)(void *)field = v->i;
    break;
  case T_SIZE:
  case T_DURATION:
    *(uint64_t *)(void *)field = v->u;
    break;
  case T_BOOL:
    *(bool *)(void *)field = v->b;
    break;
  case T_ENUM:
  case T_SIGNAL:
    *(int *)(void *)field = v->e;
    break;
  }
}

/* Parses and, when apply, stores with the given origin and line. */
static int
set_value(struct spot_config *cfg, size_t idx, const char *v, bool apply,
          int origin, int line, char *err, size_t errlen)
{
  const struct key_def *k = &keys[idx];
  union value val;
  int r;

  memset(&val, 0, sizeof(val));
  r = parse_value(k, v, &val, err, errlen);
  if (r < 0 || !apply)
    return r;
  /* A string is copied only when it is stored, and in the same place, so
   * that the copy has one visible owner. */
  if (k->type == T_STRING) {
    char **sp = (char **)(void *)((char *)cfg + k->off);
    char *copy = NULL;

    if (v != NULL && *v != '\0') {
      copy = strdup(v);
      if (copy == NULL)
        return -ENOMEM;
    }
    free(*sp);
    *sp = copy;
  } else {
    assign(cfg, k, &val);
  }
  cfg->origin_[idx] = (unsigned char)origin;
  cfg->line_[idx] = line;
  return 0;
}

/* ---- new / free / set ------------------------------------------------ */

struct spot_config *
spot_config_new(void)
{
  struct spot_config *cfg = calloc(1, sizeof(*cfg));
  char err[256];

  if (cfg == NULL)
    return NULL;
  for (size_t i = 0; i < N_KEYS; i++) {
    if (keys[i].def == NULL)
      continue;
    if (set_value(cfg, i, keys[i].def, true, SPOT_CONFIG_ORIGIN_DEFAULT, 0, err,
                  sizeof(err)) < 0) {
      /* Only strings allocate, and no string has a table default. */
      assert(!"bad default in the config table");
      spot_config_free(cfg);
      return NULL;
    }
  }
  return cfg;
}

void
spot_config_free(struct spot_config *cfg)
{
  if (cfg == NULL)
    return;
  for (size_t i = 0; i < N_KEYS; i++)
    if (keys[i].type == T_STRING)
      free(*(char **)(void *)((char *)cfg + keys[i].off));
  free(cfg->bucket);
  free(cfg->prefix);
  free(cfg->path_);
  free(cfg);
}

int
spot_config_set(struct spot_config *cfg, const char *key, const char *value,
                char *err, size_t errlen)
{
  char msg[512];
  size_t idx;
  int r;

  if (find_key(key, &idx) == NULL) {
    fail(err, errlen, "--%.64s: unknown option", key);
    return -ENOENT;
  }
  r = set_value(cfg, idx, value, true, SPOT_CONFIG_ORIGIN_CLI, 0, msg,
                sizeof(msg));
  if (r < 0)
    fail(err, errlen, "--%s: %s", keys[idx].key, msg);
  return r;
}

int
spot_config_origin(const struct spot_config *cfg, const char *key)
{
  size_t idx;

  if (find_key(key, &idx) == NULL)
    return -ENOENT;
  return cfg->origin_[idx];
}

/* ---- the file -------------------------------------------------------- */

enum line_kind {
  L_BLANK,
  L_COMMENT,
  L_SECTION,
  L_KEY,
  L_CONT,
  L_ERROR,
};

struct load {
  struct spot_config *cfg;
  const char *name;
  const char *p, *end;
  int lineno;
  enum line_kind kind;
  bool in_spotd;     /* current section is [spotd] */
  bool prev_key;     /* mirrors inih's prev_name: continuation possible */
  bool outside_told; /* "keys before [spotd]" reported once */
  bool world_readable;
  int secret_line;                /* first credential-looking key, 0 = none */
  int seen[SPOT_CONFIG_MAX_KEYS]; /* line of each key in this file */
  /* The key being read; applied when the next key, section or EOF comes,
   * so continuation lines are joined first. */
  long pending_idx; /* -1 = none, -2 = a bad key (ignore continuations) */
  int pending_line;
  struct spot_buf pending;
  struct errs *errs;
};

static const char *
skip_ws(const char *s)
{
  while (*s != '\0' && isspace((unsigned char)*s))
    s++;
  return s;
}

static void
flush_pending(struct load *ld)
{
  size_t idx;
  char msg[512];
  bool apply;

  if (ld->pending_idx < 0) {
    ld->pending_idx = -1;
    return;
  }
  idx = (size_t)ld->pending_idx;
  ld->pending_idx = -1;
  if (ld->pending.len > SPOT_CONFIG_MAX_VALUE) {
    errs_add(ld->errs, "%s:%d: %s: value longer than %d bytes", ld->name,
             ld->pending_line, keys[idx].key, SPOT_CONFIG_MAX_VALUE);
    return;
  }
  /* The command line wins: still check the value, but keep the CLI's. */
  apply = ld->cfg->origin_[idx] != SPOT_CONFIG_ORIGIN_CLI;
  if (set_value(ld->cfg, idx, spot_buf_str(&ld->pending), apply,
                SPOT_CONFIG_ORIGIN_FILE, ld->pending_line, msg,
                sizeof(msg)) < 0)
    errs_add(ld->errs, "%s:%d: %s: %s", ld->name, ld->pending_line,
             keys[idx].key, msg);
}

/* Classifies the physical line the way inih will read it (inih does not
 * tell us line numbers nor report most syntax errors by itself). */
static void
classify(struct load *ld, const char *line)
{
  const char *start = skip_ws(line);

  if (*start == '\0') {
    ld->kind = L_BLANK;
  } else if (*start == '#' || *start == ';') {
    ld->kind = L_COMMENT;
  } else if (ld->prev_key && start > line) {
    ld->kind = L_CONT;
  } else if (*start == '[') {
    const char *close = strchr(start + 1, ']');
    flush_pending(ld);
    ld->in_spotd = false;
    if (close == NULL) {
      ld->kind = L_ERROR;
      errs_add(ld->errs, "%s:%d: unterminated section header", ld->name,
               ld->lineno);
      return;
    }
    ld->kind = L_SECTION;
    ld->prev_key = false;
    /* inih ignores it; we don't, but go on checking the section's keys. */
    if (*skip_ws(close + 1) != '\0')
      errs_add(ld->errs, "%s:%d: unexpected text after the section header",
               ld->name, ld->lineno);
    if ((size_t)(close - start - 1) == 5 && strncmp(start + 1, "spotd", 5) == 0)
      ld->in_spotd = true;
    else
      errs_add(ld->errs,
               "%s:%d: unknown section [%.*s] (spotd reads only [spotd])",
               ld->name, ld->lineno, (int)(close - start - 1), start + 1);
  } else {
    const char *eq = start + strcspn(start, "=:");
    flush_pending(ld);
    if (*eq == '\0') {
      ld->kind = L_ERROR;
      errs_add(ld->errs, "%s:%d: expected 'key = value'", ld->name, ld->lineno);
      return;
    }
    ld->kind = L_KEY;
    /* inih remembers the name only when it is not empty. */
    ld->prev_key = eq > start;
  }
}

/* fgets-like reader handing inih one physical line at a time. */
static char *
read_line_cb(char *str, int num, void *stream)
{
  struct load *ld = stream;
  const char *nl;
  size_t len;
  const char *line = ld->p;

  if (ld->p >= ld->end)
    return NULL;
  nl = memchr(ld->p, '\n', (size_t)(ld->end - ld->p));
  len = nl != NULL ? (size_t)(nl - ld->p) : (size_t)(ld->end - ld->p);
  ld->p = nl != NULL ? nl + 1 : ld->end;
  ld->lineno++;
  if (len > 0 && line[len - 1] == '\r')
    len--;
  if (ld->lineno == 1 && len >= 3 && memcmp(line, "\xef\xbb\xbf", 3) == 0) {
    line += 3;
    len -= 3;
  }
  if (num < 3)
    return NULL;
  if (len + 2 > (size_t)num || len > SPOT_CONFIG_MAX_LINE) {
    errs_add(ld->errs,
             "%s:%d: line longer than %d bytes (continue long command or "
             "relaunch values on indented lines)",
             ld->name, ld->lineno, SPOT_CONFIG_MAX_LINE);
    ld->kind = L_ERROR;
    /* A comment keeps inih's continuation state as it was. */
    str[0] = '#';
    str[1] = '\n';
    str[2] = '\0';
    return str;
  }
  memcpy(str, line, len);
  str[len] = '\0';
  classify(ld, str);
  str[len + 1] = '\0';
  str[len] = '\n';
  return str;
}

static int
ini_handler_cb(void *user, const char *section, const char *name,
               const char *value)
{
  struct load *ld = user;
  const struct key_def *k;
  size_t idx;

  if (ld->kind == L_CONT) {
    if (ld->pending_idx == -2)
      return 1;
    if (ld->pending_idx < 0 || !(keys[ld->pending_idx].flags & F_MULTILINE)) {
      errs_add(ld->errs,
               "%s:%d: indented line: only command and relaunch may "
               "continue on the next line",
               ld->name, ld->lineno);
      ld->pending_idx = -2;
      return 1;
    }
    if (spot_buf_appends(&ld->pending, " ") < 0 ||
        spot_buf_appends(&ld->pending, value) < 0) {
      errs_add(ld->errs, "%s:%d: %s: value longer than %d bytes", ld->name,
               ld->pending_line, keys[ld->pending_idx].key,
               SPOT_CONFIG_MAX_VALUE);
      ld->pending_idx = -2;
    }
    return 1;
  }
  if (ld->kind != L_KEY)
    return 1; /* cannot happen: inih calls us for key lines only */
  ld->pending_idx = -2;
  if (looks_secret(name)) {
    errs_add(ld->errs,
             "%s:%d: '%.64s': credentials are never read from the config "
             "file; use the instance role, the AWS_* environment, ~/.aws, or "
             "systemd's LoadCredential=",
             ld->name, ld->lineno, name);
    if (ld->secret_line == 0)
      ld->secret_line = ld->lineno;
    return 1;
  }
  if (!ld->in_spotd) {
    if (*section == '\0' && !ld->outside_told) {
      errs_add(ld->errs, "%s:%d: key '%.64s' before the [spotd] section",
               ld->name, ld->lineno, name);
      ld->outside_told = true;
    }
    return 1; /* keys of an unknown section: the header was reported */
  }
  k = find_key(name, &idx);
  if (k == NULL) {
    errs_add(ld->errs, "%s:%d: unknown key '%.64s'", ld->name, ld->lineno,
             name);
    return 1;
  }
  if (ld->seen[idx] != 0) {
    errs_add(ld->errs, "%s:%d: duplicate key '%s' (first set on line %d)",
             ld->name, ld->lineno, k->key, ld->seen[idx]);
    return 1;
  }
  ld->seen[idx] = ld->lineno;
  spot_buf_reset(&ld->pending);
  if (spot_buf_appends(&ld->pending, value) < 0) {
    errs_add(ld->errs, "%s:%d: %s: value too long", ld->name, ld->lineno,
             k->key);
    return 1;
  }
  ld->pending_idx = (long)idx;
  ld->pending_line = ld->lineno;
  return 1;
}

static int
load_buffer(struct spot_config *cfg, const char *name, const char *data,
            size_t len, bool world_readable, struct errs *errs)
{
  struct load ld;
  const char *nul;
  int r, before = errs->n;

  nul = memchr(data, '\0', len);
  if (nul != NULL) {
    int line = 1;
    for (const char *p = data; p < nul; p++)
      line += *p == '\n';
    errs_add(errs, "%s:%d: NUL byte (not a text file?)", name, line);
    return -EINVAL;
  }
  memset(&ld, 0, sizeof(ld));
  ld.cfg = cfg;
  ld.name = name;
  ld.p = data;
  ld.end = data + len;
  ld.world_readable = world_readable;
  ld.pending_idx = -1;
  ld.errs = errs;
  spot_buf_init(&ld.pending, SPOT_CONFIG_MAX_VALUE + 1);
  r = ini_parse_stream(read_line_cb, &ld, ini_handler_cb, &ld);
  flush_pending(&ld);
  spot_buf_fini(&ld.pending);
  if (r == -2) {
    errs_add(errs, "%s: out of memory", name);
    return -ENOMEM;
  }
  if (r != 0 && errs->n == before)
    errs_add(errs, "%s:%d: syntax error", name, r);
  if (ld.secret_line != 0 && world_readable) {
    errs_add(errs,
             "%s: refusing a world-readable file that holds credentials "
             "(line %d): remove them and chmod o-r",
             name, ld.secret_line);
    return -EPERM;
  }
  if (errs->n != before)
    return -EINVAL;
  free(cfg->path_);
  cfg->path_ = strdup(name);
  return cfg->path_ != NULL ? 0 : -ENOMEM;
}

int
spot_config_load_buffer(struct spot_config *cfg, const char *name,
                        const char *data, size_t len, bool world_readable,
                        char *err, size_t errlen)
{
  struct errs e;
  int r;

  errs_init(&e, err, errlen);
  r = load_buffer(cfg, name, data, len, world_readable, &e);
  errs_finish(&e);
  return r;
}

int
spot_config_load_file(struct spot_config *cfg, const char *path, char *err,
                      size_t errlen)
{
  struct errs e;
  struct stat st;
  char *data = NULL;
  size_t len = 0;
  int fd, r;

  errs_init(&e, err, errlen);
  fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    r = -errno;
    errs_add(&e, "%s: cannot open: %s", path, strerror(-r));
    return r;
  }
  if (fstat(fd, &st) < 0) {
    r = -errno;
    errs_add(&e, "%s: cannot stat: %s", path, strerror(-r));
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    errs_add(&e, "%s: not a regular file", path);
    r = -EINVAL;
    goto out;
  }
  if (st.st_mode & S_IWOTH) {
    errs_add(&e,
             "%s: refusing a world-writable config file (mode %04o): anyone "
             "could change what spotd runs; chmod o-w",
             path, (unsigned)(st.st_mode & 07777));
    r = -EPERM;
    goto out;
  }
  if (st.st_uid != 0 && st.st_uid != geteuid()) {
    errs_add(&e,
             "%s: refusing a config file owned by uid %u (neither root nor "
             "the user running spotd)",
             path, (unsigned)st.st_uid);
    r = -EPERM;
    goto out;
  }
  if (st.st_size > SPOT_CONFIG_MAX_FILE) {
    errs_add(&e, "%s: larger than %d bytes", path, SPOT_CONFIG_MAX_FILE);
    r = -EFBIG;
    goto out;
  }
  data = malloc((size_t)st.st_size + 1);
  if (data == NULL) {
    r = -ENOMEM;
    goto out;
  }
  for (;;) {
    ssize_t n = read(fd, data + len, (size_t)st.st_size + 1 - len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      r = -errno;
      errs_add(&e, "%s: read error: %s", path, strerror(-r));
      goto out;
    }
    if (n == 0)
      break;
    len += (size_t)n;
    if (len > (size_t)st.st_size) {
      errs_add(&e, "%s: file grew while being read", path);
      r = -EAGAIN;
      goto out;
    }
  }
  r = load_buffer(cfg, path, data, len, (st.st_mode & S_IROTH) != 0, &e);

out:
  errs_finish(&e);
  free(data);
  close(fd);
  return r;
}

/* ---- validate -------------------------------------------------------- */

/* "PATH:LINE: key", "--key" or "key": where a value came from. */
static void
where(const struct spot_config *cfg, size_t idx, char *buf, size_t size)
{
  switch (cfg->origin_[idx]) {
  case SPOT_CONFIG_ORIGIN_FILE:
    snprintf(buf, size, "%s:%d: %s", cfg->path_ != NULL ? cfg->path_ : "?",
             cfg->line_[idx], keys[idx].key);
    break;
  case SPOT_CONFIG_ORIGIN_CLI:
    snprintf(buf, size, "--%s", keys[idx].key);
    break;
  default:
    snprintf(buf, size, "%s", keys[idx].key);
    break;
  }
}

static size_t
key_index(const char *key)
{
  size_t idx = 0;

  if (find_key(key, &idx) == NULL)
    assert(!"key missing from the table");
  return idx;
}

/* Sets a computed default: dir from the environment variable (its first
 * ':'-separated entry) + "/" + leaf, else fallback. */
static int
default_path(struct spot_config *cfg, const char *key, const char *env,
             const char *leaf, const char *fallback)
{
  size_t idx = key_index(key);
  char **field = (char **)(void *)((char *)cfg + keys[idx].off);
  char *v;

  /* Recomputed on each call while it is a default: the environment may
   * have changed since. */
  if (*field != NULL && cfg->origin_[idx] != SPOT_CONFIG_ORIGIN_DEFAULT)
    return 0;
  if (spot_default_path(env, leaf, fallback, &v) < 0)
    return -ENOMEM;
  free(*field);
  *field = v;
  cfg->origin_[idx] = SPOT_CONFIG_ORIGIN_DEFAULT;
  return 0;
}

/* rank and nranks default to Slurm's SLURM_NODEID and SLURM_STEP_NUM_NODES,
 * which describe a job step started with srun (one spotd per node). A
 * batch script (no step variables) runs on one node only: it stays a
 * single-rank job, or its pushes would wait for ranks that never come.
 * Outside a Slurm step, SPOTD_NRANKS set (a Kubernetes Indexed Job sets
 * it from its completions) makes the node count explicit; the rank is
 * then SPOTD_RANK, else the Job's JOB_COMPLETION_INDEX. */
static void
rank_default(struct spot_config *cfg, const char *key, const char *env,
             int64_t max, struct errs *e)
{
  size_t idx = key_index(key);
  int64_t *field = (int64_t *)(void *)((char *)cfg + keys[idx].off);
  bool rank = idx == key_index("rank");
  const char *v = getenv(env);
  int64_t n;

  if (cfg->origin_[idx] != SPOT_CONFIG_ORIGIN_DEFAULT)
    return;
  *field = rank ? 0 : 1;
  if (getenv("SLURM_STEP_NUM_NODES") == NULL) {
    if (getenv("SPOTD_NRANKS") == NULL)
      return;
    env = !rank                          ? "SPOTD_NRANKS"
          : getenv("SPOTD_RANK") != NULL ? "SPOTD_RANK"
                                         : "JOB_COMPLETION_INDEX";
    v = getenv(env);
  }
  if (v == NULL || *v == '\0')
    return;
  if (spot_parse_int64(v, rank ? 0 : 1, max, &n) < 0) {
    errs_add(e, "$%s: '%.40s' is not a valid %s (give --%s)", env, v, key, key);
    return;
  }
  *field = n;
}

int
spot_config_validate(struct spot_config *cfg, unsigned flags, char *err,
                     size_t errlen)
{
  struct errs e;
  char at[300], msg[400];
  char *bucket, *prefix;
  int r;

  errs_init(&e, err, errlen);
  rank_default(cfg, "rank", "SLURM_NODEID", 1023, &e);
  rank_default(cfg, "nranks", "SLURM_STEP_NUM_NODES", 1024, &e);
  if (cfg->rank >= cfg->nranks)
    errs_add(&e,
             "rank %" PRId64 " is not below nranks %" PRId64
             " (ranks are 0 to nranks - 1)",
             cfg->rank, cfg->nranks);
  if (spot_xfer_sizes_check((uint64_t)cfg->part_size, (uint64_t)cfg->memory,
                            (uint64_t)cfg->pack_threshold, msg,
                            sizeof(msg)) < 0)
    errs_add(&e, "%s", msg);
  /* A restart of one rank's trainer alone cannot rejoin the others'
   * collective: a multi-node job is relaunched as a whole instead. */
  if (cfg->max_restarts > 0 && cfg->nranks > 1)
    errs_add(&e,
             "max-restarts %" PRId64 " needs a one-node job (nranks is "
             "%" PRId64 "): a multi-node job restarts as a whole",
             cfg->max_restarts, cfg->nranks);
  if (cfg->job == NULL)
    errs_add(&e, "job is required (--job ID, or 'job = ID' in [spotd])");
  if (cfg->store == NULL) {
    errs_add(&e, "store is required (--store s3://BUCKET/PREFIX, or "
                 "'store = s3://BUCKET/PREFIX' in [spotd])");
  } else {
    r = spot_s3_url_parse(cfg->store, &bucket, &prefix, msg, sizeof(msg));
    if (r == 0) {
      free(cfg->bucket);
      free(cfg->prefix);
      cfg->bucket = bucket;
      cfg->prefix = prefix;
    } else {
      where(cfg, key_index("store"), at, sizeof(at));
      errs_add(&e, "%s: %s", at, msg);
    }
  }
  if ((flags & SPOT_CONFIG_NEED_COMMAND) && cfg->command == NULL)
    errs_add(&e, "command is required: give 'command = ...' in [spotd] or "
                 "run 'spotd run [OPTIONS] -- COMMAND [ARG...]'");
  if (cfg->command != NULL && check_args(cfg->command, msg, sizeof(msg)) < 0) {
    where(cfg, key_index("command"), at, sizeof(at));
    errs_add(&e, "%s: %s", at, msg);
  }
  if (cfg->relaunch != NULL &&
      check_args(cfg->relaunch, msg, sizeof(msg)) < 0) {
    where(cfg, key_index("relaunch"), at, sizeof(at));
    errs_add(&e, "%s: %s", at, msg);
  }
  if (default_path(cfg, "ckpt-dir", "STATE_DIRECTORY", "ckpt", "./spotd-ckpt") <
          0 ||
      default_path(cfg, "socket", SPOT_SOCKET_ENV, SPOT_SOCKET_LEAF,
                   SPOT_SOCKET_FALLBACK) < 0) {
    errs_finish(&e);
    return -ENOMEM;
  }
  if (strlen(cfg->socket) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
    where(cfg, key_index("socket"), at, sizeof(at));
    errs_add(&e, "%s: '%.120s...' is longer than a socket path may be (%zu)",
             at, cfg->socket, sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
  }
  errs_finish(&e);
  return e.n > 0 ? -EINVAL : 0;
}

/* ---- getopt ---------------------------------------------------------- */

int
spot_config_build_options(struct option *opts, size_t n,
                          const struct option *extra, size_t n_extra)
{
  size_t j = 0;

  if (n < N_KEYS + n_extra + 1)
    return -ENOBUFS;
  for (size_t i = 0; i < N_KEYS; i++, j++) {
    opts[j].name = keys[i].key;
    opts[j].has_arg =
        keys[i].type == T_BOOL ? optional_argument : required_argument;
    opts[j].flag = NULL;
    opts[j].val = SPOT_CONFIG_OPT_BASE + (int)i;
  }
  for (size_t i = 0; i < n_extra; i++, j++)
    opts[j] = extra[i];
  memset(&opts[j], 0, sizeof(opts[j]));
  return (int)j;
}

const char *
spot_config_option_key(int val)
{
  if (val < SPOT_CONFIG_OPT_BASE || val >= SPOT_CONFIG_OPT_BASE + (int)N_KEYS)
    return NULL;
  return keys[val - SPOT_CONFIG_OPT_BASE].key;
}

static int
check_lease_wait(const char *v, char *err, size_t errlen)
{
  uint64_t ms;

  if (strcmp(v, "forever") == 0)
    return 0;
  if (parse_duration(v, &ms) < 0 || ms == 0 || ms > (uint64_t)MS(30 * 86400))
    return fail(err, errlen,
                "'%.64s' is not 'forever' nor a duration between 1ms and "
                "30d",
                v);
  return 0;
}

int
spot_config_lease_wait(const struct spot_config *cfg, uint64_t *ms)
{
  uint64_t v = 0;

  if (cfg->lease_wait != NULL && strcmp(cfg->lease_wait, "forever") != 0 &&
      parse_duration(cfg->lease_wait, &v) < 0)
    return -EINVAL;
  *ms = v;
  return 0;
}

/* ---- help, example, effective config --------------------------------- */

/* Appends text word-wrapped at 79 columns, each line starting with
 * prefix. */
static int
wrap(struct spot_buf *b, const char *prefix, const char *text)
{
  const size_t width = 79;
  size_t col = 0;
  const char *p = text;
  int r = 0;

  while (*p != '\0' && r == 0) {
    size_t w = strcspn(p, " ");
    if (col == 0) {
      r = spot_buf_appends(b, prefix);
      col = strlen(prefix);
    } else if (col + 1 + w > width) {
      r = spot_buf_appends(b, "\n");
      col = 0;
      continue;
    } else {
      r = spot_buf_appends(b, " ");
      col++;
    }
    if (r == 0)
      r = spot_buf_append(b, p, w);
    col += w;
    p += w;
    while (*p == ' ')
      p++;
  }
  if (r == 0 && col > 0)
    r = spot_buf_appends(b, "\n");
  return r;
}

static const char *
metavar(const struct key_def *k, char *buf, size_t size)
{
  if (k->type == T_ENUM) {
    enum_list(k->enums, buf, size);
    return buf;
  }
  if (k->type == T_BOOL)
    return "[=true|false]";
  return k->metavar;
}

int
spot_config_write_help(struct spot_buf *b)
{
  char mv[128], text[1024];
  int r = 0;

  for (size_t i = 0; i < N_KEYS && r == 0; i++) {
    const struct key_def *k = &keys[i];
    const char *m = metavar(k, mv, sizeof(mv));
    r = spot_buf_printf(b, "  --%s%s%s\n", k->key, k->type == T_BOOL ? "" : " ",
                        m);
    if (r < 0)
      break;
    if (k->flags & F_REQUIRED)
      snprintf(text, sizeof(text), "%s Required.", k->help);
    else if (k->def != NULL)
      snprintf(text, sizeof(text), "%s Default: %s.", k->help, k->def);
    else
      snprintf(text, sizeof(text), "%s Default: %s.", k->help, k->def_help);
    r = wrap(b, "      ", text);
  }
  return r;
}

int
spot_config_write_example(struct spot_buf *b)
{
  char text[1024];
  int r;

  r = spot_buf_appends(
      b, "# spotd configuration: an example with every key.\n"
         "# Generated by `spotd --print-config-example`. Each key is also a\n"
         "# command-line option (--key VALUE) and the command line wins.\n"
         "#\n"
         "# Syntax: `key = value` in the [spotd] section only. Whole-line\n"
         "# comments start with '#' or ';'; there are no inline comments.\n"
         "# Lines are at most 198 bytes; command and relaunch may continue\n"
         "# on lines indented by whitespace (joined with one space).\n"
         "# Durations are seconds or take a unit (500ms, 2s, 5m, 1h, 1d);\n"
         "# sizes take K, M or G. Commented-out keys show the default, or an\n"
         "# example value when the default is computed.\n"
         "#\n"
         "# Credentials never go here: spotd uses the instance role, the\n"
         "# AWS_* environment, ~/.aws, or systemd's LoadCredential=.\n"
         "\n"
         "[spotd]\n");
  for (size_t i = 0; i < N_KEYS && r == 0; i++) {
    const struct key_def *k = &keys[i];
    if (k->flags & F_REQUIRED)
      snprintf(text, sizeof(text), "%s Required.", k->help);
    else if (k->def == NULL)
      snprintf(text, sizeof(text), "%s Default: %s.", k->help, k->def_help);
    else
      snprintf(text, sizeof(text), "%s", k->help);
    r = spot_buf_appends(b, "\n");
    if (r == 0)
      r = wrap(b, "# ", text);
    if (r == 0)
      r = spot_buf_printf(b, "#%s = %s\n", k->key,
                          k->def != NULL ? k->def : k->example);
  }
  return r;
}

static const char *
enum_name(const struct enum_val *ev, int v)
{
  for (size_t i = 0; ev[i].name != NULL; i++)
    if (ev[i].value == v)
      return ev[i].name;
  return "?";
}

int
spot_config_write_effective(const struct spot_config *cfg, struct spot_buf *b)
{
  char val[64], at[300];
  int r;

  r = spot_buf_appends(b, "[spotd]\n");
  for (size_t i = 0; i < N_KEYS && r == 0; i++) {
    const struct key_def *k = &keys[i];
    const char *field = (const char *)cfg + k->off;
    const char *v = val;

    switch (k->type) {
    case T_STRING:
      v = *(char *const *)(const void *)field;
      break;
    case T_INT:
      snprintf(val, sizeof(val), "%" PRId64,
               *(const int64_t *)(const void *)field);
      break;
    case T_SIZE:
      fmt_size(*(const uint64_t *)(const void *)field, val, sizeof(val));
      break;
    case T_DURATION:
      fmt_duration(*(const uint64_t *)(const void *)field, val, sizeof(val));
      break;
    case T_BOOL:
      v = *(const bool *)(const void *)field ? "true" : "false";
      break;
    case T_ENUM:
      v = enum_name(k->enums, *(const int *)(const void *)field);
      break;
    case T_SIGNAL:
      v = spot_config_signal_name(*(const int *)(const void *)field, val,
                                  sizeof(val));
      break;
    }
    if (v == NULL)
      continue;
    if (cfg->origin_[i] != SPOT_CONFIG_ORIGIN_DEFAULT) {
      where(cfg, i, at, sizeof(at));
      r = spot_buf_printf(b, "# from %s\n", at);
    }
    if (r == 0)
      r = spot_buf_printf(b, "%s = %s\n", k->key, v);
  }
  return r;
}

/* ---- names ----------------------------------------------------------- */

const char *
spot_config_provider_name(int provider)
{
  return enum_name(provider_vals, provider);
}

const char *
spot_config_signal_target_name(int target)
{
  return enum_name(target_vals, target);
}

const char *
spot_config_compress_name(int compress)
{
  return enum_name(compress_vals, compress);
}

const char *
spot_config_signal_name(int signo, char *buf, size_t size)
{
  for (size_t i = 0; signal_vals[i].name != NULL; i++)
    if (signal_vals[i].value == signo)
      return signal_vals[i].name;
  if (signo >= SIGRTMIN && signo <= SIGRTMAX)
    snprintf(buf, size, "RTMIN+%d", signo - SIGRTMIN);
  else
    snprintf(buf, size, "%d", signo);
  return buf;
}

/* ---- command splitting ----------------------------------------------- */

void
spot_config_free_args(char **argv)
{
  if (argv == NULL)
    return;
  for (char **a = argv; *a != NULL; a++)
    free(*a);
  free(argv);
}

int
spot_config_split_args(const char *s, char ***out_argv, int *out_argc,
                       char *err, size_t errlen)
{
  char **argv;
  char *word;
  size_t n = strlen(s), wl = 0;
  int argc = 0, r = 0;
  bool in_word = false;
  const char *p = s;

  if (n > SPOT_CONFIG_MAX_VALUE)
    return fail(err, errlen, "command longer than %d bytes",
                SPOT_CONFIG_MAX_VALUE);
  argv = calloc(SPOT_CONFIG_MAX_ARGS + 1, sizeof(*argv));
  word = malloc(n + 1);
  if (argv == NULL || word == NULL) {
    free(argv);
    free(word);
    return -ENOMEM;
  }
  for (;;) {
    char c = *p;
    if (c == '\0' || c == ' ' || c == '\t') {
      if (in_word) {
        if (argc == SPOT_CONFIG_MAX_ARGS) {
          r = fail(err, errlen, "more than %d words", SPOT_CONFIG_MAX_ARGS);
          break;
        }
        argv[argc] = strndup(word, wl);
        if (argv[argc] == NULL) {
          r = -ENOMEM;
          break;
        }
        argc++;
        wl = 0;
        in_word = false;
      }
      if (c == '\0')
        break;
      p++;
      continue;
    }
    in_word = true;
    if (c == '\'') {
      const char *q = strchr(p + 1, '\'');
      if (q == NULL) {
        r = fail(err, errlen, "unterminated ' quote");
        break;
      }
      memcpy(word + wl, p + 1, (size_t)(q - p - 1));
      wl += (size_t)(q - p - 1);
      p = q + 1;
    } else if (c == '"') {
      p++;
      while (*p != '\0' && *p != '"') {
        if (*p == '\\' && (p[1] == '"' || p[1] == '\\'))
          p++;
        word[wl++] = *p++;
      }
      if (*p != '"') {
        r = fail(err, errlen, "unterminated \" quote");
        break;
      }
      p++;
    } else if (c == '\\') {
      if (p[1] == '\0') {
        r = fail(err, errlen, "trailing backslash");
        break;
      }
      word[wl++] = p[1];
      p += 2;
    } else if (strchr("|&;<>()$`", c) != NULL) {
      r = fail(err, errlen,
               "'%c' is shell syntax, and there is no shell: quote it, or "
               "use sh -c '...'",
               c);
      break;
    } else {
      word[wl++] = c;
      p++;
    }
  }
  free(word);
  if (r == 0 && argc == 0)
    r = fail(err, errlen, "empty command");
  if (r < 0) {
    spot_config_free_args(argv);
    return r;
  }
  *out_argv = argv;
  *out_argc = argc;
  return 0;
}

uint64_t
spot_config_restart_backoff_ms(uint64_t base_ms, unsigned k)
{
  uint64_t cap = base_ms > SPOT_CONFIG_BACKOFF_CAP_MS
                     ? base_ms
                     : SPOT_CONFIG_BACKOFF_CAP_MS;
  uint64_t ms = base_ms;

  for (unsigned i = 1; i < k && ms < cap; i++)
    ms *= 2;
  return ms < cap ? ms : cap;
}
