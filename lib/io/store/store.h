/* The checkpoint store: push a folder to S3 as one committed checkpoint,
 * restore one, list them, apply retention. Async on libuv; the S3 client
 * (s3.h) moves the bytes and the codec (codec.h) runs on the op's own
 * worker pool (pool.h), whose work callbacks touch no loop state.
 *
 * Layout (docs/design.md "Store layout", "Push and the commit
 * protocol"), under ROOT = PREFIX/JOB, ATTEMPT the push attempt's folder
 * (store_journal.h):
 *   ROOT/checkpoints/NAME/ATTEMPT/<relative path>.zst   one object per file
 *   ROOT/checkpoints/NAME/ATTEMPT/packs/pack-N.pack     small files, packed
 *   ROOT/checkpoints/NAME/MANIFEST.json         written last: the commit
 *   ROOT/LATEST                                 name of the newest commit
 *
 * Multi-node jobs (nranks > 1, see spot_store_config) add
 *   ROOT/checkpoints/NAME/rank-K/ATTEMPT/<relative path>.zst
 *   ROOT/checkpoints/NAME/ranks/rank-K.json     rank K's part is complete
 *
 * Commit rules: the manifest is PUT with If-None-Match: * once every
 * object is complete, so a name commits at most once; LATEST moves after
 * it. Readers trust nothing without a committed manifest.
 *
 * Memory: at most `workers` parts are being read/compressed (each with a
 * raw buffer and the codec's scratch) and at most `workers + limit`
 * compressed parts exist at once (limit: the transfers in flight now),
 * whatever the checkpoint size, all within cfg->memory.
 *
 * Callback contract: if a function taking a callback returns < 0 the
 * callback never runs; otherwise it runs exactly once, from the loop
 * (err -ECANCELED after spot_store_cancel()), never from inside the call
 * that cancels it, so a caller may cancel in the middle of its own state
 * changes. Results are borrowed for the duration of the callback. */
#ifndef SPOT_STORE_H
#define SPOT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "core/codec.h"
#include "io/s3.h"

/* codec.h's spot_xfer_sizes_check() is the rule; these name its bounds */
#define SPOT_STORE_PART_MIN SPOT_PART_MIN
#define SPOT_STORE_PART_MAX SPOT_PART_MAX
#define SPOT_STORE_PART_DEFAULT SPOT_PART_DEFAULT
/* cfg dedup's frame (bench/results/dedup.md): the smallest change a
 * checkpoint pays for, and ~100 bytes of manifest per frame. */
#define SPOT_STORE_DEDUP_FRAME_DEFAULT ((uint64_t)1 << 20)
/* cfg dedup needs parts of at least this (store_dedup.c) */
#define SPOT_STORE_DEDUP_PART_MIN ((uint64_t)8 << 20)
/* Transfers in flight (spot_store_config.parallel 0): adaptive (pace.h),
 * from SPOT_PACE_START (8) up to what the memory budget fits, at most
 * SPOT_STORE_PARALLEL_MAX. */
#define SPOT_STORE_PARALLEL_MAX 256
/* The default budget of part buffers: 1 GiB. Sized for a training node
 * (hundreds of GiB of RAM: under 1 %), half of the AWS CRT client's
 * smallest default; with 8 MiB parts and 8 workers it still fits ~100
 * parts in flight, ~6 GB/s at 60 MB/s per connection. */
#define SPOT_STORE_MEMORY_DEFAULT ((uint64_t)1 << 30)
#define SPOT_STORE_WORKERS_MAX 64
/* Where spotd's transfers start (spot_store_config.parallel_start): the
 * upload after a notice and the restore the trainer waits for at once
 * near what the WAN benchmark found best, periodic uploads gently so
 * training is not disturbed; all grow only while it pays. */
#define SPOT_STORE_PARALLEL_URGENT 32
#define SPOT_STORE_PARALLEL_GENTLE 4
/* push: files smaller than this are packed together (pack_threshold) */
#define SPOT_STORE_PACK_THRESHOLD_DEFAULT ((uint64_t)1 << 20)
#define SPOT_STORE_PACK_OFF UINT64_MAX /* pack_threshold: no packing */
/* The trainer's "this folder is complete" marker (README "Quick
 * start"): a file of that name at the top of a pushed folder is not
 * part of the checkpoint. */
#define SPOT_STORE_MARKER "SPOTD_COMPLETE"
/* The step the SPOT_STORE_MARKER file of folder dir states
 * (spot_marker_parse(), manifest.h): >= 0, or -1 when it states none (an
 * empty marker) or there is none; -EINVAL with one line in err when the
 * trainer's text is not understood. Reads at most SPOT_MARKER_MAX + 1
 * bytes, never through a symlink. A push records it in the manifest
 * ("step") unless spot_store_config.step is given. */
int64_t spot_store_marker_step(const char *dir, char *err, size_t errlen);

enum spot_store_compress {
  SPOT_STORE_COMPRESS_AUTO = 0, /* trial per file; raw when net is faster */
  SPOT_STORE_COMPRESS_ALWAYS,   /* trial per file; never switch to raw */
  SPOT_STORE_COMPRESS_NEVER,    /* raw frames, no filter */
};

struct spot_store_config {
  struct spot_s3 *s3;
  const char *bucket;
  const char *prefix; /* "" or "a/b": no leading or trailing '/' */
  const char *job;
  uint64_t part_size; /* 0 = SPOT_STORE_PART_DEFAULT */
  /* Transfers in flight: 0 = adaptive (pace.h: from parallel_start, more
   * while the throughput grows, fewer on throttling, within memory);
   * N = exactly N (within memory), no adaptation. */
  unsigned parallel;
  unsigned parallel_start; /* adaptive: the first limit, 0 = 8 */
  /* compressing threads, 0 = the cores this process may use (at most
   * SPOT_STORE_WORKERS_MAX); each is a thread of the op's own pool */
  unsigned workers;
  /* The budget of part buffers in bytes (0 = SPOT_STORE_MEMORY_DEFAULT):
   * workers x (raw part + codec scratch + compressed part) + a compressed
   * part per transfer in flight. What does not fit lowers the transfers
   * in flight, then the workers (a line says so). */
  uint64_t memory;
  /* Aggregate bytes/s to reach (0 = as fast as it goes): the first
   * window's per-connection rate sets the concurrency that reaches it,
   * and it grows no further once reached. */
  uint64_t target_rate;
  enum spot_store_compress compress;
  unsigned keep;                /* push: committed checkpoints kept, 0 = all */
  uint64_t stale_upload_age_ms; /* push: abort older uploads, 0 = 1 hour */
  /* push: a folder for the resume journal (store_journal.c), or NULL. A
   * push killed mid-way and started again with the same journal_dir,
   * name and unchanged files resumes its multipart uploads. */
  const char *journal_dir;
  /* push, multi-node (docs/slurm.md): this node's rank and the job's
   * node count (0 = 1). With nranks > 1 rank K uploads its files as
   * checkpoints/NAME/rank-K/<rel>.zst (manifest paths "rank-K/<rel>") and
   * writes its partial manifest to checkpoints/NAME/ranks/rank-K.json
   * (If-None-Match: *) instead of committing. Rank 0 then waits until
   * every rank's marker is listed, merges them into MANIFEST.json (the
   * commit), LATEST and retention; ranks > 0 wait until MANIFEST.json
   * exists. Either wait is bounded by rank_wait_ms (0 = 60 s). */
  unsigned rank, nranks;
  uint64_t rank_wait_ms;
  /* restore, multi-node: nranks > 0 (spotd) checks the commit's rank
   * count (its ranks/ markers; none = 1) against nranks and refuses
   * another one (-EXDEV) unless reshard; with nranks > 1 rank K restores
   * only rank-K/ and the files outside every rank-J/ folder. reshard
   * restores everything. spotctl leaves nranks 0: everything. */
  bool reshard;
  /* Minimum progress per transfer (one part or frame): a transfer not
   * done within SPOT_STORE_TRANSFER_GRACE_MS + its bytes / min_rate fails
   * the op with a line saying so, even if the server trickles just above
   * libcurl's low-speed limit. 0 = $SPOT_STORE_MIN_RATE (a test knob),
   * else SPOT_STORE_MIN_RATE_DEFAULT. In bytes per second, per transfer
   * up to 8 in flight; more share 8 times it. */
  uint64_t min_rate;
  /* restore: fail with a clear line when the whole restore (LATEST,
   * manifest, every frame, fsync, rename) is not done within this; 0 = no
   * limit. spotctl restore --restore-timeout SEC sets it. */
  uint64_t restore_timeout_ms;
  /* push: store the content of the file a symlink points to instead of
   * failing on a symlink that is not a relative link inside the folder
   * (spotctl push --follow-symlinks, spotd's follow-symlinks). */
  bool follow_symlinks;
  /* push: how the commit moves LATEST: always through
   * spot_latest_update() (latest.h), a compare-and-swap that never moves
   * LATEST to a checkpoint older by the trainer's step (step > 0, else
   * what the name states). lease_owner NULL (spotctl push): no order and
   * no fencing beyond that. Else (spotd) also with order (lease_epoch,
   * lease_seq), refused unless ROOT/LEASE is held by lease_owner at
   * lease_epoch. A refusal fails the push with -ESTALE ("LATEST not
   * moved") although its manifest is written. The manifest records
   * lease_epoch ("epoch"). */
  const char *lease_owner;
  uint64_t lease_epoch, lease_seq;
  int64_t step;
  /* push (spotd): when > 0, a checkpoint whose known step is below it is
   * no new commit: refused before its manifest with -EALREADY (spotd sets
   * the committed step + 1; a followed folder's step is only known once
   * its marker is there). */
  int64_t step_floor;
  /* A checkpoint the caller found damaged (spotd's restore fallback):
   * when LATEST names it, the step rule does not keep LATEST on it. */
  char latest_damaged[129]; /* SPOT_CKPT_NAME_MAX + 1 */
  /* push: non-empty files smaller than this (and than part_size) are
   * packed together into pack objects of up to SPOT_STORE_PACK_PARTS
   * parts, each file one zstd frame (lib/core/manifest.h "Packs");
   * restore fetches runs of them with one ranged GET of up to part_size.
   * 0 = SPOT_STORE_PACK_THRESHOLD_DEFAULT, SPOT_STORE_PACK_OFF = every
   * file its own object (the layout of older versions). */
  uint64_t pack_threshold;
  /* push: follow the folder while the trainer writes it (store_follow.c):
   * files of at least SPOT_STORE_FOLLOW_MIN that look closed (size and
   * mtime unchanged for SPOT_STORE_FOLLOW_SETTLE_MS) are uploaded before
   * the SPOT_STORE_MARKER file exists, and a file seen growing has its
   * full parts uploaded as it grows (its last part at the marker); the
   * rest waits for it. Once the
   * marker is there, a final walk re-reads every file uploaded early and
   * compares size, mtime and each frame's CRC32C: a changed file is
   * uploaded again, a deleted one dropped, then the commit as usual. No
   * marker, no commit: the push runs until cancelled (its uploads are
   * then aborted, its objects deleted). The journal (journal_dir) lists
   * the multipart uploads started, as for any push. */
  bool follow;
  /* push: unchanged bytes are not uploaded again (lib/io/store_dedup.c,
   * README "Store layout"): files are cut into frames of dedup_frame
   * bytes (0 = SPOT_STORE_DEDUP_FRAME_DEFAULT) with their SHA-256 in the
   * manifest, and a frame LATEST's manifest records is referenced there,
   * not sent. Single node, not with follow. */
  bool dedup;
  uint64_t dedup_frame;
  /* restore (spotd): the restored checkpoint will then replace the
   * folder of the same name under this one (its old local copy). Before
   * anything is fetched, the free space check counts that copy as free
   * when it is on the same file system, and removes it when the
   * checkpoint fits only without it. NULL: no such copy. */
  const char *replace_parent;
  /* restore: write the frames' whole 4 KiB blocks with O_DIRECT, around
   * the page cache (a file's last partial block, packed files and a file
   * system that refuses O_DIRECT go through it): no copy into the cache
   * and no cache to allocate, so less CPU, but the files are not in the
   * page cache afterwards. spotctl restore sets it unless --page-cache;
   * spotd leaves it off: the trainer it starts next reads the files. */
  bool direct_io;
};

#define SPOT_STORE_PACK_PARTS 8
#define SPOT_STORE_FOLLOW_MIN ((uint64_t)1 << 20)
#define SPOT_STORE_FOLLOW_SCAN_MS 200
#define SPOT_STORE_FOLLOW_SETTLE_MS 600

#define SPOT_STORE_MIN_RATE_DEFAULT ((uint64_t)64 << 10)
#define SPOT_STORE_TRANSFER_GRACE_MS 5000

enum spot_store_phase {
  SPOT_STORE_PHASE_PLAN = 0,
  SPOT_STORE_PHASE_TRANSFER,
  SPOT_STORE_PHASE_COMMIT,
  SPOT_STORE_PHASE_RETAIN,
  SPOT_STORE_PHASE_FINISH,
  SPOT_STORE_PHASE_LAST,
};

struct spot_store_progress {
  enum spot_store_phase phase;
  const char *name;
  uint64_t raw_done, raw_total; /* bytes of files read or written */
  uint64_t stored_done;         /* compressed bytes moved */
  uint64_t elapsed_ms;
  unsigned retries;
  unsigned parallel; /* transfers allowed in flight now (0: not started) */
  /* push following a folder (cfg follow): SPOT_STORE_MARKER not seen yet,
   * so raw_total is only what the trainer wrote so far */
  bool marker_pending;
};

struct spot_store_result {
  int err;             /* 0 or negative errno */
  const char *message; /* one line for users when err < 0, else "" */
  const char *name;    /* the checkpoint pushed or restored */
  uint64_t files;
  uint64_t raw_bytes;
  uint64_t stored_bytes;
  unsigned retries;
  uint64_t elapsed_ms;
  uint64_t commit_ms;     /* push: time from start to the manifest committed */
  unsigned deleted;       /* push: checkpoints removed by retention */
  unsigned aborted;       /* push: stale multipart uploads aborted */
  unsigned resumed_parts; /* push: parts a resumed push found stored */
  const char *warning; /* push: retention trouble (commit still fine), or "" */
  /* restore: the whole checkpoint's bytes and the rank count that
   * committed it (cfg nranks > 0); files, raw_bytes and stored_bytes above
   * are what this rank restored (multi-node: its rank-K/ and shared
   * files). push by rank 0 of a multi-node job: ckpt_files and the bytes
   * are the merged manifest's (every rank's), the fields above this
   * rank's own upload; 0 for any other push. */
  uint64_t ckpt_files;
  uint64_t ckpt_raw_bytes, ckpt_stored_bytes;
  unsigned ckpt_nranks;
  /* restore: err came from the local disk, not from the store: no
   * space, a quota, a read-only or unwritable folder, an I/O error while
   * writing, creating, syncing or renaming next to dir. The message then
   * names the folder, the bytes the checkpoint needs there and the bytes
   * free (need_bytes, free_bytes; 0 when unknown). A checkpoint that does
   * not fit fails this way before anything is fetched. */
  bool local;
  uint64_t need_bytes, free_bytes;
  int64_t created_ms; /* restore: when the checkpoint was committed (its
                         manifest's "created"), 0 if unknown */
  int64_t step;       /* restore: the trainer's step it holds (its manifest's
                         "step", else what its name states), -1 unknown */
};

struct spot_store_entry {
  const char *name;
  bool committed; /* false: objects without a manifest (leftovers) */
  bool latest;
  int64_t created_ms; /* committed only */
  int64_t step;       /* committed only: its manifest's "step", else what its
                         name states; -1 unknown */
  uint64_t files, raw_bytes, stored_bytes;
  const char *problem; /* committed but unreadable manifest, else NULL */
};

struct spot_store_list_result {
  int err;
  const char *message;
  const char *latest; /* "" when LATEST is absent */
  /* newest first: by step when every committed one has a known step,
   * else by when each was committed; then leftovers */
  const struct spot_store_entry *entries;
  size_t n;
};

struct spot_store_op;

typedef void (*spot_store_cb)(const struct spot_store_result *res, void *data);
typedef void (*spot_store_list_cb)(const struct spot_store_list_result *res,
                                   void *data);
typedef void (*spot_store_progress_cb)(const struct spot_store_progress *p,
                                       void *data);

/* Pushes every regular file under dir (but the top-level
 * SPOT_STORE_MARKER) as checkpoint name (NULL: the folder's base name).
 * A relative symlink that stays inside dir is stored as a link; any other
 * symlink fails the push naming it (nothing committed) unless
 * cfg->follow_symlinks stores the regular file it points to. Special files
 * (fifos, sockets, devices) are skipped with a warning. A file that changes
 * while it is read fails the push. */
int spot_store_push(uv_loop_t *loop, const struct spot_store_config *cfg,
                    const char *dir, const char *name,
                    spot_store_progress_cb progress, spot_store_cb cb,
                    void *data, struct spot_store_op **op);

/* Restores checkpoint name (NULL: the one LATEST names) into dir, which
 * must not exist or be an empty folder. Everything is written into a
 * temporary folder next to dir, checked, fsynced, then renamed into
 * place, so dir is either the whole checkpoint or untouched (the
 * temporary folder is removed after a failure). Once the manifest is
 * read, a checkpoint larger than the free space next to dir fails at once
 * (res->local), nothing fetched. */
int spot_store_restore(uv_loop_t *loop, const struct spot_store_config *cfg,
                       const char *name, const char *dir,
                       spot_store_progress_cb progress, spot_store_cb cb,
                       void *data, struct spot_store_op **op);

int spot_store_list(uv_loop_t *loop, const struct spot_store_config *cfg,
                    spot_store_list_cb cb, void *data,
                    struct spot_store_op **op);

/* Legal in every state until the callback has run. The callback still
 * runs once, with -ECANCELED, from the loop after this returns. */
void spot_store_cancel(struct spot_store_op *op);

/* A push following its folder (cfg follow): the caller saw the folder's
 * SPOT_STORE_MARKER appear (inotify), so the push looks now rather than
 * at its next scan. Nothing for any other op, or once the marker is seen. */
void spot_store_push_poke(struct spot_store_op *op);

/* "ROOT/checkpoints/NAME/" etc. into out (capped); pure helpers. */
int spot_store_key(const struct spot_store_config *cfg, const char *name,
                   const char *rel, struct spot_buf *out);
/* The same, malloc'd (NULL on ENOMEM): ROOT/REL when name is NULL. */
char *spot_store_key_dup(const struct spot_store_config *cfg, const char *name,
                         const char *rel);

const char *spot_store_phase_name(enum spot_store_phase p);

/* The mode restore gives a file stored with `mode`: the permission bits
 * only (setuid, setgid and sticky are never restored) and no group or
 * other write bit that `mask` (the umask) takes away. A manifest asking for
 * more is not refused; the extra bits are dropped. Pure. */
uint32_t spot_store_restore_mode(uint32_t mode, uint32_t mask);
/* The process umask, read without changing it (/proc/self/status; else
 * umask(2) twice). */
uint32_t spot_store_umask(void);

#endif
