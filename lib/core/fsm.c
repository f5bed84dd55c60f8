/* fsm.c: see fsm.h. */
#include "core/fsm.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"

const char *
spot_fsm_name(const struct spot_fsm *m, unsigned s)
{
  if (s >= m->n || m->names == NULL || m->names[s] == NULL)
    return "?";
  return m->names[s];
}

bool
spot_fsm_legal(const struct spot_fsm *m, unsigned from, unsigned to)
{
  if (from >= m->n || to >= m->n || to >= SPOT_FSM_MAX_STATES || from == to)
    return false;
  if ((m->from_any & SPOT_FSM_BIT(to)) != 0 || m->legal == NULL)
    return true;
  return (m->legal[from] & SPOT_FSM_BIT(to)) != 0;
}

/* "lib/io/s3.c" rather than the build's path to it. */
static const char *
short_file(const char *file)
{
  static const char *const tops[] = {"lib/", "daemon/", "client/", "emulate/",
                                     "tests/"};
  const char *best = NULL;

  if (file == NULL)
    return "?";
  for (size_t i = 0; i < sizeof(tops) / sizeof(tops[0]); i++) {
    const char *p = strstr(file, tops[i]);
    if (p != NULL && (best == NULL || p < best))
      best = p;
  }
  return best != NULL ? best : file;
}

static int
judge(const struct spot_fsm *m, unsigned from, unsigned to, const char *file,
      int line)
{
  if (from == to)
    return 0;
  if (!spot_fsm_legal(m, from, to)) {
    log_err("internal: %s %s -> %s refused (%s:%d)", m->what,
            spot_fsm_name(m, from), spot_fsm_name(m, to), short_file(file),
            line);
    return -1;
  }
  return 1;
}

int
spot_fsm_refuse(const struct spot_fsm *m, unsigned from, unsigned to,
                const char *file, int line, const char *why)
{
  log_err("internal: %s %s -> %s refused: %s (%s:%d)", m->what,
          spot_fsm_name(m, from), spot_fsm_name(m, to), why, short_file(file),
          line);
  return -1;
}

static void
say(const struct spot_fsm *m, unsigned from, unsigned to, const char *file,
    int line, const char *detail)
{
  const char *sep = detail[0] != '\0' ? " " : "";

  if (m->level >= SPOT_LOG_DEBUG)
    spot_log(m->level, "%s %s -> %s%s%s (%s:%d)", m->what,
             spot_fsm_name(m, from), spot_fsm_name(m, to), sep, detail,
             short_file(file), line);
  else
    spot_log(m->level, "%s %s -> %s%s%s", m->what, spot_fsm_name(m, from),
             spot_fsm_name(m, to), sep, detail);
}

int
spot_fsm_move(const struct spot_fsm *m, unsigned from, unsigned to,
              const char *file, int line)
{
  int r = judge(m, from, to, file, line);

  if (r > 0 && m->level <= spot_log_get_level())
    say(m, from, to, file, line, "");
  return r;
}

int
spot_fsm_move_detail(const struct spot_fsm *m, unsigned from, unsigned to,
                     const char *file, int line, const char *fmt, ...)
{
  char detail[512];
  va_list ap;
  int r = judge(m, from, to, file, line);

  if (r <= 0 || m->level > spot_log_get_level())
    return r;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof(detail), fmt, ap);
  va_end(ap);
  say(m, from, to, file, line, detail);
  return r;
}
