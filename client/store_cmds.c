/* spotctl push / list / restore: the store commands. They work on the
 * store directly (no daemon): one libuv loop, the S3 client, the store. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "core/log.h"
#include "core/manifest.h"
#include "core/s3url.h"
#include "core/util.h"
#include "io/aws.h"
#include "io/http.h"
#include "io/s3.h"
#include "io/store/store.h"
#include "spotctl.h"

struct session {
  struct spotctl_s3 c;
  struct spot_store_config cfg;
  int err;
  char msg[512];
  bool done;
  bool tty;
  bool quiet;
  bool json;
  const char *verb;
  int exit_code;
};

struct common_opts {
  const char *endpoint, *region, *profile, *name, *journal;
  uint64_t part_size;
  uint64_t pack_threshold; /* 0 = default, SPOT_STORE_PACK_OFF = off */
  unsigned parallel, workers, keep;
  uint64_t memory, target_rate;
  uint64_t restore_timeout_ms;
  enum spot_store_compress compress;
  bool quiet, json, follow_symlinks, follow;
  bool dedup;           /* push --dedup */
  uint64_t dedup_frame; /* push --dedup-frame, 0 default */
  bool page_cache;      /* restore --page-cache: no O_DIRECT */
  long long step;       /* push --step, 0 none */
};

enum {
  OPT_ENDPOINT = 256,
  OPT_REGION,
  OPT_PROFILE,
  OPT_PART_SIZE,
  OPT_PARALLEL,
  OPT_WORKERS,
  OPT_COMPRESS,
  OPT_KEEP,
  OPT_JSON,
  OPT_JOURNAL,
  OPT_RESTORE_TIMEOUT,
  OPT_FOLLOW_SYMLINKS,
  OPT_MEMORY,
  OPT_TARGET_RATE,
  OPT_PACK_THRESHOLD,
  OPT_FOLLOW,
  OPT_STEP,
  OPT_PAGE_CACHE,
  OPT_DEDUP,
  OPT_DEDUP_FRAME,
};

static const struct option long_opts[] = {
    {"help", no_argument, NULL, 'h'},
    {"name", required_argument, NULL, 'n'},
    {"quiet", no_argument, NULL, 'q'},
    {"endpoint", required_argument, NULL, OPT_ENDPOINT},
    {"region", required_argument, NULL, OPT_REGION},
    {"profile", required_argument, NULL, OPT_PROFILE},
    {"part-size", required_argument, NULL, OPT_PART_SIZE},
    {"parallel", required_argument, NULL, OPT_PARALLEL},
    {"workers", required_argument, NULL, OPT_WORKERS},
    {"compress", required_argument, NULL, OPT_COMPRESS},
    {"keep", required_argument, NULL, OPT_KEEP},
    {"json", no_argument, NULL, OPT_JSON},
    {"journal", required_argument, NULL, OPT_JOURNAL},
    {"restore-timeout", required_argument, NULL, OPT_RESTORE_TIMEOUT},
    {"follow-symlinks", no_argument, NULL, OPT_FOLLOW_SYMLINKS},
    {"memory", required_argument, NULL, OPT_MEMORY},
    {"target-rate", required_argument, NULL, OPT_TARGET_RATE},
    {"pack-threshold", required_argument, NULL, OPT_PACK_THRESHOLD},
    {"follow", no_argument, NULL, OPT_FOLLOW},
    {"step", required_argument, NULL, OPT_STEP},
    {"page-cache", no_argument, NULL, OPT_PAGE_CACHE},
    {"dedup", no_argument, NULL, OPT_DEDUP},
    {"dedup-frame", required_argument, NULL, OPT_DEDUP_FRAME},
    {NULL, 0, NULL, 0},
};

static const char common_help[] =
    "  --endpoint URL     S3 endpoint (default: $AWS_ENDPOINT_URL_S3,\n"
    "                     $AWS_ENDPOINT_URL, else AWS's regional endpoint)\n"
    "  --region REGION    S3 region (default: $AWS_REGION, the profile, IMDS)\n"
    "  --profile NAME     profile of ~/.aws/credentials and ~/.aws/config\n"
    "  --parallel N       exactly N transfers in flight (default: adaptive,\n"
    "                     from 8, more while the throughput grows, fewer\n"
    "                     on 503 SlowDown, within --memory)\n"
    "  --memory SIZE      budget of part buffers (K, M, G; default 1G)\n"
    "  --target-rate RATE bytes/s to reach (K, M, G: 500M = 500 MiB/s);\n"
    "                     no more transfers once reached\n"
    "  --workers N        compressing threads (default: the cores)\n"
    "  -q, --quiet        no summary line\n"
    "  -h, --help         this help\n"
    "Credentials: $AWS_ACCESS_KEY_ID/$AWS_SECRET_ACCESS_KEY, a profile, or "
    "the\ninstance role (IMDSv2).\n";

static int
parse_uint(const char *opt, const char *v, int64_t min, int64_t max,
           unsigned *out)
{
  int64_t n;

  if (spot_parse_int64(v, min, max, &n) < 0)
    return spotctl_usage("%s: expected a number from %" PRId64 " to %" PRId64
                         ", got '%s'",
                         opt, min, max, v);
  *out = (unsigned)n;
  return 0;
}

/* The options that take a number. 0, or an exit status after the usage
 * line. */
/* The store's own rule (codec.h), so spotctl refuses what spotd's config
 * refuses, with the same words. */
static int
sizes_check(const char *opt, const char *v, uint64_t part, uint64_t memory,
            uint64_t pack)
{
  char why[160];

  if (spot_xfer_sizes_check(part, memory, pack, why, sizeof(why)) == 0)
    return 0;
  return spotctl_usage("%s '%s': %s", opt, v, why);
}

static int
parse_number_opt(int c, const char *v, struct common_opts *o)
{
  unsigned secs = 0;
  int r;

  switch (c) {
  case OPT_PART_SIZE:
    if (spot_parse_size(v, &o->part_size) < 0 || o->part_size == 0)
      return spotctl_usage("--part-size: expected a size (K, M, G suffixes), "
                           "got '%s'",
                           v);
    return sizes_check("--part-size", v, o->part_size, 0, 0);
  case OPT_PACK_THRESHOLD:
    if (spot_parse_size(v, &o->pack_threshold) < 0)
      return spotctl_usage("--pack-threshold: expected a size (K, M, G "
                           "suffixes), got '%s'",
                           v);
    r = sizes_check("--pack-threshold", v, 0, 0, o->pack_threshold);
    if (r != 0)
      return r;
    if (o->pack_threshold == 0)
      o->pack_threshold = SPOT_STORE_PACK_OFF;
    return 0;
  case OPT_PARALLEL:
    return parse_uint("--parallel", v, 1, 64, &o->parallel);
  case OPT_MEMORY:
    if (spot_parse_size(v, &o->memory) < 0 || o->memory == 0)
      return spotctl_usage("--memory: expected a size (K, M, G suffixes), "
                           "got '%s'",
                           v);
    return sizes_check("--memory", v, 0, o->memory, 0);
  case OPT_TARGET_RATE:
    if (spot_parse_size(v, &o->target_rate) < 0 || o->target_rate == 0)
      return spotctl_usage("--target-rate: expected bytes per second (K, M, "
                           "G suffixes), got '%s'",
                           v);
    return 0;
  case OPT_WORKERS:
    return parse_uint("--workers", v, 1, 64, &o->workers);
  case OPT_KEEP:
    return parse_uint("--keep", v, 0, 100000, &o->keep);
  case OPT_RESTORE_TIMEOUT:
    if (parse_uint("--restore-timeout", v, 1, 7 * 24 * 3600, &secs) != 0)
      return SPOTCTL_EXIT_USAGE;
    o->restore_timeout_ms = (uint64_t)secs * 1000;
    return 0;
  default:
    return SPOTCTL_EXIT_USAGE;
  }
}

/* Parses the options shared by the store commands. Returns -1 to go on,
 * or an exit status. */
static int
parse_opts(int argc, char **argv, struct common_opts *o, const char *usage)
{
  int c;

  memset(o, 0, sizeof(*o));
  o->keep = 0;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "hn:q", long_opts, NULL)) != -1) {
    switch (c) {
    case 'h':
      fputs(usage, stdout);
      fputs(common_help, stdout);
      return SPOTCTL_EXIT_OK;
    case 'n':
      o->name = optarg;
      break;
    case 'q':
      o->quiet = true;
      break;
    case OPT_ENDPOINT:
      o->endpoint = optarg;
      break;
    case OPT_REGION:
      o->region = optarg;
      break;
    case OPT_PROFILE:
      o->profile = optarg;
      break;
    case OPT_PART_SIZE:
    case OPT_PACK_THRESHOLD:
    case OPT_PARALLEL:
    case OPT_MEMORY:
    case OPT_TARGET_RATE:
    case OPT_WORKERS:
    case OPT_KEEP:
    case OPT_RESTORE_TIMEOUT:
      if (parse_number_opt(c, optarg, o) != 0)
        return SPOTCTL_EXIT_USAGE;
      break;
    case OPT_FOLLOW_SYMLINKS:
      o->follow_symlinks = true;
      break;
    case OPT_FOLLOW:
      o->follow = true;
      break;
    case OPT_DEDUP:
      o->dedup = true;
      break;
    case OPT_DEDUP_FRAME:
      if (spot_parse_size(optarg, &o->dedup_frame) < 0 ||
          o->dedup_frame < 4096 || o->dedup_frame % 8 != 0 ||
          o->dedup_frame > SPOT_CODEC_PART_MAX)
        return spotctl_usage("--dedup-frame: expected a size of at least 4K, "
                             "a multiple of 8, got '%s'",
                             optarg);
      o->dedup = true;
      break;
    case OPT_PAGE_CACHE:
      o->page_cache = true;
      break;
    case OPT_STEP: {
      char *end;
      errno = 0;
      o->step = strtoll(optarg, &end, 10);
      if (errno != 0 || end == optarg || *end != '\0' || o->step < 1 ||
          o->step > ((long long)1 << 53))
        return spotctl_usage("--step: expected a step from 1 to 2^53, got "
                             "'%s'",
                             optarg);
      break;
    }
    case OPT_COMPRESS:
      if (strcmp(optarg, "auto") == 0)
        o->compress = SPOT_STORE_COMPRESS_AUTO;
      else if (strcmp(optarg, "always") == 0)
        o->compress = SPOT_STORE_COMPRESS_ALWAYS;
      else if (strcmp(optarg, "never") == 0)
        o->compress = SPOT_STORE_COMPRESS_NEVER;
      else
        return spotctl_usage("--compress: expected auto, always or never, "
                             "got '%s'",
                             optarg);
      break;
    case OPT_JSON:
      o->json = true;
      break;
    case OPT_JOURNAL:
      o->journal = optarg;
      break;
    case '?':
    default:
      return spotctl_bad_option(argv[0], argv);
    }
  }
  return -1;
}

/* Loop, HTTP, credentials, S3. Returns 0 or an exit status after printing
 * the error. */
static int
session_open(struct session *s, const char *url, const struct common_opts *o)
{
  struct spotctl_s3_options so;
  int r;

  s->tty = isatty(STDOUT_FILENO) == 1;
  s->quiet = o->quiet;
  s->json = o->json;
  memset(&so, 0, sizeof(so));
  so.endpoint = o->endpoint;
  so.region = o->region;
  so.profile = o->profile;
  r = spotctl_s3_open_job(&s->c, url, &so, &s->cfg);
  if (r != 0)
    return r;
  s->cfg.part_size = o->part_size;
  s->cfg.pack_threshold = o->pack_threshold;
  s->cfg.parallel = o->parallel;
  s->cfg.memory = o->memory;
  s->cfg.target_rate = o->target_rate;
  s->cfg.workers = o->workers;
  s->cfg.compress = o->compress;
  s->cfg.keep = o->keep;
  s->cfg.journal_dir = o->journal;
  s->cfg.restore_timeout_ms = o->restore_timeout_ms;
  s->cfg.follow_symlinks = o->follow_symlinks;
  s->cfg.follow = o->follow;
  s->cfg.dedup = o->dedup;
  s->cfg.dedup_frame = o->dedup_frame;
  s->cfg.step = o->step;
  s->done = false;
  return 0;
}

static void
session_close(struct session *s)
{
  spotctl_s3_close(&s->c);
}

static void
print_progress(const struct spot_store_progress *p, void *data)
{
  struct session *s = data;
  char done[32], total[32];
  double secs = (double)p->elapsed_ms / 1000.0;
  double rate = secs > 0 ? (double)p->raw_done / secs : 0;
  double eta;

  if (!s->tty || s->quiet || p->phase == SPOT_STORE_PHASE_PLAN)
    return;
  spot_fmt_bytes(p->raw_done, done, sizeof(done));
  spot_fmt_bytes(p->raw_total, total, sizeof(total));
  eta = rate > 0 && p->raw_total > p->raw_done
            ? (double)(p->raw_total - p->raw_done) / rate
            : 0;
  printf("\r\033[K%s: %s %s / %s  %.0f MB/s", p->name,
         spot_store_phase_name(p->phase), done, total, rate / 1e6);
  if (p->stored_done > 0 && p->raw_done > 0)
    printf("  ratio %.2f", (double)p->raw_done / (double)p->stored_done);
  if (p->phase == SPOT_STORE_PHASE_TRANSFER && eta > 0)
    printf("  ETA %.0fs", eta);
  if (p->phase == SPOT_STORE_PHASE_TRANSFER && p->parallel > 0)
    printf("  x%u", p->parallel);
  if (p->retries > 0)
    printf("  %u retries", p->retries);
  if (p->phase == SPOT_STORE_PHASE_FINISH)
    printf("\r\033[K");
  fflush(stdout);
}

static void
store_done_cb(const struct spot_store_result *res, void *data)
{
  struct session *s = data;
  const char *verb = s->verb;
  char raw[32], stored[32];
  double secs = (double)res->elapsed_ms / 1000.0;

  s->done = true;
  if (res->err < 0) {
    s->exit_code = spotctl_fail("%s", res->message);
    return;
  }
  if (res->warning != NULL && res->warning[0] != '\0')
    fprintf(stderr, "spotctl: warning: %s\n", spotctl_esc(res->warning));
  if (!s->quiet)
    printf("%s %s: %" PRIu64 " files, %s -> %s stored (ratio %.2f) in %.1f s "
           "(%.0f MB/s), %u retries%s\n",
           verb, res->name, res->files,
           spot_fmt_bytes(res->raw_bytes, raw, sizeof(raw)),
           spot_fmt_bytes(res->stored_bytes, stored, sizeof(stored)),
           res->stored_bytes > 0
               ? (double)res->raw_bytes / (double)res->stored_bytes
               : 1.0,
           secs, secs > 0 ? (double)res->raw_bytes / secs / 1e6 : 0.0,
           res->retries, res->deleted > 0 ? ", old checkpoints deleted" : "");
  if (!s->quiet && res->resumed_parts > 0)
    printf("resumed %u parts already stored by an interrupted push\n",
           res->resumed_parts);
  s->exit_code = SPOTCTL_EXIT_OK;
}

static int
run_op(struct session *s)
{
  while (!s->done && uv_run(&s->c.loop, UV_RUN_ONCE) != 0)
    ;
  if (!s->done)
    return spotctl_fail("internal: the operation never finished");
  return s->exit_code;
}

static const char push_usage[] =
    "Usage: spotctl push DIR s3://BUCKET/[PREFIX/]JOB [OPTIONS]\n\n"
    "Uploads every regular file under DIR as one checkpoint of JOB, then\n"
    "commits it (the manifest is written last) and moves LATEST to it.\n\n"
    "  -n, --name NAME    checkpoint name (default: DIR's base name)\n"
    "  --part-size SIZE   bytes per part and zstd frame (default 16M)\n"
    "  --pack-threshold SIZE  files smaller than SIZE (and than a part) are\n"
    "                     packed together, a few objects for thousands of\n"
    "                     small files (default 1M; 0: one object per file)\n"
    "  --compress MODE    auto (default), always or never\n"
    "  --keep N           keep the N newest checkpoints, delete older ones\n"
    "  --journal DIR      record uploads in progress in DIR; a push of the\n"
    "                     same name killed mid-way resumes them\n"
    "  --follow-symlinks  store the content a symlink points to (default:\n"
    "                     a relative link inside DIR is stored as a link,\n"
    "                     any other link fails the push)\n"
    "  --follow           DIR is still being written: upload its files as\n"
    "                     they close, commit once DIR/SPOTD_COMPLETE exists\n"
    "                     (files changed since are uploaded again)\n"
    "  --step N           the trainer's step this checkpoint holds (default:\n"
    "                     what NAME states, as in step-000042): LATEST never\n"
    "                     moves to a checkpoint older by step\n"
    "  --dedup            upload only what changed since LATEST: files go in\n"
    "                     frames of 1 MiB with their SHA-256, and a frame\n"
    "                     LATEST already stores is referenced, not sent\n"
    "  --dedup-frame SIZE  --dedup with frames of SIZE (a multiple of 8)\n";

int
spotctl_cmd_push(int argc, char **argv)
{
  struct common_opts o;
  struct session s;
  int r;

  r = parse_opts(argc, argv, &o, push_usage);
  if (r >= 0)
    return r;
  if (argc - optind != 2)
    return spotctl_usage("push: expected DIR and s3://BUCKET/[PREFIX/]JOB");
  if (o.name != NULL && strchr(o.name, '/') != NULL)
    return spotctl_usage("push: --name '%s': a name cannot contain '/'",
                         o.name);
  memset(&s, 0, sizeof(s));
  r = session_open(&s, argv[optind + 1], &o);
  if (r == 0) {
    s.verb = "pushed";
    r = spot_store_push(&s.c.loop, &s.cfg, argv[optind], o.name, print_progress,
                        store_done_cb, &s, NULL);
    if (r == -EINVAL)
      r = spotctl_fail(
          "push: invalid checkpoint name '%s' (" SPOT_CKPT_NAME_RULES ")",
          o.name != NULL ? o.name : argv[optind]);
    else if (r < 0)
      r = spotctl_fail("push: %s", strerror(-r));
    else
      r = run_op(&s);
  }
  session_close(&s);
  return r;
}

static const char restore_usage[] =
    "Usage: spotctl restore s3://BUCKET/[PREFIX/]JOB DIR [OPTIONS]\n\n"
    "Restores a committed checkpoint into DIR (which must not exist, or be\n"
    "empty): every frame is checked, and DIR appears only when complete.\n\n"
    "  -n, --name NAME    checkpoint to restore (default: LATEST)\n"
    "  --restore-timeout SEC  fail when the restore is not done within SEC\n"
    "                     (default: no limit; each transfer must still move\n"
    "                     64 KiB/s plus 5 s)\n"
    "  --page-cache       write the files through the page cache, for a\n"
    "                     reader that follows at once (default: O_DIRECT\n"
    "                     where the file system takes it: less CPU, and\n"
    "                     the files are not left in the page cache)\n";

int
spotctl_cmd_restore(int argc, char **argv)
{
  struct common_opts o;
  struct session s;
  int r;

  r = parse_opts(argc, argv, &o, restore_usage);
  if (r >= 0)
    return r;
  if (argc - optind != 2)
    return spotctl_usage("restore: expected s3://BUCKET/[PREFIX/]JOB and DIR");
  memset(&s, 0, sizeof(s));
  r = session_open(&s, argv[optind], &o);
  if (r == 0) {
    s.verb = "restored";
    s.cfg.direct_io = !o.page_cache;
    r = spot_store_restore(&s.c.loop, &s.cfg, o.name, argv[optind + 1],
                           print_progress, store_done_cb, &s, NULL);
    if (r == -EINVAL)
      r = spotctl_usage(
          "restore: invalid checkpoint name '%s' (" SPOT_CKPT_NAME_RULES ")",
          o.name != NULL ? o.name : "");
    else if (r < 0)
      r = spotctl_fail("restore: %s", strerror(-r));
    else
      r = run_op(&s);
  }
  session_close(&s);
  return r;
}

/* Names come from the store's keys and objects: escaped for a terminal,
 * and quoted by jansson in JSON. */
#define NAME_OUT SPOT_ESCAPE_SIZE(256)

static const char *
json_quoted(const char *s, char *buf, size_t size)
{
  char esc[NAME_OUT];
  json_t *j = json_string(spot_escape(s, esc, sizeof(esc)));
  char *d = j != NULL ? json_dumps(j, JSON_ENCODE_ANY) : NULL;

  spot_strlcpy(buf, d != NULL ? d : "\"\"", size);
  free(d);
  json_decref(j);
  return buf;
}

static void
list_done_cb(const struct spot_store_list_result *res, void *data)
{
  struct session *s = data;
  size_t committed = 0;
  char name[NAME_OUT + 8], latest[NAME_OUT + 8];

  s->done = true;
  if (res->err < 0) {
    s->exit_code = spotctl_fail("%s", res->message);
    return;
  }
  s->exit_code = SPOTCTL_EXIT_OK;
  if (s->json) {
    printf("{\"job\":\"%s\",\"latest\":%s,\"checkpoints\":[", s->c.job,
           json_quoted(res->latest, latest, sizeof(latest)));
    for (size_t i = 0; i < res->n; i++) {
      const struct spot_store_entry *e = &res->entries[i];
      char when[32] = "";
      if (e->committed)
        spot_rfc3339_format(e->created_ms, when, sizeof(when));
      printf("%s{\"name\":%s,\"committed\":%s,\"latest\":%s,"
             "\"created\":\"%s\",\"files\":%" PRIu64 ",\"raw_bytes\":%" PRIu64
             ",\"stored_bytes\":%" PRIu64 "}",
             i ? "," : "", json_quoted(e->name, name, sizeof(name)),
             e->committed ? "true" : "false", e->latest ? "true" : "false",
             when, e->files, e->raw_bytes, e->stored_bytes);
    }
    printf("]}\n");
    return;
  }
  printf("%-2s %-32s %-20s %6s %12s %12s\n", "", "NAME", "CREATED", "FILES",
         "RAW", "STORED");
  for (size_t i = 0; i < res->n; i++) {
    const struct spot_store_entry *e = &res->entries[i];
    char when[32], raw[32], stored[32];

    if (!e->committed) {
      printf("%-2s %-32s %s\n", "", spot_escape(e->name, name, sizeof(name)),
             e->problem != NULL ? e->problem
                                : "(uncommitted leftover, never restored)");
      continue;
    }
    committed++;
    spot_rfc3339_format(e->created_ms, when, sizeof(when));
    printf("%-2s %-32s %-20s %6" PRIu64 " %12s %12s\n", e->latest ? "*" : "",
           spot_escape(e->name, name, sizeof(name)), when, e->files,
           spot_fmt_bytes(e->raw_bytes, raw, sizeof(raw)),
           spot_fmt_bytes(e->stored_bytes, stored, sizeof(stored)));
  }
  if (res->n == 0)
    printf("(no checkpoints)\n");
  else if (res->latest[0] != '\0')
    printf("* = LATEST (%s); %zu committed\n",
           spot_escape(res->latest, latest, sizeof(latest)), committed);
}

static const char list_usage[] =
    "Usage: spotctl list s3://BUCKET/[PREFIX/]JOB [--json]\n\n"
    "Lists the committed checkpoints of JOB, newest first, marks the one\n"
    "LATEST names, and shows uncommitted leftovers as such.\n\n"
    "  --json             one JSON document for scripts\n";

int
spotctl_cmd_list(int argc, char **argv)
{
  struct common_opts o;
  struct session s;
  int r;

  r = parse_opts(argc, argv, &o, list_usage);
  if (r >= 0)
    return r;
  if (argc - optind != 1)
    return spotctl_usage("list: expected s3://BUCKET/[PREFIX/]JOB");
  memset(&s, 0, sizeof(s));
  r = session_open(&s, argv[optind], &o);
  if (r == 0) {
    r = spot_store_list(&s.c.loop, &s.cfg, list_done_cb, &s, NULL);
    r = r < 0 ? spotctl_fail("list: %s", strerror(-r)) : run_op(&s);
  }
  session_close(&s);
  return r;
}
