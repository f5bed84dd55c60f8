/* The push journal (store_journal.c): the multipart uploads a push has in
 * progress, so a killed push resumes them. Internal to the store. */
#ifndef SPOT_STORE_JOURNAL_H
#define SPOT_STORE_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct spot__journal_part {
  int n; /* S3 part number, 1-based */
  uint64_t raw_len, comp_len;
  uint32_t crc32c;
  char etag[128];
};

struct spot__journal_file {
  char *path;
  uint64_t size;
  int64_t mtime_ns;
  uint64_t ino;
  char *upload_id;
  struct spot__journal_part *parts;
  size_t nparts;
};

struct spot__journal {
  char *job, *name;
  char *attempt; /* the push attempt's key folder; NULL: none (older) */
  uint64_t part_size;
  struct spot__journal_file *files;
  size_t nfiles;
};

/* A push attempt's id: "attempt-" and 16 lowercase hex digits, the folder
 * of its data objects under checkpoints/NAME/ (store.h), so no two
 * attempts ever write the same key. */
#define SPOT__STORE_ATTEMPT_LEN 24
void spot__store_attempt_new(char out[SPOT__STORE_ATTEMPT_LEN + 1]);
bool spot__store_attempt_valid(const char *a);

/* DIR/JOB--NAME.json, malloc'd; NULL on ENOMEM or when dir is NULL. */
char *spot__journal_path(const char *dir, const char *job, const char *name);
/* Atomic replace (temporary file + rename). 0 or negative errno. */
int spot__journal_save(const char *path, const struct spot__journal *j);
/* 0, -ENOENT (no journal), -EBADMSG (unreadable: treat as lost), -ENOMEM. */
int spot__journal_load(const char *path, struct spot__journal **out);
void spot__journal_free(struct spot__journal *j);

#endif
