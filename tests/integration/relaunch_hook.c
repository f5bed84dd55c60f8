/* relaunch_hook OUT: the tests' relaunch step. Appends one JSON line to
 * OUT: its SPOTD_* environment and the wall time ("_t", seconds), in one
 * write. A program rather than a script: it must run within the second
 * spotd leaves a relaunch step after the deadline, on a loaded machine. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static size_t
put_str(char *out, size_t at, size_t cap, const char *s, size_t n)
{
  for (size_t i = 0; i < n && at + 7 < cap; i++) {
    unsigned char c = (unsigned char)s[i];

    if (c == '"' || c == '\\') {
      out[at++] = '\\';
      out[at++] = (char)c;
    } else if (c < 0x20) {
      at += (size_t)snprintf(out + at, cap - at, "\\u%04x", c);
    } else {
      out[at++] = (char)c;
    }
  }
  return at;
}

int
main(int argc, char **argv)
{
  static char buf[1 << 16];
  struct timespec ts;
  size_t at;
  int fd;

  if (argc != 2) {
    fprintf(stderr, "usage: relaunch_hook OUT\n");
    return 2;
  }
  clock_gettime(CLOCK_REALTIME, &ts);
  at = (size_t)snprintf(buf, sizeof(buf), "{\"_t\": %lld.%09ld",
                        (long long)ts.tv_sec, ts.tv_nsec);
  for (char **e = environ; *e != NULL; e++) {
    const char *eq = strchr(*e, '=');

    if (strncmp(*e, "SPOTD_", 6) != 0 || eq == NULL || at + 16 > sizeof(buf))
      continue;
    memcpy(buf + at, ", \"", 3);
    at = put_str(buf, at + 3, sizeof(buf), *e, (size_t)(eq - *e));
    memcpy(buf + at, "\": \"", 4);
    at = put_str(buf, at + 4, sizeof(buf), eq + 1, strlen(eq + 1));
    if (at + 3 < sizeof(buf))
      buf[at++] = '"';
  }
  if (at + 2 >= sizeof(buf))
    return 1;
  buf[at++] = '}';
  buf[at++] = '\n';
  fd = open(argv[1], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0 || write(fd, buf, at) != (ssize_t)at) {
    perror(argv[1]);
    return 1;
  }
  close(fd);
  return 0;
}
