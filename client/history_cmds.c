/* spotctl history / history-event: read a job's history from the store and
 * show it (table, JSON, timeline picture), or write events through the
 * same writer spotd uses (tests, demos, and jobs run before spotd wrote
 * its own history). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "core/history.h"
#include "core/log.h"
#include "core/s3url.h"
#include "core/util.h"
#include "io/aws.h"
#include "io/http.h"
#include "io/s3.h"
#include "io/store/history_store.h"
#include "spotctl.h"

#define EVENTS_IN_MAX 100000 /* history-event: lines read */

struct hsession {
  struct spotctl_s3 c;
  bool done;
  struct spot_store_config cfg;
  int err;
  char msg[512];
};

struct hopts {
  const char *endpoint, *region, *profile, *plot;
  double price_spot, price_on_demand;
  unsigned keep;
  bool json;
};

enum {
  OPT_ENDPOINT = 256,
  OPT_REGION,
  OPT_PROFILE,
  OPT_JSON,
  OPT_PLOT,
  OPT_PRICE_SPOT,
  OPT_PRICE_OD,
  OPT_KEEP,
};

static const struct option long_opts[] = {
    {"help", no_argument, NULL, 'h'},
    {"endpoint", required_argument, NULL, OPT_ENDPOINT},
    {"region", required_argument, NULL, OPT_REGION},
    {"profile", required_argument, NULL, OPT_PROFILE},
    {"json", no_argument, NULL, OPT_JSON},
    {"plot", required_argument, NULL, OPT_PLOT},
    {"price-spot", required_argument, NULL, OPT_PRICE_SPOT},
    {"price-on-demand", required_argument, NULL, OPT_PRICE_OD},
    {"keep", required_argument, NULL, OPT_KEEP},
    {NULL, 0, NULL, 0},
};

static const char s3_help[] =
    "  --endpoint URL     S3 endpoint (default: $AWS_ENDPOINT_URL_S3,\n"
    "                     $AWS_ENDPOINT_URL, else AWS's regional endpoint)\n"
    "  --region REGION    S3 region (default: $AWS_REGION, the profile, IMDS)\n"
    "  --profile NAME     profile of ~/.aws/credentials and ~/.aws/config\n"
    "  -h, --help         this help\n";

static int
parse_price(const char *opt, const char *v, double *out)
{
  char *end;
  double d;

  errno = 0;
  d = strtod(v, &end);
  if (errno != 0 || end == v || *end != '\0' || !isfinite(d) || d <= 0 ||
      d > 1e6)
    return spotctl_usage("%s: expected a price per hour > 0, got '%s'", opt, v);
  *out = d;
  return 0;
}

/* Returns -1 to go on, or an exit status. */
static int
parse_opts(int argc, char **argv, struct hopts *o, const char *usage)
{
  int c;

  memset(o, 0, sizeof(*o));
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
    switch (c) {
    case 'h':
      fputs(usage, stdout);
      fputs(s3_help, stdout);
      return SPOTCTL_EXIT_OK;
    case OPT_ENDPOINT:
      o->endpoint = optarg;
      break;
    case OPT_REGION:
      o->region = optarg;
      break;
    case OPT_PROFILE:
      o->profile = optarg;
      break;
    case OPT_JSON:
      o->json = true;
      break;
    case OPT_PLOT:
      o->plot = optarg;
      break;
    case OPT_PRICE_SPOT:
      if (parse_price("--price-spot", optarg, &o->price_spot) != 0)
        return SPOTCTL_EXIT_USAGE;
      break;
    case OPT_PRICE_OD:
      if (parse_price("--price-on-demand", optarg, &o->price_on_demand) != 0)
        return SPOTCTL_EXIT_USAGE;
      break;
    case OPT_KEEP: {
      int64_t k;
      if (spot_parse_int64(optarg, 1, 1000000, &k) < 0)
        return spotctl_usage("--keep: expected 1 to 1000000, got '%s'", optarg);
      o->keep = (unsigned)k;
      break;
    }
    default:
      return spotctl_bad_option(argv[0], argv);
    }
  }
  return -1;
}

static void
run_until_done(struct hsession *s)
{
  while (!s->done && uv_run(&s->c.loop, UV_RUN_ONCE) != 0)
    ;
}

/* Loop, HTTP, credentials, S3. Returns 0 or an exit status (printed). */
static int
hsession_open(struct hsession *s, const char *url, const struct hopts *o)
{
  struct spotctl_s3_options so;
  int r;

  memset(&so, 0, sizeof(so));
  so.endpoint = o->endpoint;
  so.region = o->region;
  so.profile = o->profile;
  r = spotctl_s3_open_job(&s->c, url, &so, &s->cfg);
  if (r != 0)
    return r;
  s->done = false;
  return 0;
}

static void
hsession_close(struct hsession *s)
{
  spotctl_s3_close(&s->c);
}

const char *
spotctl_fmt_dur(long long ms, char *buf, size_t size)
{
  int64_t s = ms / 1000;

  if (ms < 0)
    snprintf(buf, size, "-");
  else if (s >= 86400)
    snprintf(buf, size, "%" PRId64 "d%02" PRId64 "h", s / 86400,
             s % 86400 / 3600);
  else if (s >= 3600)
    snprintf(buf, size, "%" PRId64 "h%02" PRId64 "m", s / 3600, s % 3600 / 60);
  else if (s >= 60)
    snprintf(buf, size, "%" PRId64 "m%02" PRId64 "s", s / 60, s % 60);
  else
    snprintf(buf, size, "%.1fs", (double)ms / 1000.0);
  return buf;
}

static void
print_runs(const struct spot_hist_summary *s)
{
  printf("%-3s %-22s %-20s %-9s %-9s %-5s %-14s %s\n", "RUN", "NODE",
         "STARTED (UTC)", "TRAINED", "OUTCOME", "CKPTS", "LOST", "GAP BEFORE");
  for (size_t i = 0; i < s->nruns; i++) {
    const struct spot_hist_run *r = &s->runs[i];
    char when[32], trained[32], lost[48], gap[32], ck[16], node[48];

    if (r->nnodes > 1)
      snprintf(node, sizeof(node), "%zu nodes", r->nnodes);
    else
      snprintf(node, sizeof(node), "%s",
               spotctl_esc(r->host[0] != '\0' ? r->host : r->owner));
    spot_rfc3339_format(r->start_ms, when, sizeof(when));
    spotctl_fmt_dur(r->outcome == SPOT_HIST_REFUSED
                        ? -1
                        : r->end_ms - r->train_start_ms - r->down_ms,
                    trained, sizeof(trained));
    lost[0] = r->lost_bound ? '>' : '\0';
    lost[1] = '\0';
    spotctl_fmt_dur(r->lost_ms, lost + (r->lost_bound ? 1 : 0),
                    sizeof(lost) - 1);
    if (r->lost_steps >= 0) {
      size_t n = strlen(lost);
      snprintf(lost + n, sizeof(lost) - n, " (%" PRId64 " st)", r->lost_steps);
    }
    snprintf(ck, sizeof(ck), "%u/%u", r->commits, r->checkpoints);
    printf("%-3zu %-22.22s %-20s %-9s %-9s %-5s %-14s %s\n", i + 1, node, when,
           trained, spot_hist_outcome_name(r->outcome), ck, lost,
           spotctl_fmt_dur(r->gap_before_ms, gap, sizeof(gap)));
    if (r->outcome == SPOT_HIST_REFUSED)
      printf("    start refused: %s\n", spotctl_esc(r->refused));
    if (r->outcome == SPOT_HIST_CRASHED && r->exit_signal > 0)
      printf("    the trainer was killed by signal %" PRId64 "%s\n",
             r->exit_signal, r->exhausted ? ": restarts used up" : "");
    else if (r->outcome == SPOT_HIST_CRASHED && r->exit_code >= 0)
      printf("    the trainer exited with status %" PRId64 "%s\n", r->exit_code,
             r->exhausted ? ": restarts used up" : "");
    if (r->restarts > 0) {
      char w[32];
      printf("    %u restart%s in place, trainer down %s\n", r->restarts,
             r->restarts == 1 ? "" : "s",
             spotctl_fmt_dur(r->down_ms, w, sizeof(w)));
    }
    if (r->lost_bound)
      printf("    killed, and its trainer reported no step: at least this "
             "much work was lost\n");
    if (r->lease_wait_ms > 0) {
      char w[32];
      printf("    waited %s for the job lease\n",
             spotctl_fmt_dur(r->lease_wait_ms, w, sizeof(w)));
    }
    if (r->nnodes > 1)
      printf("    run id %s\n", spotctl_esc(r->run_id));
    for (size_t k = 0; r->nnodes > 1 && k < s->nnodes; k++) {
      const struct spot_hist_node *nd = &s->nodes[k];
      if (nd->run != i)
        continue;
      printf("    rank %" PRId64 " on %s: %s\n", nd->rank,
             spotctl_esc(nd->host[0] != '\0' ? nd->host : nd->owner),
             spot_hist_outcome_name(nd->outcome));
    }
    if (r->noticed) {
      char at[32];
      spot_rfc3339_format(r->notice_ms, at, sizeof(at));
      printf("    notice %s at %s%s\n", spotctl_esc(r->notice_kind), at,
             r->final_committed ? ", final checkpoint committed"
                                : ", no final checkpoint committed");
    }
  }
}

static void
print_summary(const char *job, const struct spot_hist_summary *s)
{
  char a[32], b[32], c[32];
  double train_s = (double)s->train_ms / 1000.0;

  printf("Job %s: %u run%s, %u preemption%s, %u crash%s, %u refused "
         "start%s\n\n",
         spotctl_esc(job), s->trained_runs, s->trained_runs == 1 ? "" : "s",
         s->preemptions, s->preemptions == 1 ? "" : "s", s->crashes,
         s->crashes == 1 ? "" : "es", s->refused, s->refused == 1 ? "" : "s");
  print_runs(s);
  printf("\nSummary\n");
  printf("  %-16s %s\n", "wall time",
         spotctl_fmt_dur(s->wall_ms, a, sizeof(a)));
  printf("  %-16s %s (%.0f%% of wall time)\n", "time training",
         spotctl_fmt_dur(s->train_ms, a, sizeof(a)),
         s->wall_ms > 0 ? 100.0 * (double)s->train_ms / (double)s->wall_ms
                        : 0.0);
  printf("  %-16s %s total, %s longest\n", "resume gap",
         spotctl_fmt_dur(s->gap_ms, a, sizeof(a)),
         spotctl_fmt_dur(s->max_gap_ms, b, sizeof(b)));
  printf("  %-16s %s\n", "lease wait",
         spotctl_fmt_dur(s->lease_wait_ms, a, sizeof(a)));
  printf("  %-16s %s%s", "work lost", s->lost_bound ? "at least " : "",
         spotctl_fmt_dur(s->lost_ms, a, sizeof(a)));
  if (s->lost_steps >= 0)
    printf(" (%" PRId64 " steps)", s->lost_steps);
  printf(" over %u preemption%s, %u crash%s and %u restart%s in place\n",
         s->preemptions, s->preemptions == 1 ? "" : "s", s->crashes,
         s->crashes == 1 ? "" : "es", s->restarts, s->restarts == 1 ? "" : "s");
  printf("  %-16s %u (%u committed, %u failed); saving %.1f s (%.2f%% of "
         "training), uploads %.1f s\n",
         "checkpoints", s->checkpoints, s->commits, s->failed, s->save_s,
         train_s > 0 ? 100.0 * s->save_s / train_s : 0.0, s->upload_s);
  printf("  %-16s %u (%u failed)\n", "relaunches", s->relaunches,
         s->relaunch_failures);
  if (s->restarts > 0)
    printf("  %-16s %u (the trainer failed and was started again in "
           "place), down %s\n",
           "trainer restarts", s->restarts,
           spotctl_fmt_dur(s->down_ms, a, sizeof(a)));
  if (s->exhausted > 0)
    printf("  %-16s %u run%s ended with its restarts used up\n",
           "restarts used up", s->exhausted, s->exhausted == 1 ? "" : "s");
  if (s->priced)
    printf("  %-16s spot %.2f (%s of nodes at %.3f/h) vs on-demand %.2f "
           "(%s of useful training at %.3f/h): %s %.2f (%.0f%%)\n",
           "cost", s->cost_spot, spotctl_fmt_dur(s->node_ms, b, sizeof(b)),
           s->price_spot, s->cost_on_demand,
           spotctl_fmt_dur(s->train_ms - s->lost_ms, c, sizeof(c)),
           s->price_on_demand, s->saving >= 0 ? "saved" : "extra",
           fabs(s->saving),
           s->cost_on_demand > 0 ? 100.0 * fabs(s->saving) / s->cost_on_demand
                                 : 0.0);
}

struct show {
  struct hsession *s;
  const struct hopts *o;
  int exit_code;
};

static void
read_cb(const struct spot_history_read_result *res, void *data)
{
  struct show *sh = data;
  struct spot_hist_summary sum;
  char err[256], *json;

  sh->s->done = true;
  if (res->err < 0) {
    sh->exit_code = spotctl_fail("history: %s", res->message);
    return;
  }
  if (res->skipped > 0)
    fprintf(stderr,
            "spotctl: warning: %u history objects were not valid "
            "events (malformed, or over %d bytes) and are left out\n",
            res->skipped, SPOT_HIST_EVENT_MAX);
  if (spot_hist_summarize(res->events, res->n, sh->o->price_spot,
                          sh->o->price_on_demand, &sum) < 0) {
    sh->exit_code = spotctl_fail("history: out of memory");
    return;
  }
  sh->exit_code = SPOTCTL_EXIT_OK;
  if (res->n == 0 && res->skipped == 0) {
    /* A job name mistyped looks the same: say so, and fail. */
    sh->exit_code = spotctl_fail("history: job %s has no history in the "
                                 "store (no such job, or spotd never ran "
                                 "it)",
                                 spotctl_esc(sh->s->c.job));
    spot_hist_summary_fini(&sum);
    return;
  }
  if (sh->o->json) {
    if (spot_hist_summary_json(&sum, sh->s->c.job, res->events, res->n, &json) <
        0) {
      sh->exit_code = spotctl_fail("history: out of memory");
    } else {
      printf("%s\n", json);
      free(json);
    }
  } else if (res->n == 0) {
    printf("Job %s: no history recorded\n", spotctl_esc(sh->s->c.job));
  } else {
    print_summary(sh->s->c.job, &sum);
  }
  if (sh->o->plot != NULL && sh->exit_code == SPOTCTL_EXIT_OK &&
      spotctl_history_plot(sh->o->plot, sh->s->c.job, &sum, err, sizeof(err)) <
          0)
    sh->exit_code = spotctl_fail("history: --plot %s: %s", sh->o->plot, err);
  spot_hist_summary_fini(&sum);
}

static const char history_usage[] =
    "Usage: spotctl history s3://BUCKET/[PREFIX/]JOB [OPTIONS]\n\n"
    "Shows what happened to JOB from the history spotd keeps in the store:\n"
    "its runs (the ranks of a multi-node run count once), preemptions,\n"
    "crashes and refused starts (the trainer never started: lease held\n"
    "elsewhere, restore failed), the work each preemption or crash lost\n"
    "(from the state the job resumed from to the notice or the crash), the\n"
    "wait for the job lease, the time without a node (resume gap), the\n"
    "checkpoint overhead and, with both prices, the cost against on-demand.\n\n"
    "  --json             one JSON document (summary, runs, events)\n"
    "  --plot FILE        draw the timeline into FILE.png or FILE.svg\n"
    "  --price-spot X     spot price per node-hour\n"
    "  --price-on-demand Y\n"
    "                     on-demand price per node-hour\n";

int
spotctl_cmd_history(int argc, char **argv)
{
  struct hopts o;
  struct hsession s;
  struct show sh;
  size_t n;
  int r;

  r = parse_opts(argc, argv, &o, history_usage);
  if (r >= 0)
    return r;
  if (argc - optind != 1)
    return spotctl_usage("history: expected s3://BUCKET/[PREFIX/]JOB");
  if (o.keep > 0)
    return spotctl_usage("history: --keep is an option of history-event");
  if ((o.price_spot > 0) != (o.price_on_demand > 0))
    return spotctl_usage("history: give both --price-spot and "
                         "--price-on-demand");
  if (o.plot != NULL &&
      ((n = strlen(o.plot)) < 5 || (strcmp(o.plot + n - 4, ".png") != 0 &&
                                    strcmp(o.plot + n - 4, ".svg") != 0)))
    return spotctl_usage("history: --plot: expected a FILE.png or FILE.svg");
  memset(&s, 0, sizeof(s));
  memset(&sh, 0, sizeof(sh));
  r = hsession_open(&s, argv[optind], &o);
  if (r == 0) {
    sh.s = &s;
    sh.o = &o;
    r = spot_history_read(&s.c.loop, &s.cfg, read_cb, &sh, NULL);
    if (r < 0) {
      r = spotctl_fail("history: %s", strerror(-r));
    } else {
      run_until_done(&s);
      r = s.done ? sh.exit_code
                 : spotctl_fail("internal: the read never finished");
    }
  }
  hsession_close(&s);
  return r;
}

/* ---- history-event ------------------------------------------------------ */

struct writing {
  struct hsession *s;
  unsigned written, failed;
  bool closed;
};

static void
report_cb(int err, const char *key, const char *message, void *data)
{
  struct writing *w = data;

  /* The writer has logged the failure as a warning already. */
  if (err == 0)
    w->written++;
  else
    w->failed++;
}

static void
writer_closed_cb(void *data)
{
  struct writing *w = data;

  w->closed = true;
  w->s->done = true;
}

/* Parses every line of f into *out (*n events). Returns 0, or an exit
 * status after printing the error. */
static int
read_events(FILE *f, const char *name, struct spot_hist_event **out, size_t *n)
{
  char line[SPOT_HIST_EVENT_MAX + 2], err[256];
  size_t alloc = 0, lineno = 0;

  *out = NULL;
  *n = 0;
  while (fgets(line, sizeof(line), f) != NULL) {
    size_t len = strlen(line);
    lineno++;
    if (len > 0 && line[len - 1] == '\n')
      line[--len] = '\0';
    else if (!feof(f))
      return spotctl_fail("history-event: %s:%zu: line longer than %d bytes",
                          name, lineno, SPOT_HIST_EVENT_MAX);
    if (len == 0)
      continue;
    if (*n == EVENTS_IN_MAX)
      return spotctl_fail("history-event: %s: more than %d events", name,
                          EVENTS_IN_MAX);
    if (*n == alloc) {
      size_t na = alloc ? alloc * 2 : 16;
      struct spot_hist_event *ne = realloc(*out, na * sizeof(*ne));
      if (ne == NULL)
        return spotctl_fail("history-event: out of memory");
      *out = ne;
      alloc = na;
    }
    if (spot_hist_parse(line, len, &(*out)[*n], err, sizeof(err)) < 0)
      return spotctl_usage("history-event: %s:%zu: %s", name, lineno, err);
    (*n)++;
  }
  if (ferror(f))
    return spotctl_fail("history-event: reading %s: %s", name, strerror(errno));
  return 0;
}

static const char event_usage[] =
    "Usage: spotctl history-event s3://BUCKET/[PREFIX/]JOB [FILE|-]\n\n"
    "Writes job history events into the store through the writer spotd\n"
    "uses: one JSON event per line (the format is in lib/core/history.h),\n"
    "from FILE or standard input. For tests, demos, and recording what\n"
    "happened to a job by hand. Fails if any event is invalid or not\n"
    "written.\n\n"
    "  --keep N           prune the job's history to the newest N events\n"
    "                     (spotd keeps 5000)\n";

int
spotctl_cmd_history_event(int argc, char **argv)
{
  struct spot_history_options ho;
  struct spot_history *h = NULL;
  struct spot_hist_event *ev = NULL;
  struct writing w;
  struct hopts o;
  struct hsession s;
  const char *name;
  FILE *f;
  size_t n = 0;
  int r;

  r = parse_opts(argc, argv, &o, event_usage);
  if (r >= 0)
    return r;
  if (argc - optind < 1 || argc - optind > 2)
    return spotctl_usage("history-event: expected s3://BUCKET/[PREFIX/]JOB "
                         "and FILE or -");
  if (o.json || o.plot != NULL || o.price_spot > 0 || o.price_on_demand > 0)
    return spotctl_usage("history-event: --json, --plot and prices are "
                         "options of history");
  name = argc - optind == 2 ? argv[optind + 1] : "-";
  f = strcmp(name, "-") == 0 ? stdin : fopen(name, "re");
  if (f == NULL)
    return spotctl_fail("history-event: %s: %s", name, strerror(errno));
  r = read_events(f, name, &ev, &n);
  if (f != stdin)
    fclose(f);
  if (r != 0) {
    free(ev);
    return r;
  }
  memset(&s, 0, sizeof(s));
  memset(&w, 0, sizeof(w));
  w.s = &s;
  r = hsession_open(&s, argv[optind], &o);
  if (r == 0) {
    memset(&ho, 0, sizeof(ho));
    ho.queue_max = (unsigned)(n > 0 ? n : 1);
    ho.keep = o.keep;
    r = spot_history_new(&s.c.loop, &s.cfg, &ho, report_cb, &w, &h);
    for (size_t i = 0; r == 0 && i < n; i++)
      r = spot_history_emit(h, &ev[i]);
    if (h != NULL)
      spot_history_close(h, 60000, writer_closed_cb, &w);
    run_until_done(&s);
    if (r < 0)
      r = spotctl_fail("history-event: %s", strerror(-r));
    else if (!w.closed || w.failed > 0 || w.written != n)
      r = spotctl_fail("history-event: %u of %zu events written", w.written, n);
  }
  hsession_close(&s);
  free(ev);
  return r;
}
