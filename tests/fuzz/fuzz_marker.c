/* libFuzzer target: the trainer's marker file (spot_marker_parse in
 * lib/core/manifest.c). Checks what spotd relies on: on success the step
 * is -1 or in 0..2^53, and "step=N" of it parses back to N; on failure
 * the output is untouched and err says why. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  int64_t step = -7, again = -7;
  char err[256], text[64];
  int n;

  err[0] = '\0';
  if (spot_marker_parse((const char *)data, size, &step, err, sizeof(err)) !=
      0) {
    if (err[0] == '\0' || step != -7)
      __builtin_trap();
    return 0;
  }
  if (step < -1 || step > SPOT_CKPT_STEP_MAX)
    __builtin_trap();
  if (step >= 0) {
    n = snprintf(text, sizeof(text), "step=%lld\n", (long long)step);
    if (spot_marker_parse(text, (size_t)n, &again, NULL, 0) != 0 ||
        again != step)
      __builtin_trap();
  }
  return 0;
}
