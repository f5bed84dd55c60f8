/* libFuzzer target for the codec. Input: one selector byte, then
 *   selector & 0x80 clear: raw_len (u32 LE, capped at 1 MiB), crc32c
 *     (u32 LE), then bytes decoded as a frame with filter selector % 3:
 *     must fail cleanly or succeed with output of that CRC;
 *   selector & 0x80 set: the rest is raw data, encoded with filter
 *     selector % 3 in mode ((selector >> 2) & 31) % 3 and decoded back: must be
 *     the identity. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/codec.h"
#include "core/crc32c.h"

#define PART_MAX ((size_t)1 << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct spot_codec *codec;
static unsigned char *out, *frame;

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  unsigned sel;
  enum spot_filter f;

  if (!codec) {
    if (spot_codec_new(PART_MAX, &codec) < 0)
      abort();
    out = malloc(PART_MAX);
    frame = malloc(spot_codec_bound(PART_MAX));
    if (!out || !frame)
      abort();
  }
  if (size < 1)
    return 0;
  sel = data[0];
  f = (enum spot_filter)(sel % 3);
  data++;
  size--;
  if (sel & 0x80) {
    enum spot_codec_mode mode = (enum spot_codec_mode)(((sel >> 2) & 0x1f) % 3);
    size_t len;
    uint32_t crc;

    if (size > PART_MAX)
      size = PART_MAX;
    if (spot_codec_encode(codec, f, mode, data, size, frame,
                          spot_codec_bound(PART_MAX), &len, &crc) != 0)
      abort();
    if (crc != spot_crc32c(0, data, size))
      abort();
    if (spot_codec_decode(codec, f, frame, len, out, size, crc) != 0)
      abort();
    if (size && memcmp(out, data, size) != 0)
      abort();
  } else {
    uint32_t raw_len, crc;
    int r;

    if (size < 8)
      return 0;
    raw_len = (uint32_t)data[0] | (uint32_t)data[1] << 8 |
              (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
    crc = (uint32_t)data[4] | (uint32_t)data[5] << 8 | (uint32_t)data[6] << 16 |
          (uint32_t)data[7] << 24;
    raw_len %= PART_MAX + 1;
    r = spot_codec_decode(codec, f, data + 8, size - 8, out, raw_len, crc);
    if (r == 0 && spot_crc32c(0, out, raw_len) != crc)
      abort();
    if (r != 0 && r != -EBADMSG && r != -EILSEQ)
      abort();
  }
  return 0;
}
