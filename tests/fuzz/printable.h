/* For the libFuzzer targets: a string from the network or the store,
 * escaped as spotctl and spotd do before printing it (spot_escape), must
 * hold no control character, no C1 control, no bidi override or line
 * separator and only valid UTF-8, and escaping it again must change
 * nothing. Traps otherwise. */
#ifndef SPOT_FUZZ_PRINTABLE_H
#define SPOT_FUZZ_PRINTABLE_H

#include <stdint.h>
#include <string.h>

#include "core/util.h"

static inline void
check_printable(const char *raw)
{
  static char out[SPOT_ESCAPE_SIZE(1024)], again[sizeof(out)];
  const unsigned char *p = (const unsigned char *)out;

  spot_escape(raw, out, sizeof(out));
  while (*p != '\0') {
    uint32_t c;
    size_t n;

    if (*p < 0x20 || *p == 0x7f)
      __builtin_trap();
    if (*p < 0x80) {
      p++;
      continue;
    }
    n = *p >= 0xf0 ? 4 : *p >= 0xe0 ? 3 : *p >= 0xc2 ? 2 : 0;
    if (n == 0)
      __builtin_trap();
    c = *p & (0x7f >> n);
    for (size_t i = 1; i < n; i++) {
      if ((p[i] & 0xc0) != 0x80)
        __builtin_trap();
      c = (c << 6) | (p[i] & 0x3f);
    }
    if (c <= 0x9f || (c >= 0x202a && c <= 0x202e) || c == 0x2028 ||
        c == 0x2029 || (c >= 0x2066 && c <= 0x2069) ||
        (c >= 0xd800 && c <= 0xdfff) || c > 0x10ffff)
      __builtin_trap();
    p += n;
  }
  spot_escape(out, again, sizeof(again));
  if (strcmp(out, again) != 0)
    __builtin_trap();
}

#endif
