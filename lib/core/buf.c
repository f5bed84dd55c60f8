#include "core/buf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void
spot_buf_init(struct spot_buf *b, size_t cap)
{
  b->data = NULL;
  b->len = 0;
  b->size = 0;
  b->cap = cap;
}

void
spot_buf_fini(struct spot_buf *b)
{
  free(b->data);
  b->data = NULL;
  b->len = 0;
  b->size = 0;
}

void
spot_buf_reset(struct spot_buf *b)
{
  b->len = 0;
  if (b->data != NULL)
    b->data[0] = '\0';
}

static int
reserve(struct spot_buf *b, size_t extra)
{
  size_t need, nsize;
  char *p;

  if (extra > b->cap || b->len > b->cap - extra)
    return -E2BIG;
  need = b->len + extra + 1;
  if (need <= b->size)
    return 0;
  nsize = b->size ? b->size : 64;
  while (nsize < need)
    nsize *= 2;
  if (nsize > b->cap + 1)
    nsize = b->cap + 1;
  p = realloc(b->data, nsize);
  if (p == NULL)
    return -ENOMEM;
  b->data = p;
  b->size = nsize;
  return 0;
}

int
spot_buf_append(struct spot_buf *b, const void *p, size_t n)
{
  int r = reserve(b, n);

  if (r < 0)
    return r;
  if (n > 0)
    memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = '\0';
  return 0;
}

int
spot_buf_appends(struct spot_buf *b, const char *s)
{
  return spot_buf_append(b, s, strlen(s));
}

int
spot_buf_vprintf(struct spot_buf *b, const char *fmt, va_list ap)
{
  va_list aq;
  int n, r;

  va_copy(aq, ap);
  n = vsnprintf(NULL, 0, fmt, aq);
  va_end(aq);
  if (n < 0)
    return -EINVAL;
  r = reserve(b, (size_t)n);
  if (r < 0)
    return r;
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  b->len += (size_t)n;
  return 0;
}

int
spot_buf_printf(struct spot_buf *b, const char *fmt, ...)
{
  va_list ap;
  int r;

  va_start(ap, fmt);
  r = spot_buf_vprintf(b, fmt, ap);
  va_end(ap);
  return r;
}

void
spot_buf_consume(struct spot_buf *b, size_t n)
{
  if (n >= b->len) {
    spot_buf_reset(b);
    return;
  }
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
  b->data[b->len] = '\0';
}

char *
spot_buf_steal(struct spot_buf *b)
{
  char *p = b->data;

  if (p == NULL)
    p = calloc(1, 1);
  b->data = NULL;
  b->len = 0;
  b->size = 0;
  return p;
}

const char *
spot_buf_str(const struct spot_buf *b)
{
  return b->data != NULL ? b->data : "";
}
