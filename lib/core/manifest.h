/* The checkpoint manifest (MANIFEST.json): what a committed checkpoint
 * holds and how each file is stored. Pure: build it, serialize it, parse it
 * back; no I/O. Manifests read from the store are untrusted, so parsing
 * validates everything the restore relies on (safe relative paths, frames
 * that tile each file exactly, bounded sizes and counts) and reports the
 * first problem naming the field, e.g. "files[2].path: '..' component".
 *
 * JSON (version 1; unknown keys are rejected, integers are JSON integers):
 *
 *   { "format": "spotd-checkpoint", "version": 1,
 *     "name": "step-1200", "job": "llama-7b",
 *     "created": "2026-12-02T10:13:50Z", "epoch": 3,
 *     "totals": { "files": 2, "raw_bytes": 8388613, "stored_bytes": 6944102 },
 *     "files": [
 *       { "path": "model/weights.bin", "size": 8388613, "mode": 420,
 *         "mtime_ns": 1796206430123456789, "filter": "bytegroup4",
 *         "key": "model/weights.bin.zst",
 *         "frames": [ { "raw_off": 0, "raw_len": 8388608,
 *                       "comp_off": 0, "comp_len": 6944080,
 *                       "crc32c": 3817410051 },
 *                     { "raw_off": 8388608, "raw_len": 5,
 *                       "comp_off": 6944080, "comp_len": 22,
 *                       "crc32c": 1205127438 } ] },
 *       { "path": "model/EMPTY", "size": 0, "mode": 420, "mtime_ns": 0,
 *         "filter": "none", "frames": [] } ] }
 *
 * "epoch" (optional, >= 0; absent = 0) is the job lease epoch of the
 * spotd that committed it (lib/io/lease.h); older manifests lack it.
 * "step" (optional, 0..2^53; absent = unknown) is the trainer's step the
 * checkpoint holds, as its marker stated it (spot_marker_parse()) or its
 * name does (spot_ckpt_name_step()): what orders checkpoints by training
 * progress whatever their names (latest.h). Older manifests lack it.
 *
 * Per file: "path" relative to the checkpoint folder; "mode" the permission
 * bits (<= 07777; restore drops setuid/setgid/sticky, store.h);
 * "mtime_ns" >= SPOT_MANIFEST_MTIME_MIN_NS; "filter" a spot_filter_name();
 * "key" the object key relative to PREFIX/JOB/checkpoints/NAME/
 * ("ATTEMPT/<path>.zst", README "Store layout"; "<path>.zst" before
 * attempts); the frames, one per part, tile [0, size) and the object [0,
 * stored) with no gap or overlap, and "crc32c" is the CRC32C of the frame's raw
 * bytes (codec.h says why raw). An EMPTY file has no frame and NO object: no
 * "key", nothing is uploaded (a PUT per empty file is a wasted round trip,
 * and an empty object is not a zstd stream anyway); restore just creates
 * it. A non-empty file always has a key and >= 1 frame.
 * ("totals" are checked against the sums of the files when parsing.)
 *
 * A symlink is an entry with "link": its target, size 0, no key, no
 * frames, filter "none". The target is relative and stays inside the
 * checkpoint folder: spot_manifest_link_valid(). Restore makes it a
 * symlink again (after every file is written).
 *
 * Paths and keys: UTF-8 (JSON strings are), 1..SPOT_MANIFEST_PATH_MAX
 * bytes, no NUL, no leading '/', no empty, "." or ".." component, each
 * component <= 255 bytes; no two files share a path or a key, no file's
 * path is a folder of another's ("a" and "a/b"), no key is
 * "MANIFEST.json". Names and jobs satisfy spot_ckpt_name_valid().
 *
 * Packs (README "Store layout"): small files may be stored together in
 * pack objects instead of one object each. The manifest then lists the
 * packs before "files" (a manifest without packs has no "packs" key at
 * all, and is byte-identical to what older builds wrote):
 *
 *   "packs": [ { "key": "attempt-0123456789abcdef/packs/pack-000001.pack",
 *                "stored": 6291456 } ],
 *
 * and a packed file has "pack" (the key of its pack) instead of "key":
 *
 *   { "path": "config.json", "size": 612, "mode": 420, "mtime_ns": ...,
 *     "filter": "none",
 *     "pack": "attempt-0123456789abcdef/packs/pack-000001.pack",
 *     "frames": [ { "raw_off": 0, "raw_len": 612, "comp_off": 81920,
 *                   "comp_len": 301, "crc32c": 2055291110 } ] }
 *
 * Its frames' comp_off are offsets in the pack object: they start
 * anywhere in it but are contiguous (each frame starts where the previous
 * one ends), the file's stored bytes (<= SPOT_CODEC_PART_MAX) end within
 * the pack's "stored", and no two files' ranges in one pack overlap
 * (gaps between them are allowed: push pads a pack's parts with zstd
 * skippable frames, see lib/io/store/store_push_xfer.c, so a pack is a valid
 * zstd stream of its files' bytes). Pack keys follow the rules of keys
 * and share their namespace (no pack key is a file's key or another
 * pack's); the store names them ".pack", never "<path>.zst". A packed file
 * is never empty and never a link; at most SPOT_MANIFEST_PACKS_MAX packs.
 *
 * References (version 2, README "Store layout", docs/design.md "Store
 * layout"): a frame may carry "sha256" (lower-case hex of the SHA-256 of
 * its raw bytes: the identity of its content; CRC32C only checks a
 * transfer) and may be a reference to a frame an earlier checkpoint of
 * the job stored, instead of bytes in the file's own object:
 *
 *   "refs": [ { "name": "step-100",
 *               "key": "attempt-0123456789abcdef/model.pt.zst",
 *               "stored": 104857600 } ],
 *   ... "frames": [ { "raw_off": 0, "raw_len": 1048576, "ref": 0,
 *                     "comp_off": 3145728, "comp_len": 901234,
 *                     "crc32c": 12345, "sha256": "9f86...0f00" }, ... ]
 *
 * "ref" is an index in "refs"; comp_off/comp_len are then a range of that
 * object (within its "stored"), and the frame is not part of the file's
 * own object: the file's other frames tile the file's own object [0,
 * stored) in file order, and together with the references all frames
 * tile [0, size). A file whose frames are all references has no "key".
 * A ref's name is a valid checkpoint name other than this manifest's,
 * its key follows the rules of keys; at most SPOT_MANIFEST_REFS_MAX.
 * Packed files never reference. "totals" then also has "ref_bytes": the
 * raw bytes of the referenced frames. A manifest with any of these says
 * "version": 2; one without is version 1, byte-identical to older ones.
 *
 * Not thread-safe: the store builds the manifest on its loop thread. */
#ifndef SPOT_MANIFEST_H
#define SPOT_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/codec.h"

#define SPOT_MANIFEST_VERSION 1
/* What a manifest that references earlier checkpoints' frames, or records
 * frame hashes, says (see "References" above); this build reads 1 and 2. */
#define SPOT_MANIFEST_VERSION_REFS 2
#define SPOT_MANIFEST_FORMAT "spotd-checkpoint"
#define SPOT_MANIFEST_NAME "MANIFEST.json"
/* Bounds applied when building and when parsing. */
/* What the restore can open: PATH_MAX counts the NUL, NAME_MAX does not. */
#define SPOT_MANIFEST_PATH_MAX 4095
#define SPOT_MANIFEST_COMPONENT_MAX 255
/* mtime_ns that futimens() takes on every file system we restore to:
 * 1901-12-13 (a 32-bit time_t's minimum) .. INT64_MAX (2262). */
#define SPOT_MANIFEST_MTIME_MIN_NS (-2147483648LL * 1000000000LL)
/* The documented limits of a checkpoint (README "What the store refuses
 * or never does"):
 * files, and the manifest's size. Within them restore needs at most
 * ~2.2 x the manifest's size for it (the text, then the parsed entries;
 * each element of "files" is parsed on its own). */
#define SPOT_MANIFEST_FILES_MAX 300000
/* per file: frames of a file pushed with dedup (lib/io/store/store_dedup.c) are
 * smaller than its parts, so more than S3's part limit */
#define SPOT_MANIFEST_FRAMES_MAX 1048576
/* S3's part limit: parts per file */
#define SPOT_MANIFEST_PARTS_MAX 10000
#define SPOT_MANIFEST_TOTAL_FRAMES_MAX 4000000
#define SPOT_MANIFEST_PACKS_MAX 65536
#define SPOT_MANIFEST_REFS_MAX 65536
#define SPOT_MANIFEST_SHA256_LEN 32
#define SPOT_MANIFEST_JSON_MAX ((size_t)40 << 20)
#define SPOT_CKPT_NAME_MAX 128

struct spot_manifest_frame {
  uint64_t raw_off;  /* offset in the file */
  uint64_t raw_len;  /* 1..SPOT_CODEC_PART_MAX */
  uint64_t comp_off; /* offset in the object */
  uint64_t comp_len; /* 1..spot_codec_bound(raw_len) */
  uint32_t crc32c;   /* of the raw bytes */
  bool set;          /* builder only: spot_manifest_set_frame() was called */
  bool has_sha;      /* "sha256" is recorded */
  /* 1 + the index in spot_manifest.refs of the object that holds this
   * frame (an earlier checkpoint's; comp_off is an offset in it), 0: the
   * file's own object (or pack) */
  uint32_t ref;
  unsigned char sha256[SPOT_MANIFEST_SHA256_LEN]; /* of the raw bytes */
};

struct spot_manifest_file {
  char *path;
  char *key;  /* NULL for an empty file and a symlink */
  char *link; /* a symlink's target, else NULL */
  uint64_t size;
  uint64_t stored; /* sum of comp_len */
  uint32_t mode;   /* st_mode & 07777 */
  int64_t mtime_ns;
  enum spot_filter filter;
  struct spot_manifest_frame *frames;
  size_t nframes;
  size_t frames_alloc;
  /* packed: 1 + the index of its pack in spot_manifest.packs, else 0;
   * pack_off is where its first frame starts in the pack */
  size_t pack;
  uint64_t pack_off;
};

/* A pack object of small files (see above). */
struct spot_manifest_pack {
  char *key;       /* relative to the checkpoint, like a file's key */
  uint64_t stored; /* the object's size */
};

/* An object of an earlier checkpoint of the same job that frames
 * reference: ROOT/checkpoints/<name>/<key>. */
struct spot_manifest_ref {
  char *name;      /* the checkpoint that stored it (never this one) */
  char *key;       /* relative to that checkpoint, like a file's key */
  uint64_t stored; /* the object's size */
};

struct spot_manifest {
  unsigned version;
  char *name;
  char *job;
  int64_t created_ms; /* 1970..9999, serialized with second precision */
  uint64_t epoch;     /* optional "epoch": the writer's lease epoch, 0 none */
  int64_t step;       /* optional "step": the trainer's step, -1 unknown */
  uint64_t total_raw;
  uint64_t total_stored;
  struct spot_manifest_file *files; /* nfiles entries, in insertion order */
  size_t nfiles;
  size_t files_alloc;
  size_t total_frames;
  struct spot_manifest_pack *packs; /* npacks entries, "packs" */
  size_t npacks;
  size_t packs_alloc;
  struct spot_manifest_ref *refs; /* nrefs entries, "refs" */
  size_t nrefs;
  size_t refs_alloc;
  uint64_t total_ref_raw; /* raw bytes of the frames that are references */
};

/* Whether name is a valid checkpoint name (also used for job ids): 1..128
 * bytes of printable ASCII other than space, no '/', no '\\', no "..",
 * and no leading '.' (spotd's own folders next to checkpoints start with
 * one: .spotd-resume, .spotd-journal, the restore's temporary folder).
 * The one check push, list, restore and the manifest parser share. */
bool spot_ckpt_name_valid(const char *name);
/* The trainer's step a checkpoint name states, or -1 when it states none:
 * the decimal number after the last "step" in the name (any case, then an
 * optional '-', '_', '=' or '.'), as in step-000042, global_step1200 or
 * ckpt_step=5; else the whole name when it is a number ("1200"). At most
 * 2^53. Only a stated step orders checkpoints by training progress (see
 * latest.h); other names are ordered by commit alone. */
int64_t spot_ckpt_name_step(const char *name);
/* The largest step a name, a marker or a manifest may state. */
#define SPOT_CKPT_STEP_MAX ((int64_t)1 << 53)

/* The trainer's marker file, SPOTD_COMPLETE (README "Trainer contract"):
 * empty, as older trainers write it (step unknown), or text lines
 * "key=value" of which spotd reads "step" (the training step the
 * checkpoint holds, decimal, 0..SPOT_CKPT_STEP_MAX) and skips the others;
 * blank lines and lines starting with '#' are skipped. At most
 * SPOT_MARKER_MAX bytes. The file is written by the trainer, so it is
 * untrusted: returns 0 with *step set (-1: none stated), or -EINVAL with
 * one line in err (a line without '=', a bad or repeated step, a NUL, too
 * long) and *step untouched. */
#define SPOT_MARKER_MAX 4096
#define SPOT_MARKER_STEP_KEY "step"
int spot_marker_parse(const char *buf, size_t len, int64_t *step, char *err,
                      size_t errlen);

/* The rules above in words, for messages. */
#define SPOT_CKPT_NAME_RULES                                                   \
  "1-128 printable ASCII characters, no space, '/', '\\' or '..', not "        \
  "starting with '.'"
/* Whether path is a valid relative path by the rules above. */
bool spot_manifest_path_valid(const char *path);

/* Whether a symlink at path (valid by the rules above) pointing at target
 * stays inside the checkpoint folder: target is relative, 1..PATH_MAX-1
 * bytes, its components are names, except leading ".." components (no
 * more than path has folders); no "." or empty component, so no link is
 * followed by "..", which would leave where the names say. */
bool spot_manifest_link_valid(const char *path, const char *target);

/* An empty manifest. Returns 0, -EINVAL (invalid name or job, created_ms
 * outside 1970..9999) or -ENOMEM. */
int spot_manifest_new(const char *name, const char *job, int64_t created_ms,
                      struct spot_manifest **out);
void spot_manifest_free(struct spot_manifest *m);

/* Adds a file; *out_index (may be NULL) identifies it for
 * spot_manifest_set_frame(). key is NULL iff size is 0. Returns 0, -EINVAL
 * (invalid path or key, not UTF-8, mode > 07777, bad filter, key/size
 * mismatch), -E2BIG (too many files) or -ENOMEM. Duplicates and "a" vs
 * "a/b" conflicts are found by spot_manifest_to_json() (hash sets, once). */
int spot_manifest_add_file(struct spot_manifest *m, const char *path,
                           const char *key, uint64_t size, uint32_t mode,
                           int64_t mtime_ns, enum spot_filter filter,
                           size_t *out_index);

/* Adds a symlink entry (see spot_manifest_link_valid()). Returns 0,
 * -EINVAL, -E2BIG or -ENOMEM like spot_manifest_add_file(). */
int spot_manifest_add_link(struct spot_manifest *m, const char *path,
                           const char *target, int64_t mtime_ns,
                           size_t *out_index);

/* Adds a pack object (stored: its size, may be set later with
 * spot_manifest_set_pack_stored()); *out_index (may be NULL) is its index
 * for spot_manifest_add_packed(). Returns 0, -EINVAL (key invalid by the
 * rules of keys), -E2BIG (more than SPOT_MANIFEST_PACKS_MAX) or -ENOMEM.
 * Duplicate keys are found by spot_manifest_to_json(). */
int spot_manifest_add_pack(struct spot_manifest *m, const char *key,
                           uint64_t stored, size_t *out_index);
/* Sets pack index's stored size. 0 or -EINVAL (bad index). */
int spot_manifest_set_pack_stored(struct spot_manifest *m, size_t index,
                                  uint64_t stored);
/* Adds a non-empty file stored in pack (an index of
 * spot_manifest_add_pack()) at pack_off (may be set later with
 * spot_manifest_set_pack_off()); its frames are set as for any file and
 * laid out contiguously from pack_off. Returns what
 * spot_manifest_add_file() does (-EINVAL also for size 0 or a bad pack). */
int spot_manifest_add_packed(struct spot_manifest *m, const char *path,
                             size_t pack, uint64_t pack_off, uint64_t size,
                             uint32_t mode, int64_t mtime_ns,
                             enum spot_filter filter, size_t *out_index);
/* Sets where packed file index starts in its pack. 0 or -EINVAL (bad
 * index, not a packed file). */
int spot_manifest_set_pack_off(struct spot_manifest *m, size_t index,
                               uint64_t pack_off);
/* The key of the object file f's bytes are in: its own or its pack's. */
const char *spot_manifest_object_key(const struct spot_manifest *m,
                                     const struct spot_manifest_file *f);

/* Records frame number part (0-based) of file index: parts may be set in
 * any order (as workers finish); offsets are computed when serializing.
 * Returns 0, -EINVAL (bad index, zero length, raw_len > SPOT_CODEC_PART_MAX,
 * comp_len > spot_codec_bound(raw_len), file is empty), -E2BIG (part >=
 * SPOT_MANIFEST_FRAMES_MAX or too many frames in total) or -ENOMEM. */
int spot_manifest_set_frame(struct spot_manifest *m, size_t index, size_t part,
                            uint64_t raw_len, uint64_t comp_len,
                            uint32_t crc32c);

/* Records the SHA-256 of frame part of file index (set it after
 * spot_manifest_set_frame()). 0 or -EINVAL (bad index or frame). */
int spot_manifest_set_frame_sha(struct spot_manifest *m, size_t index,
                                size_t part, const unsigned char *sha256);

/* Adds (or finds: same name and key) a referenced object of checkpoint
 * name (not this one); *out_index is its index for
 * spot_manifest_set_ref_frame(). Returns 0, -EINVAL (invalid name or
 * key, stored 0), -E2BIG (more than SPOT_MANIFEST_REFS_MAX) or -ENOMEM.
 * Linear in the refs so far. */
int spot_manifest_add_ref(struct spot_manifest *m, const char *name,
                          const char *key, uint64_t stored, size_t *out_index);

/* Records frame part of file index as a reference: its raw_len bytes are
 * the comp_len bytes at comp_off of ref (an index of
 * spot_manifest_add_ref()), crc32c and sha256 as recorded for it there.
 * Returns what spot_manifest_set_frame() does (-EINVAL also for a bad ref
 * or a packed file). */
int spot_manifest_set_ref_frame(struct spot_manifest *m, size_t index,
                                size_t part, size_t ref, uint64_t comp_off,
                                uint64_t raw_len, uint64_t comp_len,
                                uint32_t crc32c, const unsigned char *sha256);

/* Drops file index's key: all its frames are references, it has no
 * object of its own. 0 or -EINVAL. */
int spot_manifest_clear_key(struct spot_manifest *m, size_t index);

/* The checkpoint name and key of the object frame fr of file f is in:
 * a reference's, else this checkpoint's (NULL name) own or pack key. */
const char *spot_manifest_frame_key(const struct spot_manifest *m,
                                    const struct spot_manifest_file *f,
                                    const struct spot_manifest_frame *fr,
                                    const char **name);

/* Computes offsets and totals, validates the whole manifest by the parse
 * rules, and returns a malloc'd NUL-terminated JSON text in *out. Returns
 * 0, -EINVAL (then err says why, e.g. "files[0].frames[2]: missing") or
 * -ENOMEM. err may be NULL. */
int spot_manifest_to_json(struct spot_manifest *m, char **out, char *err,
                          size_t errlen);

/* Parses and validates len bytes of untrusted JSON (no NUL needed). On
 * success *out is a new manifest with offsets and totals filled in.
 * Returns 0, -EBADMSG (not valid JSON, wrong type, out of range, rule
 * broken; err names the field), -E2BIG (len > SPOT_MANIFEST_JSON_MAX),
 * -EPROTONOSUPPORT (unknown version) or -ENOMEM. */
int spot_manifest_parse(const char *json, size_t len,
                        struct spot_manifest **out, char *err, size_t errlen);

/* The file with this path, or NULL. Linear. */
const struct spot_manifest_file *
spot_manifest_find(const struct spot_manifest *m, const char *path);
/* The largest raw_len of any frame (0 when there is none): the part_max
 * a restore needs for spot_codec_new(). */
uint64_t spot_manifest_max_frame_raw(const struct spot_manifest *m);

#endif
