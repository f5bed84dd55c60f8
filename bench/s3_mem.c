/* s3_mem - an in-memory S3 for benchmarks (libmicrohttpd, a thread per
 * connection): path-style S3 on 127.0.0.1 that keeps every object in RAM,
 * so spotd's push, restore, list, lease and store check can be timed
 * where Ceph cannot run, or without Ceph's CPU on a small machine. It is a
 * bench tool, not a test oracle: real S3 behaviour is tested against Ceph.
 *
 * Answers: PUT (If-None-Match: *, If-Match with a quoted or bare ETag,
 * x-amz-meta-* kept and returned), GET (Range -> 206, If-Match), HEAD,
 * DELETE, POST ?delete, multipart (POST ?uploads, PUT ?partNumber&uploadId,
 * POST ?uploadId, DELETE ?uploadId, GET ?uploadId, GET ?uploads) and
 * ListObjectsV2 (prefix, delimiter, max-keys, continuation-token). Every
 * bucket exists; no signature check. A completed multipart upload keeps
 * its parts as they came (no copy); a GET reads across them.
 *
 *   s3_mem [--arena SIZE] [PORT]   (PORT 0 or none: a free port, printed
 *                                   on stdout; --arena: see blob_new)
 *
 * Serves until SIGTERM or SIGINT; prints what it holds on stderr. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "mhd_serve.h"

#define MAX_PUT (5ULL << 30) /* S3's largest single PUT and part */
#define MAX_POST (16U << 20) /* XML bodies: complete, delete */
#define MAX_PARTS 10000
#define MAX_KEYS 1000
#define META_CAP 2048

/* An uploaded body, shared by the object (or part) and the GETs that are
 * still sending it, so a DELETE or overwrite never frees bytes in flight. */
struct blob {
  atomic_uint ref;
  size_t len, cap;
  char data[];
};

struct seg {
  struct blob *b;
  uint64_t off; /* where it starts in the object */
};

struct obj {
  char *key; /* "bucket/key" */
  struct seg *segs;
  size_t nseg;
  uint64_t size;
  char etag[48]; /* bare */
  char *meta;    /* "x-amz-meta-name: value\n" lines, or NULL */
  time_t mtime;
};

struct part {
  int number;
  struct blob *b;
  char etag[48];
};

struct upload {
  char id[40];
  char *key;          /* "bucket/key" */
  struct part *parts; /* ascending number */
  size_t nparts;
  time_t initiated;
};

/* one request: its body as it arrives */
struct req {
  struct blob *body;
  bool too_big, nomem;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct obj *objs; /* sorted by key */
static size_t nobjs, capobjs;
static struct upload *ups;
static size_t nups, capups;
static atomic_ullong ids;
static unsigned long long seed;

/* ---- helpers ------------------------------------------------------------ */

/* Where large bodies go. Fresh memory is what an in-memory store costs
 * most on a VM: faulting in 4 KiB pages as a body arrives cost this
 * server 4 CPU-s per GiB stored, huge pages populated at once still 1.5,
 * more than the client spent compressing. So --arena reserves (and
 * touches) memory before the measured run, and large bodies are carved
 * from it; an arena body's memory is not reused after a DELETE or an
 * overwrite (a bench stores a checkpoint or two). Past the arena, large
 * bodies get their own mapping in huge pages, populated at once. */
#define BIG_BLOB (1U << 20)

static char *arena;
static size_t arena_size;
static atomic_size_t arena_used;

static size_t
blob_bytes(size_t cap)
{
  return sizeof(struct blob) + (cap > 0 ? cap : 1);
}

static void *
map_big(size_t bytes)
{
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

  if (p == MAP_FAILED)
    return NULL;
  madvise(p, bytes, MADV_HUGEPAGE); /* a hint: no error if refused */
  madvise(p, bytes, MADV_POPULATE_WRITE);
  return p;
}

static bool
in_arena(const struct blob *b)
{
  return arena != NULL && (const char *)b >= arena &&
         (const char *)b < arena + arena_size;
}

static struct blob *
blob_new(size_t cap)
{
  size_t bytes = blob_bytes(cap);
  struct blob *b = NULL;

  if (bytes >= BIG_BLOB && arena != NULL) {
    size_t want = (bytes + 63) & ~(size_t)63;
    size_t off = atomic_fetch_add(&arena_used, want);

    if (off + want <= arena_size)
      b = (struct blob *)(void *)(arena + off);
  }
  if (b == NULL)
    b = bytes >= BIG_BLOB ? map_big(bytes) : malloc(bytes);
  if (b == NULL)
    return NULL;
  atomic_init(&b->ref, 1);
  b->len = 0;
  b->cap = cap;
  return b;
}

static void
blob_unref(struct blob *b)
{
  if (b == NULL || atomic_fetch_sub(&b->ref, 1) != 1 || in_arena(b))
    return;
  if (blob_bytes(b->cap) >= BIG_BLOB)
    munmap(b, blob_bytes(b->cap));
  else
    free(b);
}

/* a growing text buffer for the XML answers */
struct sb {
  char *s;
  size_t len, cap;
  bool nomem;
};

static void sb_printf(struct sb *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
sb_printf(struct sb *b, const char *fmt, ...)
{
  va_list ap;
  int n;

  if (b->nomem)
    return;
  for (;;) {
    size_t room = b->cap - b->len;

    va_start(ap, fmt);
    n = vsnprintf(b->s != NULL ? b->s + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->nomem = true;
      return;
    }
    if ((size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    size_t ncap = (b->cap + (size_t)n + 1) * 2;
    char *p = realloc(b->s, ncap);

    if (p == NULL) {
      b->nomem = true;
      return;
    }
    b->s = p;
    b->cap = ncap;
  }
}

static void
sb_escaped(struct sb *b, const char *s)
{
  for (; *s != '\0'; s++) {
    switch (*s) {
    case '&':
      sb_printf(b, "&amp;");
      break;
    case '<':
      sb_printf(b, "&lt;");
      break;
    case '>':
      sb_printf(b, "&gt;");
      break;
    case '"':
      sb_printf(b, "&quot;");
      break;
    case '\'':
      sb_printf(b, "&apos;");
      break;
    default:
      sb_printf(b, "%c", *s);
    }
  }
}

static void
new_etag(char *out, size_t size, int nparts)
{
  unsigned long long n = ++ids;

  if (nparts > 0)
    snprintf(out, size, "%016llx%016llx-%d", seed, n, nparts);
  else
    snprintf(out, size, "%016llx%016llx", seed, n);
}

static void
iso_time(time_t t, char *out, size_t size)
{
  struct tm tm;

  gmtime_r(&t, &tm);
  strftime(out, size, "%Y-%m-%dT%H:%M:%S.000Z", &tm);
}

/* If-Match and If-None-Match values: quoted or bare, or "*" */
static bool
etag_matches(const char *want, const char *etag)
{
  size_t n;

  while (*want == ' ')
    want++;
  if (strcmp(want, "*") == 0)
    return true;
  if (strncmp(want, "W/", 2) == 0)
    want += 2;
  n = strlen(want);
  if (n >= 2 && want[0] == '"' && want[n - 1] == '"') {
    want++;
    n -= 2;
  }
  return strlen(etag) == n && strncmp(want, etag, n) == 0;
}

/* ---- the object map (lock held) ---------------------------------------- */

/* the index of key, or where it would go */
static size_t
find(const char *key, bool *found)
{
  size_t lo = 0, hi = nobjs;

  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(objs[mid].key, key);

    if (c == 0) {
      *found = true;
      return mid;
    }
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *found = false;
  return lo;
}

static void
obj_clear(struct obj *o)
{
  for (size_t i = 0; i < o->nseg; i++)
    blob_unref(o->segs[i].b);
  free(o->segs);
  free(o->meta);
  free(o->key);
}

/* Stores o under its key (taking o's memory), replacing what was there. */
static int
put_obj(struct obj *o)
{
  bool found;
  size_t i = find(o->key, &found);

  if (found) {
    free(o->key);
    o->key = objs[i].key;
    objs[i].key = NULL;
    obj_clear(&objs[i]);
    objs[i] = *o;
    return 0;
  }
  if (nobjs == capobjs) {
    size_t ncap = capobjs > 0 ? capobjs * 2 : 1024;
    struct obj *p = realloc(objs, ncap * sizeof(*p));

    if (p == NULL)
      return -1;
    objs = p;
    capobjs = ncap;
  }
  memmove(&objs[i + 1], &objs[i], (nobjs - i) * sizeof(*objs));
  objs[i] = *o;
  nobjs++;
  return 0;
}

static void
del_obj(const char *key)
{
  bool found;
  size_t i = find(key, &found);

  if (!found)
    return;
  obj_clear(&objs[i]);
  memmove(&objs[i], &objs[i + 1], (nobjs - i - 1) * sizeof(*objs));
  nobjs--;
}

static struct upload *
find_upload(const char *id, const char *key)
{
  for (size_t i = 0; i < nups; i++)
    if (strcmp(ups[i].id, id) == 0 && strcmp(ups[i].key, key) == 0)
      return &ups[i];
  return NULL;
}

static void
drop_upload(struct upload *u)
{
  size_t i = (size_t)(u - ups);

  for (size_t j = 0; j < u->nparts; j++)
    blob_unref(u->parts[j].b);
  free(u->parts);
  free(u->key);
  memmove(&ups[i], &ups[i + 1], (nups - i - 1) * sizeof(*ups));
  nups--;
}

/* ---- answers ------------------------------------------------------------ */

static enum MHD_Result
send_sb(struct MHD_Connection *c, unsigned code, struct sb *b, const char *etag)
{
  struct MHD_Response *r;
  enum MHD_Result ret;
  char tag[64];

  if (b->nomem) {
    free(b->s);
    return MHD_NO;
  }
  r = MHD_create_response_from_buffer(b->len, b->s != NULL ? b->s : (char *)"",
                                      b->s != NULL ? MHD_RESPMEM_MUST_FREE
                                                   : MHD_RESPMEM_PERSISTENT);
  if (r == NULL) {
    free(b->s);
    return MHD_NO;
  }
  if (b->len > 0)
    MHD_add_response_header(r, "Content-Type", "application/xml");
  if (etag != NULL) {
    snprintf(tag, sizeof(tag), "\"%s\"", etag);
    MHD_add_response_header(r, "ETag", tag);
  }
  ret = MHD_queue_response(c, code, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result
reply(struct MHD_Connection *c, unsigned code, const char *etag)
{
  struct sb b = {0};

  return send_sb(c, code, &b, etag);
}

static enum MHD_Result
error(struct MHD_Connection *c, unsigned code, const char *s3code,
      const char *msg)
{
  struct sb b = {0};

  sb_printf(&b,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s"
            "</Code><Message>%s</Message></Error>",
            s3code, msg);
  return send_sb(c, code, &b, NULL);
}

static const char *
arg(struct MHD_Connection *c, const char *key)
{
  return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, key);
}

/* present, with a value or not ("?uploads" and "?uploads=" alike) */
static bool
has_arg(struct MHD_Connection *c, const char *key)
{
  return MHD_lookup_connection_value_n(c, MHD_GET_ARGUMENT_KIND, key,
                                       strlen(key), NULL, NULL) == MHD_YES;
}

static const char *
header(struct MHD_Connection *c, const char *name)
{
  return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
}

/* ---- GET and HEAD ------------------------------------------------------- */

/* what a GET sends: the object's segments as they were when it began */
struct reader {
  struct seg *segs;
  size_t nseg;
  uint64_t start; /* first byte of the object sent */
};

static ssize_t
read_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
  struct reader *rd = cls;
  uint64_t at = rd->start + pos;
  size_t lo = 0, hi = rd->nseg, done = 0;

  /* the last segment that starts at or before `at` */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;

    if (rd->segs[mid].off <= at)
      lo = mid;
    else
      hi = mid;
  }
  for (size_t i = lo; i < rd->nseg && done < max; i++) {
    uint64_t in = at + done - rd->segs[i].off;
    size_t n;

    if (in >= rd->segs[i].b->len)
      continue;
    n = rd->segs[i].b->len - (size_t)in;
    if (n > max - done)
      n = max - done;
    memcpy(buf + done, rd->segs[i].b->data + in, n);
    done += n;
  }
  return done > 0 ? (ssize_t)done : MHD_CONTENT_READER_END_OF_STREAM;
}

static void
reader_free(void *cls)
{
  struct reader *rd = cls;

  for (size_t i = 0; i < rd->nseg; i++)
    blob_unref(rd->segs[i].b);
  free(rd->segs);
  free(rd);
}

/* "bytes=a-b" or "bytes=a-": false when there is none or it does not fit */
static bool
parse_range(const char *h, uint64_t size, uint64_t *a, uint64_t *b, bool *bad)
{
  char *end;

  *bad = false;
  if (h == NULL || strncmp(h, "bytes=", 6) != 0)
    return false;
  h += 6;
  if (*h < '0' || *h > '9') {
    *bad = true; /* suffix ranges: not used by the client */
    return false;
  }
  *a = strtoull(h, &end, 10);
  if (*end != '-') {
    *bad = true;
    return false;
  }
  if (end[1] == '\0')
    *b = size > 0 ? size - 1 : 0;
  else
    *b = strtoull(end + 1, &end, 10);
  if (*a >= size || *b < *a) {
    *bad = true;
    return false;
  }
  if (*b >= size)
    *b = size - 1;
  return true;
}

static enum MHD_Result
get_obj(struct MHD_Connection *c, const char *key, bool head)
{
  struct MHD_Response *r;
  struct reader *rd;
  enum MHD_Result ret;
  uint64_t a = 0, b = 0, len;
  bool found, ranged, bad = false;
  const char *im = header(c, "If-Match");
  char tag[64], date[64], crange[96];
  char *meta = NULL;
  struct tm tm;
  size_t i;

  rd = calloc(1, sizeof(*rd));
  if (rd == NULL)
    return MHD_NO;
  pthread_mutex_lock(&lock);
  i = find(key, &found);
  if (!found) {
    pthread_mutex_unlock(&lock);
    free(rd);
    if (head)
      return reply(c, MHD_HTTP_NOT_FOUND, NULL);
    return error(c, MHD_HTTP_NOT_FOUND, "NoSuchKey",
                 "The specified key does not exist.");
  }
  if (im != NULL && !etag_matches(im, objs[i].etag)) {
    pthread_mutex_unlock(&lock);
    free(rd);
    return error(c, MHD_HTTP_PRECONDITION_FAILED, "PreconditionFailed",
                 "If-Match does not match the object's ETag.");
  }
  /* an empty object has no byte to range over: all of it (none) */
  ranged = !head && objs[i].size > 0 &&
           parse_range(header(c, "Range"), objs[i].size, &a, &b, &bad);
  if (!head && objs[i].size > 0 && bad) {
    pthread_mutex_unlock(&lock);
    free(rd);
    return error(c, 416U, "InvalidRange",
                 "The requested range is not satisfiable.");
  }
  len = ranged ? b - a + 1 : objs[i].size;
  rd->start = a;
  rd->segs = malloc((objs[i].nseg > 0 ? objs[i].nseg : 1) * sizeof(*rd->segs));
  if (rd->segs == NULL ||
      (objs[i].meta != NULL && (meta = strdup(objs[i].meta)) == NULL)) {
    pthread_mutex_unlock(&lock);
    free(rd->segs);
    free(rd);
    return MHD_NO;
  }
  for (size_t s = 0; s < objs[i].nseg; s++) {
    rd->segs[s] = objs[i].segs[s];
    atomic_fetch_add(&rd->segs[s].b->ref, 1);
  }
  rd->nseg = objs[i].nseg;
  snprintf(tag, sizeof(tag), "\"%s\"", objs[i].etag);
  gmtime_r(&objs[i].mtime, &tm);
  strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  snprintf(crange, sizeof(crange), "bytes %llu-%llu/%llu",
           (unsigned long long)a, (unsigned long long)b,
           (unsigned long long)objs[i].size);
  pthread_mutex_unlock(&lock);

  r = MHD_create_response_from_callback(len, 1U << 20, read_cb, rd,
                                        reader_free);
  if (r == NULL) {
    reader_free(rd);
    free(meta);
    return MHD_NO;
  }
  MHD_add_response_header(r, "ETag", tag);
  MHD_add_response_header(r, "Last-Modified", date);
  MHD_add_response_header(r, "Accept-Ranges", "bytes");
  MHD_add_response_header(r, "Content-Type", "binary/octet-stream");
  if (ranged)
    MHD_add_response_header(r, "Content-Range", crange);
  for (char *p = meta, *eol; p != NULL && *p != '\0'; p = eol + 1) {
    char *colon = strchr(p, ':');

    eol = strchr(p, '\n');
    if (eol == NULL || colon == NULL || colon > eol)
      break;
    *colon = '\0';
    *eol = '\0';
    MHD_add_response_header(r, p, colon + 2);
  }
  free(meta);
  ret =
      MHD_queue_response(c, ranged ? MHD_HTTP_PARTIAL_CONTENT : MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

/* ---- PUT ---------------------------------------------------------------- */

static enum MHD_Result
meta_cb(void *cls, enum MHD_ValueKind kind, const char *name, const char *value)
{
  struct sb *b = cls;

  (void)kind;
  if (value != NULL && strncasecmp(name, "x-amz-meta-", 11) == 0 &&
      b->len + strlen(name) + strlen(value) + 4 < META_CAP) {
    sb_printf(b, "x-amz-meta-");
    for (const char *p = name + 11; *p != '\0'; p++)
      sb_printf(b, "%c", *p >= 'A' && *p <= 'Z' ? (char)(*p - 'A' + 'a') : *p);
    sb_printf(b, ": %s\n", value);
  }
  return MHD_YES;
}

static enum MHD_Result
put_part(struct MHD_Connection *c, const char *key, struct req *rq,
         const char *upload_id, const char *pn)
{
  char *end;
  long n = strtol(pn, &end, 10);
  struct upload *u;
  char etag[48];
  size_t i;

  if (*end != '\0' || n < 1 || n > MAX_PARTS)
    return error(c, MHD_HTTP_BAD_REQUEST, "InvalidArgument",
                 "Part number must be an integer between 1 and 10000.");
  pthread_mutex_lock(&lock);
  u = find_upload(upload_id, key);
  if (u == NULL) {
    pthread_mutex_unlock(&lock);
    return error(c, MHD_HTTP_NOT_FOUND, "NoSuchUpload",
                 "The specified upload does not exist.");
  }
  for (i = 0; i < u->nparts && u->parts[i].number < n; i++)
    ;
  if (i == u->nparts || u->parts[i].number != n) {
    struct part *p = realloc(u->parts, (u->nparts + 1) * sizeof(*p));

    if (p == NULL) {
      pthread_mutex_unlock(&lock);
      return error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "InternalError",
                   "out of memory");
    }
    u->parts = p;
    memmove(&p[i + 1], &p[i], (u->nparts - i) * sizeof(*p));
    u->nparts++;
    p[i].number = (int)n;
    p[i].b = NULL;
  }
  blob_unref(u->parts[i].b);
  u->parts[i].b = rq->body;
  rq->body = NULL;
  new_etag(u->parts[i].etag, sizeof(u->parts[i].etag), 0);
  snprintf(etag, sizeof(etag), "%s", u->parts[i].etag);
  pthread_mutex_unlock(&lock);
  return reply(c, MHD_HTTP_OK, etag);
}

/* 0 when the conditional headers allow writing over what key holds */
static int
precondition(struct MHD_Connection *c, const char *key)
{
  const char *inm = header(c, "If-None-Match");
  const char *im = header(c, "If-Match");
  bool found;
  size_t i = find(key, &found);

  if (inm != NULL && found && etag_matches(inm, objs[i].etag))
    return -1;
  if (im != NULL && (!found || !etag_matches(im, objs[i].etag)))
    return -1;
  return 0;
}

static enum MHD_Result
put_obj_req(struct MHD_Connection *c, const char *key, struct req *rq)
{
  struct obj o = {0};
  struct sb meta = {0};
  char etag[48];

  MHD_get_connection_values(c, MHD_HEADER_KIND, meta_cb, &meta);
  o.key = strdup(key);
  o.segs = malloc(sizeof(*o.segs));
  if (o.key == NULL || o.segs == NULL || meta.nomem) {
    free(o.key);
    free(o.segs);
    free(meta.s);
    return error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "InternalError",
                 "out of memory");
  }
  o.meta = meta.s;
  o.segs[0].b = rq->body;
  o.segs[0].off = 0;
  o.nseg = 1;
  o.size = rq->body->len;
  o.mtime = time(NULL);
  new_etag(o.etag, sizeof(o.etag), 0);
  snprintf(etag, sizeof(etag), "%s", o.etag);
  pthread_mutex_lock(&lock);
  if (precondition(c, key) < 0) {
    pthread_mutex_unlock(&lock);
    free(o.key);
    free(o.segs);
    free(o.meta);
    return error(c, MHD_HTTP_PRECONDITION_FAILED, "PreconditionFailed",
                 "At least one of the pre-conditions you specified did not "
                 "hold");
  }
  rq->body = NULL; /* the object's now */
  if (put_obj(&o) < 0) {
    pthread_mutex_unlock(&lock);
    obj_clear(&o);
    return error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "InternalError",
                 "out of memory");
  }
  pthread_mutex_unlock(&lock);
  return reply(c, MHD_HTTP_OK, etag);
}

/* ---- POST: multipart and DeleteObjects ---------------------------------- */

static enum MHD_Result
create_upload(struct MHD_Connection *c, const char *key)
{
  struct upload u = {0};
  struct sb b = {0};
  const char *slash = strchr(key, '/');

  snprintf(u.id, sizeof(u.id), "%016llx%016llx", seed ^ 0x5bd1e995ULL,
           (unsigned long long)++ids);
  u.key = strdup(key);
  u.initiated = time(NULL);
  pthread_mutex_lock(&lock);
  if (u.key != NULL && nups == capups) {
    size_t ncap = capups > 0 ? capups * 2 : 64;
    struct upload *p = realloc(ups, ncap * sizeof(*p));

    if (p == NULL) {
      free(u.key);
      u.key = NULL;
    } else {
      ups = p;
      capups = ncap;
    }
  }
  if (u.key == NULL) {
    pthread_mutex_unlock(&lock);
    return error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "InternalError",
                 "out of memory");
  }
  ups[nups++] = u;
  pthread_mutex_unlock(&lock);
  sb_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                "<InitiateMultipartUploadResult><Bucket>");
  sb_printf(&b, "%.*s</Bucket><Key>", (int)(slash - key), key);
  sb_escaped(&b, slash + 1);
  sb_printf(&b, "</Key><UploadId>%s</UploadId></InitiateMultipartUploadResult>",
            u.id);
  return send_sb(c, MHD_HTTP_OK, &b, NULL);
}

/* the text of each <tag>...</tag> in body, in order; returns how many */
static size_t
xml_values(const char *body, const char *tag, char ***out)
{
  char open[32], close[32];
  size_t n = 0, cap = 0;
  char **v = NULL;

  snprintf(open, sizeof(open), "<%s>", tag);
  snprintf(close, sizeof(close), "</%s>", tag);
  for (const char *p = strstr(body, open); p != NULL; p = strstr(p, open)) {
    const char *s = p + strlen(open), *e = strstr(s, close);
    char *t, *w;

    if (e == NULL)
      break;
    if (n == cap) {
      char **nv = realloc(v, (cap = cap > 0 ? cap * 2 : 16) * sizeof(*nv));

      if (nv == NULL)
        break;
      v = nv;
    }
    t = malloc((size_t)(e - s) + 1);
    if (t == NULL)
      break;
    /* the five XML entities back to characters */
    w = t;
    for (const char *q = s; q < e; q++) {
      static const struct {
        const char *ent;
        char ch;
      } ents[] = {{"&amp;", '&'},
                  {"&lt;", '<'},
                  {"&gt;", '>'},
                  {"&quot;", '"'},
                  {"&apos;", '\''}};
      bool done = false;

      for (size_t k = 0; k < sizeof(ents) / sizeof(ents[0]) && *q == '&'; k++)
        if (strncmp(q, ents[k].ent, strlen(ents[k].ent)) == 0) {
          *w++ = ents[k].ch;
          q += strlen(ents[k].ent) - 1;
          done = true;
          break;
        }
      if (!done)
        *w++ = *q;
    }
    *w = '\0';
    v[n++] = t;
    p = e + strlen(close);
  }
  *out = v;
  return n;
}

static void
free_values(char **v, size_t n)
{
  for (size_t i = 0; i < n; i++)
    free(v[i]);
  free(v);
}

static enum MHD_Result
complete_upload(struct MHD_Connection *c, const char *key,
                const char *upload_id, struct req *rq)
{
  struct obj o = {0};
  struct upload *u;
  struct sb b = {0};
  char **nums = NULL;
  size_t n;
  const char *slash = strchr(key, '/');

  rq->body->data[rq->body->len] = '\0'; /* room kept by body_append */
  n = xml_values(rq->body->data, "PartNumber", &nums);
  if (n == 0) {
    free_values(nums, n);
    return error(c, MHD_HTTP_BAD_REQUEST, "MalformedXML",
                 "The XML you provided was not well-formed.");
  }
  o.key = strdup(key);
  o.segs = calloc(n, sizeof(*o.segs));
  if (o.key == NULL || o.segs == NULL) {
    free(o.key);
    free(o.segs);
    free_values(nums, n);
    return error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "InternalError",
                 "out of memory");
  }
  pthread_mutex_lock(&lock);
  u = find_upload(upload_id, key);
  if (u == NULL) {
    pthread_mutex_unlock(&lock);
    free(o.key);
    free(o.segs);
    free_values(nums, n);
    return error(c, MHD_HTTP_NOT_FOUND, "NoSuchUpload",
                 "The specified upload does not exist.");
  }
  for (size_t i = 0; i < n; i++) {
    long num = strtol(nums[i], NULL, 10);
    size_t j;

    for (j = 0; j < u->nparts && u->parts[j].number != num; j++)
      ;
    if (j == u->nparts || (i > 0 && num <= strtol(nums[i - 1], NULL, 10))) {
      pthread_mutex_unlock(&lock);
      free(o.key);
      free(o.segs);
      free_values(nums, n);
      return error(c, MHD_HTTP_BAD_REQUEST, "InvalidPart",
                   "One or more of the specified parts could not be found, "
                   "or are not in ascending order.");
    }
    o.segs[i].b = u->parts[j].b;
    o.segs[i].off = o.size;
    o.size += u->parts[j].b->len;
  }
  if (precondition(c, key) < 0) {
    pthread_mutex_unlock(&lock);
    free(o.key);
    free(o.segs);
    free_values(nums, n);
    return error(c, MHD_HTTP_PRECONDITION_FAILED, "PreconditionFailed",
                 "At least one of the pre-conditions you specified did not "
                 "hold");
  }
  for (size_t i = 0; i < n; i++)
    atomic_fetch_add(&o.segs[i].b->ref, 1);
  o.nseg = n;
  o.mtime = time(NULL);
  new_etag(o.etag, sizeof(o.etag), (int)n);
  if (put_obj(&o) < 0) {
    pthread_mutex_unlock(&lock);
    obj_clear(&o);
    free_values(nums, n);
    return error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "InternalError",
                 "out of memory");
  }
  drop_upload(u);
  pthread_mutex_unlock(&lock);
  free_values(nums, n);
  sb_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                "<CompleteMultipartUploadResult><Bucket>");
  sb_printf(&b, "%.*s</Bucket><Key>", (int)(slash - key), key);
  sb_escaped(&b, slash + 1);
  sb_printf(&b,
            "</Key><ETag>&quot;%s&quot;</ETag>"
            "</CompleteMultipartUploadResult>",
            o.etag);
  return send_sb(c, MHD_HTTP_OK, &b, NULL);
}

static enum MHD_Result
delete_objects(struct MHD_Connection *c, const char *bucket, struct req *rq)
{
  struct sb b = {0};
  char **keys = NULL, **quiet = NULL;
  size_t n, nq;
  bool q;

  rq->body->data[rq->body->len] = '\0';
  n = xml_values(rq->body->data, "Key", &keys);
  nq = xml_values(rq->body->data, "Quiet", &quiet);
  q = nq > 0 && strcmp(quiet[0], "true") == 0;
  free_values(quiet, nq);
  sb_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DeleteResult>");
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n; i++) {
    struct sb full = {0};

    sb_printf(&full, "%s/%s", bucket, keys[i]);
    if (full.nomem) {
      b.nomem = true;
      break;
    }
    del_obj(full.s);
    free(full.s);
    if (!q) {
      sb_printf(&b, "<Deleted><Key>");
      sb_escaped(&b, keys[i]);
      sb_printf(&b, "</Key></Deleted>");
    }
  }
  pthread_mutex_unlock(&lock);
  free_values(keys, n);
  sb_printf(&b, "</DeleteResult>");
  return send_sb(c, MHD_HTTP_OK, &b, NULL);
}

/* ---- lists -------------------------------------------------------------- */

static void
hex(struct sb *b, const char *s)
{
  for (; *s != '\0'; s++)
    sb_printf(b, "%02x", (unsigned char)*s);
}

/* a continuation token back to "K<key>" or "P<common prefix>" */
static char *
unhex(const char *s)
{
  size_t n = strlen(s);
  char *out;

  if (n % 2 != 0 || (out = malloc(n / 2 + 1)) == NULL)
    return NULL;
  for (size_t i = 0; i < n / 2; i++) {
    unsigned v;

    if (sscanf(s + 2 * i, "%2x", &v) != 1) {
      free(out);
      return NULL;
    }
    out[i] = (char)v;
  }
  out[n / 2] = '\0';
  return out;
}

static enum MHD_Result
list_objects(struct MHD_Connection *c, const char *bucket)
{
  const char *prefix = arg(c, "prefix"), *delim = arg(c, "delimiter");
  const char *mk = arg(c, "max-keys"), *token = arg(c, "continuation-token");
  struct sb b = {0}, full = {0}, last = {0};
  char *after = NULL;
  size_t after_len;
  long max = mk != NULL ? strtol(mk, NULL, 10) : MAX_KEYS;
  size_t count = 0, blen = strlen(bucket) + 1, i;
  bool found, truncated = false, last_is_prefix = false;

  if (prefix == NULL)
    prefix = "";
  if (delim != NULL && delim[0] == '\0')
    delim = NULL;
  if (max < 0 || max > MAX_KEYS)
    max = MAX_KEYS;
  if (token != NULL && ((after = unhex(token)) == NULL || after[0] == '\0')) {
    free(after);
    return error(c, MHD_HTTP_BAD_REQUEST, "InvalidArgument",
                 "The continuation token provided is incorrect");
  }
  after_len = after != NULL ? strlen(after) - 1 : 0;
  sb_printf(&full, "%s/%s", bucket, prefix);
  sb_printf(&b,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult>"
            "<Name>%s</Name><Prefix>",
            bucket);
  sb_escaped(&b, prefix);
  sb_printf(&b, "</Prefix><MaxKeys>%ld</MaxKeys>", max);
  if (delim != NULL) {
    sb_printf(&b, "<Delimiter>");
    sb_escaped(&b, delim);
    sb_printf(&b, "</Delimiter>");
  }
  if (full.nomem) {
    free(after);
    free(b.s);
    return MHD_NO;
  }
  pthread_mutex_lock(&lock);
  for (i = find(full.s, &found); i < nobjs; i++) {
    const char *k = objs[i].key, *rel;
    const char *d;

    if (strncmp(k, full.s, full.len) != 0)
      break;
    rel = k + blen;
    if (after != NULL &&
        (strcmp(rel, after + 1) <= 0 ||
         (after[0] == 'P' && strncmp(rel, after + 1, after_len) == 0)))
      continue;
    d = delim != NULL ? strstr(rel + strlen(prefix), delim) : NULL;
    if (d != NULL) {
      size_t plen = (size_t)(d - rel) + strlen(delim);

      if (last_is_prefix && last.s != NULL && last.len == plen &&
          strncmp(last.s, rel, plen) == 0)
        continue; /* the same common prefix again */
      if (count == (size_t)max) {
        truncated = true;
        break;
      }
      last.len = 0;
      sb_printf(&last, "%.*s", (int)plen, rel);
      last_is_prefix = true;
      sb_printf(&b, "<CommonPrefixes><Prefix>");
      sb_escaped(&b, last.s != NULL ? last.s : "");
      sb_printf(&b, "</Prefix></CommonPrefixes>");
    } else {
      char date[40];

      if (count == (size_t)max) {
        truncated = true;
        break;
      }
      last.len = 0;
      sb_printf(&last, "%s", rel);
      last_is_prefix = false;
      iso_time(objs[i].mtime, date, sizeof(date));
      sb_printf(&b, "<Contents><Key>");
      sb_escaped(&b, rel);
      sb_printf(&b,
                "</Key><LastModified>%s</LastModified><ETag>&quot;%s&quot;"
                "</ETag><Size>%llu</Size><StorageClass>STANDARD</StorageClass>"
                "</Contents>",
                date, objs[i].etag, (unsigned long long)objs[i].size);
    }
    count++;
  }
  pthread_mutex_unlock(&lock);
  sb_printf(&b, "<KeyCount>%zu</KeyCount><IsTruncated>%s</IsTruncated>", count,
            truncated ? "true" : "false");
  if (token != NULL)
    sb_printf(&b, "<ContinuationToken>%s</ContinuationToken>", token);
  if (truncated && last.s != NULL) {
    sb_printf(&b, "<NextContinuationToken>%s", last_is_prefix ? "50" : "4b");
    hex(&b, last.s);
    sb_printf(&b, "</NextContinuationToken>");
  }
  sb_printf(&b, "</ListBucketResult>");
  free(after);
  free(full.s);
  free(last.s);
  return send_sb(c, MHD_HTTP_OK, &b, NULL);
}

static enum MHD_Result
list_parts(struct MHD_Connection *c, const char *key, const char *upload_id)
{
  struct sb b = {0};
  struct upload *u;

  sb_printf(&b,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListPartsResult>"
            "<UploadId>%s</UploadId>",
            upload_id);
  pthread_mutex_lock(&lock);
  u = find_upload(upload_id, key);
  if (u == NULL) {
    pthread_mutex_unlock(&lock);
    free(b.s);
    return error(c, MHD_HTTP_NOT_FOUND, "NoSuchUpload",
                 "The specified upload does not exist.");
  }
  for (size_t i = 0; i < u->nparts; i++)
    sb_printf(&b,
              "<Part><PartNumber>%d</PartNumber><ETag>&quot;%s&quot;</ETag>"
              "<Size>%zu</Size></Part>",
              u->parts[i].number, u->parts[i].etag, u->parts[i].b->len);
  pthread_mutex_unlock(&lock);
  sb_printf(&b, "<IsTruncated>false</IsTruncated></ListPartsResult>");
  return send_sb(c, MHD_HTTP_OK, &b, NULL);
}

static enum MHD_Result
list_uploads(struct MHD_Connection *c, const char *bucket)
{
  const char *prefix = arg(c, "prefix");
  struct sb b = {0}, full = {0};

  sb_printf(&full, "%s/%s", bucket, prefix != NULL ? prefix : "");
  sb_printf(&b,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<ListMultipartUploadsResult><Bucket>%s</Bucket>",
            bucket);
  if (full.nomem) {
    free(b.s);
    return MHD_NO;
  }
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < nups; i++) {
    char date[40];

    if (strncmp(ups[i].key, full.s, full.len) != 0)
      continue;
    iso_time(ups[i].initiated, date, sizeof(date));
    sb_printf(&b, "<Upload><Key>");
    sb_escaped(&b, ups[i].key + strlen(bucket) + 1);
    sb_printf(&b,
              "</Key><UploadId>%s</UploadId><Initiated>%s</Initiated>"
              "</Upload>",
              ups[i].id, date);
  }
  pthread_mutex_unlock(&lock);
  free(full.s);
  sb_printf(&b,
            "<IsTruncated>false</IsTruncated></ListMultipartUploadsResult>");
  return send_sb(c, MHD_HTTP_OK, &b, NULL);
}

/* ---- the request -------------------------------------------------------- */

static int
body_append(struct req *rq, const char *data, size_t len, size_t limit)
{
  if (rq->too_big || rq->nomem)
    return 0;
  if ((rq->body != NULL ? rq->body->len : 0) + len > limit) {
    rq->too_big = true;
    return 0;
  }
  /* one byte more than the body: the XML parsers want a terminator */
  if (rq->body == NULL || rq->body->len + len + 1 > rq->body->cap) {
    size_t have = rq->body != NULL ? rq->body->len : 0;
    size_t ncap = (have + len + 1) * 2;
    struct blob *nb = blob_new(ncap);

    if (nb == NULL) {
      rq->nomem = true;
      return 0;
    }
    if (rq->body != NULL) {
      memcpy(nb->data, rq->body->data, have);
      nb->len = have;
      blob_unref(rq->body);
    }
    rq->body = nb;
  }
  memcpy(rq->body->data + rq->body->len, data, len);
  rq->body->len += len;
  return 0;
}

static void
completed(void *cls, struct MHD_Connection *c, void **state,
          enum MHD_RequestTerminationCode toe)
{
  struct req *rq = *state;

  (void)cls;
  (void)c;
  (void)toe;
  if (rq != NULL) {
    blob_unref(rq->body);
    free(rq);
    *state = NULL;
  }
}

static enum MHD_Result
dispatch(struct MHD_Connection *c, const char *url, const char *method,
         struct req *rq)
{
  const char *path = url[0] == '/' ? url + 1 : url;
  const char *slash = strchr(path, '/');
  const char *upload_id = arg(c, "uploadId");
  bool bucket_only = slash == NULL || slash[1] == '\0';
  bool head = strcmp(method, "HEAD") == 0, get = strcmp(method, "GET") == 0;
  bool put = strcmp(method, "PUT") == 0, post = strcmp(method, "POST") == 0;
  bool del = strcmp(method, "DELETE") == 0;
  char bucket[256];

  if (rq->too_big)
    return error(c, MHD_HTTP_BAD_REQUEST, "EntityTooLarge",
                 "Your proposed upload exceeds the maximum allowed size");
  if (rq->nomem)
    return error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "InternalError",
                 "out of memory");
  snprintf(bucket, sizeof(bucket), "%.*s",
           (int)(slash != NULL ? (size_t)(slash - path) : strlen(path)), path);
  if (bucket[0] == '\0')
    return error(c, MHD_HTTP_BAD_REQUEST, "InvalidRequest",
                 "path-style requests only: /BUCKET/KEY");
  if (rq->body == NULL && (put || post)) {
    rq->body = blob_new(1); /* an empty body */
    if (rq->body == NULL)
      return MHD_NO;
  }
  if (bucket_only) {
    if (post && has_arg(c, "delete"))
      return delete_objects(c, bucket, rq);
    if (get && has_arg(c, "uploads"))
      return list_uploads(c, bucket);
    if (get)
      return list_objects(c, bucket);
    if (head || put)
      return reply(c, MHD_HTTP_OK, NULL); /* every bucket exists */
    return error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "MethodNotAllowed",
                 "The specified method is not allowed against this "
                 "resource.");
  }
  if (put) {
    if (upload_id != NULL)
      return put_part(c, path, rq, upload_id,
                      arg(c, "partNumber") != NULL ? arg(c, "partNumber") : "");
    return put_obj_req(c, path, rq);
  }
  if (post) {
    if (has_arg(c, "uploads"))
      return create_upload(c, path);
    if (upload_id != NULL)
      return complete_upload(c, path, upload_id, rq);
    return error(c, MHD_HTTP_BAD_REQUEST, "InvalidRequest",
                 "POST: ?uploads or ?uploadId");
  }
  if (get && upload_id != NULL)
    return list_parts(c, path, upload_id);
  if (get || head)
    return get_obj(c, path, head);
  if (del) {
    if (upload_id != NULL) {
      struct upload *u;

      pthread_mutex_lock(&lock);
      u = find_upload(upload_id, path);
      if (u != NULL)
        drop_upload(u);
      pthread_mutex_unlock(&lock);
      if (u == NULL)
        return error(c, MHD_HTTP_NOT_FOUND, "NoSuchUpload",
                     "The specified upload does not exist.");
      return reply(c, MHD_HTTP_NO_CONTENT, NULL);
    }
    pthread_mutex_lock(&lock);
    del_obj(path);
    pthread_mutex_unlock(&lock);
    return reply(c, MHD_HTTP_NO_CONTENT, NULL);
  }
  return error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "MethodNotAllowed",
               "The specified method is not allowed against this resource.");
}

static enum MHD_Result
handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
       const char *version, const char *data, size_t *data_len, void **state)
{
  struct req *rq = *state;

  (void)cls;
  (void)version;
  if (rq == NULL) {
    /* the headers: the body (if any) comes next */
    const char *cl = header(c, "Content-Length");
    unsigned long long len = cl != NULL ? strtoull(cl, NULL, 10) : 0;

    rq = calloc(1, sizeof(*rq));
    if (rq == NULL)
      return MHD_NO;
    *state = rq;
    if (len > MAX_PUT)
      rq->too_big = true;
    else if (len > 0 && (rq->body = blob_new((size_t)len + 1)) == NULL)
      rq->nomem = true;
    return MHD_YES;
  }
  if (*data_len > 0) {
    body_append(rq, data, *data_len,
                strcmp(method, "PUT") == 0 ? MAX_PUT : MAX_POST);
    *data_len = 0;
    return MHD_YES;
  }
  return dispatch(c, url, method, rq);
}

int
main(int argc, char **argv)
{
  unsigned long port = 0;
  unsigned long long bytes = 0;
  char *end = NULL;
  bool have_port = false;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      printf("usage: s3_mem [--arena SIZE] [PORT]\n"
             "An in-memory S3 on 127.0.0.1 for benchmarks (path style, no\n"
             "signature check, every bucket exists). PORT 0 or none: a free\n"
             "port, printed on stdout. SIGTERM or SIGINT stops it.\n"
             "  --arena SIZE  reserve and touch SIZE bytes (K, M, G) at start\n"
             "                for the bodies, so that storing them costs no\n"
             "                page faults while measured; not reused after\n"
             "                a DELETE or overwrite\n");
      return 0;
    }
    if (strcmp(argv[i], "--arena") == 0 && i + 1 < argc) {
      unsigned long long v = strtoull(argv[++i], &end, 10);
      unsigned shift = *end == 'K'   ? 10
                       : *end == 'M' ? 20
                       : *end == 'G' ? 30
                                     : 0;

      if (end == argv[i] || (shift > 0 && end[1] != '\0') ||
          (shift == 0 && *end != '\0') || v == 0 || v > (1ULL << 40) >> shift) {
        fprintf(stderr, "s3_mem: --arena wants a size such as 4G, not '%s'\n",
                argv[i]);
        return 2;
      }
      arena_size = (size_t)(v << shift);
      continue;
    }
    if (have_port) {
      fprintf(stderr, "usage: s3_mem [--arena SIZE] [PORT]\n");
      return 2;
    }
    port = strtoul(argv[i], &end, 10);
    if (end == argv[i] || *end != '\0' || port > 65535) {
      fprintf(stderr, "s3_mem: PORT is a number from 0 to 65535, not '%s'\n",
              argv[i]);
      return 2;
    }
    have_port = true;
  }
  if (arena_size > 0 && (arena = map_big(arena_size)) == NULL) {
    fprintf(stderr, "s3_mem: cannot reserve an arena of %zu bytes\n",
            arena_size);
    return 1;
  }
  seed = ((unsigned long long)time(NULL) << 20) ^ (unsigned long long)getpid();
  if (mhd_serve("s3_mem", (unsigned)port, handle, completed) != 0)
    return 1;
  for (size_t i = 0; i < nobjs; i++) {
    bytes += objs[i].size;
    obj_clear(&objs[i]);
  }
  fprintf(stderr, "s3_mem: held %zu objects, %llu bytes, %zu open uploads\n",
          nobjs, bytes, nups);
  while (nups > 0)
    drop_upload(&ups[0]);
  free(objs);
  free(ups);
  return 0;
}
