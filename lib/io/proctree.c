/* The processes of a job as a tree (proctree.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/util.h"
#include "io/proctree.h"

/* ------------------------------------------------------------- parsers */

int
spot_proc_parse_stat(const char *text, struct spot_proc *out)
{
  const char *p = strrchr(text, ')');
  unsigned long long start = 0;
  long pid, ppid;
  char st;
  int field;

  if (p == NULL || sscanf(text, "%ld (", &pid) != 1 || pid <= 0)
    return -EINVAL;
  if (sscanf(p + 1, " %c %ld", &st, &ppid) != 2 || ppid < 0)
    return -EINVAL;
  /* p + 1 starts at field 3 (state); the start time is field 22. */
  p++;
  for (field = 2; field < 21; field++) {
    p = strchr(p + 1, ' ');
    if (p == NULL)
      return -EINVAL;
  }
  if (sscanf(p, " %llu", &start) != 1)
    return -EINVAL;
  out->pid = (pid_t)pid;
  out->ppid = (pid_t)ppid;
  out->start = start;
  out->state = st;
  return 0;
}

/* The value of "field:" in a /proc/PID/status text, blanks skipped; NULL
 * when no line has it. */
static const char *
status_field(const char *status, const char *field)
{
  size_t len = strlen(field);
  const char *p = status;

  while (p != NULL && *p != '\0') {
    if (strncmp(p, field, len) == 0 && p[len] == ':') {
      p += len + 1;
      while (*p == ' ' || *p == '\t')
        p++;
      return p;
    }
    p = strchr(p, '\n');
    if (p != NULL)
      p++;
  }
  return NULL;
}

int
spot_proc_parse_sigmask(const char *status, const char *field, uint64_t *mask)
{
  const char *p = status_field(status, field);
  unsigned long long v;
  char *end;

  if (p == NULL)
    return -EINVAL;
  errno = 0;
  v = strtoull(p, &end, 16);
  if (end == p || errno != 0 || (*end != '\n' && *end != '\0'))
    return -EINVAL;
  *mask = v;
  return 0;
}

int
spot_proc_parse_nspid(const char *status, pid_t *inner)
{
  const char *p = status_field(status, "NSpid");
  long v = -1;

  if (p == NULL)
    return -EINVAL;
  for (;;) {
    char *end;
    long x;

    while (*p == ' ' || *p == '\t')
      p++;
    if (*p == '\n' || *p == '\0')
      break;
    errno = 0;
    x = strtol(p, &end, 10);
    if (end == p || errno != 0 || x <= 0 || x > INT32_MAX)
      return -EINVAL;
    v = x;
    p = end;
  }
  if (v <= 0)
    return -EINVAL;
  *inner = (pid_t)v;
  return 0;
}

bool
spot_proc_mask_has(uint64_t mask, int signum)
{
  return signum >= 1 && signum <= 64 && (mask >> (signum - 1)) & 1u;
}

static const struct spot_proc *
find(const struct spot_proc *procs, size_t n, pid_t pid)
{
  for (size_t i = 0; i < n; i++)
    if (procs[i].pid == pid)
      return &procs[i];
  return NULL;
}

size_t
spot_proc_descendants(struct spot_proc *procs, size_t n, pid_t root)
{
  const struct spot_proc *r = find(procs, n, root);
  struct spot_proc *out;
  unsigned char *in;
  size_t nout = 0, done = 0;

  if (r == NULL || n == 0)
    return 0;
  in = calloc(n, 1);
  out = calloc(n, sizeof(*out));
  if (in == NULL || out == NULL) {
    free(in);
    free(out);
    return 0;
  }
  out[nout++] = *r; /* the root first, dropped at the end */
  in[r - procs] = 1;
  /* Breadth first: the children of out[done] are appended after it. */
  while (done < nout) {
    const struct spot_proc *parent = &out[done++];

    for (size_t i = 0; i < n; i++)
      if (!in[i] && procs[i].ppid == parent->pid &&
          procs[i].start >= parent->start) {
        in[i] = 1;
        out[nout++] = procs[i];
      }
  }
  memcpy(procs, out + 1, (nout - 1) * sizeof(*out));
  free(in);
  free(out);
  return nout - 1;
}

/* -------------------------------------------------------------- /proc */

static int
read_small(const char *path, char *buf, size_t size)
{
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  size_t len = 0;

  if (fd < 0)
    return errno == ENOENT ? -ESRCH : -errno;
  while (len + 1 < size) {
    ssize_t r = read(fd, buf + len, size - 1 - len);

    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      int e = errno;

      close(fd);
      return e == ESRCH ? -ESRCH : -e;
    }
    if (r == 0)
      break;
    len += (size_t)r;
  }
  close(fd);
  buf[len] = '\0';
  return len == 0 ? -ESRCH : 0;
}

static int
read_stat_at(const char *proc, pid_t pid, struct spot_proc *out)
{
  char path[4200], buf[1024];
  int r;

  snprintf(path, sizeof(path), "%s/%d/stat", proc, (int)pid);
  r = read_small(path, buf, sizeof(buf));
  if (r < 0)
    return r;
  return spot_proc_parse_stat(buf, out) < 0 ? -ESRCH : 0;
}

int
spot_proc_read(pid_t pid, struct spot_proc *out)
{
  return read_stat_at("/proc", pid, out);
}

/* Every entry is read: a job's process may sort after any number of
 * others (a busy machine, a launcher with thousands of workers), and a
 * tree missing one would leave it running unsignalled. More than max is
 * an error, never a silent cut. */
int
spot_proc_scan_at(const char *proc, size_t max, struct spot_proc **out,
                  size_t *n)
{
  struct spot_proc *v = NULL;
  size_t nv = 0, cap = 0;
  struct dirent *de;
  DIR *dir = opendir(proc);

  if (dir == NULL)
    return errno > 0 ? -errno : -EIO;
  while ((de = readdir(dir)) != NULL) {
    struct spot_proc p;
    char *end;
    long pid = strtol(de->d_name, &end, 10);

    if (*end != '\0' || pid <= 0 || read_stat_at(proc, (pid_t)pid, &p) < 0)
      continue;
    if (nv == cap) {
      struct spot_proc *nvv;

      if (cap >= max) {
        free(v);
        closedir(dir);
        return -E2BIG;
      }
      cap = cap ? cap * 2 : 256;
      if (cap > max)
        cap = max;
      nvv = realloc(v, cap * sizeof(*v));
      if (nvv == NULL) {
        free(v);
        closedir(dir);
        return -ENOMEM;
      }
      v = nvv;
    }
    v[nv++] = p;
  }
  closedir(dir);
  *out = v;
  *n = nv;
  return 0;
}

int
spot_proc_scan(struct spot_proc **out, size_t *n)
{
  return spot_proc_scan_at("/proc", SPOT_PROCTREE_MAX, out, n);
}

int
spot_proc_tree(pid_t root, struct spot_proc **out, size_t *n)
{
  struct spot_proc *v = NULL;
  size_t nv = 0, k = 0;
  int r = spot_proc_scan(&v, &nv);

  if (r < 0)
    return r;
  if (v == NULL) {
    *out = NULL;
    *n = 0;
    return 0;
  }
  nv = spot_proc_descendants(v, nv, root);
  for (size_t i = 0; i < nv; i++)
    if (v[i].state != 'Z' && v[i].state != 'X')
      v[k++] = v[i];
  *out = v;
  *n = k;
  return 0;
}

/* p's /proc text, but only while p is still the process it was. */
static int
read_same(const struct spot_proc *p, const char *what, char *buf, size_t size)
{
  struct spot_proc now;
  char path[64];
  int r;

  snprintf(path, sizeof(path), "/proc/%d/%s", (int)p->pid, what);
  r = read_small(path, buf, size);
  if (r < 0)
    return r;
  if (spot_proc_read(p->pid, &now) < 0 || now.start != p->start)
    return -ESRCH;
  return 0;
}

int
spot_proc_sigstate(const struct spot_proc *p, int signum)
{
  char buf[4096];
  uint64_t cgt, ign;
  int r = read_same(p, "status", buf, sizeof(buf));

  if (r < 0)
    return r;
  if (spot_proc_parse_sigmask(buf, "SigCgt", &cgt) < 0 ||
      spot_proc_parse_sigmask(buf, "SigIgn", &ign) < 0)
    return -EINVAL;
  /* Blocked or not makes no difference: a blocked signal at the default
   * action kills once unblocked, and an ignored one is queued while
   * blocked (or waited for: sigtimedwait() unblocks what it waits for,
   * so /proc shows it unblocked then). */
  if (spot_proc_mask_has(cgt, signum))
    return SPOT_PROC_SIG_CAUGHT;
  return spot_proc_mask_has(ign, signum) ? SPOT_PROC_SIG_IGNORED
                                         : SPOT_PROC_SIG_DEFAULT;
}

int
spot_proc_maps_file(const struct spot_proc *p, const char *path)
{
  size_t plen = strlen(path);
  char mpath[64], line[4608];
  int found = 0;
  FILE *f;

  snprintf(mpath, sizeof(mpath), "/proc/%d/maps", (int)p->pid);
  f = fopen(mpath, "re");
  if (f == NULL)
    return errno == ENOENT ? -ESRCH : -errno;
  while (!found && fgets(line, sizeof(line), f) != NULL) {
    size_t len = strlen(line);

    if (len > 0 && line[len - 1] == '\n')
      line[--len] = '\0';
    if (len >= plen + 1 && strcmp(line + len - plen, path) == 0 &&
        line[len - plen - 1] == ' ')
      found = 1;
  }
  fclose(f);
  return found;
}

int
spot_proc_kill(const struct spot_proc *p, int signum)
{
  struct spot_proc now;
  int fd, r = 0;

  fd = (int)syscall(SYS_pidfd_open, p->pid, 0);
  if (fd < 0) {
    if (errno != ENOSYS)
      return -errno;
    /* No pidfds: check, then kill; the window is a few microseconds. */
    if (spot_proc_read(p->pid, &now) < 0 || now.start != p->start)
      return -ESRCH;
    return kill(p->pid, signum) < 0 ? -errno : 0;
  }
  /* The pidfd pins the process: once it matches, a reuse cannot happen. */
  if (spot_proc_read(p->pid, &now) < 0 || now.start != p->start)
    r = -ESRCH;
  else if (syscall(SYS_pidfd_send_signal, fd, signum, NULL, 0) < 0)
    r = -errno;
  close(fd);
  return r;
}

int
spot_proc_inner_pid(const struct spot_proc *p, pid_t *inner)
{
  char buf[4096];
  int r = read_same(p, "status", buf, sizeof(buf));

  if (r < 0)
    return r;
  return spot_proc_parse_nspid(buf, inner);
}

int
spot_proc_own(void)
{
  char buf[32];
  ssize_t n = readlink("/proc/self", buf, sizeof(buf) - 1);
  int64_t pid;

  if (n <= 0)
    return errno == ENOENT ? -ENOENT : -EIO;
  buf[n] = '\0';
  if (spot_parse_int64(buf, 1, INT32_MAX, &pid) < 0)
    return -EIO;
  return pid == (int64_t)getpid() ? 0 : -EXDEV;
}

int
spot_proc_kill_tree(pid_t root, int signum)
{
  struct spot_proc *v;
  size_t n;
  int r = spot_proc_tree(root, &v, &n), sent = 0;

  if (r < 0)
    return r;
  for (size_t i = 0; i < n; i++)
    if (spot_proc_kill(&v[i], signum) == 0)
      sent++;
  free(v);
  return sent;
}

/* The device and inode fields ("08:01 1234") of the line of maps (an open
 * /proc/PID/maps) that starts at addr, or of every line when addr is
 * NULL, each passed to match(); stops when match returns true. */
static bool
maps_ids(FILE *f, const void *addr, bool (*match)(const char *, void *),
         void *data)
{
  char line[4608], dev[32];
  unsigned long start;
  unsigned long long ino;
  char id[64];

  while (fgets(line, sizeof(line), f) != NULL) {
    if (sscanf(line, "%lx-%*s %*s %*s %31s %llu", &start, dev, &ino) != 3)
      continue;
    if (addr != NULL && start != (unsigned long)(uintptr_t)addr)
      continue;
    snprintf(id, sizeof(id), "%s %llu", dev, ino);
    if (match(id, data))
      return true;
  }
  return false;
}

struct id_copy {
  char *out;
  size_t n;
};

static bool
copy_id(const char *id, void *data)
{
  struct id_copy *c = data;

  return (size_t)snprintf(c->out, c->n, "%s", id) < c->n;
}

int
spot_proc_self_map_id(const void *addr, char *id, size_t n)
{
  struct id_copy c = {id, n};
  FILE *f = fopen("/proc/self/maps", "re");
  bool found;

  if (f == NULL)
    return -errno;
  found = maps_ids(f, addr, copy_id, &c);
  fclose(f);
  return found ? 0 : -ENOENT;
}

static bool
same_id(const char *id, void *data)
{
  const char *const *want = data;

  return strcmp(id, *want) == 0;
}

int
spot_proc_maps_id(const struct spot_proc *p, const char *id)
{
  char mpath[64];
  int found;
  FILE *f;

  snprintf(mpath, sizeof(mpath), "/proc/%d/maps", (int)p->pid);
  f = fopen(mpath, "re");
  if (f == NULL)
    return errno == ENOENT ? -ESRCH : -errno;
  found = maps_ids(f, NULL, same_id, &id) ? 1 : 0;
  fclose(f);
  return found;
}
