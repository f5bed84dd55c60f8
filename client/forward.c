/* Commands that live in a program of their own, spotd-NAME: `spotctl NAME
 * ARGS...` execs it with ARGS. The emulator is one: it serves HTTP from a
 * thread per connection and spawns shells, none of which belongs in the
 * client every training node runs. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "spotctl.h"

/* execv of dir/prog; returns (only on failure) the errno. */
static int
exec_in(const char *dir, const char *prog, char **argv)
{
  char path[PATH_MAX];

  if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, prog) >= sizeof(path))
    return ENAMETOOLONG;
  argv[0] = path;
  execv(path, argv);
  return errno;
}

int
spotctl_cmd_forward(int argc, char **argv)
{
  const char *name = argv[0];
  char prog[64], self[PATH_MAX], *slash;
  ssize_t n;
  int err = ENOENT;

  (void)argc; /* argv ends with NULL: it goes through whole */
  if ((size_t)snprintf(prog, sizeof(prog), "spotd-%s", name) >= sizeof(prog))
    return spotctl_fail("%s: command name too long", name);
  /* First the program installed beside this spotctl, so a spotctl run by
   * its full path runs its own release of spotd-NAME; then PATH. */
  n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    self[n] = '\0';
    slash = strrchr(self, '/');
    if (slash != NULL) {
      *slash = '\0';
      err = exec_in(slash == self ? "" : self, prog, argv);
    }
  }
  if (err == ENOENT) {
    argv[0] = prog;
    execvp(prog, argv);
    err = errno;
  }
  if (err == ENOENT)
    return spotctl_fail("%s: %s not found beside spotctl (in %s) nor on "
                        "PATH; install it with spotctl",
                        name, prog, n > 0 ? self : "?");
  return spotctl_fail("%s: cannot run %s: %s", name, prog, strerror(err));
}
