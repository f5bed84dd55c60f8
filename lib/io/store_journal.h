/* The push journal (store_journal.c): the multipart uploads a push has in
 * progress, so a killed push resumes them. Internal to the store. */
#ifndef SPOT_STORE_JOURNAL_H
#define SPOT_STORE_JOURNAL_H

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
  uint64_t part_size;
  struct spot__journal_file *files;
  size_t nfiles;
};

/* DIR/JOB--NAME.json, malloc'd; NULL on ENOMEM or when dir is NULL. */
char *spot__journal_path(const char *dir, const char *job, const char *name);
/* Atomic replace (temporary file + rename). 0 or negative errno. */
int spot__journal_save(const char *path, const struct spot__journal *j);
/* 0, -ENOENT (no journal), -EBADMSG (unreadable: treat as lost), -ENOMEM. */
int spot__journal_load(const char *path, struct spot__journal **out);
void spot__journal_free(struct spot__journal *j);

#endif
