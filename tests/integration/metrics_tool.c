/* Test helper: spotd's metric registry (lib/core/metrics.c) driven from
 * stdin, one update per line:
 *   add|set|observe NAME VALUE [LABEL=VALUE ...]
 *   common - [LABEL=VALUE ...]   (labels of every sample, as spotd's
 *                                  job and rank)
 * then the text format on stdout, and with an argument the same text
 * written to that path through spot_metrics_write_file(). Exit 1 with a
 * line on stderr when an update is refused (so tests see refusals). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/metrics.h"
#include "io/store/history_store.h"

#define LABELS_MAX 8

static int
apply(struct spot_metrics *m, char *line)
{
  const char *labels[2 * LABELS_MAX + 1];
  char *save = NULL, *op, *name, *val, *tok, *end;
  bool common;
  size_t nl = 0;
  double v;

  op = strtok_r(line, " \n", &save);
  name = strtok_r(NULL, " \n", &save);
  val = strtok_r(NULL, " \n", &save);
  if (op == NULL || name == NULL || val == NULL)
    return -EINVAL;
  common = strcmp(op, "common") == 0;
  v = common ? 0 : strtod(val, &end);
  if (!common && *end != '\0')
    return -EINVAL;
  /* common: NAME is "-" and VALUE already the first label. */
  for (tok = common ? val : strtok_r(NULL, " \n", &save);
       tok != NULL && nl < LABELS_MAX; tok = strtok_r(NULL, " \n", &save)) {
    char *eq = strchr(tok, '=');
    if (eq == NULL)
      return -EINVAL;
    *eq = '\0';
    labels[2 * nl] = tok;
    labels[2 * nl + 1] = eq + 1;
    nl++;
  }
  labels[2 * nl] = NULL;
  if (common)
    return spot_metrics_common_labels(m, nl ? labels : NULL);
  if (strcmp(op, "add") == 0)
    return spot_metrics_add(m, name, nl ? labels : NULL, v);
  if (strcmp(op, "set") == 0)
    return spot_metrics_set(m, name, nl ? labels : NULL, v);
  if (strcmp(op, "observe") == 0)
    return spot_metrics_observe(m, name, nl ? labels : NULL, v);
  return -EINVAL;
}

int
main(int argc, char **argv)
{
  struct spot_metrics *m;
  struct spot_buf out;
  char line[1024];
  int r, rc = 0;

  if (spot_metrics_new_spotd(&m) < 0)
    return 1;
  while (fgets(line, sizeof(line), stdin) != NULL) {
    char copy[1024];
    memcpy(copy, line, sizeof(copy));
    r = apply(m, line);
    if (r < 0) {
      fprintf(stderr, "refused (%s): %s", strerror(-r), copy);
      rc = 1;
    }
  }
  spot_buf_init(&out, 1 << 20);
  r = spot_metrics_render(m, &out);
  if (r == 0)
    fputs(spot_buf_str(&out), stdout);
  if (r == 0 && argc > 1)
    r = spot_metrics_write_file(argv[1], spot_buf_str(&out));
  if (r < 0) {
    fprintf(stderr, "metrics_tool: %s\n", strerror(-r));
    rc = 1;
  }
  spot_buf_fini(&out);
  spot_metrics_free(m);
  return rc;
}
