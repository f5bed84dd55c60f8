/* Async S3 client on libuv + libcurl (through http.h). SigV4 is signed by
 * curl (CURLOPT_AWS_SIGV4); we write the canonical path and query
 * ourselves and send x-amz-content-sha256 on every request (s3.c says
 * why: curl 7.88 signs them as given and adds no payload hash). Responses and
 * errors are parsed with expat. Bodies come from caller buffers and go to
 * caller sinks, so no object is ever held whole unless the caller asks for it.
 *
 * Callback contract: if a function taking a callback returns < 0, the
 * callback never runs; otherwise it runs exactly once, from the loop, with
 * res->err == -ECANCELED when the operation was cancelled. The result and
 * everything it points to are borrowed for the duration of the callback.
 * "From the loop" holds for cancels too: spot_s3_cancel() only queues the
 * callback (as uv_close() does), so a caller may cancel in the middle of
 * its own state changes; only spot_s3_free() runs callbacks itself. */
#ifndef SPOT_S3_H
#define SPOT_S3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/aws_conf.h"
#include "core/buf.h"
#include "core/s3_xml.h"
#include "io/http.h"

/* Supplies credentials before each request (after a refresh when they are
 * about to expire). Returns 0 and fills *out (borrowed until the next call),
 * or a negative errno. Async refresh (IMDS) is the provider's business: it
 * keeps the last good credentials and refreshes ahead of expiry. */
struct spot_creds_provider {
  int (*get)(struct spot_creds_provider *p, const struct spot_creds **out);
  void *data;
};

struct spot_s3_config {
  /* "http://127.0.0.1:7480" or "https://s3.eu-west-1.amazonaws.com" */
  const char *endpoint;
  const char *region; /* "us-east-1" */
  bool path_style;    /* true for custom endpoints */
  struct spot_creds_provider *creds;
  unsigned max_retries;    /* default 5 when 0 */
  uint64_t retry_base_ms;  /* default 200 when 0 */
  uint64_t retry_cap_ms;   /* default 10000 when 0 */
  long connect_timeout_ms; /* default 5000 when 0 */
  /* abort when < low_speed_limit B/s this long; default
   * $SPOT_S3_LOW_SPEED_TIME (a test knob), else 20 */
  long low_speed_time_s;
  long low_speed_limit; /* default 1024 */
  /* whole request; 0 = none (big parts on slow links) */
  long request_timeout_ms;
  /* I/O threads for the transfers of big bodies (parts and PUTs of 1 MiB
   * and more, GETs into a sink), each with its own loop and connections:
   * 0 = $SPOT_IO_THREADS (a test knob), else 1 up to 4 cores and half
   * the cores above; 1 = none, the caller's loop carries all.
   * At most SPOT_S3_IO_THREADS_MAX. Made on the first such transfer,
   * joined by spot_s3_free(). */
  unsigned io_threads;
};
#define SPOT_S3_IO_THREADS_MAX 8

struct spot_s3;
struct spot_s3_op; /* one operation in flight, for spot_s3_cancel() */

struct spot_s3_result {
  /* 0, or negative errno: -EIO network, 5xx and errors inside a 200;
   * -EACCES 401/403; -ENOENT 404 and NoSuch*; -EEXIST 412 on
   * If-None-Match; -EINVAL 400; -EBUSY 409/429; -ERANGE 416; -EBADMSG
   * unparsable reply; -EMSGSIZE reply over the cap; -ECANCELED; or the
   * error a GET sink returned. */
  int err;
  long http_status;    /* 0 when no response */
  const char *s3_code; /* "NoSuchKey", "SignatureDoesNotMatch", ... or "" */
  const char *message; /* human text: S3 Message or curl's error, or "" */
  unsigned retries;    /* attempts beyond the first */
  const char *op_name; /* "PUT", "GET", "LIST", "MPU-PART", ... */
  const char *bucket;
  const char *key; /* "" for bucket-level operations */
  /* Per operation: */
  const char *etag;        /* put, part, complete, head, get ("" if none) */
  uint64_t content_length; /* head, get */
  const char *upload_id;   /* mpu_create */
  /* list: one page */
  const struct spot_s3_object_info *objects;
  size_t n_objects;
  const char *const *common_prefixes;
  size_t n_common_prefixes;
  const char *next_token; /* NULL when this was the last page */
  /* list_parts */
  const struct spot_s3_part_info *parts;
  size_t n_parts;
  /* list_uploads */
  const struct spot_s3_upload_info *uploads;
  size_t n_uploads;
  /* delete_objects: keys the server refused to delete */
  const char *const *failed_keys;
  size_t n_failed_keys;
  /* get, head, put_ex: the x-amz-meta-* response headers as
   * "x-amz-meta-NAME: VALUE\n" lines ("" if none); see spot_s3_meta_get */
  const char *meta;
  /* The server's Date header (ms since the epoch, whole seconds; 0 when
   * none) and this host's wall clock when the answered attempt was sent
   * and when its answer came: see spot_s3_clock_skew_ms(). */
  int64_t date_ms, sent_wall_ms, recv_wall_ms;
};

/* How far this host's wall clock is from the server's, at least (ms;
 * > 0: ahead, < 0: behind), from one answer: the server stamped Date
 * somewhere in [date, date + 1 s) while the local clock was in [sent,
 * recv], so only a gap outside that counts. 0 when they agree within
 * that or the answer had no Date. */
int64_t spot_s3_clock_skew_ms(const struct spot_s3_result *res);

typedef void (*spot_s3_cb)(const struct spot_s3_result *res, void *data);
/* GET body sink: return 0 to continue, negative errno to abort the
 * transfer (the op then fails with that error, no retry). Called with
 * offset relative to the start of the requested range; a retry goes on
 * from the bytes already sunk (a ranged GET of the same ETag).
 *
 * Thread: with I/O threads (spot_s3_config.io_threads >= 2) a GET into a
 * sink runs on one of them, and so does its sink: it may touch only what
 * belongs to that one transfer (the restore's writes into its slot's
 * buffer), never the caller's loop state. The completion callback still
 * runs on the caller's loop, after the last sink call. */
typedef int (*spot_s3_sink_cb)(const void *p, size_t n, uint64_t offset,
                               void *data);

/* Owns nothing of cfg's strings: they are copied. http must outlive s3. */
int spot_s3_new(struct spot_http *http, const struct spot_s3_config *cfg,
                struct spot_s3 **out);
/* Cancels every operation in flight and runs their callbacks, with
 * -ECANCELED, before it returns (also those already queued by
 * spot_s3_cancel()), then frees. The loop must still turn afterwards to
 * release the ops' handles. Safe on NULL. */
void spot_s3_free(struct spot_s3 *s3);
/* Legal in any state until the op's callback has run (the op pointer is
 * dead after that; a second cancel before then does nothing). The
 * callback has not run when this returns: it runs from the loop, with
 * -ECANCELED, on its next turn (or in spot_s3_free()). */
void spot_s3_cancel(struct spot_s3_op *op);

enum spot_s3_put_flags {
  SPOT_S3_IF_NONE_MATCH = 1 << 0, /* If-None-Match: * (commit) */
};

/* data must stay valid until the callback. Payload is hashed (SHA-256)
 * into x-amz-content-sha256 when len <= 64 KiB, else UNSIGNED-PAYLOAD. */
int spot_s3_put(struct spot_s3 *s3, const char *bucket, const char *key,
                const void *data, size_t len, unsigned flags, spot_s3_cb cb,
                void *cbdata, struct spot_s3_op **op);
/* A PUT with conditions and one user-metadata header. if_match is sent
 * verbatim as If-Match (quote it or not: Ceph 16 RGW compares the
 * unquoted ETag, AWS the quoted one, see spot_s3_if_match_unquoted); a
 * failed condition ends with -EEXIST (412) or -ENOENT (AWS: no such key).
 * meta_name ("spotd-order") and meta_value are sent as
 * x-amz-meta-NAME: VALUE (printable ASCII only); meta2_* likewise, a
 * second header. */
struct spot_s3_put_opts {
  unsigned flags;       /* enum spot_s3_put_flags */
  const char *if_match; /* NULL: none */
  const char *meta_name, *meta_value;
  const char *meta2_name, *meta2_value;
};
int spot_s3_put_ex(struct spot_s3 *s3, const char *bucket, const char *key,
                   const void *data, size_t len,
                   const struct spot_s3_put_opts *opts, spot_s3_cb cb,
                   void *cbdata, struct spot_s3_op **op);
/* Which If-Match form this server wants, as learned by a caller (lease.c):
 * false (default) = quoted as returned, true = bare hex (Ceph 16). */
bool spot_s3_if_match_unquoted(const struct spot_s3 *s3);
void spot_s3_set_if_match_unquoted(struct spot_s3 *s3, bool unquoted);

/* Range [off, off+len); len == 0 means to the end. Exactly one of sink or
 * into is used: into collects the body in a capped buffer. */
int spot_s3_get(struct spot_s3 *s3, const char *bucket, const char *key,
                uint64_t off, uint64_t len, spot_s3_sink_cb sink,
                struct spot_buf *into, spot_s3_cb cb, void *cbdata,
                struct spot_s3_op **op);
int spot_s3_head(struct spot_s3 *s3, const char *bucket, const char *key,
                 spot_s3_cb cb, void *cbdata, struct spot_s3_op **op);
/* ListObjectsV2, one page (max_keys 0 = server default 1000). token is
 * the previous result's next_token or NULL. delimiter may be NULL. */
int spot_s3_list(struct spot_s3 *s3, const char *bucket, const char *prefix,
                 const char *delimiter, const char *token, unsigned max_keys,
                 spot_s3_cb cb, void *cbdata, struct spot_s3_op **op);
/* DeleteObjects, at most 1000 keys. */
int spot_s3_delete_objects(struct spot_s3 *s3, const char *bucket,
                           const char *const *keys, size_t n, spot_s3_cb cb,
                           void *cbdata, struct spot_s3_op **op);
int spot_s3_mpu_create(struct spot_s3 *s3, const char *bucket, const char *key,
                       spot_s3_cb cb, void *cbdata, struct spot_s3_op **op);
int spot_s3_mpu_part(struct spot_s3 *s3, const char *bucket, const char *key,
                     const char *upload_id, int part_number, const void *data,
                     size_t len, spot_s3_cb cb, void *cbdata,
                     struct spot_s3_op **op);
int spot_s3_mpu_complete(struct spot_s3 *s3, const char *bucket,
                         const char *key, const char *upload_id,
                         const struct spot_s3_part_info *parts, size_t n,
                         spot_s3_cb cb, void *cbdata, struct spot_s3_op **op);
int spot_s3_mpu_abort(struct spot_s3 *s3, const char *bucket, const char *key,
                      const char *upload_id, spot_s3_cb cb, void *cbdata,
                      struct spot_s3_op **op);
int spot_s3_mpu_list_parts(struct spot_s3 *s3, const char *bucket,
                           const char *key, const char *upload_id,
                           spot_s3_cb cb, void *cbdata, struct spot_s3_op **op);
/* ListMultipartUploads under a prefix, one page of up to 1000. */
int spot_s3_list_uploads(struct spot_s3 *s3, const char *bucket,
                         const char *prefix, spot_s3_cb cb, void *cbdata,
                         struct spot_s3_op **op);

/* How many answers so far asked to slow down (503 SlowDown or any 503,
 * 429, RequestTimeout and the other throttling codes), retried or not:
 * the store's concurrency control backs off when it grows. */
uint64_t spot_s3_throttled(const struct spot_s3 *s3);

/* Helpers, pure: */
/* Percent-encodes per SigV4 (unreserved A-Za-z0-9-._~ kept); '/' kept
 * when keep_slash (object keys in paths). */
int spot_s3_uri_encode(const char *in, bool keep_slash, struct spot_buf *out);
/* One line describing a failed result for users:
 * "PUT s3://b/k: 403 SignatureDoesNotMatch: The request signature ..." */
/* Copies the value of user-metadata header x-amz-meta-NAME from a
 * result's meta lines into out. 0, -ENOENT (absent) or -E2BIG. */
int spot_s3_meta_get(const char *meta, const char *name, char *out,
                     size_t size);
/* Whether S3 refused the request's credentials themselves (a wrong
 * secret, an unknown key id, a bad or expired session token), as opposed
 * to a policy denying a signed request (AccessDenied). */
bool spot_s3_bad_credentials(const struct spot_s3_result *res);
const char *spot_s3_strerror(const struct spot_s3_result *res, char *buf,
                             size_t size);

#endif
