/* spotd: supervise a training command, checkpoint it, keep it durable. */
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "spot-config.h"

int
main(int argc, char **argv)
{
  spot_log_init("spotd", SPOT_LOG_INFO);
  if (argc > 1 && strcmp(argv[1], "--version") == 0) {
    printf("spotd %s\n", SPOT_VERSION);
    return 0;
  }
  fprintf(stderr, "spotd: the daemon is not built yet\n");
  return 1;
}
