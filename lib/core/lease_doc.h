/* The job lease document and the decisions taken on it. Pure: no I/O, no
 * clock (callers pass the time), so unit tests and the fuzz target link
 * only this. The I/O lives in lease.c (acquire, renew, release) and
 * latest.c (LATEST only moves forward).
 *
 * ROOT/LEASE, one small JSON object (version 1, unknown keys ignored so a
 * newer writer may add fields; integers are JSON integers):
 *
 *   { "format": "spotd-lease", "version": 1,
 *     "owner": "i-0abc123/3f2e.../ip-10-0-0-7:4242",
 *     "epoch": 3, "state": "held",
 *     "ttl_ms": 30000, "expires_ms": 1796206460123,
 *     "expires": "2026-12-02T10:14:20Z",
 *     "nonce": "9f86d081884c7d65" }
 *
 * "owner" is whatever the caller names itself (instance id, boot id,
 * host and pid); "epoch" grows by one on every takeover and is the fencing
 * token every commit carries; "state" is "held" or "released" (a release
 * keeps the epoch, so the next taker bumps it); "expires_ms" is wall-clock
 * time (the holder renews long before it); "nonce" is fresh random on
 * every write, so a writer recognises its own write after a lost response
 * and every write has a distinct ETag (If-Match cannot be fooled by an
 * identical body). */
#ifndef SPOT_LEASE_DOC_H
#define SPOT_LEASE_DOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SPOT_LEASE_KEY "LEASE" /* ROOT/LEASE */
#define SPOT_LEASE_FORMAT "spotd-lease"
#define SPOT_LEASE_VERSION 1
#define SPOT_LEASE_OWNER_MAX 256 /* bytes, printable ASCII */
#define SPOT_LEASE_NONCE_MAX 64
#define SPOT_LEASE_JSON_MAX 4096 /* a lease object bigger is refused */
/* epoch, seq and ttl bounds: JSON integers jansson and doubles keep */
#define SPOT_LEASE_EPOCH_MAX ((uint64_t)1 << 53)
#define SPOT_LEASE_TTL_MAX_MS ((int64_t)24 * 3600 * 1000)

struct spot_lease_doc {
  char owner[SPOT_LEASE_OWNER_MAX + 1];
  uint64_t epoch; /* 1..SPOT_LEASE_EPOCH_MAX */
  bool released;
  int64_t ttl_ms;     /* 1..SPOT_LEASE_TTL_MAX_MS */
  int64_t expires_ms; /* wall clock, ms since 1970 */
  char nonce[SPOT_LEASE_NONCE_MAX + 1];
};

/* Whether owner is usable: 1..SPOT_LEASE_OWNER_MAX bytes of printable
 * ASCII (space allowed, no quote or backslash needed: JSON escapes). */
bool spot_lease_doc_owner_valid(const char *owner);

/* Parses len bytes of untrusted JSON. Returns 0 (out filled), -EBADMSG
 * (err says which field), -E2BIG (over SPOT_LEASE_JSON_MAX) or
 * -EPROTONOSUPPORT (another format version). out is untouched on error.
 * err may be NULL. */
int spot_lease_doc_parse(const char *json, size_t len,
                         struct spot_lease_doc *out, char *err, size_t errlen);
/* The JSON text (malloc'd, NUL-terminated) of d. 0, -EINVAL (a field out
 * of range) or -ENOMEM. */
int spot_lease_doc_encode(const struct spot_lease_doc *d, char **out);

enum spot_lease_verdict {
  SPOT_LEASE_ABSENT,   /* no lease object: create it, epoch 1 */
  SPOT_LEASE_RELEASED, /* released by its holder: take it, epoch + 1 */
  SPOT_LEASE_EXPIRED,  /* held, expired beyond the grace: take, epoch + 1 */
  SPOT_LEASE_OURS,     /* our own last write (owner and nonce): renew */
  SPOT_LEASE_THEIRS,   /* held by another writer: wait or refuse */
  SPOT_LEASE_DEAD,     /* THEIRS, but its holder's process is gone from
                          this machine: take, epoch + 1 */
  SPOT_LEASE_VERDICT_LAST,
};

/* A spotd's owner id names the process that holds the lease:
 * "[INSTANCE/]BOOT/pidns-N/HOST:PID" (the kernel's boot id, the inode of
 * its pid namespace, the host name, the pid), so that a node can tell a
 * holder on its own machine, in its own pid namespace, whose process is
 * gone. format returns 0 or -E2BIG; parse returns 0, or -EINVAL for an
 * owner id of another form (a hand-picked `spotctl lease --owner`). */
struct spot_lease_owner {
  char boot[64];
  uint64_t pidns;
  char host[128];
  long pid;
};
int spot_lease_owner_format(const char *instance,
                            const struct spot_lease_owner *o, char *out,
                            size_t size);
int spot_lease_owner_parse(const char *owner, struct spot_lease_owner *out);

/* cur NULL means the object does not exist. our_nonce is the nonce of our
 * last write (NULL or "" when we wrote none): the same owner id with
 * another nonce is another incarnation (a restarted process) and counts
 * as THEIRS until it expires, since it may still be running. A held lease
 * is expired only when now_ms > expires_ms + grace_ms (grace covers clock
 * skew between nodes). */
enum spot_lease_verdict spot_lease_doc_judge(const struct spot_lease_doc *cur,
                                             const char *owner,
                                             const char *our_nonce,
                                             int64_t now_ms, int64_t grace_ms);
/* The epoch the next write carries: 1 when absent, cur's when OURS,
 * cur's + 1 otherwise (0 for THEIRS: nothing to write, or on overflow). */
uint64_t spot_lease_doc_next_epoch(const struct spot_lease_doc *cur,
                                   enum spot_lease_verdict v);
/* "absent", "released", "expired", "ours", "theirs", "dead". */
const char *spot_lease_doc_verdict_name(enum spot_lease_verdict v);
/* Milliseconds until a THEIRS lease may be taken over (0 if now). */
int64_t spot_lease_doc_wait_ms(const struct spot_lease_doc *cur, int64_t now_ms,
                               int64_t grace_ms);

/* ETags. S3 returns them quoted ("\"0cc1...\""); Ceph 16 RGW's PUT
 * If-Match wants them bare, AWS quoted. bare copies without the W/ prefix
 * and the quotes; quoted adds the quotes. Both return 0 or -E2BIG. */
int spot_lease_doc_etag_bare(const char *etag, char *out, size_t size);
int spot_lease_doc_etag_quoted(const char *etag, char *out, size_t size);
/* Same entity tag whatever the quoting. */
bool spot_lease_doc_etag_same(const char *a, const char *b);

/* LATEST's order: the commit's (lease epoch, sequence within the epoch),
 * carried as the object's user metadata x-amz-meta-spotd-order: "E.S", so
 * the body stays the plain checkpoint name older readers expect. */
#define SPOT_LATEST_ORDER_META "spotd-order"
struct spot_latest_order {
  uint64_t epoch, seq;
};
/* "E.S" with both decimal, no sign, no leading zeros beyond "0". 0 or
 * -EINVAL. */
int spot_lease_doc_order_parse(const char *s, struct spot_latest_order *out);
void spot_lease_doc_order_format(struct spot_latest_order o, char *buf,
                                 size_t size);
/* <0, 0, >0 like strcmp: epoch first, then seq. */
int spot_lease_doc_order_cmp(struct spot_latest_order a,
                             struct spot_latest_order b);

#endif
