/* The checkpoint codec: one part of a file (8-16 MiB) in, one independent
 * zstd frame out, and back. Pure: no I/O, no libuv, no logging on the data
 * path. One struct spot_codec per worker thread; it owns the zstd contexts
 * and a scratch buffer of part_max bytes, so encoding and decoding parts
 * allocate nothing once warm. A codec is not thread-safe; different codecs
 * are independent.
 *
 * Frame format. Every frame is a standard zstd frame (RFC 8878) with the
 * content size in its header and no zstd checksum, so the object of a file
 * (its frames concatenated) is a plain zstd stream. With SPOT_FILTER_NONE,
 * `zstd -d` of the object reproduces the file byte for byte; with a byte
 * grouping filter it reproduces the grouped bytes (the manifest says which).
 *
 * Filters. Byte grouping stores byte j of every k-byte element in plane j:
 * fp32 -> 4 planes (sign+exponent bits land in one plane, which is the only
 * part of a Gaussian float that compresses), bf16/fp16 -> 2 planes. When n
 * is not a multiple of k the last n % k bytes are copied unchanged after
 * the planes. Filters apply per part, so parts must start on an element
 * boundary (the store's part size is a multiple of 4).
 *
 * Compression. zstd level SPOT_CODEC_LEVEL with forced literal compression
 * (ZSTD_c_literalCompressionMode = ZSTD_ps_enable): measured ratio 1.21 on
 * fp32 weights + Adam after 4-plane grouping, 1.52 on bf16 after 2-plane
 * grouping, at ~2 GB/s per core (measured with bench/codec_bench.c).
 *
 * Dense mode (SPOT_CODEC_DENSE) is zstd level 1 for unfiltered data with
 * real redundancy (text), where the fast setting leaves half the gain.
 *
 * Raw mode (SPOT_CODEC_RAW) writes the same bytes as zstd raw blocks: a
 * valid frame that any zstd decodes, at memcpy speed. The store uses it
 * when compression does not pay for a file (spot_codec_choose_filter()
 * says so) or when the network is faster than the compressing workers
 * (spot_codec_compress_pays()). Decoding does not need to know the mode.
 *
 * Checksum. Each frame's CRC32C is computed over the RAW part (the bytes
 * of the file, before filtering and compression), and the manifest records
 * only that one. Why raw: it is end to end, so it also catches a codec or
 * filter bug and a memory error between read and upload, not only storage
 * or transfer damage; and nothing is lost by checking after decompression,
 * because decoding a damaged frame is safe (zstd bounds every write by the
 * expected raw length and fails cleanly) and the failure path's cost does
 * not matter. A CRC of the compressed bytes would only add a second field
 * to keep consistent. */
#ifndef SPOT_CODEC_H
#define SPOT_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum spot_filter {
  SPOT_FILTER_NONE = 0,   /* "none" */
  SPOT_FILTER_BYTEGROUP2, /* "bytegroup2": 2 byte planes (bf16, fp16) */
  SPOT_FILTER_BYTEGROUP4, /* "bytegroup4": 4 byte planes (fp32) */
  SPOT_FILTER_LAST,
};

enum spot_codec_mode {
  SPOT_CODEC_ZSTD = 0, /* filter + zstd SPOT_CODEC_LEVEL, forced literals */
  SPOT_CODEC_RAW,      /* filter + zstd raw blocks (no compression) */
  SPOT_CODEC_DENSE,    /* filter + zstd SPOT_CODEC_DENSE_LEVEL: text-like */
  SPOT_CODEC_MODE_LAST,
};

/* Hard cap on one part (and on part_max). S3 allows 10000 parts, so this
 * bounds a file at ~1.2 TiB at the cap, 80 GiB at 8 MiB parts. */
#define SPOT_CODEC_PART_MAX ((size_t)128 << 20)

/* The one rule for the sizes of a transfer, used by spotd's config,
 * spotctl and the store alike. A part is one S3 multipart part and one
 * zstd frame: at least S3's 5 MiB minimum, at most SPOT_CODEC_PART_MAX, in
 * whole 4 KiB pages (direct and aligned reads). The memory budget holds at
 * least one part. Files below the pack threshold (0 = no packing) are
 * packed, so it is at most a part. */
#define SPOT_PART_MIN ((uint64_t)5 << 20)
#define SPOT_PART_MAX ((uint64_t)SPOT_CODEC_PART_MAX)
#define SPOT_PART_DEFAULT ((uint64_t)16 << 20)
#define SPOT_PART_ALIGN 4096
#define SPOT_MEMORY_MIN ((uint64_t)1 << 20)
/* 0 when the sizes are usable; else -EINVAL and err (may be NULL) says
 * which one and what is allowed. A size given as 0 is not checked (the
 * default applies). */
int spot_xfer_sizes_check(uint64_t part_size, uint64_t memory,
                          uint64_t pack_threshold, char *err, size_t errlen);
/* spot_codec_choose_filter() looks at no more than this many bytes. The
 * trial is 3-4 compressions of it, for every file: 1 MiB made a push of
 * 1 MiB files spend 54 % of its CPU on the trial. Not less than 512 KiB:
 * zstd picks one Huffman table per 128 KiB block, and a grouped sample
 * whose planes are smaller than a block mixes the exponent plane with
 * mantissas in one block (fp32 at 256 KiB: ratio 1.12 instead of the
 * 1.20 that 8 MiB parts get, so the trial chose bytegroup2). */
#define SPOT_CODEC_SAMPLE_MAX ((size_t)512 << 10)
/* zstd compression level (the lowest levels only differ in match search;
 * on float data the gain comes from literal Huffman coding). */
#define SPOT_CODEC_LEVEL (-1000)
/* A filter is chosen only if it makes the sample at least this many
 * percent smaller than SPOT_FILTER_NONE does. */
#define SPOT_CODEC_FILTER_GAIN_PCT 2
/* Compression is worth it only if it saves at least this many percent of
 * the sample; below that the file goes out in raw frames. */
#define SPOT_CODEC_MIN_SAVING_PCT 1
/* Unfiltered data (text, JSON, pickles) gains from real match finding:
 * level 1 halves text that level -1000 only shrinks by 1.6x, at ~1/3 of
 * the speed (bench/codec_bench). SPOT_CODEC_DENSE is chosen when it makes
 * the sample this many percent smaller than SPOT_CODEC_ZSTD. */
#define SPOT_CODEC_DENSE_LEVEL 1
#define SPOT_CODEC_DENSE_GAIN_PCT 25

struct spot_codec;

/* "none", "bytegroup2", "bytegroup4"; NULL for an invalid value. */
const char *spot_filter_name(enum spot_filter f);
/* The inverse; -EINVAL for an unknown name. */
int spot_filter_from_name(const char *name, enum spot_filter *out);

/* A codec for parts of at most part_max bytes (1..SPOT_CODEC_PART_MAX).
 * Allocates the zstd contexts and a part_max scratch buffer. Returns 0,
 * -EINVAL or -ENOMEM. For restore, size it with the largest frame of the
 * manifest (spot_manifest_max_frame_raw()). */
int spot_codec_new(size_t part_max, struct spot_codec **out);
void spot_codec_free(struct spot_codec *c);
size_t spot_codec_part_max(const struct spot_codec *c);

/* Bytes the output buffer of spot_codec_encode() needs for an n-byte part
 * in any mode (ZSTD_compressBound(n), or a little more for tiny parts). */
size_t spot_codec_bound(size_t n);

/* Encodes src[0..n) into one zstd frame in dst (dst_cap bytes, at least
 * spot_codec_bound(n)). dst must not overlap src, except that with a
 * grouping filter (any but SPOT_FILTER_NONE) src may be dst itself: the
 * grouping reads all of src into the codec's own buffer before the frame
 * is written (a caller then reads a part straight into its output
 * buffer and needs no buffer of its own). n may be 0 (an empty
 * frame). On success sets *out_len to the frame length and *out_crc to
 * spot_crc32c(0, src, n), and returns 0. Errors: -EINVAL (bad filter or
 * mode), -E2BIG (n > part_max), -ENOBUFS (dst_cap too small), -EIO (zstd
 * failed; never expected). In raw mode the filter is still applied, so a
 * file may switch mode between parts and its frames still decode the same
 * way; use SPOT_FILTER_NONE for files that are raw from the start. */
int spot_codec_encode(struct spot_codec *c, enum spot_filter filter,
                      enum spot_codec_mode mode, const void *src, size_t n,
                      void *dst, size_t dst_cap, size_t *out_len,
                      uint32_t *out_crc);

/* A raw frame (SPOT_CODEC_RAW, SPOT_FILTER_NONE) built in place, for a
 * caller that reads the part straight into it instead of into a buffer
 * that spot_codec_encode() would copy: writes the frame header and every
 * block header of an n-byte raw frame into dst and returns the frame's
 * length (0 if dst_cap < spot_codec_bound(n)). Bytes [i * B, i * B + B)
 * of the part (B = SPOT_CODEC_RAW_BLOCK; the last block is shorter) then
 * go to dst + spot_codec_raw_payload(n, i); filled in, the frame is the
 * one spot_codec_encode() writes for those bytes in raw mode. The CRC32C
 * of the part is the caller's (spot_crc32c() over the payloads). */
#define SPOT_CODEC_RAW_BLOCK ((size_t)128 << 10)
size_t spot_codec_raw_frame(void *dst, size_t dst_cap, size_t n);
size_t spot_codec_raw_payload(size_t n, size_t i);

/* Decodes one frame src[0..src_len) that must hold exactly raw_len bytes
 * into dst (raw_len bytes), undoes the filter and checks the CRC32C of the
 * result against crc. Returns 0, or:
 *   -EBADMSG  not exactly one valid zstd frame of raw_len bytes (corrupt,
 *             truncated, trailing bytes, wrong content size);
 *   -EILSEQ   the frame decoded but its CRC32C is not crc;
 *   -EINVAL   bad filter; -E2BIG raw_len > part_max.
 * dst's content is unspecified after an error. Never crashes on garbage,
 * never writes past dst + raw_len. */
int spot_codec_decode(struct spot_codec *c, enum spot_filter filter,
                      const void *src, size_t src_len, void *dst,
                      size_t raw_len, uint32_t crc);

/* The outcome of trying every filter on a sample. */
struct spot_codec_trial {
  enum spot_filter filter;       /* the filter to use for the whole file */
  enum spot_codec_mode mode;     /* the mode to start with */
  bool compress;                 /* mode != SPOT_CODEC_RAW */
  size_t sample_len;             /* bytes tried (<= SPOT_CODEC_SAMPLE_MAX) */
  size_t size[SPOT_FILTER_LAST]; /* sample size per filter, fast mode */
  size_t dense_size;             /* sample size in dense mode (0: not tried) */
};

/* Compresses the first min(n, SPOT_CODEC_SAMPLE_MAX) bytes of a file
 * (the sample) with each filter and picks: the smallest filtered result if
 * it beats SPOT_FILTER_NONE by SPOT_CODEC_FILTER_GAIN_PCT, else
 * SPOT_FILTER_NONE (text, random, already compressed data); and compress =
 * false when even the best saves less than SPOT_CODEC_MIN_SAVING_PCT
 * (then mode = SPOT_CODEC_RAW with SPOT_FILTER_NONE: zstd would only store
 * raw blocks, more slowly). When no filter helps and the data compresses,
 * SPOT_CODEC_DENSE is also tried, and mode says which of the two zstd
 * settings to use (dense if SPOT_CODEC_DENSE_GAIN_PCT smaller). An empty
 * sample gives SPOT_FILTER_NONE and SPOT_CODEC_RAW. Costs three or four
 * compressions of 1 MiB (2-5 ms); run it on the worker thread that reads
 * the first part. Returns 0 or the errors of spot_codec_encode(). */
int spot_codec_choose_filter(struct spot_codec *c, const void *sample, size_t n,
                             struct spot_codec_trial *out);

/* Whether compressing keeps the upload at least as fast as sending raw
 * frames. compress_bps: raw bytes per second all compressing workers
 * together achieve (measured from the work callbacks: part bytes / time
 * in spot_codec_encode, times the number of workers). net_bps: wire bytes
 * per second the uploads achieve (measured while parts are queued waiting
 * for a transfer slot, else the figure is the producer's speed, not the
 * network's). ratio: raw / stored bytes so far. With compression the
 * pipeline moves min(compress_bps, net_bps * ratio) raw bytes per second,
 * raw mode moves net_bps; compression is kept when it is not slower (it
 * also saves storage). An unknown figure (0) means "compress". The store
 * should re-evaluate every few parts and switch per part between the
 * trial's mode and SPOT_CODEC_RAW (the mode does not change how frames
 * decode). */
bool spot_codec_compress_pays(double compress_bps, double net_bps,
                              double ratio);

/* Byte grouping into k planes (k = 2 or 4) and its inverse, exposed for
 * tests and benchmarks. dst and src must not overlap. */
void spot_codec_group(void *dst, const void *src, size_t n, unsigned k);
void spot_codec_ungroup(void *dst, const void *src, size_t n, unsigned k);

#endif
