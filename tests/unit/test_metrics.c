#include "cmocka-compat.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/metrics.h"

static char *
render(struct spot_metrics *m)
{
  struct spot_buf b;
  char *s;

  spot_buf_init(&b, 1 << 20);
  assert_int_equal(spot_metrics_render(m, &b), 0);
  s = strdup(spot_buf_str(&b));
  spot_buf_fini(&b);
  return s;
}

static void
test_counter_gauge(void **state)
{
  struct spot_metrics *m;
  char *text;
  double v;

  assert_int_equal(spot_metrics_new(&m), 0);
  assert_int_equal(spot_metrics_register(m, "x_total", SPOT_METRIC_COUNTER,
                                         "Things \\ done.", NULL, 0),
                   0);
  assert_int_equal(spot_metrics_register(m, "x_total", SPOT_METRIC_COUNTER,
                                         "again", NULL, 0),
                   -EEXIST);
  assert_int_equal(
      spot_metrics_register(m, "g", SPOT_METRIC_GAUGE, "A gauge.", NULL, 0), 0);
  /* Label-less families start at 0. */
  text = render(m);
  assert_string_equal(text, "# HELP x_total Things \\\\ done.\n"
                            "# TYPE x_total counter\n"
                            "x_total 0\n"
                            "# HELP g A gauge.\n"
                            "# TYPE g gauge\n"
                            "g 0\n");
  free(text);
  assert_int_equal(spot_metrics_add(m, "x_total", NULL, 2), 0);
  assert_int_equal(spot_metrics_add(m, "x_total", NULL, -1), -EINVAL);
  assert_int_equal(
      spot_metrics_add(m, "x_total", SPOT_LABELS("k", "a\"b\\c\nd"), 1), 0);
  assert_int_equal(
      spot_metrics_add(m, "x_total", SPOT_LABELS("k", "v", "k2", "w"), 0.5), 0);
  assert_int_equal(
      spot_metrics_add(m, "x_total", SPOT_LABELS("k", "v", "k2", "w"), 0.5), 0);
  assert_int_equal(spot_metrics_set(m, "g", NULL, -2.25), 0);
  assert_int_equal(spot_metrics_add(m, "g", NULL, 1), 0);
  assert_int_equal(spot_metrics_set(m, "x_total", NULL, 5), -EINVAL);
  assert_int_equal(spot_metrics_observe(m, "g", NULL, 5), -EINVAL);
  assert_int_equal(spot_metrics_add(m, "nope", NULL, 1), -ENOENT);
  assert_int_equal(spot_metrics_add(m, "x_total", SPOT_LABELS("1k", "v"), 1),
                   -EINVAL);
  assert_int_equal(spot_metrics_add(m, "x_total", SPOT_LABELS("__k", "v"), 1),
                   -EINVAL);
  assert_int_equal(
      spot_metrics_get(m, "x_total", SPOT_LABELS("k", "v", "k2", "w"), &v), 0);
  assert_true(v == 1.0);
  assert_int_equal(spot_metrics_get(m, "x_total", SPOT_LABELS("k", "zz"), &v),
                   -ENOENT);
  text = render(m);
  assert_non_null(strstr(text, "\nx_total 2\n"));
  assert_non_null(strstr(text, "\nx_total{k=\"a\\\"b\\\\c\\nd\"} 1\n"));
  assert_non_null(strstr(text, "\nx_total{k=\"v\",k2=\"w\"} 1\n"));
  assert_non_null(strstr(text, "\ng -1.25\n"));
  free(text);
  spot_metrics_free(m);
  spot_metrics_free(NULL);
}

static void
test_histogram(void **state)
{
  static const double b[] = {0.5, 1, 2.5};
  static const double bad[] = {1, 1};
  struct spot_metrics *m;
  char *text;

  assert_int_equal(spot_metrics_new(&m), 0);
  assert_int_equal(spot_metrics_register(m, "h_seconds", SPOT_METRIC_HISTOGRAM,
                                         "H.", bad, 2),
                   -EINVAL);
  assert_int_equal(spot_metrics_register(m, "h_seconds", SPOT_METRIC_HISTOGRAM,
                                         "H.", NULL, 0),
                   -EINVAL);
  assert_int_equal(
      spot_metrics_register(m, "bad name", SPOT_METRIC_GAUGE, "H.", NULL, 0),
      -EINVAL);
  assert_int_equal(
      spot_metrics_register(m, "h_seconds", SPOT_METRIC_HISTOGRAM, "H.", b, 3),
      0);
  assert_int_equal(spot_metrics_observe(m, "h_seconds", NULL, 0.5), 0);
  assert_int_equal(spot_metrics_observe(m, "h_seconds", NULL, 2), 0);
  assert_int_equal(spot_metrics_observe(m, "h_seconds", NULL, 100), 0);
  assert_int_equal(spot_metrics_observe(m, "h_seconds", NULL, NAN), -EINVAL);
  assert_int_equal(
      spot_metrics_observe(m, "h_seconds", SPOT_LABELS("le", "1"), 1), -EINVAL);
  text = render(m);
  assert_string_equal(text, "# HELP h_seconds H.\n"
                            "# TYPE h_seconds histogram\n"
                            "h_seconds_bucket{le=\"0.5\"} 1\n"
                            "h_seconds_bucket{le=\"1\"} 1\n"
                            "h_seconds_bucket{le=\"2.5\"} 2\n"
                            "h_seconds_bucket{le=\"+Inf\"} 3\n"
                            "h_seconds_sum 102.5\n"
                            "h_seconds_count 3\n");
  free(text);
  assert_int_equal(
      spot_metrics_observe(m, "h_seconds", SPOT_LABELS("r", "x"), 0.1), 0);
  text = render(m);
  assert_non_null(strstr(text, "h_seconds_bucket{r=\"x\",le=\"0.5\"} 1\n"));
  assert_non_null(strstr(text, "h_seconds_count{r=\"x\"} 1\n"));
  free(text);
  spot_metrics_free(m);
}

static void
test_bounds_and_fmt(void **state)
{
  struct spot_metrics *m;
  char name[32], val[16], buf[64];

  assert_int_equal(spot_metrics_new(&m), 0);
  for (int i = 0; i < SPOT_METRICS_FAMILIES; i++) {
    snprintf(name, sizeof(name), "m%d", i);
    assert_int_equal(
        spot_metrics_register(m, name, SPOT_METRIC_COUNTER, "x", NULL, 0), 0);
  }
  assert_int_equal(
      spot_metrics_register(m, "more", SPOT_METRIC_COUNTER, "x", NULL, 0),
      -ENOSPC);
  for (int i = 1; i < SPOT_METRICS_SERIES; i++) {
    snprintf(val, sizeof(val), "%d", i);
    assert_int_equal(spot_metrics_add(m, "m0", SPOT_LABELS("k", val), 1), 0);
  }
  assert_int_equal(spot_metrics_add(m, "m0", SPOT_LABELS("k", "last"), 1),
                   -ENOSPC);
  spot_metrics_free(m);

  assert_string_equal(spot_metrics_fmt(INFINITY, buf, sizeof(buf)), "+Inf");
  assert_string_equal(spot_metrics_fmt(-INFINITY, buf, sizeof(buf)), "-Inf");
  assert_string_equal(spot_metrics_fmt(NAN, buf, sizeof(buf)), "NaN");
  assert_string_equal(spot_metrics_fmt(1764748800, buf, sizeof(buf)),
                      "1764748800");
  assert_string_equal(spot_metrics_fmt(0.25, buf, sizeof(buf)), "0.25");
}

static void
test_spotd_set(void **state)
{
  static const char *const names[] = {
      SPOT_M_CHECKPOINTS,     SPOT_M_SAVE_SECONDS,     SPOT_M_UPLOAD_SECONDS,
      SPOT_M_UPLOADED_BYTES,  SPOT_M_LAST_COMMIT,      SPOT_M_WORK_AT_RISK,
      SPOT_M_NOTICES,         SPOT_M_META_ERRORS,      SPOT_M_RELAUNCHES,
      SPOT_M_RESTORE_SECONDS, SPOT_M_TRAINER_RESTARTS,
  };
  struct spot_metrics *m;
  char *text, line[128];

  assert_int_equal(spot_metrics_new_spotd(&m), 0);
  assert_int_equal(
      spot_metrics_add(m, SPOT_M_CHECKPOINTS,
                       SPOT_LABELS("reason", "notice", "outcome", "committed"),
                       1),
      0);
  assert_int_equal(spot_metrics_observe(m, SPOT_M_SAVE_SECONDS, NULL, 1.5), 0);
  text = render(m);
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    snprintf(line, sizeof(line), "# TYPE %s ", names[i]);
    if (strstr(text, line) == NULL)
      fail_msg("%s missing", names[i]);
    assert_int_equal(strncmp(names[i], "spotd_", 6), 0);
  }
  assert_non_null(strstr(text, "spotd_checkpoints_total{reason=\"notice\","
                               "outcome=\"committed\"} 1\n"));
  assert_non_null(strstr(text, "spotd_checkpoint_save_seconds_count 1\n"));
  free(text);
  spot_metrics_free(m);
}

/* Each line of text that starts with name followed by '{' or ' '. */
static unsigned
samples_of(const char *text, const char *name, bool labelled_only)
{
  size_t n = strlen(name);
  unsigned k = 0;

  for (const char *p = text; p != NULL && *p != '\0';) {
    if (strncmp(p, name, n) == 0 &&
        (p[n] == '{' || (p[n] == ' ' && !labelled_only)))
      k++;
    p = strchr(p, '\n');
    p = p != NULL ? p + 1 : NULL;
  }
  return k;
}

/* A family whose samples all have labels has no unlabelled 0 sample; the
 * job and rank go on every sample, histograms' buckets included. */
static void
test_labels_no_stray(void **state)
{
  static const char *const labelled[] = {
      "\n" SPOT_M_CHECKPOINTS " ", "\n" SPOT_M_UPLOADED_BYTES " ",
      "\n" SPOT_M_NOTICES " ", "\n" SPOT_M_RELAUNCHES " "};
  struct spot_metrics *m;
  char *text;

  (void)state;
  assert_int_equal(spot_metrics_new_spotd(&m), 0);
  text = render(m);
  for (size_t i = 0; i < sizeof(labelled) / sizeof(labelled[0]); i++)
    if (strstr(text, labelled[i]) != NULL)
      fail_msg("stray unlabelled sample '%s0' in\n%s", labelled[i] + 1, text);
  assert_int_equal(samples_of(text, SPOT_M_CHECKPOINTS, false), 0);
  /* Label-less families still start at 0. */
  assert_non_null(strstr(text, "\n" SPOT_M_META_ERRORS " 0\n"));
  free(text);

  assert_int_equal(
      spot_metrics_common_labels(m, SPOT_LABELS("job", "llm-7b", "rank", "1")),
      0);
  assert_int_equal(
      spot_metrics_add(m, SPOT_M_CHECKPOINTS,
                       SPOT_LABELS("reason", "periodic", "outcome", "failed"),
                       1),
      0);
  assert_int_equal(spot_metrics_observe(m, SPOT_M_SAVE_SECONDS, NULL, 3), 0);
  text = render(m);
  assert_int_equal(samples_of(text, SPOT_M_CHECKPOINTS, false), 1);
  assert_non_null(strstr(text, SPOT_M_CHECKPOINTS
                         "{job=\"llm-7b\",rank=\"1\",reason=\"periodic\","
                         "outcome=\"failed\"} 1\n"));
  assert_non_null(
      strstr(text, SPOT_M_META_ERRORS "{job=\"llm-7b\",rank=\"1\"} 0\n"));
  assert_non_null(strstr(text, SPOT_M_SAVE_SECONDS
                         "_bucket{job=\"llm-7b\",rank=\"1\",le=\"5\"} 1\n"));
  assert_non_null(strstr(text, SPOT_M_SAVE_SECONDS
                         "_count{job=\"llm-7b\",rank=\"1\"} 1\n"));
  /* Every sample line has the job. */
  for (const char *p = text; *p != '\0';) {
    const char *e = strchr(p, '\n');
    if (p[0] != '#' && strncmp(p, "spotd_", 6) == 0 &&
        strncmp(strchr(p, '{') != NULL ? strchr(p, '{') : p,
                "{job=\"llm-7b\",rank=\"1\"",
                strlen("{job=\"llm-7b\",rank=\"1\"")) != 0)
      fail_msg("a sample without job and rank: %.*s", (int)(e - p), p);
    p = e + 1;
  }
  free(text);
  /* A bad label set is refused and changes nothing. */
  assert_int_equal(spot_metrics_common_labels(m, SPOT_LABELS("__x", "1")),
                   -EINVAL);
  text = render(m);
  assert_non_null(strstr(text, "{job=\"llm-7b\""));
  free(text);
  assert_int_equal(spot_metrics_common_labels(m, NULL), 0);
  text = render(m);
  assert_non_null(strstr(text, "\n" SPOT_M_META_ERRORS " 0\n"));
  free(text);
  spot_metrics_free(m);

  /* register_labelled() for any registry. */
  assert_int_equal(spot_metrics_new(&m), 0);
  assert_int_equal(spot_metrics_register_labelled(
                       m, "x_total", SPOT_METRIC_COUNTER, "X.", NULL, 0),
                   0);
  text = render(m);
  assert_int_equal(samples_of(text, "x_total", false), 0);
  free(text);
  spot_metrics_free(m);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_counter_gauge),   cmocka_unit_test(test_histogram),
      cmocka_unit_test(test_bounds_and_fmt),  cmocka_unit_test(test_spotd_set),
      cmocka_unit_test(test_labels_no_stray),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
