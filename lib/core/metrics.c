/* A small registry of Prometheus metrics and its text format. */
#include "core/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

struct series {
  char *labels;     /* rendered: k="v",k2="v2" (escaped), "" for none */
  double value;     /* counter, gauge */
  uint64_t *counts; /* histogram: per bound, then +Inf (not cumulative) */
  double sum;
  uint64_t count;
};

struct family {
  char *name, *help;
  enum spot_metric_type type;
  double bounds[SPOT_METRICS_BUCKETS];
  size_t nbounds;
  struct series series[SPOT_METRICS_SERIES];
  size_t nseries;
};

struct spot_metrics {
  struct family fam[SPOT_METRICS_FAMILIES];
  size_t nfam;
  char *common; /* rendered labels every sample carries, "" none */
};

static const char *const type_names[SPOT_METRIC_LAST] = {
    [SPOT_METRIC_COUNTER] = "counter",
    [SPOT_METRIC_GAUGE] = "gauge",
    [SPOT_METRIC_HISTOGRAM] = "histogram",
};

int
spot_metrics_new(struct spot_metrics **out)
{
  struct spot_metrics *m = calloc(1, sizeof(*m));

  if (m == NULL)
    return -ENOMEM;
  *out = m;
  return 0;
}

void
spot_metrics_free(struct spot_metrics *m)
{
  if (m == NULL)
    return;
  for (size_t i = 0; i < m->nfam; i++) {
    struct family *f = &m->fam[i];
    for (size_t j = 0; j < f->nseries; j++) {
      free(f->series[j].labels);
      free(f->series[j].counts);
    }
    free(f->name);
    free(f->help);
  }
  free(m->common);
  free(m);
}

static bool
name_ok(const char *s, bool colon)
{
  if (s == NULL || s[0] == '\0' || (s[0] >= '0' && s[0] <= '9'))
    return false;
  for (; *s != '\0'; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
          (*s >= '0' && *s <= '9') || *s == '_' || (colon && *s == ':')))
      return false;
  return true;
}

static struct family *
find(const struct spot_metrics *m, const char *name)
{
  for (size_t i = 0; i < m->nfam; i++)
    if (strcmp(m->fam[i].name, name) == 0)
      return (struct family *)&m->fam[i];
  return NULL;
}

int
spot_metrics_escape(const char *in, struct spot_buf *out)
{
  int r = 0;

  for (; *in != '\0' && r == 0; in++) {
    if (*in == '\\')
      r = spot_buf_appends(out, "\\\\");
    else if (*in == '"')
      r = spot_buf_appends(out, "\\\"");
    else if (*in == '\n')
      r = spot_buf_appends(out, "\\n");
    else
      r = spot_buf_append(out, in, 1);
  }
  return r;
}

/* The label list rendered and checked into a new string. */
static int
render_labels(const struct family *f, const char *const *labels, char **out)
{
  struct spot_buf b;
  int r = 0;

  spot_buf_init(&b, 4096);
  for (size_t i = 0; labels != NULL && labels[i] != NULL && r == 0; i += 2) {
    if (labels[i + 1] == NULL || !name_ok(labels[i], false) ||
        strncmp(labels[i], "__", 2) == 0 ||
        (f->type == SPOT_METRIC_HISTOGRAM && strcmp(labels[i], "le") == 0) ||
        strlen(labels[i + 1]) > SPOT_METRICS_LABEL_MAX) {
      r = -EINVAL;
      break;
    }
    r = spot_buf_printf(&b, "%s%s=\"", i > 0 ? "," : "", labels[i]);
    if (r == 0)
      r = spot_metrics_escape(labels[i + 1], &b);
    if (r == 0)
      r = spot_buf_appends(&b, "\"");
  }
  if (r == 0) {
    *out = b.data != NULL ? spot_buf_steal(&b) : strdup("");
    r = *out == NULL ? -ENOMEM : 0;
  }
  spot_buf_fini(&b);
  return r;
}

/* The series of a label set, made on first use. */
static int
get_series(struct family *f, const char *const *labels, bool create,
           struct series **out)
{
  struct series *s;
  char *key = NULL;
  int r = render_labels(f, labels, &key);

  /* (key is set whenever r is 0; the analyzer cannot tell.) */
  if (r < 0 || key == NULL)
    return r < 0 ? r : -ENOMEM;
  for (size_t i = 0; i < f->nseries; i++)
    if (strcmp(f->series[i].labels, key) == 0) {
      free(key);
      *out = &f->series[i];
      return 0;
    }
  if (!create || f->nseries == SPOT_METRICS_SERIES) {
    free(key);
    return create ? -ENOSPC : -ENOENT;
  }
  s = &f->series[f->nseries];
  memset(s, 0, sizeof(*s));
  if (f->type == SPOT_METRIC_HISTOGRAM) {
    s->counts = calloc(f->nbounds + 1, sizeof(*s->counts));
    if (s->counts == NULL) {
      free(key);
      return -ENOMEM;
    }
  }
  s->labels = key;
  f->nseries++;
  *out = s;
  return 0;
}

static int
add_family(struct spot_metrics *m, const char *name, enum spot_metric_type type,
           const char *help, const double *bounds, size_t nbounds,
           bool labelled)
{
  struct family *f;
  struct series *s;

  if (m == NULL || !name_ok(name, true) || (unsigned)type >= SPOT_METRIC_LAST ||
      help == NULL || strchr(help, '\n') != NULL ||
      nbounds > SPOT_METRICS_BUCKETS ||
      (type == SPOT_METRIC_HISTOGRAM) != (nbounds > 0))
    return -EINVAL;
  for (size_t i = 0; i < nbounds; i++)
    if (!isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1]))
      return -EINVAL;
  if (find(m, name) != NULL)
    return -EEXIST;
  if (m->nfam == SPOT_METRICS_FAMILIES)
    return -ENOSPC;
  f = &m->fam[m->nfam];
  memset(f, 0, sizeof(*f));
  f->name = strdup(name);
  f->help = strdup(help);
  if (f->name == NULL || f->help == NULL) {
    free(f->name);
    free(f->help);
    f->name = f->help = NULL;
    return -ENOMEM;
  }
  f->type = type;
  if (nbounds > 0)
    memcpy(f->bounds, bounds, nbounds * sizeof(*bounds));
  f->nbounds = nbounds;
  m->nfam++;
  /* Label-less families are rendered from the start (at 0); a labelled
   * one has no sample without labels, so none is made for it. */
  return labelled ? 0 : get_series(f, NULL, true, &s);
}

int
spot_metrics_register(struct spot_metrics *m, const char *name,
                      enum spot_metric_type type, const char *help,
                      const double *bounds, size_t nbounds)
{
  return add_family(m, name, type, help, bounds, nbounds, false);
}

int
spot_metrics_register_labelled(struct spot_metrics *m, const char *name,
                               enum spot_metric_type type, const char *help,
                               const double *bounds, size_t nbounds)
{
  return add_family(m, name, type, help, bounds, nbounds, true);
}

int
spot_metrics_common_labels(struct spot_metrics *m, const char *const *labels)
{
  struct family f;
  char *r = NULL;
  int e;

  if (m == NULL)
    return -EINVAL;
  /* Checked like any label set, as a family of no particular type. */
  memset(&f, 0, sizeof(f));
  f.type = SPOT_METRIC_HISTOGRAM;
  e = render_labels(&f, labels, &r);
  if (e < 0)
    return e;
  free(m->common);
  m->common = r;
  return 0;
}

static int
update(struct spot_metrics *m, const char *name, const char *const *labels,
       enum spot_metric_type want, struct series **s)
{
  struct family *f = m != NULL ? find(m, name) : NULL;

  if (f == NULL)
    return -ENOENT;
  if (f->type != want &&
      !(want == SPOT_METRIC_COUNTER && f->type == SPOT_METRIC_GAUGE))
    return -EINVAL;
  return get_series(f, labels, true, s);
}

int
spot_metrics_add(struct spot_metrics *m, const char *name,
                 const char *const *labels, double v)
{
  struct family *f = m != NULL ? find(m, name) : NULL;
  struct series *s;
  int r;

  if (f != NULL && f->type == SPOT_METRIC_COUNTER && !(v >= 0))
    return -EINVAL;
  r = update(m, name, labels, SPOT_METRIC_COUNTER, &s);
  if (r == 0)
    s->value += v;
  return r;
}

int
spot_metrics_set(struct spot_metrics *m, const char *name,
                 const char *const *labels, double v)
{
  struct series *s;
  int r = update(m, name, labels, SPOT_METRIC_GAUGE, &s);

  if (r == 0)
    s->value = v;
  return r;
}

int
spot_metrics_observe(struct spot_metrics *m, const char *name,
                     const char *const *labels, double v)
{
  struct family *f = m != NULL ? find(m, name) : NULL;
  struct series *s;
  size_t i;
  int r;

  if (isnan(v))
    return -EINVAL;
  r = update(m, name, labels, SPOT_METRIC_HISTOGRAM, &s);
  if (r < 0)
    return r;
  for (i = 0; i < f->nbounds && v > f->bounds[i]; i++)
    ;
  s->counts[i]++;
  s->sum += v;
  s->count++;
  return 0;
}

int
spot_metrics_get(const struct spot_metrics *m, const char *name,
                 const char *const *labels, double *out)
{
  struct family *f = m != NULL ? find(m, name) : NULL;
  struct series *s;
  int r;

  if (f == NULL)
    return -ENOENT;
  if (f->type == SPOT_METRIC_HISTOGRAM)
    return -EINVAL;
  r = get_series(f, labels, false, &s);
  if (r == 0)
    *out = s->value;
  return r;
}

const char *
spot_metrics_fmt(double v, char *buf, size_t size)
{
  if (isnan(v))
    snprintf(buf, size, "NaN");
  else if (isinf(v))
    snprintf(buf, size, "%sInf", v > 0 ? "+" : "-");
  else if (v > -9007199254740992.0 && v < 9007199254740992.0 &&
           v == (double)(int64_t)v)
    snprintf(buf, size, "%" PRId64, (int64_t)v);
  else
    snprintf(buf, size, "%.17g", v);
  return buf;
}

/* name{common[,labels][,extra]} value\n */
static int
sample(struct spot_buf *out, const char *name, const char *suffix,
       const char *common, const char *labels, const char *extra, double v)
{
  const char *parts[3] = {common != NULL ? common : "", labels,
                          extra != NULL ? extra : ""};
  char num[64];
  bool any = false;
  int r = spot_buf_printf(out, "%s%s", name, suffix);

  for (size_t i = 0; i < 3 && r == 0; i++) {
    if (parts[i][0] == '\0')
      continue;
    r = spot_buf_printf(out, "%s%s", any ? "," : "{", parts[i]);
    any = true;
  }
  if (r == 0)
    r = spot_buf_printf(out, "%s %s\n", any ? "}" : "",
                        spot_metrics_fmt(v, num, sizeof(num)));
  return r;
}

static int
render_histogram(const struct family *f, const struct series *s,
                 const char *common, struct spot_buf *out)
{
  uint64_t cum = 0;
  char le[96], num[64];
  int r = 0;

  for (size_t i = 0; i <= f->nbounds && r == 0; i++) {
    cum += s->counts[i];
    snprintf(le, sizeof(le), "le=\"%s\"",
             i < f->nbounds ? spot_metrics_fmt(f->bounds[i], num, sizeof(num))
                            : "+Inf");
    r = sample(out, f->name, "_bucket", common, s->labels, le, (double)cum);
  }
  if (r == 0)
    r = sample(out, f->name, "_sum", common, s->labels, NULL, s->sum);
  if (r == 0)
    r = sample(out, f->name, "_count", common, s->labels, NULL,
               (double)s->count);
  return r;
}

int
spot_metrics_render(const struct spot_metrics *m, struct spot_buf *out)
{
  int r = 0;

  for (size_t i = 0; i < m->nfam && r == 0; i++) {
    const struct family *f = &m->fam[i];
    r = spot_buf_printf(out, "# HELP %s ", f->name);
    /* HELP escapes \\ and \n only; register() refused newlines. */
    for (const char *p = f->help; *p != '\0' && r == 0; p++)
      r = *p == '\\' ? spot_buf_appends(out, "\\\\")
                     : spot_buf_append(out, p, 1);
    if (r == 0)
      r = spot_buf_printf(out, "\n# TYPE %s %s\n", f->name,
                          type_names[f->type]);
    for (size_t j = 0; j < f->nseries && r == 0; j++) {
      const struct series *s = &f->series[j];
      r = f->type == SPOT_METRIC_HISTOGRAM
              ? render_histogram(f, s, m->common, out)
              : sample(out, f->name, "", m->common, s->labels, NULL, s->value);
    }
  }
  return r;
}

int
spot_metrics_new_spotd(struct spot_metrics **out)
{
  static const double save_b[] = {0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300};
  static const double upload_b[] = {1, 2, 5, 10, 20, 30, 60, 120, 300, 600};
  static const struct {
    const char *name;
    enum spot_metric_type type;
    const char *help;
    const double *b;
    size_t nb;
    bool labelled; /* every sample has labels of its own */
  } defs[] = {
      {SPOT_M_CHECKPOINTS, SPOT_METRIC_COUNTER,
       "Checkpoints that ended, by reason and outcome (committed, failed).",
       NULL, 0, true},
      {SPOT_M_SAVE_SECONDS, SPOT_METRIC_HISTOGRAM,
       "Time the trainer took to save a checkpoint (signal to complete).",
       save_b, SPOT_ARRAY_SIZE(save_b)},
      {SPOT_M_UPLOAD_SECONDS, SPOT_METRIC_HISTOGRAM,
       "Time from a complete checkpoint to its commit (or failure).", upload_b,
       SPOT_ARRAY_SIZE(upload_b)},
      {SPOT_M_UPLOADED_BYTES, SPOT_METRIC_COUNTER,
       "Bytes of committed checkpoints, raw (read) and stored (sent).", NULL, 0,
       true},
      {SPOT_M_LAST_COMMIT, SPOT_METRIC_GAUGE,
       "Unix time of the newest committed checkpoint (0: none yet).", NULL, 0},
      {SPOT_M_WORK_AT_RISK, SPOT_METRIC_GAUGE,
       "Seconds of training since the state of the last commit.", NULL, 0},
      {SPOT_M_NOTICES, SPOT_METRIC_COUNTER,
       "Interruption notices seen, by kind.", NULL, 0, true},
      {SPOT_M_META_ERRORS, SPOT_METRIC_COUNTER,
       "Metadata service polls that failed.", NULL, 0},
      {SPOT_M_RELAUNCHES, SPOT_METRIC_COUNTER,
       "Relaunch commands run, by outcome (ok, failed).", NULL, 0, true},
      {SPOT_M_RESTORE_SECONDS, SPOT_METRIC_GAUGE,
       "How long the restore before the trainer's start took.", NULL, 0},
      {SPOT_M_TRAINER_RESTARTS, SPOT_METRIC_COUNTER,
       "Times this job's trainer was started again (relaunches included).",
       NULL, 0},
  };
  struct spot_metrics *m = NULL;
  int r = spot_metrics_new(&m);

  for (size_t i = 0; r == 0 && i < SPOT_ARRAY_SIZE(defs); i++)
    r = add_family(m, defs[i].name, defs[i].type, defs[i].help, defs[i].b,
                   defs[i].nb, defs[i].labelled);
  if (r < 0) {
    spot_metrics_free(m);
    return r;
  }
  *out = m;
  return 0;
}
