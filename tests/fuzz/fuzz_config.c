/* libFuzzer target: the config file parser (inih + our checks), the
 * command splitter and the s3:// URL parser, on arbitrary bytes. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h"
#include "core/config.h"
#include "core/s3url.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct spot_config *cfg;
  struct spot_buf b;
  char err[2048], **argv, *s, *bucket, *prefix, *job;
  int argc;

  if (size > SPOT_CONFIG_MAX_FILE)
    return 0;
  cfg = spot_config_new();
  if (cfg == NULL)
    return 0;
  /* The whole input as a file: world-readable on odd sizes. */
  spot_config_load_buffer(cfg, "fuzz.conf", (const char *)data, size,
                          (size & 1) != 0, err, sizeof(err));
  if (strlen(err) >= sizeof(err))
    abort();
  if (spot_config_validate(cfg, SPOT_CONFIG_NEED_COMMAND, err, sizeof(err)) ==
      0) {
    if (cfg->bucket == NULL || cfg->prefix == NULL || cfg->command == NULL)
      abort();
  }
  spot_buf_init(&b, 1 << 20);
  if (spot_config_write_effective(cfg, &b) == 0) {
    /* What we print must load again (unless a joined value is now longer
     * than a line). */
    struct spot_config *again = spot_config_new();
    if (again != NULL) {
      spot_config_load_buffer(again, "eff.conf", b.data, b.len, false, err,
                              sizeof(err));
      spot_config_free(again);
    }
  }
  spot_buf_fini(&b);
  spot_config_free(cfg);

  /* The same bytes as one command line and as a URL. */
  s = strndup((const char *)data, size);
  if (s == NULL)
    return 0;
  if (spot_config_split_args(s, &argv, &argc, err, sizeof(err)) == 0) {
    if (argc < 1 || argv[argc] != NULL)
      abort();
    spot_config_free_args(argv);
  }
  if (spot_s3_url_parse(s, &bucket, &prefix, err, sizeof(err)) == 0) {
    size_t pl = strlen(prefix);
    if (pl > 0 && (prefix[0] == '/' || prefix[pl - 1] == '/'))
      abort();
    free(bucket);
    free(prefix);
  }
  if (spot_s3_url_parse_job(s, &bucket, &prefix, &job, err, sizeof(err)) == 0) {
    free(bucket);
    free(prefix);
    free(job);
  }
  free(s);
  return 0;
}
