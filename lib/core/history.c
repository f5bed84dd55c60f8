/* The job history: events as JSON (one table of fields drives both the
 * encoder and the strict parser) and the summary of a list of events. */
#include "core/history.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

static const char *const type_names[SPOT_HIST_LAST] = {
    [SPOT_HIST_RUN_START] = "run_start",   [SPOT_HIST_RESTORE] = "restore",
    [SPOT_HIST_CHECKPOINT] = "checkpoint", [SPOT_HIST_NOTICE] = "notice",
    [SPOT_HIST_RUN_END] = "run_end",       [SPOT_HIST_RELAUNCH] = "relaunch",
    [SPOT_HIST_LEASE] = "lease",           [SPOT_HIST_RESTART] = "restart",
    [SPOT_HIST_PROGRESS] = "progress",
};

static const char *const outcome_names[SPOT_HIST_OUTCOME_LAST] = {
    [SPOT_HIST_RUNNING] = "running",     [SPOT_HIST_EXITED] = "exited",
    [SPOT_HIST_PREEMPTED] = "preempted", [SPOT_HIST_CRASHED] = "crashed",
    [SPOT_HIST_STOPPED] = "stopped",     [SPOT_HIST_REFUSED] = "refused",
};

enum ftype { F_STR, F_I64, F_U64, F_DBL, F_BOOL };

#define T(x) (1u << SPOT_HIST_##x)
#define OFF(f) offsetof(struct spot_hist_event, f)
#define SZ(f) sizeof(((struct spot_hist_event *)0)->f)

/* Every optional field: name, type, where it lives, its default (ints),
 * and the event types that carry it. */
static const struct field {
  const char *name;
  enum ftype type;
  size_t off, size;
  int64_t dflt;
  unsigned types;
} fields[] = {
    {"step", F_I64, OFF(step), 0, -1,
     T(RESTORE) | T(CHECKPOINT) | T(NOTICE) | T(RUN_END) | T(PROGRESS) |
         T(RESTART)},
    {"host", F_STR, OFF(host), SZ(host), 0, T(RUN_START)},
    {"instance_id", F_STR, OFF(instance_id), SZ(instance_id), 0, T(RUN_START)},
    {"instance_type", F_STR, OFF(instance_type), SZ(instance_type), 0,
     T(RUN_START)},
    {"zone", F_STR, OFF(zone), SZ(zone), 0, T(RUN_START)},
    {"restart_count", F_I64, OFF(restart_count), 0, 0,
     T(RUN_START) | T(RESTART)},
    {"run", F_STR, OFF(run), SZ(run), 0, T(RUN_START)},
    {"rank", F_I64, OFF(rank), 0, -1, T(RUN_START)},
    {"nranks", F_I64, OFF(nranks), 0, 0, T(RUN_START)},
    {"checkpoint", F_STR, OFF(checkpoint), SZ(checkpoint), 0,
     T(RESTORE) | T(CHECKPOINT) | T(RESTART)},
    {"raw_bytes", F_U64, OFF(raw_bytes), 0, 0, T(RESTORE) | T(CHECKPOINT)},
    {"stored_bytes", F_U64, OFF(stored_bytes), 0, 0,
     T(RESTORE) | T(CHECKPOINT)},
    {"seconds", F_DBL, OFF(seconds), 0, 0, T(RESTORE) | T(RESTART)},
    {"down_s", F_DBL, OFF(down_s), 0, 0, T(RESTART)},
    {"reason", F_STR, OFF(reason), SZ(reason), 0,
     T(CHECKPOINT) | T(RELAUNCH) | T(RUN_END)},
    {"save_s", F_DBL, OFF(save_s), 0, 0, T(CHECKPOINT)},
    {"upload_s", F_DBL, OFF(upload_s), 0, 0, T(CHECKPOINT)},
    {"committed", F_BOOL, OFF(committed), 0, 0, T(CHECKPOINT) | T(RUN_END)},
    {"kind", F_STR, OFF(kind), SZ(kind), 0, T(NOTICE)},
    {"deadline_ms", F_I64, OFF(deadline_ms), 0, -1, T(NOTICE)},
    {"outcome", F_STR, OFF(outcome), SZ(outcome), 0, T(RUN_END)},
    {"lost_s", F_DBL, OFF(lost_s), 0, -1, T(RUN_END)},
    {"exit_code", F_I64, OFF(exit_code), 0, -1, T(RUN_END) | T(RESTART)},
    {"exit_signal", F_I64, OFF(exit_signal), 0, 0, T(RUN_END) | T(RESTART)},
    {"backend", F_STR, OFF(backend), SZ(backend), 0, T(RELAUNCH)},
    {"result", F_STR, OFF(result), SZ(result), 0, T(RELAUNCH)},
    {"action", F_STR, OFF(action), SZ(action), 0, T(LEASE)},
    {"epoch", F_I64, OFF(epoch), 0, 0, T(LEASE)},
};

/* Seconds and counters beyond these are nonsense, not history. */
#define DBL_LIMIT 1e9
#define I64_LIMIT ((int64_t)1 << 53)

const char *
spot_hist_type_name(enum spot_hist_type t)
{
  return (unsigned)t < SPOT_HIST_LAST ? type_names[t] : "?";
}

const char *
spot_hist_outcome_name(enum spot_hist_outcome o)
{
  return (unsigned)o < SPOT_HIST_OUTCOME_LAST ? outcome_names[o] : "?";
}

bool
spot_hist_owner_valid(const char *owner)
{
  size_t n = owner != NULL ? strlen(owner) : 0;

  if (n == 0 || n > SPOT_HIST_OWNER_MAX)
    return false;
  for (size_t i = 0; i < n; i++) {
    char c = owner[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return false;
  }
  return !(n <= 2 && owner[0] == '.' && (n == 1 || owner[1] == '.'));
}

int
spot_hist_set_str(char *field, size_t size, const char *src)
{
  size_t n = strlen(src);

  if (n >= size)
    return -E2BIG;
  memcpy(field, src, n + 1);
  return 0;
}

int
spot_hist_event_init(struct spot_hist_event *ev, enum spot_hist_type type,
                     int64_t time_ms, const char *owner, uint64_t seq)
{
  if ((unsigned)type >= SPOT_HIST_LAST || !spot_hist_owner_valid(owner) ||
      time_ms < 0)
    return -EINVAL;
  memset(ev, 0, sizeof(*ev));
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(fields); i++)
    if (fields[i].type == F_I64)
      *(int64_t *)(void *)((char *)ev + fields[i].off) = fields[i].dflt;
  ev->lost_s = -1;
  ev->type = type;
  ev->time_ms = time_ms;
  ev->seq = seq;
  spot_hist_set_str(ev->owner, sizeof(ev->owner), owner);
  return 0;
}

/* Adds one field when it differs from its default. Returns 0 or -1. */
static int
encode_field(json_t *o, const struct spot_hist_event *ev, const struct field *f)
{
  const char *p = (const char *)ev + f->off;
  int64_t i;
  double d;

  switch (f->type) {
  case F_STR:
    return p[0] == '\0' ? 0 : json_object_set_new(o, f->name, json_string(p));
  case F_I64:
    memcpy(&i, p, sizeof(i));
    return i == f->dflt ? 0 : json_object_set_new(o, f->name, json_integer(i));
  case F_U64: {
    uint64_t u;
    memcpy(&u, p, sizeof(u));
    return u == 0
               ? 0
               : json_object_set_new(o, f->name, json_integer((json_int_t)u));
  }
  case F_DBL:
    memcpy(&d, p, sizeof(d));
    if (d == (double)f->dflt)
      return 0;
    return json_object_set_new(o, f->name, json_real(d));
  case F_BOOL:
    return *(const bool *)(const void *)p
               ? json_object_set_new(o, f->name, json_true())
               : 0;
  }
  return -1;
}

int
spot_hist_encode(const struct spot_hist_event *ev, char **out)
{
  json_t *o;
  int bad = 0;
  char *s;

  if ((unsigned)ev->type >= SPOT_HIST_LAST ||
      !spot_hist_owner_valid(ev->owner) || ev->time_ms < 0 ||
      ev->seq > (uint64_t)I64_LIMIT)
    return -EINVAL;
  o = json_object();
  if (o == NULL)
    return -ENOMEM;
  bad |= json_object_set_new(o, "v", json_integer(SPOT_HIST_VERSION));
  bad |= json_object_set_new(o, "type", json_string(type_names[ev->type]));
  bad |= json_object_set_new(o, "time_ms", json_integer(ev->time_ms));
  bad |= json_object_set_new(o, "owner", json_string(ev->owner));
  bad |= json_object_set_new(o, "seq", json_integer((json_int_t)ev->seq));
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(fields); i++)
    if (fields[i].types & (1u << ev->type))
      bad |= encode_field(o, ev, &fields[i]);
  s = bad ? NULL : json_dumps(o, JSON_COMPACT);
  json_decref(o);
  if (s == NULL)
    return -ENOMEM;
  *out = s;
  return 0;
}

__attribute__((format(printf, 3, 4))) static int
fail(char *err, size_t size, const char *fmt, ...)
{
  va_list ap;

  if (size > 0) {
    va_start(ap, fmt);
    vsnprintf(err, size, fmt, ap);
    va_end(ap);
  }
  return -EINVAL;
}

/* An integer within [lo, hi] (JSON integers only). */
static int
get_int(json_t *v, int64_t lo, int64_t hi, int64_t *out)
{
  json_int_t i;

  if (!json_is_integer(v))
    return -EINVAL;
  i = json_integer_value(v);
  if (i < lo || i > hi)
    return -ERANGE;
  *out = i;
  return 0;
}

static int
parse_field(json_t *v, struct spot_hist_event *ev, const struct field *f,
            char *err, size_t size)
{
  char *p = (char *)ev + f->off;
  int64_t i;
  double d;

  switch (f->type) {
  case F_STR:
    if (!json_is_string(v))
      return fail(err, size, "%s: expected a string", f->name);
    if (json_string_length(v) >= f->size ||
        strlen(json_string_value(v)) != json_string_length(v))
      return fail(err, size, "%s: longer than %zu bytes or has a NUL", f->name,
                  f->size - 1);
    memcpy(p, json_string_value(v), json_string_length(v) + 1);
    return 0;
  case F_I64:
    if (get_int(v, -1, I64_LIMIT, &i) < 0)
      return fail(err, size, "%s: expected an integer from -1 to 2^53",
                  f->name);
    memcpy(p, &i, sizeof(i));
    return 0;
  case F_U64:
    if (get_int(v, 0, I64_LIMIT, &i) < 0)
      return fail(err, size, "%s: expected an integer from 0 to 2^53", f->name);
    {
      uint64_t u = (uint64_t)i;
      memcpy(p, &u, sizeof(u));
    }
    return 0;
  case F_DBL:
    if (!json_is_number(v))
      return fail(err, size, "%s: expected a number", f->name);
    d = json_number_value(v);
    if (!isfinite(d) || d < -1 || d > DBL_LIMIT)
      return fail(err, size, "%s: out of range", f->name);
    memcpy(p, &d, sizeof(d));
    return 0;
  case F_BOOL:
    if (!json_is_boolean(v))
      return fail(err, size, "%s: expected true or false", f->name);
    *(bool *)(void *)p = json_is_true(v);
    return 0;
  }
  return fail(err, size, "internal: field type");
}

static int
parse_header(json_t *o, struct spot_hist_event *out, char *err, size_t size)
{
  json_t *type = json_object_get(o, "type");
  json_t *owner = json_object_get(o, "owner");
  int64_t v, t, seq;
  int k;

  if (get_int(json_object_get(o, "v"), 0, 1000, &v) < 0 ||
      v != SPOT_HIST_VERSION)
    return fail(err, size, "v: expected %d", SPOT_HIST_VERSION);
  if (!json_is_string(type))
    return fail(err, size, "type: expected a string");
  for (k = 0; k < SPOT_HIST_LAST; k++)
    if (strcmp(json_string_value(type), type_names[k]) == 0)
      break;
  if (k == SPOT_HIST_LAST)
    return fail(err, size, "type: unknown event type");
  if (get_int(json_object_get(o, "time_ms"), 0, I64_LIMIT, &t) < 0)
    return fail(err, size, "time_ms: expected milliseconds since the epoch");
  if (get_int(json_object_get(o, "seq"), 0, I64_LIMIT, &seq) < 0)
    return fail(err, size, "seq: expected a count from 0");
  if (!json_is_string(owner) ||
      strlen(json_string_value(owner)) != json_string_length(owner) ||
      spot_hist_event_init(out, (enum spot_hist_type)k, t,
                           json_string_value(owner), (uint64_t)seq) < 0)
    return fail(err, size,
                "owner: expected 1-%d characters of "
                "[A-Za-z0-9._-]",
                SPOT_HIST_OWNER_MAX);
  return 0;
}

int
spot_hist_parse(const char *json, size_t len, struct spot_hist_event *out,
                char *err, size_t errsize)
{
  struct spot_hist_event ev;
  json_error_t je;
  json_t *o;
  int r;

  memset(&ev, 0, sizeof(ev));
  if (len > SPOT_HIST_EVENT_MAX) {
    fail(err, errsize, "event of %zu bytes, more than %d", len,
         SPOT_HIST_EVENT_MAX);
    return -E2BIG;
  }
  o = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
  if (o == NULL)
    return fail(err, errsize, "invalid JSON: %s", je.text);
  if (!json_is_object(o)) {
    json_decref(o);
    return fail(err, errsize, "expected a JSON object");
  }
  r = parse_header(o, &ev, err, errsize);
  for (size_t i = 0; r == 0 && i < SPOT_ARRAY_SIZE(fields); i++) {
    json_t *v = json_object_get(o, fields[i].name);
    if (v != NULL && (fields[i].types & (1u << ev.type)))
      r = parse_field(v, &ev, &fields[i], err, errsize);
  }
  json_decref(o);
  if (r == 0)
    *out = ev;
  return r;
}

static int
cmp_events(const void *a, const void *b)
{
  const struct spot_hist_event *x = a, *y = b;
  int c;

  if (x->time_ms != y->time_ms)
    return x->time_ms < y->time_ms ? -1 : 1;
  c = strcmp(x->owner, y->owner);
  if (c != 0)
    return c;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

void
spot_hist_sort(struct spot_hist_event *ev, size_t n)
{
  if (n > 1)
    qsort(ev, n, sizeof(*ev), cmp_events);
}

/* Per-node bookkeeping while summarizing. */
struct acc {
  bool ended, committed_any, lease_closed;
  unsigned notices, failed;
  int64_t last_ms, capture_ms, capture_step, start_step, end_step;
  const char *last_commit; /* the newest checkpoint it committed */
};

struct work {
  struct spot_hist_summary *s;
  struct acc *accs;
  size_t alloc, runs_alloc;
  const struct spot_hist_event *ev;
  size_t n;
};

static size_t
find_node(const struct spot_hist_summary *s, const char *owner)
{
  for (size_t i = s->nnodes; i-- > 0;)
    if (strcmp(s->nodes[i].owner, owner) == 0)
      return i;
  return SIZE_MAX;
}

static int64_t
max64(int64_t a, int64_t b)
{
  return a > b ? a : b;
}

static void
take_checkpoint(struct spot_hist_node *r, struct acc *a,
                const struct spot_hist_event *e)
{
  r->checkpoints++;
  r->save_s += e->save_s;
  r->upload_s += e->upload_s;
  if (!e->committed) {
    a->failed++;
    return;
  }
  r->commits++;
  a->committed_any = true;
  a->last_commit = e->checkpoint;
  /* The state saved is the one when the trainer began writing. */
  a->capture_ms = e->time_ms - (int64_t)((e->save_s + e->upload_s) * 1000.0);
  a->capture_step = e->step;
}

static void
take_end(struct spot_hist_node *r, struct acc *a,
         const struct spot_hist_event *e)
{
  static const struct {
    const char *name;
    enum spot_hist_outcome o;
  } map[] = {
      {"preempted", SPOT_HIST_PREEMPTED}, {"exited", SPOT_HIST_EXITED},
      {"stopped", SPOT_HIST_STOPPED},     {"crashed", SPOT_HIST_CRASHED},
      {"refused", SPOT_HIST_REFUSED},
  };

  a->ended = true;
  r->end_ms = e->time_ms;
  r->final_committed = e->committed;
  r->exit_code = e->exit_code;
  r->exit_signal = e->exit_signal;
  r->outcome = SPOT_HIST_CRASHED;
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(map); i++)
    if (strcmp(e->outcome, map[i].name) == 0)
      r->outcome = map[i].o;
  if (r->outcome == SPOT_HIST_REFUSED)
    r->refused = e->reason[0] != '\0' ? e->reason : "unknown";
  r->exhausted = r->outcome == SPOT_HIST_CRASHED &&
                 strcmp(e->reason, "restarts-used") == 0;
  if (e->step >= 0 && a->end_step < 0)
    a->end_step = e->step;
}

static void
take_lease(struct spot_hist_summary *s, struct spot_hist_node *r, struct acc *a,
           const struct spot_hist_event *e)
{
  s->lease_changes++;
  if (strcmp(e->action, "waiting") == 0) {
    if (r->lease_from_ms < 0)
      r->lease_from_ms = e->time_ms;
  } else if (r->lease_from_ms >= 0 && !a->lease_closed &&
             (strcmp(e->action, "held") == 0 ||
              strcmp(e->action, "acquired") == 0 ||
              strcmp(e->action, "failed") == 0)) {
    a->lease_closed = true;
    r->lease_wait_ms = max64(0, e->time_ms - r->lease_from_ms);
    /* Nothing trains while it waits: a fresh start (no restore follows)
     * trains from here. */
    if (r->restore_from_ms < 0)
      r->train_start_ms = max64(r->train_start_ms, e->time_ms);
  }
}

/* The node of an owner, made on its first event. */
static int
node_of(struct work *w, const struct spot_hist_event *e, size_t *out)
{
  struct spot_hist_summary *s = w->s;
  size_t i = find_node(s, e->owner);
  struct spot_hist_node *r;
  struct acc *a;

  if (i != SIZE_MAX) {
    *out = i;
    return 0;
  }
  if (s->nnodes == w->alloc) {
    size_t na = w->alloc ? w->alloc * 2 : 8;
    struct spot_hist_node *nr = realloc(s->nodes, na * sizeof(*nr));
    struct acc *nacc;
    if (nr == NULL)
      return -ENOMEM;
    s->nodes = nr;
    nacc = realloc(w->accs, na * sizeof(*nacc));
    if (nacc == NULL)
      return -ENOMEM;
    w->accs = nacc;
    w->alloc = na;
  }
  i = s->nnodes++;
  r = &s->nodes[i];
  memset(r, 0, sizeof(*r));
  r->owner = e->owner;
  r->host = r->instance_id = r->instance_type = r->zone = "";
  r->run_id = r->restored = r->notice_kind = r->refused = "";
  r->rank = -1;
  r->run = SIZE_MAX; /* group_nodes() */
  r->start_ms = r->train_start_ms = e->time_ms;
  r->lease_from_ms = r->restore_from_ms = -1;
  r->last_step = -1;
  r->exit_code = -1;
  a = &w->accs[i];
  memset(a, 0, sizeof(*a));
  a->capture_step = a->start_step = a->end_step = -1;
  *out = i;
  return 0;
}

/* Adds one event to its node. */
static int
take_event(struct work *w, const struct spot_hist_event *e)
{
  struct spot_hist_summary *s = w->s;
  struct spot_hist_node *r;
  struct acc *a;
  size_t i;

  if (node_of(w, e, &i) < 0)
    return -ENOMEM;
  r = &s->nodes[i];
  a = &w->accs[i];
  a->last_ms = e->time_ms;
  r->last_step = max64(r->last_step, e->step);
  switch (e->type) {
  case SPOT_HIST_RUN_START:
    r->host = e->host;
    r->instance_id = e->instance_id;
    r->instance_type = e->instance_type;
    r->zone = e->zone;
    if (e->run[0] != '\0') {
      r->run_id = e->run;
      r->rank = e->rank;
    }
    break;
  case SPOT_HIST_RESTORE:
    r->restored = e->checkpoint;
    r->restore_s = e->seconds;
    r->train_start_ms = e->time_ms;
    r->restore_from_ms =
        max64(r->start_ms, e->time_ms - (int64_t)(e->seconds * 1000.0 + 0.5));
    a->start_step = e->step;
    break;
  case SPOT_HIST_CHECKPOINT:
    take_checkpoint(r, a, e);
    break;
  case SPOT_HIST_NOTICE:
    a->notices++;
    if (!r->noticed) {
      r->noticed = true;
      r->notice_ms = e->time_ms;
      r->notice_kind = e->kind;
      if (e->step >= 0)
        a->end_step = e->step;
    }
    break;
  case SPOT_HIST_RUN_END:
    take_end(r, a, e);
    break;
  case SPOT_HIST_RELAUNCH:
    s->relaunches++;
    if (strcmp(e->result, "ok") != 0)
      s->relaunch_failures++;
    break;
  case SPOT_HIST_LEASE:
    take_lease(s, r, a, e);
    break;
  case SPOT_HIST_RESTART:
    s->restarts++;
    r->restarts++;
    break;
  default:
    break;
  }
  return 0;
}

/* The totals add up to 10000 runs of up to 2^53 ms each: a sum that
 * would overflow stays at INT64_MAX instead of wrapping negative. */
static void
add64(int64_t *sum, int64_t v)
{
  if (__builtin_add_overflow(*sum, v, sum))
    *sum = v < 0 ? INT64_MIN : INT64_MAX;
}

static bool
has_rank(const struct spot_hist_summary *s, size_t run, int64_t rank)
{
  for (size_t i = 0; i < s->nnodes; i++)
    if (s->nodes[i].run == run && s->nodes[i].rank == rank &&
        s->nodes[i].run_id[0] != '\0')
      return true;
  return false;
}

/* Whether node i started while a node of run k was still alive. */
static bool
overlaps(const struct work *w, size_t k, size_t i)
{
  const struct spot_hist_summary *s = w->s;

  for (size_t j = 0; j < i; j++)
    if (s->nodes[j].run == k && s->nodes[i].start_ms <= w->accs[j].last_ms)
      return true;
  return false;
}

/* Puts every node into a run: the ranks of one multi-node run share its
 * run id. A run id seen again with a rank it already has is a new run
 * (the same id reused by a later start). Without --run-id or Slurm the id
 * comes from the RESTARTS count, which ranks read at slightly different
 * times and may see differently: a rank the newest multi-node run lacks,
 * started while that run's nodes were alive, is one of its nodes too. */
static int
group_nodes(struct work *w)
{
  struct spot_hist_summary *s = w->s;

  for (size_t i = 0; i < s->nnodes; i++) {
    struct spot_hist_node *nd = &s->nodes[i];
    size_t run = SIZE_MAX, last = s->nruns - 1;

    if (nd->run_id[0] != '\0')
      for (size_t k = s->nruns; k-- > 0;)
        if (strcmp(s->runs[k].run_id, nd->run_id) == 0) {
          if (!has_rank(s, k, nd->rank))
            run = k;
          break;
        }
    if (run == SIZE_MAX && nd->run_id[0] != '\0' && s->nruns > 0 &&
        s->runs[last].run_id[0] != '\0' && !has_rank(s, last, nd->rank) &&
        overlaps(w, last, i))
      run = last;
    if (run == SIZE_MAX) {
      if (s->nruns == w->runs_alloc) {
        size_t na = w->runs_alloc ? w->runs_alloc * 2 : 8;
        struct spot_hist_run *nr = realloc(s->runs, na * sizeof(*nr));
        if (nr == NULL)
          return -ENOMEM;
        s->runs = nr;
        w->runs_alloc = na;
      }
      run = s->nruns++;
      memset(&s->runs[run], 0, sizeof(s->runs[run]));
      s->runs[run].run_id = nd->run_id;
    }
    nd->run = run;
    s->runs[run].nnodes++;
  }
  return 0;
}

/* The capture time and step of the commit of checkpoint `name`. */
static bool
commit_capture(const struct work *w, const char *name, int64_t *ms,
               int64_t *step)
{
  for (size_t i = 0; i < w->n; i++) {
    const struct spot_hist_event *e = &w->ev[i];
    if (e->type == SPOT_HIST_CHECKPOINT && e->committed &&
        strcmp(e->checkpoint, name) == 0) {
      *ms = e->time_ms - (int64_t)((e->save_s + e->upload_s) * 1000.0);
      *step = e->step;
      return true;
    }
  }
  return false;
}

/* The checkpoint the first node of run `next` restored, NULL none. */
static const char *
next_restored(const struct work *w, size_t next)
{
  const struct spot_hist_summary *s = w->s;

  for (size_t i = 0; i < s->nnodes; i++)
    if (s->nodes[i].run == next && s->nodes[i].restored[0] != '\0')
      return s->nodes[i].restored;
  return NULL;
}

/* The state a later start resumed from: the capture time and step of the
 * commit of the checkpoint the first node of run `next` restored. */
static bool
resumed_from(const struct work *w, size_t next, int64_t *ms, int64_t *step)
{
  const char *name = next_restored(w, next);

  return name != NULL && commit_capture(w, name, ms, step);
}

/* Restarts in place, in the order they happened: each one's failure
 * (its start again less the time it was down), the state it resumed
 * (the commit it names, else what the node started from) and the work
 * between them. */
static void
take_restarts(struct work *w)
{
  struct spot_hist_summary *s = w->s;
  size_t k = 0;

  for (size_t i = 0; i < s->nnodes; i++) {
    struct spot_hist_node *r = &s->nodes[i];
    const struct acc *a = &w->accs[i];
    r->restart_times = s->rtimes_ + k;
    r->restart_lost_steps = -1;
    for (size_t j = 0; j < w->n; j++) {
      const struct spot_hist_event *e = &w->ev[j];
      int64_t down, failed, cap = r->train_start_ms;
      int64_t cap_step = r->restored[0] != '\0' ? a->start_step : 0;

      if (e->type != SPOT_HIST_RESTART || strcmp(e->owner, r->owner) != 0)
        continue;
      down = (int64_t)(e->down_s * 1000.0 + 0.5);
      failed = max64(r->start_ms, e->time_ms - down);
      if (e->checkpoint[0] != '\0')
        (void)commit_capture(w, e->checkpoint, &cap, &cap_step);
      else /* an older writer's: the node's newest commit before it */
        for (size_t m = 0; m < j; m++)
          if (w->ev[m].type == SPOT_HIST_CHECKPOINT && w->ev[m].committed &&
              strcmp(w->ev[m].owner, r->owner) == 0) {
            cap = w->ev[m].time_ms -
                  (int64_t)((w->ev[m].save_s + w->ev[m].upload_s) * 1000.0);
            cap_step = w->ev[m].step;
          }
      cap = cap < failed ? cap : failed;
      s->rtimes_[k++] = failed;
      s->rtimes_[k++] = e->time_ms;
      s->rtimes_[k++] = cap;
      r->down_ms += e->time_ms - failed;
      r->restart_lost_ms += failed - cap;
      if (e->step >= 0 && cap_step >= 0)
        r->restart_lost_steps =
            max64(r->restart_lost_steps, 0) + max64(0, e->step - cap_step);
    }
    r->nrestart_times = (size_t)(s->rtimes_ + k - r->restart_times);
  }
}

#define SPOT_HIST_CAPTURE_SLACK_MS 2

/* The restarts' loss is part of the node's. */
static void
add_restart_loss(struct spot_hist_node *r)
{
  if (r->restarts == 0)
    return;
  r->lost_ms = max64(r->lost_ms, 0) + r->restart_lost_ms;
  if (r->restart_lost_steps >= 0)
    r->lost_steps = max64(r->lost_steps, 0) + r->restart_lost_steps;
}

/* Outcome and lost work of one node once all events are in. */
static void
close_node(struct work *w, size_t i)
{
  struct spot_hist_summary *s = w->s;
  struct spot_hist_node *r = &s->nodes[i];
  const struct acc *a = &w->accs[i];
  int64_t t_end, capture, cap_step, end_step;

  if (!a->ended) {
    r->end_ms = a->last_ms;
    r->outcome = r->run + 1 == s->nruns ? SPOT_HIST_RUNNING : SPOT_HIST_CRASHED;
  }
  /* A node that saw a notice and was not finished by its trainer was
   * preempted, whatever else stopped it; a refused start trained nothing
   * and lost nothing, notice or not. */
  if (r->noticed && r->outcome != SPOT_HIST_EXITED &&
      r->outcome != SPOT_HIST_REFUSED)
    r->outcome = SPOT_HIST_PREEMPTED;
  if (r->outcome == SPOT_HIST_REFUSED)
    r->train_start_ms = r->end_ms;
  r->lost_ms = r->lost_steps = -1;
  if (r->outcome != SPOT_HIST_PREEMPTED && r->outcome != SPOT_HIST_CRASHED) {
    add_restart_loss(r);
    return;
  }
  t_end = r->noticed ? r->notice_ms : r->end_ms;
  capture = a->committed_any ? a->capture_ms : r->train_start_ms;
  cap_step = a->committed_any         ? a->capture_step
             : r->restored[0] != '\0' ? a->start_step
                                      : 0;
  /* The job goes on from what the next run restored: a commit that did
   * not verify, or a newer one by another node, moves that point. */
  if (r->run + 1 < s->nruns)
    resumed_from(w, r->run + 1, &capture, &cap_step);
  /* The time before the last restart is the restarts' loss already. */
  if (r->nrestart_times >= 3)
    capture = max64(capture, r->restart_times[r->nrestart_times - 2]);
  /* The trainer's step at the end: the notice's, the run_end's, else the
   * newest it reported (a killed node's progress events). */
  end_step = a->end_step >= 0 ? a->end_step : r->last_step;
  /* capture is the commit's time less save_s and upload_s, each rounded
   * to the millisecond: it may come out up to SPOT_HIST_CAPTURE_SLACK_MS
   * early, which is no work lost. */
  r->lost_ms =
      t_end - capture <= SPOT_HIST_CAPTURE_SLACK_MS ? 0 : t_end - capture;
  if (end_step >= 0 && cap_step >= 0)
    r->lost_steps = max64(0, end_step - cap_step);
  /* Final and nothing committed in the run: the checkpoint it resumed
   * from was the final one, the trainer made no step (spotd said so). */
  if (r->final_committed && !a->committed_any && r->restored[0] != '\0') {
    r->lost_ms = 0;
    r->lost_steps = 0;
  }
  /* Final committed and the job goes on from it (or the next run is not
   * known yet): nothing lost, on every rank. A rank that learned of the
   * notice from another (through the store, up to a poll later) saw its
   * trainer save for the peer before its own notice: still nothing. */
  if (r->final_committed && r->noticed && a->committed_any &&
      (r->run + 1 >= s->nruns || next_restored(w, r->run + 1) == NULL ||
       strcmp(next_restored(w, r->run + 1), a->last_commit) == 0)) {
    r->lost_ms = 0;
    r->lost_steps = r->lost_steps >= 0 || end_step >= 0 ? 0 : -1;
  }
  /* Killed (no run_end) and no step ever reported: its last event is the
   * last thing known, the work lost is at least this much. */
  r->lost_bound = !a->ended && r->last_step < 0 && r->lost_ms > 0;
  add_restart_loss(r);
}

static int
outcome_rank(enum spot_hist_outcome o)
{
  static const int rank[SPOT_HIST_OUTCOME_LAST] = {
      [SPOT_HIST_PREEMPTED] = 5, [SPOT_HIST_CRASHED] = 4,
      [SPOT_HIST_RUNNING] = 3,   [SPOT_HIST_STOPPED] = 2,
      [SPOT_HIST_EXITED] = 1,    [SPOT_HIST_REFUSED] = 0,
  };
  return rank[o];
}

/* A run from its nodes: one run counts once however many ranks it has. */
static void
close_run(struct work *w, size_t k)
{
  struct spot_hist_summary *s = w->s;
  struct spot_hist_run *run = &s->runs[k];
  bool first = true, trained_any = false;

  run->lost_ms = run->lost_steps = -1;
  run->exit_code = -1;
  run->final_committed = true;
  for (size_t i = 0; i < s->nnodes; i++) {
    const struct spot_hist_node *nd = &s->nodes[i];
    const struct acc *a = &w->accs[i];
    if (nd->run != k)
      continue;
    if (first) {
      run->owner = nd->owner;
      run->host = nd->host;
      run->restored = nd->restored;
      run->notice_kind = nd->notice_kind;
      run->refused = nd->refused;
      run->start_ms = nd->start_ms;
      run->train_start_ms = nd->train_start_ms;
      run->end_ms = nd->end_ms;
      run->outcome = nd->outcome;
    }
    first = false;
    run->start_ms = nd->start_ms < run->start_ms ? nd->start_ms : run->start_ms;
    run->end_ms = max64(run->end_ms, nd->end_ms);
    /* The ranks train together: from when the last of them is ready. */
    if (nd->outcome != SPOT_HIST_REFUSED) {
      if (!trained_any || nd->train_start_ms > run->train_start_ms)
        run->train_start_ms = nd->train_start_ms;
      trained_any = true;
    }
    if (outcome_rank(nd->outcome) > outcome_rank(run->outcome))
      run->outcome = nd->outcome;
    if (run->restored[0] == '\0')
      run->restored = nd->restored;
    if (nd->noticed && (!run->noticed || nd->notice_ms < run->notice_ms)) {
      run->noticed = true;
      run->notice_ms = nd->notice_ms;
      run->notice_kind = nd->notice_kind;
    }
    if (nd->checkpoints > run->checkpoints) {
      run->checkpoints = nd->checkpoints;
      run->commits = nd->commits;
      run->failed = a->failed;
    }
    run->save_s = nd->save_s > run->save_s ? nd->save_s : run->save_s;
    run->upload_s = nd->upload_s > run->upload_s ? nd->upload_s : run->upload_s;
    run->restore_s =
        nd->restore_s > run->restore_s ? nd->restore_s : run->restore_s;
    run->lease_wait_ms = max64(run->lease_wait_ms, nd->lease_wait_ms);
    if (!nd->final_committed)
      run->final_committed = false;
    run->lost_ms = max64(run->lost_ms, nd->lost_ms);
    run->lost_steps = max64(run->lost_steps, nd->lost_steps);
    if (run->exit_code < 0 && run->exit_signal == 0) {
      run->exit_code = nd->exit_code;
      run->exit_signal = nd->exit_signal;
    }
    run->restarts = nd->restarts > run->restarts ? nd->restarts : run->restarts;
    run->down_ms = max64(run->down_ms, nd->down_ms);
    run->exhausted |= nd->exhausted;
    run->lost_bound |= nd->lost_bound;
  }
  if (!trained_any)
    run->train_start_ms = run->end_ms;
  if (run->outcome == SPOT_HIST_REFUSED)
    run->refused = run->refused[0] != '\0' ? run->refused : "unknown";
  else
    run->refused = "";
}

/* The job's totals from its runs (and its nodes for the node time). */
static void
totals(struct work *w)
{
  struct spot_hist_summary *s = w->s;
  int64_t prev_end = -1;
  unsigned notices = 0;

  for (size_t i = 0; i < s->nnodes; i++)
    add64(&s->node_ms, max64(0, s->nodes[i].end_ms - s->nodes[i].start_ms));
  for (size_t k = 0; k < s->nruns; k++) {
    struct spot_hist_run *run = &s->runs[k];
    unsigned run_notices = 0;

    for (size_t i = 0; i < s->nnodes; i++)
      if (s->nodes[i].run == k && w->accs[i].notices > run_notices)
        run_notices = w->accs[i].notices;
    notices += run_notices;
    run->gap_before_ms = -1;
    add64(&s->lease_wait_ms, run->lease_wait_ms);
    if (run->outcome == SPOT_HIST_REFUSED) {
      s->refused++;
      continue;
    }
    s->trained_runs++;
    if (prev_end >= 0) {
      run->gap_before_ms = max64(0, run->train_start_ms - prev_end);
      add64(&s->gap_ms, run->gap_before_ms);
      s->max_gap_ms = max64(s->max_gap_ms, run->gap_before_ms);
    }
    prev_end = run->end_ms;
    add64(&s->train_ms,
          max64(0, run->end_ms - run->train_start_ms - run->down_ms));
    add64(&s->down_ms, run->down_ms);
    if (run->exhausted)
      s->exhausted++;
    s->lost_bound |= run->lost_bound;
    s->checkpoints += run->checkpoints;
    s->commits += run->commits;
    s->failed += run->failed;
    s->save_s += run->save_s;
    s->upload_s += run->upload_s;
    if (run->outcome == SPOT_HIST_PREEMPTED)
      s->preemptions++;
    else if (run->outcome == SPOT_HIST_CRASHED)
      s->crashes++;
    if (run->lost_ms >= 0)
      add64(&s->lost_ms, run->lost_ms);
    if (run->lost_steps >= 0) {
      s->lost_steps = max64(s->lost_steps, 0);
      add64(&s->lost_steps, run->lost_steps);
    }
  }
  s->notices = notices;
}

static void
fill_commit_times(struct spot_hist_summary *s, const struct spot_hist_event *ev,
                  size_t n)
{
  size_t k = 0;

  for (size_t i = 0; i < s->nnodes; i++) {
    struct spot_hist_node *r = &s->nodes[i];
    r->commit_times = s->times_ + k;
    for (size_t j = 0; j < n; j++)
      if (ev[j].type == SPOT_HIST_CHECKPOINT && ev[j].committed &&
          strcmp(ev[j].owner, r->owner) == 0)
        s->times_[k++] = ev[j].time_ms;
    r->ncommit_times = (size_t)(s->times_ + k - r->commit_times);
  }
}

/* Useful training on demand: each rank needs its own node. */
static double
on_demand_ms(const struct spot_hist_summary *s)
{
  double ms = 0;

  for (size_t k = 0; k < s->nruns; k++) {
    const struct spot_hist_run *run = &s->runs[k];
    if (run->outcome == SPOT_HIST_REFUSED)
      continue;
    ms += (double)max64(0, run->end_ms - run->train_start_ms - run->down_ms -
                               max64(0, run->lost_ms)) *
          (double)run->nnodes;
  }
  return ms;
}

int
spot_hist_summarize(const struct spot_hist_event *ev, size_t n,
                    double price_spot, double price_on_demand,
                    struct spot_hist_summary *out)
{
  struct spot_hist_summary s;
  struct work w;
  int r = 0;

  memset(&s, 0, sizeof(s));
  memset(&w, 0, sizeof(w));
  w.s = &s;
  w.ev = ev;
  w.n = n;
  s.lost_steps = -1;
  for (size_t i = 0; i < n && r == 0; i++)
    r = take_event(&w, &ev[i]);
  if (r == 0)
    r = group_nodes(&w);
  s.times_ = r == 0 ? calloc(n + 1, sizeof(*s.times_)) : NULL;
  s.rtimes_ = s.times_ != NULL ? calloc(3 * n + 1, sizeof(*s.rtimes_)) : NULL;
  if (s.rtimes_ == NULL) {
    free(s.times_);
    free(w.accs);
    free(s.nodes);
    free(s.runs);
    return -ENOMEM;
  }
  take_restarts(&w);
  for (size_t i = 0; i < s.nnodes; i++)
    close_node(&w, i);
  for (size_t k = 0; k < s.nruns; k++)
    close_run(&w, k);
  totals(&w);
  free(w.accs);
  fill_commit_times(&s, ev, n);
  if (n > 0) {
    s.first_ms = ev[0].time_ms;
    s.last_ms = ev[n - 1].time_ms;
    s.wall_ms = s.last_ms - s.first_ms;
  }
  if (s.train_ms > 0)
    s.overhead = s.save_s / ((double)s.train_ms / 1000.0);
  if (price_spot > 0 && price_on_demand > 0) {
    s.priced = true;
    s.price_spot = price_spot;
    s.price_on_demand = price_on_demand;
    s.cost_spot = (double)s.node_ms / 3600e3 * price_spot;
    s.cost_on_demand = on_demand_ms(&s) / 3600e3 * price_on_demand;
    s.saving = s.cost_on_demand - s.cost_spot;
  }
  *out = s;
  return 0;
}

void
spot_hist_summary_fini(struct spot_hist_summary *s)
{
  if (s == NULL)
    return;
  free(s->runs);
  free(s->nodes);
  free(s->times_);
  free(s->rtimes_);
  memset(s, 0, sizeof(*s));
}

static double
secs(int64_t ms)
{
  return (double)ms / 1000.0;
}

static double
secs_or(int64_t ms)
{
  return ms >= 0 ? secs(ms) : -1.0;
}

static json_t *
node_json(const struct spot_hist_node *r)
{
  json_t *o = json_pack(
      "{s:s,s:s,s:s,s:s,s:s,s:s,s:I,s:s,s:f,s:I,s:f,s:I,s:I,s:s,s:s,s:b,"
      "s:I,s:s,s:i,s:i,s:f,s:f,s:b,s:I,s:I,s:f,s:I,s:I}",
      "owner", r->owner, "host", r->host, "instance_id", r->instance_id,
      "instance_type", r->instance_type, "zone", r->zone, "run_id", r->run_id,
      "rank", (json_int_t)r->rank, "restored", r->restored, "restore_s",
      r->restore_s, "start_ms", (json_int_t)r->start_ms, "lease_wait_s",
      secs(r->lease_wait_ms), "train_start_ms", (json_int_t)r->train_start_ms,
      "end_ms", (json_int_t)r->end_ms, "outcome",
      spot_hist_outcome_name(r->outcome), "refused", r->refused, "noticed",
      r->noticed, "notice_ms", (json_int_t)(r->noticed ? r->notice_ms : -1),
      "notice_kind", r->notice_kind, "checkpoints", (int)r->checkpoints,
      "commits", (int)r->commits, "save_s", r->save_s, "upload_s", r->upload_s,
      "final_committed", r->final_committed, "last_step",
      (json_int_t)r->last_step, "lost_steps", (json_int_t)r->lost_steps,
      "lost_s", secs_or(r->lost_ms), "exit_code", (json_int_t)r->exit_code,
      "exit_signal", (json_int_t)r->exit_signal);

  if (o != NULL &&
      json_object_update_new(
          o,
          json_pack("{s:i,s:f,s:I,s:f,s:b,s:b}", "restarts", (int)r->restarts,
                    "restart_lost_s", secs(r->restart_lost_ms),
                    "restart_lost_steps", (json_int_t)r->restart_lost_steps,
                    "down_s", secs(r->down_ms), "exhausted", r->exhausted,
                    "lost_bound", r->lost_bound)) < 0) {
    json_decref(o);
    return NULL;
  }
  return o;
}

static json_t *
run_json(const struct spot_hist_summary *s, size_t k)
{
  const struct spot_hist_run *r = &s->runs[k];
  json_t *nodes = json_array();
  json_t *o = json_pack(
      "{s:s,s:s,s:s,s:s,s:f,s:f,s:I,s:I,s:I,s:s,s:s,s:b,s:I,s:s,s:i,s:i,"
      "s:i,s:f,s:f,s:b,s:I,s:f,s:f,s:I,s:I}",
      "run_id", r->run_id, "owner", r->owner, "host", r->host, "restored",
      r->restored, "restore_s", r->restore_s, "lease_wait_s",
      secs(r->lease_wait_ms), "start_ms", (json_int_t)r->start_ms,
      "train_start_ms", (json_int_t)r->train_start_ms, "end_ms",
      (json_int_t)r->end_ms, "outcome", spot_hist_outcome_name(r->outcome),
      "refused", r->refused, "noticed", r->noticed, "notice_ms",
      (json_int_t)(r->noticed ? r->notice_ms : -1), "notice_kind",
      r->notice_kind, "checkpoints", (int)r->checkpoints, "commits",
      (int)r->commits, "failed_checkpoints", (int)r->failed, "save_s",
      r->save_s, "upload_s", r->upload_s, "final_committed", r->final_committed,
      "lost_steps", (json_int_t)r->lost_steps, "lost_s", secs_or(r->lost_ms),
      "gap_before_s", secs_or(r->gap_before_ms), "exit_code",
      (json_int_t)r->exit_code, "exit_signal", (json_int_t)r->exit_signal);
  int bad = o == NULL || nodes == NULL;

  if (!bad)
    bad |= json_object_update_new(
               o, json_pack("{s:i,s:f,s:b,s:b}", "restarts", (int)r->restarts,
                            "down_s", secs(r->down_ms), "exhausted",
                            r->exhausted, "lost_bound", r->lost_bound)) < 0;
  for (size_t i = 0; !bad && i < s->nnodes; i++)
    if (s->nodes[i].run == k)
      bad |= json_array_append_new(nodes, node_json(&s->nodes[i])) < 0;
  if (!bad)
    bad |= json_object_set(o, "nodes", nodes) < 0;
  json_decref(nodes);
  if (bad) {
    json_decref(o);
    return NULL;
  }
  return o;
}

static json_t *
summary_json(const struct spot_hist_summary *s)
{
  json_t *o = json_pack(
      "{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:I,s:I,s:f,s:f,"
      "s:f,s:f,s:I,s:f,s:f,s:f,s:f,s:f,s:f}",
      "runs", (int)s->trained_runs, "preemptions", (int)s->preemptions,
      "crashes", (int)s->crashes, "refused", (int)s->refused, "nodes",
      (int)s->nnodes, "notices", (int)s->notices, "checkpoints",
      (int)s->checkpoints, "commits", (int)s->commits, "failed_checkpoints",
      (int)s->failed, "relaunches", (int)s->relaunches, "relaunch_failures",
      (int)s->relaunch_failures, "lease_changes", (int)s->lease_changes,
      "restarts", (int)s->restarts, "first_ms", (json_int_t)s->first_ms,
      "last_ms", (json_int_t)s->last_ms, "wall_s", secs(s->wall_ms), "node_s",
      secs(s->node_ms), "train_s", secs(s->train_ms), "lost_s",
      secs(s->lost_ms), "lost_steps", (json_int_t)s->lost_steps, "lease_wait_s",
      secs(s->lease_wait_ms), "gap_s", secs(s->gap_ms), "max_gap_s",
      secs(s->max_gap_ms), "save_s", s->save_s, "upload_s", s->upload_s,
      "overhead", s->overhead);

  if (o != NULL &&
      json_object_update_new(o, json_pack("{s:i,s:f,s:b}", "restarts_used_up",
                                          (int)s->exhausted, "down_s",
                                          secs(s->down_ms), "lost_bound",
                                          s->lost_bound)) < 0) {
    json_decref(o);
    return NULL;
  }
  if (o != NULL && s->priced) {
    json_t *c =
        json_pack("{s:f,s:f,s:f,s:f,s:f}", "price_spot", s->price_spot,
                  "price_on_demand", s->price_on_demand, "spot", s->cost_spot,
                  "on_demand", s->cost_on_demand, "saving", s->saving);
    if (c == NULL || json_object_set_new(o, "cost", c) < 0) {
      json_decref(o);
      return NULL;
    }
  }
  return o;
}

int
spot_hist_summary_json(const struct spot_hist_summary *s, const char *job,
                       const struct spot_hist_event *ev, size_t n, char **out)
{
  json_t *root = json_object(), *runs = json_array(), *evs = json_array();
  json_t *sum = summary_json(s);
  int bad = root == NULL || runs == NULL || evs == NULL || sum == NULL;
  char *str = NULL;

  for (size_t i = 0; !bad && i < s->nruns; i++)
    bad |= json_array_append_new(runs, run_json(s, i)) < 0;
  for (size_t i = 0; !bad && ev != NULL && i < n; i++) {
    char *e = NULL;
    json_t *j;
    bad |= spot_hist_encode(&ev[i], &e) < 0;
    j = bad ? NULL : json_loads(e, 0, NULL);
    free(e);
    bad |= j == NULL || json_array_append_new(evs, j) < 0;
  }
  if (!bad) {
    bad |= json_object_set_new(root, "job", json_string(job)) < 0;
    bad |= json_object_set(root, "summary", sum) < 0;
    bad |= json_object_set(root, "runs", runs) < 0;
    if (ev != NULL)
      bad |= json_object_set(root, "events", evs) < 0;
  }
  if (!bad)
    str = json_dumps(root, JSON_INDENT(1) | JSON_ENSURE_ASCII);
  json_decref(root);
  json_decref(runs);
  json_decref(evs);
  json_decref(sum);
  if (str == NULL)
    return -ENOMEM;
  *out = str;
  return 0;
}
