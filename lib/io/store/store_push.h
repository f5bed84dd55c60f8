/* Push internals, shared by the files of the push job (internal to the
 * store):
 *   store_push.c       the op, walk, verify, commit, LATEST, abort: the
 *                      main state machine (enum push_state)
 *   store_push_xfer.c  the transfer pipeline (enum file_state per file,
 *                      enum slot_state per in-flight part)
 *   store_resume.c     the journal and resuming a killed push
 *                      (enum resume_state)
 *   store_ranks.c      the multi-node commit: rank markers, wait, merge
 *                      (enum ranks_state)
 *   store_retain.c     retention after a commit (enum retain_state)
 *   store_follow.c     cfg follow: files uploaded while the folder is
 *                      written, the final walk at the marker
 *                      (enum follow_state)
 * Each sub-job owns its state and setter; when it is done it hands back
 * to spot__push_advance(). */
#ifndef SPOT_STORE_PUSH_H
#define SPOT_STORE_PUSH_H

#include <sys/types.h>

#include "core/manifest.h"
#include "io/store/latest.h"
#include "io/store/store_internal.h"
#include "io/store/store_journal.h"

enum push_state {
  PUSH_WALK,         /* pool: list, stat and sample the files */
  PUSH_CHECK,        /* GET 1 byte of MANIFEST.json: never overwrite a commit */
  PUSH_DEDUP,        /* store_dedup.c (cfg dedup): LATEST's manifest, hashes */
  PUSH_RESUME,       /* store_resume.c: journal, then orphaned uploads */
  PUSH_XFER,         /* store_push_xfer.c: parts and files */
  PUSH_VERIFY,       /* pool: stat every file again */
  PUSH_RANKS,        /* store_ranks.c (nranks > 1) */
  PUSH_COMMIT,       /* PUT MANIFEST.json, If-None-Match: * */
  PUSH_COMMIT_CHECK, /* 412 after a retry: read it back, ours? */
  PUSH_LATEST,       /* PUT LATEST */
  PUSH_RETAIN,       /* store_retain.c */
  PUSH_ABORT,        /* after an error: abort our multipart uploads */
  PUSH_DONE,
  PUSH_STATE_LAST,
};

/* A file's upload. Single-part files go WAIT -> DONE; multipart ones
 * WAIT -> CREATING -> OPEN -> COMPLETING -> DONE, and OPEN -> ABORTING
 * after an error. */
enum file_state {
  FILE_WAIT,
  FILE_CREATING,
  FILE_OPEN, /* has an upload id */
  FILE_COMPLETING,
  FILE_DONE,
  FILE_ABORTING,
  FILE_STATE_LAST,
};

struct spot__pack;

/* store_dedup.c: a frame of a file pushed with cfg dedup. */
struct spot__dframe {
  uint64_t comp_len; /* encoded (with its padding) */
  uint32_t crc;
  int32_t base; /* the base frame it references (dedup.idx), -1: sent */
  bool has_sha;
  unsigned char sha[SPOT_MANIFEST_SHA256_LEN];
};

struct pfile {
  char *rel;
  char *abs;  /* what is read: the file, or what a followed link names */
  char *link; /* a symlink stored as one: its target (no object) */
  char *key;
  uint64_t size;
  uint32_t mode;
  int64_t mtime_ns;
  dev_t dev;
  ino_t ino;
  enum spot_filter filter;
  bool compress;
  enum spot_codec_mode cmode; /* what the trial chose (zstd or dense) */
  size_t nparts;
  size_t next_part; /* next part to dispatch */
  size_t parts_done;
  size_t midx; /* index in the manifest */
  enum file_state state;
  char *upload_id;
  struct spot_s3_part_info *etags;
  struct spot_s3_op *s3op; /* create or complete */
  /* store_pack.c: a packed file's pack (1 + the pack entry's index in
   * files), 0 if it has its own object; a pack entry's layout, else NULL */
  size_t pack;
  struct spot__pack *pk;
  /* follow (store_follow.c): a file taken while it grows. size and
   * nparts cover its full parts so far and grow; it completes only once
   * growing is false. open_ended (never changes once set, read by the
   * workers): every part is padded, the last one too. */
  bool growing, open_ended;
  /* store_dedup.c (cfg dedup): the file's ndf frames; own[0..nown) the
   * ones sent (indices in df), part p holds own[part_first[p] ..
   * part_first[p + 1]); NULL when the file is pushed as one frame per
   * part */
  struct spot__dframe *df;
  size_t ndf;
  size_t *own, nown;
  size_t *part_first;
};

enum dedup_state {
  DEDUP_LATEST,   /* GET LATEST */
  DEDUP_MANIFEST, /* GET its manifest: the base */
  DEDUP_HEAD,     /* HEAD the objects its hashed frames are in */
  DEDUP_HASH,     /* pool: hash every frame, look it up in the base */
  DEDUP_DONE,
  DEDUP_STATE_LAST,
};

/* A base frame with a SHA-256: files[file].frames[frame] of the base. */
struct spot__dedup_ent {
  unsigned char sha[SPOT_MANIFEST_SHA256_LEN];
  uint32_t file, frame;
};

/* Hashing work: frames [first, end) of files[file]. */
struct spot__dedup_unit {
  size_t file, first, end;
};

struct push_op;

struct spot__dedup_job {
  uv_work_t work;
  struct push_op *op;
  int err; /* the worker's */
  size_t file;
};

struct dedup {
  enum dedup_state state;
  struct spot_manifest *base;  /* LATEST's manifest, NULL: none */
  struct spot__dedup_ent *idx; /* sorted by sha */
  size_t nidx;
  struct spot__dedup_unit *units;
  size_t nunits;
  _Atomic size_t next_unit; /* the workers' cursor */
  struct spot__dedup_job *jobs;
  unsigned jobs_left;
  uint64_t ref_raw; /* bytes referenced, not sent */
  /* HEAD: per base object (files, then refs), OBJ_*; the next to HEAD */
  unsigned char *obj;
  size_t head_idx;
};

enum { OBJ_UNUSED, OBJ_USED, OBJ_OK, OBJ_BAD };

/* A part's slot (struct spot__store_slot in store_internal.h). */
enum slot_state {
  SLOT_FREE = 0,
  SLOT_ENCODING,
  SLOT_READY,
  SLOT_SENDING,
  SLOT_STATE_LAST,
};

enum resume_state {
  RESUME_JOURNAL,      /* list parts / abort each journaled upload */
  RESUME_ORPHANS_LIST, /* list uploads of this name */
  RESUME_ORPHANS_ABORT,
  RESUME_DONE,
  RESUME_STATE_LAST,
};

struct resume {
  enum resume_state state;
  char *journal_path;
  uint64_t journal_saved_ms;
  struct spot__journal *journal;
  size_t idx;
  unsigned resumed_parts;
  char **orphan_keys, **orphan_ids; /* uploads of this name not resumed */
  size_t norphans, orphan_idx;
  bool attempt_from_journal; /* op->attempt is a journaled push's */
};

enum ranks_state {
  RANKS_IDLE,
  RANKS_MARKER,       /* PUT ranks/rank-K.json, If-None-Match: * */
  RANKS_MARKER_CHECK, /* 412 after a retry: read it back */
  RANKS_WAIT,         /* rank 0: list ranks/ */
  RANKS_SLEEP,        /* between two polls (wait_timer armed) */
  RANKS_READ,         /* rank 0: GET and merge the markers */
  RANKS_MERGED,       /* rank 0: op->manifest is the merged one */
  RANKS_COMMIT_WAIT,  /* rank > 0: GET 1 byte of MANIFEST.json */
  RANKS_COMMITTED,    /* rank > 0: rank 0 committed */
  RANKS_FAILED,
  RANKS_STATE_LAST,
};

struct ranks {
  enum ranks_state state;
  enum ranks_state poll; /* what RANKS_SLEEP goes back to */
  uv_timer_t wait_timer; /* the 500 ms poll; initialised iff nranks > 1 */
  uint64_t wait_start_ms;
  bool *seen;   /* WAIT: markers listed this round */
  char *token;  /* WAIT: next list page */
  unsigned idx; /* READ: next marker to read */
  struct spot_manifest *merged;
  uint64_t own_stored; /* MERGED: this rank's part stored this much */
};

enum retain_state {
  RETAIN_LIST,          /* list checkpoints/ (pages) */
  RETAIN_READ,          /* GET each manifest */
  RETAIN_READ_TOMB,     /* no manifest: GET its RETIRED marker */
  RETAIN_TOMB_PUT,      /* PUT RETIRED before the manifest goes */
  RETAIN_DEL_MANIFEST,  /* delete the oldest's manifest first */
  RETAIN_DEL_LIST,      /* list what is left of it */
  RETAIN_DEL_PAGE,      /* delete that page, then list again */
  RETAIN_UPLOADS_LIST,  /* list multipart uploads */
  RETAIN_UPLOADS_ABORT, /* abort the stale ones */
  RETAIN_DONE,
  RETAIN_STATE_LAST,
};

struct retain_entry {
  char *name;
  int64_t created_ms;
  int64_t step; /* the manifest's, else the name's; -1 unknown */
  /* the objects its frames reference (full keys), manifest.h */
  char **refs;
  size_t nrefs;
  bool retired; /* no manifest, a RETIRED marker: objects left to collect */
};

struct retain {
  enum retain_state state;
  char **names;
  size_t nnames, names_alloc;
  char *token;
  struct retain_entry *entries;
  size_t nentries, read_idx, del_idx;
  bool read_tomb; /* READ: the manifest was 404, GET RETIRED next */
  bool tomb_done; /* DEL_MANIFEST: RETIRED is written for del_idx */
  /* the objects kept checkpoints reference, sorted: never deleted */
  char **kept_refs;
  size_t nkept_refs;
  char **del_keys;
  size_t ndel_keys;
  struct spot_s3_upload_info *uploads;
  size_t nuploads, upload_idx;
};

struct push_op {
  struct spot__store_op b; /* first: the op handle is its address */
  enum push_state state;
  char *dir;
  char warning[512];
  char walk_warn[512];

  struct pfile *files;
  size_t nfiles;
  size_t next_file; /* dispatch cursor */
  size_t npacks;    /* pack entries (store_pack.c), the last of files */

  struct spot__store_pipe pipe;
  unsigned active_xfers;

  /* this attempt's key folder (store_journal.h), "" for the old layout
   * when resuming an older journal */
  char attempt[SPOT__STORE_ATTEMPT_LEN + 1];
  /* after a failure: delete this attempt's completed objects (only when
   * nothing of ours can be committed: before the commit, or it said 412) */
  bool del_own;
  size_t del_idx;
  const char *del_keys[1000];
  struct spot_manifest *manifest;
  char *manifest_json;
  struct spot_s3_op *s3op; /* the one sequential op (check, commit, ...) */
  struct spot_latest_op *latest_op; /* a fenced LATEST update */
  bool fenced; /* the lease was read, ours, just before the commit */
  /* an earlier run of this push (same journaled attempt) wrote the
   * manifest but not LATEST: publish it, at most past this epoch */
  bool publish;
  uint64_t publish_epoch;
  struct spot_buf body;

  /* throughput figures for the raw/compress choice */
  uint64_t enc_bytes, enc_ns;
  uint64_t net_bytes, net_ms_start;
  uint64_t commit_ms;
  unsigned deleted, aborted;

  struct resume resume;
  struct dedup dedup;
  struct ranks ranks;
  struct retain retain;
  struct follow *follow; /* store_follow.c, cfg follow only */
};

/* store_push.c */
void spot__push_advance(struct push_op *op);
/* The walk (pool): appends the folder's files to op->files, with their
 * filters and part counts; errors go to op->b.err/msg. */
void spot__push_walk(struct push_op *op);
/* After the walk (loop): totals, manifest size estimate. 0 or < 0 (the
 * op failed with a message). */
int spot__push_walked(struct push_op *op);
/* Fills f's paths (copied) and what st says; 0 or -ENOMEM (nothing
 * allocated then). */
int spot__push_pfile_init(struct pfile *f, const char *rel, const char *abs,
                          const struct stat *st);
void spot__push_pfile_fini(struct pfile *f);
/* Whether a sample is text: such a file is stored unfiltered. */
bool spot__push_looks_like_text(const unsigned char *p, size_t n);
/* The push's and a file's state: only these change them (fsm.h). */
void spot__push_set_state_at(struct push_op *op, enum push_state s,
                             const char *file, int line);
#define spot__push_set_state(op, s)                                            \
  spot__push_set_state_at((op), (s), __FILE__, __LINE__)
/* The commit: PUT op->manifest_json as MANIFEST.json, If-None-Match. */
void spot__push_commit(struct push_op *op);
/* GETs key (malloc'd, freed here) into op->body; true when started. */
bool spot__push_read_back(struct push_op *op, char *key, spot_s3_cb cb);
/* Whether op->body holds exactly op->manifest_json. */
bool spot__push_body_is_ours(const struct push_op *op);

/* store_push_xfer.c */
/* pread of exactly n bytes at off: 0, -ESTALE (the file shrank) or
 * negative errno. */
int spot__push_read_full(int fd, void *buf, size_t n, uint64_t off);
int spot__push_xfer_setup(struct push_op *op);
/* A new op->manifest with every file of op->files (keys, entries). */
int spot__push_manifest_build(struct push_op *op);
/* The trainer's step of the checkpoint pushed: cfg step when > 0, else
 * what its marker states, else what its name states; -1 unknown.
 * Recorded in the manifest, and what LATEST's step rule compares. */
int64_t spot__push_step(const struct push_op *op);
/* Adds op->files[i] to op->manifest (its key and entry). */
int spot__push_add_to_manifest(struct push_op *op, struct pfile *f);
void spot__push_xfer_start(struct push_op *op);
void spot__push_pump(struct push_op *op);
void spot__push_file_set_state_at(struct push_op *op, struct pfile *f,
                                  enum file_state s, const char *file,
                                  int line);
#define spot__push_file_set_state(op, f, s)                                    \
  spot__push_file_set_state_at((op), (f), (s), __FILE__, __LINE__)
void spot__push_xfer_cancel(struct push_op *op);
bool spot__push_files_done(const struct push_op *op);

/* store_pack.c: small files packed together. After the walk
 * the pack entries are appended to op->files (f->pk set): each is uploaded
 * like a file whose parts are runs of whole small files, each file one
 * zstd frame; its members (f->pack set) have no object and no part of
 * their own. */
/* Whether f is packed (the threshold of the config). Pure. */
/* Files below this are packed (0: packing is off); read-only, any thread. */
uint64_t spot__pack_threshold(const struct push_op *op);
bool spot__pack_small(const struct push_op *op, const struct pfile *f);
/* Appends the pack entries and adds the packs to op->manifest. */
int spot__pack_plan(struct push_op *op);
/* Adds packed file f to the manifest. */
int spot__pack_add_member(struct push_op *op, struct pfile *f);
/* Raw bytes of part `part` of pack entry f. */
uint64_t spot__pack_part_raw(const struct push_op *op, const struct pfile *f,
                             size_t part);
/* Worker: reads and encodes the files of slot s's part of a pack. */
void spot__pack_encode(struct push_op *op, struct spot__store_slot *s);
/* Loop: the part of slot s is encoded; records its files' frames. */
int spot__pack_encoded(struct push_op *op, struct spot__store_slot *s);
/* Every pack is stored: their sizes and the files' offsets into the
 * manifest. */
int spot__pack_finish(struct push_op *op);
void spot__pack_free(struct pfile *f);
/* store_push_xfer.c: pad_part() for packs' parts. */
int spot__push_pad(void *comp, size_t cap, size_t *len);

/* store_resume.c */
uint64_t spot__dedup_frame_size(const struct push_op *op);
bool spot__dedup_on(const struct push_op *op);
bool spot__dedup_wanted(const struct push_op *op, const struct pfile *f);
void spot__dedup_start(struct push_op *op);
bool spot__dedup_done(const struct push_op *op);
int spot__dedup_plan(struct push_op *op);
uint64_t spot__dedup_part_raw(const struct push_op *op, const struct pfile *f,
                              size_t part);
int spot__dedup_add_refs(struct push_op *op, struct pfile *f);
void spot__dedup_encode(struct push_op *op, struct spot__store_slot *s,
                        struct pfile *f);
int spot__dedup_encoded(struct push_op *op, struct spot__store_slot *s);
void spot__dedup_fini(struct push_op *op);
void spot__dedup_pfile_fini(struct pfile *f);

int spot__resume_init(struct push_op *op);
void spot__resume_start(struct push_op *op);
void spot__resume_fini(struct push_op *op);
void spot__resume_save(struct push_op *op, bool force);
void spot__resume_remove(struct push_op *op);

/* store_ranks.c */
int spot__ranks_init(struct push_op *op);
void spot__ranks_start(struct push_op *op);
void spot__ranks_cancel(struct push_op *op);
void spot__ranks_close(struct push_op *op);
void spot__ranks_fini(struct push_op *op);

/* store_follow.c (cfg follow) */
struct follow;
int spot__follow_init(struct push_op *op);
/* Called by spot__push_advance() in PUSH_XFER once every file is done
 * and nothing is in flight: true while the follow holds the push (no
 * marker yet, or the final walk runs), false once the final file list is
 * in place and the push may verify and commit. */
bool spot__follow_hold(struct push_op *op);
void spot__follow_cancel(struct push_op *op);
/* Whether the final walk runs on the pool: op->files is then the walk's. */
bool spot__follow_walking(const struct push_op *op);
/* The folder's marker may be there: scan now, not at the next period. */
void spot__follow_poke(struct push_op *op);
void spot__follow_close(struct push_op *op);
void spot__follow_fini(struct push_op *op);

/* store_retain.c */
void spot__retain_start(struct push_op *op);
void spot__retain_fini(struct push_op *op);

#endif
