/* spotctl history --plot: the job's timeline as a picture (cairo, PNG or
 * SVG). One lane per node (per rank in a multi-node job); each node of a
 * run a bar (the wait for the job lease and the restore before it in
 * colors of their own, the work a preemption or crash lost as an orange
 * strip under it), committed checkpoints as ticks above it, notices as red
 * triangles, a crash as a square mark at its end, each restart in place
 * as the same mark where the trainer failed, the time it was down in pink
 * and the work it lost as an orange strip, a refused start as a
 * short grey bar, the time without a node as grey bands across all lanes;
 * a time axis and a legend. Rectangles are drawn without antialiasing on
 * whole pixels, so each bar is one block of exactly RUN_RGB (tests count
 * them). */
#include <cairo-svg.h>
#include <cairo.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/history.h"
#include "core/util.h"
#include "spotctl.h"

#define WIDTH 1000
#define LEFT 150 /* lane labels */
#define RIGHT 30
#define TOP 56 /* title */
#define LANE_H 44
#define BAR_H 22
#define AXIS_H 40
#define LEGEND_H 56 /* two rows */
#define CRASH_W 10
#define REFUSED_MIN_W 6
#define LANES_MAX 40

struct rgb {
  double r, g, b;
};

/* SPOTCTL_PLOT_RUN_RGB in spotctl.h: the tests look for it. */
static const struct rgb run_c = {SPOTCTL_PLOT_RUN_R / 255.0,
                                 SPOTCTL_PLOT_RUN_G / 255.0,
                                 SPOTCTL_PLOT_RUN_B / 255.0};
#define RGB_OF(r, g, b)                                                        \
  {                                                                            \
    (r) / 255.0, (g) / 255.0, (b) / 255.0                                      \
  }
#define RGB(x) RGB_OF(x)
static const struct rgb restore_c = RGB(SPOTCTL_PLOT_RESTORE_RGB);
static const struct rgb lease_c = RGB(SPOTCTL_PLOT_LEASE_RGB);
static const struct rgb refused_c = RGB(SPOTCTL_PLOT_REFUSED_RGB);
static const struct rgb crash_c = RGB(SPOTCTL_PLOT_CRASH_RGB);
static const struct rgb down_c = RGB(SPOTCTL_PLOT_DOWN_RGB);
static const struct rgb lost_c = {240 / 255.0, 150 / 255.0, 40 / 255.0};
static const struct rgb gap_c = {225 / 255.0, 225 / 255.0, 225 / 255.0};
static const struct rgb notice_c = {214 / 255.0, 39 / 255.0, 40 / 255.0};
static const struct rgb ink = {0.15, 0.15, 0.15};

struct plot {
  cairo_t *cr;
  const struct spot_hist_summary *s;
  int64_t t0, t1;
  double plot_w;
  char lanes[LANES_MAX][72];
  size_t nlanes;
};

static void
color(cairo_t *cr, struct rgb c)
{
  cairo_set_source_rgb(cr, c.r, c.g, c.b);
}

static double
x_of(const struct plot *p, int64_t t)
{
  double f = (double)(t - p->t0) / (double)(p->t1 - p->t0);

  return (double)(int)(LEFT + f * p->plot_w + 0.5);
}

/* A filled rectangle on whole pixels, at least 1 px wide. */
static void
box(cairo_t *cr, double x0, double y, double x1, double h, struct rgb c)
{
  if (x1 < x0 + 1)
    x1 = x0 + 1;
  color(cr, c);
  cairo_rectangle(cr, x0, y, x1 - x0, h);
  cairo_fill(cr);
}

/* A rank's lane whatever host it ran on; else the host's. */
static void
lane_name(const struct spot_hist_node *r, char *buf, size_t size)
{
  if (r->rank >= 0)
    snprintf(buf, size, "rank %" PRId64, r->rank);
  else
    snprintf(buf, size, "%s", r->host[0] != '\0' ? r->host : r->owner);
}

static size_t
lane_of(struct plot *p, const struct spot_hist_node *r)
{
  char name[72];

  lane_name(r, name, sizeof(name));
  for (size_t i = 0; i < p->nlanes; i++)
    if (strcmp(p->lanes[i], name) == 0)
      return i;
  if (p->nlanes == LANES_MAX)
    return LANES_MAX - 1; /* the last lane takes the rest */
  spot_strlcpy(p->lanes[p->nlanes], name, sizeof(p->lanes[0]));
  return p->nlanes++;
}

static void
text(cairo_t *cr, double x, double y, double size, const char *s)
{
  cairo_set_font_size(cr, size);
  cairo_move_to(cr, x, y);
  cairo_show_text(cr, s);
}

/* A step of 1, 2, 5, 10, 15, 30 min, 1, 2, 3, 6, 12 h or days so that the
 * axis has 4 to 10 ticks. */
static int64_t
tick_step(int64_t span)
{
  static const int64_t steps[] = {
      1000,    2000,     5000,     10000,    30000,    60000,
      120000,  300000,   600000,   900000,   1800000,  3600000,
      7200000, 10800000, 21600000, 43200000, 86400000, 172800000,
  };

  for (size_t i = 0; i < SPOT_ARRAY_SIZE(steps); i++)
    if (span / steps[i] <= 10)
      return steps[i];
  return span / 10 + 1;
}

static void
axis(struct plot *p, double y)
{
  cairo_t *cr = p->cr;
  int64_t step = tick_step(p->t1 - p->t0);
  char label[32];

  color(cr, ink);
  cairo_set_line_width(cr, 1);
  cairo_move_to(cr, LEFT, y + 0.5);
  cairo_line_to(cr, LEFT + p->plot_w, y + 0.5);
  cairo_stroke(cr);
  for (int64_t t = 0; t <= p->t1 - p->t0; t += step) {
    double x = x_of(p, p->t0 + t);
    int64_t m = t / 60000;
    cairo_move_to(cr, x + 0.5, y);
    cairo_line_to(cr, x + 0.5, y + 5);
    cairo_stroke(cr);
    if (step < 60000)
      snprintf(label, sizeof(label), "%" PRId64 "s", t / 1000);
    else if (m < 60)
      snprintf(label, sizeof(label), "%" PRId64 "m", m);
    else
      snprintf(label, sizeof(label), "%" PRId64 "h%02" PRId64, m / 60, m % 60);
    text(cr, x - 8, y + 18, 11, label);
  }
  text(cr, LEFT + p->plot_w - 150, y + 34, 11, "time since the first event");
}

static void
swatch(cairo_t *cr, double x, double y, struct rgb c, const char *name)
{
  box(cr, x, y, x + 12, 12, c);
  color(cr, ink);
  text(cr, x + 17, y + 11, 12, name);
}

static void
legend(struct plot *p, double y)
{
  static const char *const names[] = {"training", "lease wait", "restore",
                                      "work lost", "no node (gap)"};
  const struct rgb cs[] = {run_c, lease_c, restore_c, lost_c, gap_c};
  cairo_t *cr = p->cr;
  double x = LEFT;

  for (size_t i = 0; i < SPOT_ARRAY_SIZE(names); i++) {
    swatch(cr, x, y, cs[i], names[i]);
    x += 130;
  }
  x = LEFT;
  y += 20;
  color(cr, ink);
  cairo_rectangle(cr, x + 5, y, 2, 12);
  cairo_fill(cr);
  text(cr, x + 12, y + 11, 12, "checkpoint committed");
  x += 175;
  color(cr, notice_c);
  cairo_move_to(cr, x, y);
  cairo_line_to(cr, x + 12, y);
  cairo_line_to(cr, x + 6, y + 12);
  cairo_close_path(cr);
  cairo_fill(cr);
  color(cr, ink);
  text(cr, x + 17, y + 11, 12, "notice");
  x += 90;
  /* Legend swatches are 12 px: smaller than any mark the tests count. */
  swatch(cr, x, y, crash_c, "crash");
  x += 90;
  swatch(cr, x, y, refused_c, "refused start");
  x += 130;
  swatch(cr, x, y, down_c, "restart (down)");
}

static void
draw_node(struct plot *p, const struct spot_hist_node *r, double top)
{
  cairo_t *cr = p->cr;
  double y = top + (LANE_H - BAR_H) / 2.0 + 4;
  double xt = x_of(p, r->train_start_ms), xe = x_of(p, r->end_ms);

  cairo_set_antialias(cr, CAIRO_ANTIALIAS_NONE);
  if (r->outcome == SPOT_HIST_REFUSED) {
    /* Never trained: a thin bar from its start to its end, wide enough to
     * see however short the attempt. */
    double xs = x_of(p, r->start_ms);
    box(cr, xs, y + BAR_H / 3.0,
        xe > xs + REFUSED_MIN_W ? xe : xs + REFUSED_MIN_W, BAR_H / 3.0,
        refused_c);
    cairo_set_antialias(cr, CAIRO_ANTIALIAS_DEFAULT);
    return;
  }
  if (r->lease_wait_ms > 0)
    box(cr, x_of(p, r->lease_from_ms), y,
        x_of(p, r->lease_from_ms + r->lease_wait_ms), BAR_H, lease_c);
  if (r->restore_from_ms >= 0 && xt > x_of(p, r->restore_from_ms))
    box(cr, x_of(p, r->restore_from_ms), y, xt, BAR_H, restore_c);
  box(cr, xt, y, xe > xt ? xe : xt + 1, BAR_H, run_c);
  if (r->lost_ms - r->restart_lost_ms > 0) {
    int64_t t_end = r->noticed ? r->notice_ms : r->end_ms;
    box(cr, x_of(p, t_end - (r->lost_ms - r->restart_lost_ms)), y + BAR_H + 1,
        x_of(p, t_end), 5, lost_c);
  }
  for (size_t i = 0; i + 2 < r->nrestart_times; i += 3) {
    const int64_t *t = r->restart_times + i; /* failed, running, resumed */
    double xf = x_of(p, t[0]), xr = x_of(p, t[1]);
    if (t[0] > t[2])
      box(cr, x_of(p, t[2]), y + BAR_H + 1, xf, 5, lost_c);
    box(cr, xf, y, xr > xf ? xr : xf + 1, BAR_H, down_c);
    box(cr, xf - CRASH_W / 2.0, y + (BAR_H - CRASH_W) / 2.0, xf + CRASH_W / 2.0,
        CRASH_W, crash_c);
  }
  if (r->outcome == SPOT_HIST_CRASHED)
    box(cr, xe, y + (BAR_H - CRASH_W) / 2.0, xe + CRASH_W, CRASH_W, crash_c);
  color(cr, ink);
  for (size_t i = 0; i < r->ncommit_times; i++) {
    double x = x_of(p, r->commit_times[i]);
    cairo_rectangle(cr, x, y - 7, 2, 6);
    cairo_fill(cr);
  }
  cairo_set_antialias(cr, CAIRO_ANTIALIAS_DEFAULT);
  if (r->noticed) {
    double x = x_of(p, r->notice_ms);
    color(cr, notice_c);
    cairo_move_to(cr, x - 6, y - 12);
    cairo_line_to(cr, x + 6, y - 12);
    cairo_line_to(cr, x, y - 1);
    cairo_close_path(cr);
    cairo_fill(cr);
  }
}

static void
draw(struct plot *p, const char *job, double height)
{
  const struct spot_hist_summary *s = p->s;
  cairo_t *cr = p->cr;
  double lanes_h = (double)p->nlanes * LANE_H;
  char title[512], start[32], lost[64];

  color(cr, (struct rgb){1, 1, 1});
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                         CAIRO_FONT_WEIGHT_NORMAL);
  /* Gaps first, as bands behind the lanes: from a run's end to the next
   * run that trained (a refused start in between is no run). */
  cairo_set_antialias(cr, CAIRO_ANTIALIAS_NONE);
  for (size_t i = 0; i < s->nruns; i++)
    if (s->runs[i].gap_before_ms > 0)
      box(cr, x_of(p, s->runs[i].train_start_ms - s->runs[i].gap_before_ms),
          TOP - 4, x_of(p, s->runs[i].train_start_ms), lanes_h + 4, gap_c);
  cairo_set_antialias(cr, CAIRO_ANTIALIAS_DEFAULT);
  for (size_t i = 0; i < p->nlanes; i++) {
    color(cr, ink);
    text(cr, 10, TOP + (double)i * LANE_H + LANE_H / 2.0 + 8, 12, p->lanes[i]);
  }
  for (size_t i = 0; i < s->nnodes; i++) {
    size_t lane = lane_of(p, &s->nodes[i]);
    draw_node(p, &s->nodes[i], TOP + (double)lane * LANE_H);
  }
  spot_rfc3339_format(s->first_ms, start, sizeof(start));
  spotctl_fmt_dur(s->lost_ms, lost, sizeof(lost));
  snprintf(title, sizeof(title),
           "Job %s: %u run%s, %u preemption%s, %u crash%s, %u restart%s, "
           "%u refused, %s%s of work lost (from %s)",
           job, s->trained_runs, s->trained_runs == 1 ? "" : "s",
           s->preemptions, s->preemptions == 1 ? "" : "s", s->crashes,
           s->crashes == 1 ? "" : "es", s->restarts,
           s->restarts == 1 ? "" : "s", s->refused, s->lost_bound ? ">=" : "",
           lost, start);
  color(cr, ink);
  text(cr, 10, 24, 15, title);
  axis(p, TOP + lanes_h + 6);
  legend(p, height - LEGEND_H + 8);
}

int
spotctl_history_plot(const char *path, const char *job,
                     const struct spot_hist_summary *s, char *err,
                     size_t errsize)
{
  struct plot p;
  cairo_surface_t *surf;
  cairo_status_t st;
  size_t len = strlen(path);
  bool svg = len > 4 && strcmp(path + len - 4, ".svg") == 0;
  double height;

  memset(&p, 0, sizeof(p));
  p.s = s;
  for (size_t i = 0; i < s->nnodes; i++)
    lane_of(&p, &s->nodes[i]);
  if (p.nlanes == 0) {
    snprintf(err, errsize, "no runs in the history, nothing to draw");
    return -ENODATA;
  }
  p.t0 = s->first_ms;
  p.t1 = s->last_ms > s->first_ms ? s->last_ms : s->first_ms + 1000;
  p.plot_w = WIDTH - LEFT - RIGHT;
  height = TOP + (double)p.nlanes * LANE_H + AXIS_H + LEGEND_H + 10;
  surf =
      svg ? cairo_svg_surface_create(path, WIDTH, height)
          : cairo_image_surface_create(CAIRO_FORMAT_RGB24, WIDTH, (int)height);
  p.cr = cairo_create(surf);
  draw(&p, job, height);
  st = cairo_status(p.cr);
  cairo_destroy(p.cr);
  if (st == CAIRO_STATUS_SUCCESS && !svg)
    st = cairo_surface_write_to_png(surf, path);
  cairo_surface_finish(surf);
  if (st == CAIRO_STATUS_SUCCESS)
    st = cairo_surface_status(surf);
  cairo_surface_destroy(surf);
  /* Drop cairo's font caches: spotctl exits soon, and leak checkers
   * (valgrind in CI) should see nothing left. */
  cairo_debug_reset_static_data();
  if (st != CAIRO_STATUS_SUCCESS) {
    snprintf(err, errsize, "%s", cairo_status_to_string(st));
    return -EIO;
  }
  return 0;
}
