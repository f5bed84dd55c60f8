/* The checkpoint codec: byte grouping + zstd, one frame per part. See
 * codec.h for the format and the choices behind it. */
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_c_literalCompressionMode */
#include "core/codec.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "core/crc32c.h"
#include "core/util.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) &&        \
    !defined(SPOT_NO_SIMD) /* -DSPOT_NO_SIMD: portable code only */
#define HAVE_X86_SIMD 1
#include <nmmintrin.h> /* SSE4.2 crc32, includes SSSE3 */
#else
#define HAVE_X86_SIMD 0
#endif

struct spot_codec {
  ZSTD_CCtx *cctx;
  ZSTD_DCtx *dctx;
  size_t part_max;
  unsigned char *scratch; /* part_max bytes: filtered data */
  unsigned char *trial;   /* spot_codec_bound(sample) bytes, lazily */
  size_t trial_size;
  enum spot_codec_mode cctx_mode; /* what the CCtx is set up for */
};

static const char *const filter_names[SPOT_FILTER_LAST] = {
    [SPOT_FILTER_NONE] = "none",
    [SPOT_FILTER_BYTEGROUP2] = "bytegroup2",
    [SPOT_FILTER_BYTEGROUP4] = "bytegroup4",
};

const char *
spot_filter_name(enum spot_filter f)
{
  if ((unsigned)f >= SPOT_FILTER_LAST)
    return NULL;
  return filter_names[f];
}

int
spot_filter_from_name(const char *name, enum spot_filter *out)
{
  if (!name)
    return -EINVAL;
  for (unsigned i = 0; i < SPOT_FILTER_LAST; i++)
    if (strcmp(name, filter_names[i]) == 0) {
      *out = (enum spot_filter)i;
      return 0;
    }
  return -EINVAL;
}

static unsigned
filter_width(enum spot_filter f)
{
  switch (f) {
  case SPOT_FILTER_BYTEGROUP2:
    return 2;
  case SPOT_FILTER_BYTEGROUP4:
    return 4;
  case SPOT_FILTER_NONE:
  case SPOT_FILTER_LAST:
    break;
  }
  return 1;
}

/* Byte grouping. The scalar loops below are the reference and the
 * fallback; on x86-64 with SSSE3 (every CPU since 2006) a 4x4 byte
 * transpose per 16 bytes does the grouping, because gcc does not vectorize
 * the strided gathers and the scalar group4 (2.8 GB/s) cost as much as
 * zstd itself. The inverse vectorizes well enough on its own (5+ GB/s), but
 * an SSE2 interleave is as short and twice as fast. */
static void
group2_c(unsigned char *restrict d, const unsigned char *restrict s, size_t m,
         size_t i)
{
  unsigned char *d1 = d + m;

  for (; i < m; i++) {
    d[i] = s[2 * i];
    d1[i] = s[2 * i + 1];
  }
}

static void
group4_c(unsigned char *restrict d, const unsigned char *restrict s, size_t m,
         size_t i)
{
  unsigned char *d1 = d + m, *d2 = d + 2 * m, *d3 = d + 3 * m;

  for (; i < m; i++) {
    d[i] = s[4 * i];
    d1[i] = s[4 * i + 1];
    d2[i] = s[4 * i + 2];
    d3[i] = s[4 * i + 3];
  }
}

static void
ungroup2_c(unsigned char *restrict d, const unsigned char *restrict s, size_t m,
           size_t i)
{
  const unsigned char *s1 = s + m;

  for (; i < m; i++) {
    d[2 * i] = s[i];
    d[2 * i + 1] = s1[i];
  }
}

static void
ungroup4_c(unsigned char *restrict d, const unsigned char *restrict s, size_t m,
           size_t i)
{
  const unsigned char *s1 = s + m, *s2 = s + 2 * m, *s3 = s + 3 * m;

  for (; i < m; i++) {
    d[4 * i] = s[i];
    d[4 * i + 1] = s1[i];
    d[4 * i + 2] = s2[i];
    d[4 * i + 3] = s3[i];
  }
}

/* The portable loops from element i on, k = 2 or 4. */
static void
group_c(unsigned char *restrict d, const unsigned char *restrict s, size_t m,
        size_t i, unsigned k)
{
  if (k == 2)
    group2_c(d, s, m, i);
  else
    group4_c(d, s, m, i);
}

static void
ungroup_c(unsigned char *restrict d, const unsigned char *restrict s, size_t m,
          size_t i, unsigned k)
{
  if (k == 2)
    ungroup2_c(d, s, m, i);
  else
    ungroup4_c(d, s, m, i);
}

/* The tail (n % k bytes, after m planes of k) stays as is. */
static void
copy_tail(void *dst, const void *src, size_t n, size_t m, unsigned k)
{
  memcpy((unsigned char *)dst + m * k, (const unsigned char *)src + m * k,
         n - m * k);
}

#if HAVE_X86_SIMD
/* One step of 16 elements of 4 bytes from p, the first being element i:
 * pshufb gathers each byte position of 4 elements into one 32-bit lane,
 * then a 4x4 transpose of the lanes across four registers yields 16 bytes
 * of each of the m-byte planes of d. */
__attribute__((target("ssse3"), always_inline)) static inline void
group4_step(unsigned char *restrict d, const unsigned char *restrict p,
            size_t m, size_t i)
{
  const __m128i mask =
      _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  __m128i v0 = _mm_shuffle_epi8(_mm_loadu_si128((const void *)p), mask);
  __m128i v1 = _mm_shuffle_epi8(_mm_loadu_si128((const void *)(p + 16)), mask);
  __m128i v2 = _mm_shuffle_epi8(_mm_loadu_si128((const void *)(p + 32)), mask);
  __m128i v3 = _mm_shuffle_epi8(_mm_loadu_si128((const void *)(p + 48)), mask);
  __m128i t0 = _mm_unpacklo_epi32(v0, v1), t1 = _mm_unpacklo_epi32(v2, v3);
  __m128i t2 = _mm_unpackhi_epi32(v0, v1), t3 = _mm_unpackhi_epi32(v2, v3);

  _mm_storeu_si128((void *)(d + i), _mm_unpacklo_epi64(t0, t1));
  _mm_storeu_si128((void *)(d + m + i), _mm_unpackhi_epi64(t0, t1));
  _mm_storeu_si128((void *)(d + 2 * m + i), _mm_unpacklo_epi64(t2, t3));
  _mm_storeu_si128((void *)(d + 3 * m + i), _mm_unpackhi_epi64(t2, t3));
}

/* The same for 16 elements of 2 bytes. */
__attribute__((target("ssse3"), always_inline)) static inline void
group2_step(unsigned char *restrict d, const unsigned char *restrict p,
            size_t m, size_t i)
{
  const __m128i mask =
      _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  __m128i a = _mm_shuffle_epi8(_mm_loadu_si128((const void *)p), mask);
  __m128i b = _mm_shuffle_epi8(_mm_loadu_si128((const void *)(p + 16)), mask);

  _mm_storeu_si128((void *)(d + i), _mm_unpacklo_epi64(a, b));
  _mm_storeu_si128((void *)(d + m + i), _mm_unpackhi_epi64(a, b));
}

/* The inverse steps (SSE2, part of x86-64: no runtime check needed): 16
 * elements from element i of the m-byte planes of s, as the 64 (o[0..3]) or
 * 32 (o[0..1]) bytes of d from element i on. */
__attribute__((always_inline)) static inline void
ungroup4_step(const unsigned char *s, size_t m, size_t i, __m128i o[4])
{
  __m128i p0 = _mm_loadu_si128((const void *)(s + i));
  __m128i p1 = _mm_loadu_si128((const void *)(s + m + i));
  __m128i p2 = _mm_loadu_si128((const void *)(s + 2 * m + i));
  __m128i p3 = _mm_loadu_si128((const void *)(s + 3 * m + i));
  __m128i u0 = _mm_unpacklo_epi8(p0, p1), u1 = _mm_unpacklo_epi8(p2, p3);
  __m128i u2 = _mm_unpackhi_epi8(p0, p1), u3 = _mm_unpackhi_epi8(p2, p3);

  o[0] = _mm_unpacklo_epi16(u0, u1);
  o[1] = _mm_unpackhi_epi16(u0, u1);
  o[2] = _mm_unpacklo_epi16(u2, u3);
  o[3] = _mm_unpackhi_epi16(u2, u3);
}

__attribute__((always_inline)) static inline void
ungroup2_step(const unsigned char *s, size_t m, size_t i, __m128i o[2])
{
  __m128i p0 = _mm_loadu_si128((const void *)(s + i));
  __m128i p1 = _mm_loadu_si128((const void *)(s + m + i));

  o[0] = _mm_unpacklo_epi8(p0, p1);
  o[1] = _mm_unpackhi_epi8(p0, p1);
}

/* m elements of 4 (2) bytes, 16 per step; return the elements done. */
__attribute__((target("ssse3"))) static size_t
group4_ssse3(unsigned char *restrict d, const unsigned char *restrict s,
             size_t m)
{
  size_t i;

  for (i = 0; i + 16 <= m; i += 16)
    group4_step(d, s + 4 * i, m, i);
  return i;
}

__attribute__((target("ssse3"))) static size_t
group2_ssse3(unsigned char *restrict d, const unsigned char *restrict s,
             size_t m)
{
  size_t i;

  for (i = 0; i + 16 <= m; i += 16)
    group2_step(d, s + 2 * i, m, i);
  return i;
}

static size_t
ungroup4_sse2(unsigned char *restrict d, const unsigned char *restrict s,
              size_t m)
{
  size_t i;

  for (i = 0; i + 16 <= m; i += 16) {
    __m128i o[4];

    ungroup4_step(s, m, i, o);
    for (int k = 0; k < 4; k++)
      _mm_storeu_si128((void *)(d + 4 * i + 16 * k), o[k]);
  }
  return i;
}

static size_t
ungroup2_sse2(unsigned char *restrict d, const unsigned char *restrict s,
              size_t m)
{
  size_t i;

  for (i = 0; i + 16 <= m; i += 16) {
    __m128i o[2];

    ungroup2_step(s, m, i, o);
    for (int k = 0; k < 2; k++)
      _mm_storeu_si128((void *)(d + 2 * i + 16 * k), o[k]);
  }
  return i;
}

/* Continues the (uninverted) CRC32C c over the words 8-byte words at p. */
__attribute__((target("sse4.2"), always_inline)) static inline uint64_t
crc_words(uint64_t c, const unsigned char *p, int words)
{
  uint64_t w[8];

  memcpy(w, p, (size_t)words * sizeof(w[0]));
  for (int k = 0; k < words; k++)
    c = _mm_crc32_u64(c, w[k]);
  return c;
}

/* Stores v at d and continues the CRC32C c over it. */
__attribute__((target("sse4.2"), always_inline)) static inline uint64_t
store_crc(unsigned char *d, __m128i v, uint64_t c)
{
  _mm_storeu_si128((void *)d, v);
  c = _mm_crc32_u64(c, (uint64_t)_mm_cvtsi128_si64(v));
  return _mm_crc32_u64(c,
                       (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(v, v)));
}

/* The same groupings with the CRC32C of the source computed in the same
 * pass: the source is read once, and the crc32 chain (latency-bound) runs
 * beside the shuffles. bench/codec_bench: fp32 encode 1440 -> 1880 MB/s,
 * decode 2700 -> 3300 MB/s per core. *crc is continued like
 * spot_crc32c(). */
__attribute__((target("ssse3,sse4.2"))) static size_t
group4_crc_x86(unsigned char *restrict d, const unsigned char *restrict s,
               size_t m, uint32_t *crc)
{
  uint64_t c = ~*crc;
  size_t i;

  for (i = 0; i + 16 <= m; i += 16) {
    c = crc_words(c, s + 4 * i, 8);
    group4_step(d, s + 4 * i, m, i);
  }
  *crc = ~(uint32_t)c;
  return i;
}

__attribute__((target("ssse3,sse4.2"))) static size_t
group2_crc_x86(unsigned char *restrict d, const unsigned char *restrict s,
               size_t m, uint32_t *crc)
{
  uint64_t c = ~*crc;
  size_t i;

  for (i = 0; i + 16 <= m; i += 16) {
    c = crc_words(c, s + 2 * i, 4);
    group2_step(d, s + 2 * i, m, i);
  }
  *crc = ~(uint32_t)c;
  return i;
}

/* The inverses, with the CRC32C of the output (d) computed in the same
 * pass, from the registers just stored. */
__attribute__((target("sse4.2"))) static size_t
ungroup4_crc_x86(unsigned char *restrict d, const unsigned char *restrict s,
                 size_t m, uint32_t *crc)
{
  uint64_t c = ~*crc;
  size_t i;

  for (i = 0; i + 16 <= m; i += 16) {
    __m128i o[4];

    ungroup4_step(s, m, i, o);
    for (int k = 0; k < 4; k++)
      c = store_crc(d + 4 * i + 16 * k, o[k], c);
  }
  *crc = ~(uint32_t)c;
  return i;
}

__attribute__((target("sse4.2"))) static size_t
ungroup2_crc_x86(unsigned char *restrict d, const unsigned char *restrict s,
                 size_t m, uint32_t *crc)
{
  uint64_t c = ~*crc;
  size_t i;

  for (i = 0; i + 16 <= m; i += 16) {
    __m128i o[2];

    ungroup2_step(s, m, i, o);
    for (int k = 0; k < 2; k++)
      c = store_crc(d + 2 * i + 16 * k, o[k], c);
  }
  *crc = ~(uint32_t)c;
  return i;
}
#endif

/* Ungroups k planes of s into d and returns the CRC32C of d. */
static uint32_t
ungroup_crc(unsigned char *d, const unsigned char *s, size_t n, unsigned k)
{
  uint32_t crc = 0;

#if HAVE_X86_SIMD
  if (__builtin_cpu_supports("sse4.2")) {
    size_t m = n / k, i;

    i = k == 2 ? ungroup2_crc_x86(d, s, m, &crc)
               : ungroup4_crc_x86(d, s, m, &crc);
    ungroup_c(d, s, m, i, k);
    copy_tail(d, s, n, m, k);
    return spot_crc32c(crc, d + i * k, n - i * k);
  }
#endif
  spot_codec_ungroup(d, s, n, k);
  return spot_crc32c(crc, d, n);
}

/* Groups src into k planes in d and returns the CRC32C of src. */
static uint32_t
group_crc(unsigned char *d, const unsigned char *s, size_t n, unsigned k)
{
  uint32_t crc = 0;

#if HAVE_X86_SIMD
  if (__builtin_cpu_supports("ssse3") && __builtin_cpu_supports("sse4.2")) {
    size_t m = n / k, i;

    i = k == 2 ? group2_crc_x86(d, s, m, &crc) : group4_crc_x86(d, s, m, &crc);
    group_c(d, s, m, i, k);
    copy_tail(d, s, n, m, k);
    return spot_crc32c(crc, s + i * k, n - i * k);
  }
#endif
  spot_codec_group(d, s, n, k);
  return spot_crc32c(crc, s, n);
}

/* m elements of k = 2 or 4 bytes, the fastest kernel the CPU has. */
static void
group(unsigned char *restrict d, const unsigned char *restrict s, size_t m,
      unsigned k)
{
  size_t i = 0;

#if HAVE_X86_SIMD
  if (__builtin_cpu_supports("ssse3"))
    i = k == 2 ? group2_ssse3(d, s, m) : group4_ssse3(d, s, m);
#endif
  group_c(d, s, m, i, k);
}

static void
ungroup(unsigned char *restrict d, const unsigned char *restrict s, size_t m,
        unsigned k)
{
  size_t i = 0;

#if HAVE_X86_SIMD
  i = k == 2 ? ungroup2_sse2(d, s, m) : ungroup4_sse2(d, s, m);
#endif
  ungroup_c(d, s, m, i, k);
}

/* Exposed for the unit tests: force the portable loops. */
void spot__codec_group_c(void *dst, const void *src, size_t n, unsigned k);

void
spot__codec_group_c(void *dst, const void *src, size_t n, unsigned k)
{
  size_t m = n / k;

  group_c(dst, src, m, 0, k);
  copy_tail(dst, src, n, m, k);
}

void
spot_codec_group(void *dst, const void *src, size_t n, unsigned k)
{
  size_t m = k ? n / k : 0;

  if (k == 2 || k == 4)
    group(dst, src, m, k);
  else
    m = 0;
  copy_tail(dst, src, n, m, k);
}

void
spot_codec_ungroup(void *dst, const void *src, size_t n, unsigned k)
{
  size_t m = k ? n / k : 0;

  if (k == 2 || k == 4)
    ungroup(dst, src, m, k);
  else
    m = 0;
  copy_tail(dst, src, n, m, k);
}

/* Raw frames, written by hand (RFC 8878 section 3.1.1): magic, a frame
 * header with a 128 KiB window and the content size, then raw blocks of at
 * most 128 KiB, the last one flagged. No content checksum. */
#define RAW_BLOCK_MAX SPOT_CODEC_RAW_BLOCK
#define RAW_HEADER_MAX (4 + 1 + 1 + 8)

static size_t
raw_frame_size(size_t n)
{
  size_t blocks = n ? (n + RAW_BLOCK_MAX - 1) / RAW_BLOCK_MAX : 1;

  return RAW_HEADER_MAX + 3 * blocks + n;
}

static void
put_le(unsigned char *p, uint64_t v, unsigned bytes)
{
  for (unsigned i = 0; i < bytes; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

/* The frame header of an n-byte raw frame at d; returns its length. */
static size_t
raw_header(unsigned char *d, size_t n)
{
  int big = (uint64_t)n > UINT32_MAX;

  put_le(d, ZSTD_MAGICNUMBER, 4);
  /* Frame_Content_Size_flag 2 (4 bytes) or 3 (8 bytes); not single
   * segment, so a Window_Descriptor follows: exponent 7 = 2^17. */
  d[4] = big ? 0xC0 : 0x80;
  d[5] = 7 << 3;
  put_le(d + 6, n, big ? 8 : 4);
  return big ? 14 : 10;
}

/* The block header before len of the n bytes left, at p. */
static void
raw_block_header(unsigned char *p, size_t len, size_t left)
{
  uint32_t hdr = (uint32_t)len << 3; /* Block_Type 0 = Raw_Block */

  if (len == left)
    hdr |= 1; /* Last_Block */
  put_le(p, hdr, 3);
}

static size_t
write_raw_frame(unsigned char *d, const unsigned char *s, size_t n)
{
  unsigned char *p = d + raw_header(d, n);

  do {
    size_t len = n < RAW_BLOCK_MAX ? n : RAW_BLOCK_MAX;

    raw_block_header(p, len, n);
    p += 3;
    memcpy(p, s, len);
    p += len;
    s += len;
    n -= len;
  } while (n > 0);
  return (size_t)(p - d);
}

size_t
spot_codec_raw_frame(void *dst, size_t dst_cap, size_t n)
{
  unsigned char *d = dst, *p;

  if (dst_cap < spot_codec_bound(n))
    return 0;
  p = d + raw_header(d, n);
  do {
    size_t len = n < RAW_BLOCK_MAX ? n : RAW_BLOCK_MAX;

    raw_block_header(p, len, n);
    p += 3 + len;
    n -= len;
  } while (n > 0);
  return (size_t)(p - d);
}

size_t
spot_codec_raw_payload(size_t n, size_t i)
{
  return ((uint64_t)n > UINT32_MAX ? 14 : 10) + 3 * (i + 1) + i * RAW_BLOCK_MAX;
}

size_t
spot_codec_bound(size_t n)
{
  size_t z = ZSTD_compressBound(n), r = raw_frame_size(n);

  return z > r ? z : r;
}

/* The compression parameters of a mode (only when they change: setting
 * them is cheap, but a change may resize the context's tables). */
static size_t
set_level(struct spot_codec *c, enum spot_codec_mode mode)
{
  bool dense = mode == SPOT_CODEC_DENSE;
  size_t r;

  r = ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_compressionLevel,
                             dense ? SPOT_CODEC_DENSE_LEVEL : SPOT_CODEC_LEVEL);
  if (!ZSTD_isError(r))
    r = ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_literalCompressionMode,
                               dense ? ZSTD_ps_auto : ZSTD_ps_enable);
  if (!ZSTD_isError(r))
    c->cctx_mode = mode;
  return r;
}

int
spot_codec_new(size_t part_max, struct spot_codec **out)
{
  struct spot_codec *c;
  size_t r;

  if (part_max == 0 || part_max > SPOT_CODEC_PART_MAX)
    return -EINVAL;
  c = calloc(1, sizeof(*c));
  if (!c)
    return -ENOMEM;
  c->part_max = part_max;
  c->cctx = ZSTD_createCCtx();
  c->dctx = ZSTD_createDCtx();
  c->scratch = spot_big_alloc(part_max, part_max);
  if (!c->cctx || !c->dctx || !c->scratch) {
    spot_codec_free(c);
    return -ENOMEM;
  }
  r = set_level(c, SPOT_CODEC_ZSTD);
  if (!ZSTD_isError(r))
    r = ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_contentSizeFlag, 1);
  if (!ZSTD_isError(r))
    r = ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_checksumFlag, 0);
  if (ZSTD_isError(r)) {
    spot_codec_free(c);
    return -EIO;
  }
  *out = c;
  return 0;
}

void
spot_codec_free(struct spot_codec *c)
{
  if (!c)
    return;
  ZSTD_freeCCtx(c->cctx);
  ZSTD_freeDCtx(c->dctx);
  spot_big_free(c->scratch, c->part_max);
  free(c->trial);
  free(c);
}

size_t
spot_codec_part_max(const struct spot_codec *c)
{
  return c->part_max;
}

/* Filter + frame; the CRC32C of src into *crc unless crc is NULL. */
static int
encode(struct spot_codec *c, enum spot_filter filter, enum spot_codec_mode mode,
       const void *src, size_t n, void *dst, size_t dst_cap, size_t *out_len,
       uint32_t *crc)
{
  unsigned k;
  const void *in = src;
  size_t r;

  if ((unsigned)filter >= SPOT_FILTER_LAST ||
      (unsigned)mode >= SPOT_CODEC_MODE_LAST)
    return -EINVAL;
  if (n > c->part_max)
    return -E2BIG;
  if (dst_cap < spot_codec_bound(n))
    return -ENOBUFS;
  k = filter_width(filter);
  /* With k > 1, src is read whole into scratch here, before dst is
   * written: src may be dst (codec.h). */
  if (k > 1 && crc) {
    *crc = group_crc(c->scratch, src, n, k);
    in = c->scratch;
  } else if (k > 1) {
    spot_codec_group(c->scratch, src, n, k);
    in = c->scratch;
  } else if (crc) {
    *crc = spot_crc32c(0, src, n);
  }
  if (mode == SPOT_CODEC_RAW) {
    *out_len = write_raw_frame(dst, in, n);
    return 0;
  }
  r = 0;
  if (mode != c->cctx_mode)
    r = set_level(c, mode);
  if (!ZSTD_isError(r))
    r = ZSTD_compress2(c->cctx, dst, dst_cap, in, n);
  if (ZSTD_isError(r)) {
    /* the context may be mid-frame: start clean next time */
    ZSTD_CCtx_reset(c->cctx, ZSTD_reset_session_only);
    return -EIO;
  }
  *out_len = r;
  return 0;
}

int
spot_codec_encode(struct spot_codec *c, enum spot_filter filter,
                  enum spot_codec_mode mode, const void *src, size_t n,
                  void *dst, size_t dst_cap, size_t *out_len, uint32_t *out_crc)
{
  size_t len;
  uint32_t crc = 0;
  int r;

  r = encode(c, filter, mode, src, n, dst, dst_cap, &len, &crc);
  if (r < 0)
    return r;
  *out_crc = crc;
  *out_len = len;
  return 0;
}

int
spot_codec_decode(struct spot_codec *c, enum spot_filter filter,
                  const void *src, size_t src_len, void *dst, size_t raw_len,
                  uint32_t crc)
{
  unsigned k;
  unsigned long long fcs;
  unsigned char *out;
  size_t r;

  if ((unsigned)filter >= SPOT_FILTER_LAST)
    return -EINVAL;
  if (raw_len > c->part_max)
    return -E2BIG;
  /* Exactly one zstd frame (not a skippable one), nothing after it, and
   * if it states its content size, the expected one. */
  if (src_len < 4 || ((const unsigned char *)src)[0] != 0x28 ||
      ((const unsigned char *)src)[1] != 0xB5 ||
      ((const unsigned char *)src)[2] != 0x2F ||
      ((const unsigned char *)src)[3] != 0xFD)
    return -EBADMSG;
  r = ZSTD_findFrameCompressedSize(src, src_len);
  if (ZSTD_isError(r) || r != src_len)
    return -EBADMSG;
  fcs = ZSTD_getFrameContentSize(src, src_len);
  if (fcs == ZSTD_CONTENTSIZE_ERROR ||
      (fcs != ZSTD_CONTENTSIZE_UNKNOWN && fcs != raw_len))
    return -EBADMSG;
  k = filter_width(filter);
  out = k > 1 ? c->scratch : dst;
  /* Bounded by raw_len: a frame that decodes to more fails here. */
  r = ZSTD_decompressDCtx(c->dctx, out, raw_len, src, src_len);
  if (ZSTD_isError(r) || r != raw_len)
    return -EBADMSG;
  if ((k > 1 ? ungroup_crc(dst, out, raw_len, k)
             : spot_crc32c(0, dst, raw_len)) != crc)
    return -EILSEQ;
  return 0;
}

int
spot_codec_choose_filter(struct spot_codec *c, const void *sample, size_t n,
                         struct spot_codec_trial *out)
{
  struct spot_codec_trial t;
  size_t best;

  memset(&t, 0, sizeof(t));
  t.filter = SPOT_FILTER_NONE;
  t.mode = SPOT_CODEC_RAW;
  if (n > SPOT_CODEC_SAMPLE_MAX)
    n = SPOT_CODEC_SAMPLE_MAX;
  if (n > c->part_max)
    n = c->part_max;
  t.sample_len = n;
  if (n == 0) {
    *out = t;
    return 0;
  }
  if (c->trial_size < spot_codec_bound(n)) {
    size_t size =
        spot_codec_bound(n < SPOT_CODEC_SAMPLE_MAX ? SPOT_CODEC_SAMPLE_MAX : n);
    unsigned char *p = realloc(c->trial, size);

    if (!p)
      return -ENOMEM;
    c->trial = p;
    c->trial_size = size;
  }
  for (unsigned f = 0; f < SPOT_FILTER_LAST; f++) {
    int r = encode(c, (enum spot_filter)f, SPOT_CODEC_ZSTD, sample, n, c->trial,
                   c->trial_size, &t.size[f], NULL);

    if (r < 0)
      return r;
  }
  /* Filters in order of width: a wider one must beat the best so far by
   * the gain threshold (bf16 grouped in 4 planes is as small as in 2, but
   * 2 is what the data is, and faster). */
  best = t.size[SPOT_FILTER_NONE];
  for (unsigned f = SPOT_FILTER_NONE + 1; f < SPOT_FILTER_LAST; f++)
    if (t.size[f] * 100 <= best * (100 - SPOT_CODEC_FILTER_GAIN_PCT)) {
      best = t.size[f];
      t.filter = (enum spot_filter)f;
    }
  t.compress = best * 100 <= n * (100 - SPOT_CODEC_MIN_SAVING_PCT);
  t.mode = t.compress ? SPOT_CODEC_ZSTD : SPOT_CODEC_RAW;
  if (!t.compress)
    t.filter = SPOT_FILTER_NONE;
  /* Grouped floats only have literal entropy to lose: no dense trial. */
  if (t.compress && t.filter == SPOT_FILTER_NONE) {
    int r = encode(c, SPOT_FILTER_NONE, SPOT_CODEC_DENSE, sample, n, c->trial,
                   c->trial_size, &t.dense_size, NULL);

    if (r < 0)
      return r;
    if (t.dense_size * 100 <= best * (100 - SPOT_CODEC_DENSE_GAIN_PCT))
      t.mode = SPOT_CODEC_DENSE;
  }
  *out = t;
  return 0;
}

bool
spot_codec_compress_pays(double compress_bps, double net_bps, double ratio)
{
  double with;

  /* unknown (0, negative or NaN) figures: keep compressing */
  if (!(compress_bps > 0) || !(net_bps > 0) || !(ratio > 0))
    return true;
  with = net_bps * ratio;
  if (compress_bps < with)
    with = compress_bps;
  return with >= net_bps;
}

int
spot_xfer_sizes_check(uint64_t part_size, uint64_t memory,
                      uint64_t pack_threshold, char *err, size_t errlen)
{
  const char *why = NULL;
  char buf[160];

  if (part_size != 0 &&
      (part_size < SPOT_PART_MIN || part_size > SPOT_PART_MAX ||
       part_size % SPOT_PART_ALIGN != 0)) {
    snprintf(buf, sizeof(buf),
             "part size %" PRIu64 ": expected 5M to 128M, a multiple of 4K",
             part_size);
    why = buf;
  } else if (memory != 0 && memory < SPOT_MEMORY_MIN) {
    snprintf(buf, sizeof(buf),
             "memory %" PRIu64 ": expected at least 1M (one part buffer)",
             memory);
    why = buf;
  } else if (pack_threshold > SPOT_PART_MAX) {
    snprintf(buf, sizeof(buf),
             "pack threshold %" PRIu64 ": expected 0 (no packing) to 128M",
             pack_threshold);
    why = buf;
  }
  if (why == NULL)
    return 0;
  if (err != NULL && errlen > 0)
    snprintf(err, errlen, "%s", why);
  return -EINVAL;
}
