#include "cmocka-compat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "core/codec.h"
#include "core/crc32c.h"

#define ARRAY_N(a) (sizeof(a) / sizeof((a)[0]))

void spot__codec_group_c(void *dst, const void *src, size_t n, unsigned k);

static uint64_t rng = 88172645463325252ull;

static uint64_t
rnd(void)
{
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void
fill_random(unsigned char *p, size_t n)
{
  for (size_t i = 0; i < n; i++)
    p[i] = (unsigned char)(rnd() >> 24);
}

/* N(0, 1), near enough: the sum of 12 uniforms minus 6 (no libm here;
 * bench/codec_bench.c uses Box-Muller) */
static double
gauss(void)
{
  double s = 0;

  for (int i = 0; i < 12; i++)
    s += (double)(rnd() >> 11) / 9007199254740992.0;
  return s - 6.0;
}

static void
fill_fp32(unsigned char *p, size_t n)
{
  size_t i;

  for (i = 0; i + 4 <= n; i += 4) {
    float f = (float)(gauss() * 0.02);

    memcpy(p + i, &f, 4);
  }
  for (; i < n; i++)
    p[i] = 0x5a;
}

static void
fill_bf16(unsigned char *p, size_t n)
{
  size_t i;

  for (i = 0; i + 2 <= n; i += 2) {
    float f = (float)(gauss() * 0.02);
    uint32_t u;
    uint16_t h;

    memcpy(&u, &f, 4);
    h = (uint16_t)(u >> 16);
    memcpy(p + i, &h, 2);
  }
  for (; i < n; i++)
    p[i] = 0xa5;
}

enum input { IN_RANDOM, IN_CONST, IN_FP32, IN_BF16, IN_LAST };

static void
fill(enum input in, unsigned char *p, size_t n)
{
  switch (in) {
  case IN_RANDOM:
    fill_random(p, n);
    break;
  case IN_CONST:
    memset(p, 0x42, n);
    break;
  case IN_FP32:
    fill_fp32(p, n);
    break;
  case IN_BF16:
  case IN_LAST:
    fill_bf16(p, n);
    break;
  }
}

static void
test_crc32c_vectors(void **state)
{
  unsigned char b[32];

  assert_int_equal(spot_crc32c(0, "123456789", 9), 0xE3069283u);
  assert_int_equal(spot_crc32c_sw(0, "123456789", 9), 0xE3069283u);
  assert_int_equal(spot_crc32c(0, "", 0), 0);
  /* RFC 3720 (iSCSI) B.4 */
  memset(b, 0, sizeof(b));
  assert_int_equal(spot_crc32c(0, b, 32), 0x8A9136AAu);
  assert_int_equal(spot_crc32c_sw(0, b, 32), 0x8A9136AAu);
  memset(b, 0xff, sizeof(b));
  assert_int_equal(spot_crc32c(0, b, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++)
    b[i] = (unsigned char)i;
  assert_int_equal(spot_crc32c(0, b, 32), 0x46DD794Eu);
  assert_int_equal(spot_crc32c_sw(0, b, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; i++)
    b[i] = (unsigned char)(31 - i);
  assert_int_equal(spot_crc32c(0, b, 32), 0x113FDB5Cu);
  /* chaining */
  assert_int_equal(spot_crc32c(spot_crc32c(0, "1234", 4), "56789", 5),
                   0xE3069283u);
}

static void
test_crc32c_hw_matches_sw(void **state)
{
  size_t n = 5000;
  unsigned char *p = malloc(n);

  assert_non_null(p);
  fill_random(p, n);
  /* every alignment and many lengths, both paths */
  for (size_t off = 0; off < 16; off++)
    for (size_t len = 0; len < 300; len += 7)
      assert_int_equal(spot_crc32c(0, p + off, len),
                       spot_crc32c_sw(0, p + off, len));
  assert_int_equal(spot_crc32c(7, p, n), spot_crc32c_sw(7, p, n));
  assert_int_equal(spot_crc32c(spot_crc32c(0, p, 1001), p + 1001, n - 1001),
                   spot_crc32c(0, p, n));
  free(p);
}

static void
test_filter_names(void **state)
{
  enum spot_filter f;

  for (unsigned i = 0; i < SPOT_FILTER_LAST; i++) {
    assert_int_equal(spot_filter_from_name(spot_filter_name(i), &f), 0);
    assert_int_equal(f, i);
  }
  assert_string_equal(spot_filter_name(SPOT_FILTER_BYTEGROUP4), "bytegroup4");
  assert_null(spot_filter_name(SPOT_FILTER_LAST));
  assert_int_equal(spot_filter_from_name("bytegroup8", &f), -EINVAL);
  assert_int_equal(spot_filter_from_name("", &f), -EINVAL);
  assert_int_equal(spot_filter_from_name(NULL, &f), -EINVAL);
}

static const size_t odd_sizes[] = {0,  1,  2,  3,  4,  5,  7,   15,   16,
                                   17, 63, 64, 65, 66, 67, 255, 4097, 100003};

static void
test_group_layout(void **state)
{
  const unsigned char src[11] = {0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22};
  const unsigned char g4[11] = {0, 10, 1, 11, 2, 12, 3, 13, 20, 21, 22};
  const unsigned char g2[11] = {0, 2, 10, 12, 20, 1, 3, 11, 13, 21, 22};
  unsigned char d[11], back[11];

  spot_codec_group(d, src, 11, 4);
  assert_memory_equal(d, g4, 11); /* planes, then the 3 tail bytes as is */
  spot_codec_ungroup(back, d, 11, 4);
  assert_memory_equal(back, src, 11);
  spot_codec_group(d, src, 11, 2);
  assert_memory_equal(d, g2, 11);
  spot_codec_ungroup(back, d, 11, 2);
  assert_memory_equal(back, src, 11);
}

static void
test_group_matches_reference(void **state)
{
  size_t max = 100003 + 16;
  unsigned char *src = malloc(max), *a = malloc(max), *b = malloc(max),
                *back = malloc(max);

  assert_true(src && a && b && back);
  fill_random(src, max);
  for (size_t i = 0; i < ARRAY_N(odd_sizes); i++)
    for (unsigned k = 2; k <= 4; k += 2)
      for (size_t off = 0; off < 3; off++) {
        size_t n = odd_sizes[i];

        spot_codec_group(a, src + off, n, k);
        spot__codec_group_c(b, src + off, n, k);
        if (n == 0)
          continue;
        assert_memory_equal(a, b, n);
        spot_codec_ungroup(back, a, n, k);
        assert_memory_equal(back, src + off, n);
      }
  free(src);
  free(a);
  free(b);
  free(back);
}

static void
roundtrip(struct spot_codec *c, const unsigned char *src, size_t n,
          enum spot_filter f, enum spot_codec_mode mode)
{
  size_t bound = spot_codec_bound(n), len = 0;
  unsigned char *dst = malloc(bound), *back = malloc(n + 1);
  uint32_t crc = 0;

  assert_true(dst && back);
  assert_int_equal(
      spot_codec_encode(c, f, mode, src, n, dst, bound, &len, &crc), 0);
  assert_true(len > 0 && len <= bound);
  assert_int_equal(crc, spot_crc32c(0, src, n));
  back[n] = 0x77; /* canary: decode writes exactly n bytes */
  assert_int_equal(spot_codec_decode(c, f, dst, len, back, n, crc), 0);
  if (n > 0)
    assert_memory_equal(back, src, n);
  assert_int_equal(back[n], 0x77);
  if (mode == SPOT_CODEC_RAW)
    assert_true(len >= n);
  free(dst);
  free(back);
}

static void
test_roundtrip_all(void **state)
{
  static const size_t sizes[] = {0,    1,      3,      5,
                                 4097, 131072, 131073, (1 << 20) + 3};
  size_t max = (1 << 20) + 3;
  unsigned char *src = malloc(max);
  struct spot_codec *c;

  assert_non_null(src);
  assert_int_equal(spot_codec_new(max, &c), 0);
  assert_int_equal(spot_codec_part_max(c), max);
  for (unsigned in = 0; in < IN_LAST; in++) {
    fill(in, src, max);
    for (size_t i = 0; i < ARRAY_N(sizes); i++)
      for (unsigned f = 0; f < SPOT_FILTER_LAST; f++)
        for (unsigned m = 0; m < SPOT_CODEC_MODE_LAST; m++)
          roundtrip(c, src, sizes[i], f, m);
  }
  spot_codec_free(c);
  free(src);
}

/* With a grouping filter src may be dst (codec.h): the push reads a part
 * into its slot's buffer and encodes it there. Every mode, fp32 and bf16
 * parts with a tail: the frame written over its own input decodes to the
 * input, with the input's CRC32C, and is the frame of a separate output. */
static void
test_encode_in_place(void **state)
{
  size_t n = (1 << 20) + 7, bound = spot_codec_bound(n);
  unsigned char *src = malloc(n), *buf = malloc(bound), *sep = malloc(bound),
                *back = malloc(n);
  struct spot_codec *c;

  (void)state;
  assert_true(src && buf && sep && back);
  assert_int_equal(spot_codec_new(n, &c), 0);
  for (unsigned f = SPOT_FILTER_NONE + 1; f < SPOT_FILTER_LAST; f++) {
    fill(f == SPOT_FILTER_BYTEGROUP2 ? IN_BF16 : IN_FP32, src, n);
    for (unsigned m = 0; m < SPOT_CODEC_MODE_LAST; m++) {
      size_t len = 0, sep_len = 0;
      uint32_t crc = 0, sep_crc = 0;

      assert_int_equal(
          spot_codec_encode(c, f, m, src, n, sep, bound, &sep_len, &sep_crc),
          0);
      memcpy(buf, src, n);
      assert_int_equal(
          spot_codec_encode(c, f, m, buf, n, buf, bound, &len, &crc), 0);
      assert_int_equal(crc, spot_crc32c(0, src, n));
      assert_int_equal(len, sep_len);
      assert_memory_equal(buf, sep, len);
      assert_int_equal(spot_codec_decode(c, f, buf, len, back, n, crc), 0);
      assert_memory_equal(back, src, n);
    }
  }
  spot_codec_free(c);
  free(src);
  free(buf);
  free(sep);
  free(back);
}

static void
test_ratio_float(void **state)
{
  size_t n = 1 << 20, bound = spot_codec_bound(n), l4, l0;
  unsigned char *src = malloc(n), *dst = malloc(bound);
  struct spot_codec *c;
  uint32_t crc;

  assert_true(src && dst);
  assert_int_equal(spot_codec_new(n, &c), 0);
  fill_fp32(src, n);
  assert_int_equal(spot_codec_encode(c, SPOT_FILTER_NONE, SPOT_CODEC_ZSTD, src,
                                     n, dst, bound, &l0, &crc),
                   0);
  assert_int_equal(spot_codec_encode(c, SPOT_FILTER_BYTEGROUP4, SPOT_CODEC_ZSTD,
                                     src, n, dst, bound, &l4, &crc),
                   0);
  /* Gaussian fp32: grouping gains ~10% and reaches ~1.2 */
  assert_true(l4 < l0);
  assert_true((double)n / (double)l4 > 1.15);
  spot_codec_free(c);
  free(src);
  free(dst);
}

/* Encodes n bytes of input with filter f; returns the frame (malloc'd). */
static unsigned char *
make_frame(struct spot_codec *c, const unsigned char *src, size_t n,
           enum spot_filter f, enum spot_codec_mode mode, size_t *len,
           uint32_t *crc)
{
  size_t bound = spot_codec_bound(n);
  unsigned char *dst = malloc(bound + 16);

  assert_non_null(dst);
  assert_int_equal(spot_codec_encode(c, f, mode, src, n, dst, bound, len, crc),
                   0);
  return dst;
}

static void
test_corrupt_frames(void **state)
{
  size_t n = 70000, len;
  unsigned char *src = malloc(n), *back = malloc(n), *fr;
  struct spot_codec *c;
  uint32_t crc;

  assert_true(src && back);
  assert_int_equal(spot_codec_new(n, &c), 0);
  fill_fp32(src, n);
  for (unsigned m = 0; m < SPOT_CODEC_MODE_LAST; m++) {
    fr = make_frame(c, src, n, SPOT_FILTER_BYTEGROUP4, m, &len, &crc);
    /* checksum mismatch is its own error */
    assert_int_equal(
        spot_codec_decode(c, SPOT_FILTER_BYTEGROUP4, fr, len, back, n, crc ^ 1),
        -EILSEQ);
    /* the wrong filter decodes but fails the checksum */
    assert_int_equal(
        spot_codec_decode(c, SPOT_FILTER_NONE, fr, len, back, n, crc), -EILSEQ);
    /* truncated, trailing bytes, wrong expected size, empty */
    assert_int_equal(
        spot_codec_decode(c, SPOT_FILTER_BYTEGROUP4, fr, len - 1, back, n, crc),
        -EBADMSG);
    fr[len] = 0;
    assert_int_equal(
        spot_codec_decode(c, SPOT_FILTER_BYTEGROUP4, fr, len + 1, back, n, crc),
        -EBADMSG);
    assert_int_equal(
        spot_codec_decode(c, SPOT_FILTER_BYTEGROUP4, fr, len, back, n - 1, crc),
        -EBADMSG);
    assert_int_equal(
        spot_codec_decode(c, SPOT_FILTER_BYTEGROUP4, fr, 0, back, n, crc),
        -EBADMSG);
    /* single-byte flips at many positions: an error, never a crash, never
     * wrong data (a flip of a bit decoders ignore, like the frame header's
     * unused bit, may decode fine, and then the data must be right) */
    for (size_t pos = 0, tried = 0, failed = 0; pos < len;
         pos += (pos < 64 ? 1 : 97)) {
      int r;

      fr[pos] ^= 0x10;
      r = spot_codec_decode(c, SPOT_FILTER_BYTEGROUP4, fr, len, back, n, crc);
      assert_true(r == 0 || r == -EBADMSG || r == -EILSEQ);
      if (r == 0)
        assert_memory_equal(back, src, n);
      else
        failed++;
      fr[pos] ^= 0x10;
      tried++;
      if (pos + 97 >= len)
        assert_true(failed * 10 >= tried * 9);
    }
    assert_int_equal(
        spot_codec_decode(c, SPOT_FILTER_BYTEGROUP4, fr, len, back, n, crc), 0);
    free(fr);
  }
  /* garbage and a skippable frame */
  {
    unsigned char g[256] = {0x50, 0x2A, 0x4D, 0x18, 4, 0, 0, 0, 1, 2, 3, 4};

    assert_int_equal(spot_codec_decode(c, SPOT_FILTER_NONE, g, 12, back, 0, 0),
                     -EBADMSG);
    for (int i = 0; i < 200; i++) {
      fill_random(g, sizeof(g));
      if (i & 1) {
        g[0] = 0x28, g[1] = 0xB5, g[2] = 0x2F, g[3] = 0xFD;
      }
      assert_int_equal(spot_codec_decode(c, SPOT_FILTER_NONE, g, sizeof(g),
                                         back, 1000, 0) < 0,
                       1);
    }
  }
  spot_codec_free(c);
  free(src);
  free(back);
}

static void
test_errors(void **state)
{
  struct spot_codec *c = NULL;
  unsigned char src[64] = {0}, dst[256];
  size_t len;
  uint32_t crc;

  assert_int_equal(spot_codec_new(0, &c), -EINVAL);
  assert_int_equal(spot_codec_new(SPOT_CODEC_PART_MAX + 1, &c), -EINVAL);
  assert_null(c);
  spot_codec_free(NULL);
  assert_int_equal(spot_codec_new(32, &c), 0);
  assert_int_equal(spot_codec_encode(c, SPOT_FILTER_NONE, SPOT_CODEC_ZSTD, src,
                                     33, dst, sizeof(dst), &len, &crc),
                   -E2BIG);
  assert_int_equal(spot_codec_encode(c, SPOT_FILTER_LAST, SPOT_CODEC_ZSTD, src,
                                     8, dst, sizeof(dst), &len, &crc),
                   -EINVAL);
  assert_int_equal(spot_codec_encode(c, SPOT_FILTER_NONE, SPOT_CODEC_MODE_LAST,
                                     src, 8, dst, sizeof(dst), &len, &crc),
                   -EINVAL);
  assert_int_equal(spot_codec_encode(c, SPOT_FILTER_NONE, SPOT_CODEC_ZSTD, src,
                                     8, dst, 8, &len, &crc),
                   -ENOBUFS);
  assert_int_equal(spot_codec_encode(c, SPOT_FILTER_NONE, SPOT_CODEC_ZSTD, src,
                                     32, dst, sizeof(dst), &len, &crc),
                   0);
  assert_int_equal(
      spot_codec_decode(c, SPOT_FILTER_NONE, dst, len, src, 33, crc), -E2BIG);
  assert_int_equal(
      spot_codec_decode(c, SPOT_FILTER_LAST, dst, len, src, 32, crc), -EINVAL);
  assert_true(spot_codec_bound(0) >= 20);
  assert_true(spot_codec_bound(1 << 20) >= ZSTD_compressBound(1 << 20));
  spot_codec_free(c);
}

/* What `zstd -d` does: a streaming decode of the concatenated frames of an
 * object, with the default window limit. Unfiltered frames, compressed or
 * raw, must give back the file exactly. */
static void
test_plain_zstd_decodes(void **state)
{
  size_t part = 100000, n = 3 * part + 17, bound = spot_codec_bound(part);
  unsigned char *src = malloc(n), *obj = malloc(4 * bound), *out = malloc(n);
  size_t olen = 0;
  struct spot_codec *c;
  ZSTD_DCtx *d = ZSTD_createDCtx();
  ZSTD_inBuffer in;
  ZSTD_outBuffer ob;
  static const char text[] = "some text some text some text";
  size_t r;

  assert_true(src && obj && out && d);
  assert_int_equal(spot_codec_new(part, &c), 0);
  fill_fp32(src, n);
  memcpy(src + part, text, sizeof(text) - 1);
  for (size_t off = 0, i = 0; off < n; off += part, i++) {
    size_t len, k = n - off < part ? n - off : part;
    uint32_t crc;

    /* every mode in turn, as when the store adapts mid-file */
    assert_int_equal(spot_codec_encode(c, SPOT_FILTER_NONE,
                                       (enum spot_codec_mode)(i % 3), src + off,
                                       k, obj + olen, bound, &len, &crc),
                     0);
    /* each frame alone: ZSTD_decompress, content size in the header */
    assert_int_equal(ZSTD_getFrameContentSize(obj + olen, len), k);
    assert_int_equal(ZSTD_decompress(out, k, obj + olen, len), k);
    assert_memory_equal(out, src + off, k);
    olen += len;
  }
  in = (ZSTD_inBuffer){obj, olen, 0};
  ob = (ZSTD_outBuffer){out, n, 0};
  do {
    r = ZSTD_decompressStream(d, &ob, &in);
    assert_false(ZSTD_isError(r));
  } while (in.pos < in.size && ob.pos < ob.size);
  assert_int_equal(r, 0); /* ended on a frame boundary */
  assert_int_equal(ob.pos, n);
  assert_memory_equal(out, src, n);
  /* an empty raw frame too */
  {
    size_t len;
    uint32_t crc;

    assert_int_equal(spot_codec_encode(c, SPOT_FILTER_NONE, SPOT_CODEC_RAW, src,
                                       0, obj, bound, &len, &crc),
                     0);
    assert_int_equal(ZSTD_decompress(out, 1, obj, len), 0);
  }
  ZSTD_freeDCtx(d);
  spot_codec_free(c);
  free(src);
  free(obj);
  free(out);
}

static void
test_choose_filter(void **state)
{
  size_t n = SPOT_CODEC_SAMPLE_MAX + 4096;
  unsigned char *p = malloc(n);
  struct spot_codec *c;
  struct spot_codec_trial t;

  assert_non_null(p);
  assert_int_equal(spot_codec_new(n, &c), 0);
  fill_fp32(p, n);
  assert_int_equal(spot_codec_choose_filter(c, p, n, &t), 0);
  assert_int_equal(t.filter, SPOT_FILTER_BYTEGROUP4);
  assert_true(t.compress);
  assert_int_equal(t.mode, SPOT_CODEC_ZSTD);
  assert_int_equal(t.dense_size, 0);
  assert_int_equal(t.sample_len, SPOT_CODEC_SAMPLE_MAX);
  assert_true(t.size[SPOT_FILTER_BYTEGROUP4] < t.size[SPOT_FILTER_NONE]);
  fill_bf16(p, n);
  assert_int_equal(spot_codec_choose_filter(c, p, n, &t), 0);
  assert_int_equal(t.filter, SPOT_FILTER_BYTEGROUP2);
  assert_true(t.compress);
  assert_int_equal(t.mode, SPOT_CODEC_ZSTD);
  fill_random(p, n);
  assert_int_equal(spot_codec_choose_filter(c, p, n, &t), 0);
  assert_int_equal(t.filter, SPOT_FILTER_NONE);
  assert_false(t.compress);
  assert_int_equal(t.mode, SPOT_CODEC_RAW);
  memset(p, 0, n);
  assert_int_equal(spot_codec_choose_filter(c, p, n, &t), 0);
  assert_int_equal(t.filter, SPOT_FILTER_NONE);
  assert_true(t.compress);
  assert_int_not_equal(t.mode, SPOT_CODEC_RAW);
  /* log-like text: words from a small vocabulary with random numbers;
   * level 1 finds the repeats that level -1000 misses */
  for (size_t i = 0; i < n;) {
    static const char *const w[] = {"step ",   "loss=",  "lr=", "epoch ",
                                    "tokens ", "saved ", "\n"};
    const char *s = w[rnd() % 7];
    char num[16];

    for (; *s && i < n; s++)
      p[i++] = (unsigned char)*s;
    snprintf(num, sizeof(num), "%u ", (unsigned)(rnd() % 1000));
    for (s = num; *s && i < n; s++)
      p[i++] = (unsigned char)*s;
  }
  assert_int_equal(spot_codec_choose_filter(c, p, n, &t), 0);
  assert_int_equal(t.filter, SPOT_FILTER_NONE);
  assert_true(t.compress);
  assert_int_equal(t.mode, SPOT_CODEC_DENSE);
  assert_true(t.dense_size > 0 && t.dense_size < t.size[SPOT_FILTER_NONE]);
  for (size_t i = 0; i < 1000; i++)
    p[i] =
        (unsigned char)"the quick brown fox jumps over the lazy dog\n"[i % 44];
  assert_int_equal(spot_codec_choose_filter(c, p, 1000, &t), 0);
  assert_int_equal(t.filter, SPOT_FILTER_NONE);
  assert_true(t.compress);
  assert_int_equal(t.sample_len, 1000);
  assert_int_equal(spot_codec_choose_filter(c, p, 0, &t), 0);
  assert_int_equal(t.filter, SPOT_FILTER_NONE);
  assert_false(t.compress);
  assert_int_equal(t.mode, SPOT_CODEC_RAW);
  spot_codec_free(c);
  free(p);
}

static void
test_compress_pays(void **state)
{
  volatile double zero = 0;

  /* unknown figures: compress */
  assert_true(spot_codec_compress_pays(0, 1e9, 1.2));
  assert_true(spot_codec_compress_pays(1e9, 0, 1.2));
  assert_true(spot_codec_compress_pays(1e9, 1e9, 0.0 / zero));
  /* slow network (S3 at 130 MB/s), fast workers: compress */
  assert_true(spot_codec_compress_pays(3e9, 130e6, 1.2));
  /* loopback at 2.5 GB/s, 2 cores at 1.6 GB/s: raw */
  assert_false(spot_codec_compress_pays(3.2e9, 5e9, 1.2));
  /* incompressible: raw even on a slow network */
  assert_false(spot_codec_compress_pays(3e9, 130e6, 0.99));
  /* equal: compress (same speed, less storage) */
  assert_true(spot_codec_compress_pays(1e9, 1e9, 1.2));
}

/* A raw frame built in place and filled block by block is byte for byte
 * the frame spot_codec_encode() writes in raw mode, and decodes. */
static void
test_raw_frame_in_place(void **state)
{
  static const size_t sizes[] = {0,
                                 1,
                                 SPOT_CODEC_RAW_BLOCK - 1,
                                 SPOT_CODEC_RAW_BLOCK,
                                 SPOT_CODEC_RAW_BLOCK + 1,
                                 5 * SPOT_CODEC_RAW_BLOCK + 77};
  size_t max = 5 * SPOT_CODEC_RAW_BLOCK + 77, cap = spot_codec_bound(max);
  unsigned char *src = malloc(max), *a = malloc(cap), *b = malloc(cap);
  unsigned char *out = malloc(max);
  struct spot_codec *c;

  assert_non_null(src);
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(out);
  assert_int_equal(spot_codec_new(max, &c), 0);
  fill_random(src, max);
  for (size_t k = 0; k < ARRAY_N(sizes); k++) {
    size_t n = sizes[k], alen, blen;
    uint32_t crc;

    memset(b, 0xee, cap);
    assert_int_equal(spot_codec_encode(c, SPOT_FILTER_NONE, SPOT_CODEC_RAW, src,
                                       n, a, cap, &alen, &crc),
                     0);
    assert_int_equal(spot_codec_raw_frame(b, spot_codec_bound(n) - 1, n), 0);
    blen = spot_codec_raw_frame(b, cap, n);
    assert_int_equal(blen, alen);
    for (size_t i = 0; i * SPOT_CODEC_RAW_BLOCK < n; i++) {
      size_t len = n - i * SPOT_CODEC_RAW_BLOCK;

      if (len > SPOT_CODEC_RAW_BLOCK)
        len = SPOT_CODEC_RAW_BLOCK;
      memcpy(b + spot_codec_raw_payload(n, i), src + i * SPOT_CODEC_RAW_BLOCK,
             len);
    }
    assert_memory_equal(a, b, alen);
    assert_int_equal(spot_codec_decode(c, SPOT_FILTER_NONE, b, blen, out, n,
                                       spot_crc32c(0, src, n)),
                     0);
    assert_memory_equal(out, src, n);
  }
  spot_codec_free(c);
  free(src);
  free(a);
  free(b);
  free(out);
}

/* The one rule for part size, memory and pack threshold. */
static void
test_xfer_sizes(void **state)
{
  char err[160];

  (void)state;
  assert_int_equal(spot_xfer_sizes_check(0, 0, 0, err, sizeof(err)), 0);
  assert_int_equal(spot_xfer_sizes_check(SPOT_PART_DEFAULT, (uint64_t)1 << 30,
                                         (uint64_t)1 << 20, err, sizeof(err)),
                   0);
  assert_int_equal(spot_xfer_sizes_check(SPOT_PART_MIN, SPOT_MEMORY_MIN,
                                         SPOT_PART_MAX, err, sizeof(err)),
                   0);
  assert_int_equal(spot_xfer_sizes_check(SPOT_PART_MAX, 0, 0, NULL, 0), 0);
  assert_int_equal(
      spot_xfer_sizes_check(SPOT_PART_MAX + 4096, 0, 0, err, sizeof(err)),
      -EINVAL);
  assert_non_null(strstr(err, "128M"));
  assert_int_equal(
      spot_xfer_sizes_check(SPOT_PART_MIN - 4096, 0, 0, err, sizeof(err)),
      -EINVAL);
  assert_int_equal(
      spot_xfer_sizes_check(SPOT_PART_MIN + 1, 0, 0, err, sizeof(err)),
      -EINVAL);
  assert_non_null(strstr(err, "multiple of 4K"));
  assert_int_equal(
      spot_xfer_sizes_check(0, SPOT_MEMORY_MIN - 1, 0, err, sizeof(err)),
      -EINVAL);
  assert_non_null(strstr(err, "memory"));
  assert_int_equal(
      spot_xfer_sizes_check(0, 0, SPOT_PART_MAX + 1, err, sizeof(err)),
      -EINVAL);
  assert_non_null(strstr(err, "pack threshold"));
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_xfer_sizes),
      cmocka_unit_test(test_crc32c_vectors),
      cmocka_unit_test(test_crc32c_hw_matches_sw),
      cmocka_unit_test(test_filter_names),
      cmocka_unit_test(test_group_layout),
      cmocka_unit_test(test_group_matches_reference),
      cmocka_unit_test(test_roundtrip_all),
      cmocka_unit_test(test_encode_in_place),
      cmocka_unit_test(test_ratio_float),
      cmocka_unit_test(test_corrupt_frames),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_plain_zstd_decodes),
      cmocka_unit_test(test_choose_filter),
      cmocka_unit_test(test_compress_pays),
      cmocka_unit_test(test_raw_frame_in_place),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
