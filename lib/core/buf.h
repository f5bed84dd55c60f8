/* A growable byte buffer with a hard cap. Always NUL-terminated. */
#ifndef SPOT_BUF_H
#define SPOT_BUF_H

#include <stdarg.h>
#include <stddef.h>

struct spot_buf {
  char *data;  /* NULL until the first append */
  size_t len;  /* bytes used, excluding the terminating NUL */
  size_t size; /* bytes allocated */
  size_t cap;  /* hard limit on len */
};

void spot_buf_init(struct spot_buf *b, size_t cap);
void spot_buf_fini(struct spot_buf *b);
void spot_buf_reset(struct spot_buf *b);
/* Returns 0, -ENOMEM, or -E2BIG when the cap would be exceeded (the
 * buffer is left unchanged then). */
int spot_buf_append(struct spot_buf *b, const void *p, size_t n);
int spot_buf_appends(struct spot_buf *b, const char *s);
int spot_buf_printf(struct spot_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int spot_buf_vprintf(struct spot_buf *b, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
/* Drops the first n bytes. */
void spot_buf_consume(struct spot_buf *b, size_t n);
/* Hands the data to the caller (free() it); the buffer becomes empty. */
char *spot_buf_steal(struct spot_buf *b);
/* The data, "" when empty. */
const char *spot_buf_str(const struct spot_buf *b);

#endif
