/* AWS Signature Version 4, pure functions (no I/O, no clock).
 *
 * curl signs our requests (CURLOPT_AWS_SIGV4); this is how we prove what
 * it signs is right: the canonical request AWS computes from a request
 * must be byte-identical to what we send, and the tests check these
 * functions against AWS's published vectors and against the
 * Authorization header curl actually sends. Internal to lib/ (spot__). */
#ifndef SPOT_SIGV4_H
#define SPOT_SIGV4_H

#include <stdbool.h>
#include <stddef.h>

#include "core/buf.h"

#define SPOT__SHA256_EMPTY                                                     \
  "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

struct spot__sigv4_header {
  const char *name;
  const char *value;
};

struct spot__sigv4_request {
  const char *method;
  /* Path as in the request line. Percent-decoded, then encoded the SigV4
   * way ('/' kept); S3 style: no dot-segment normalisation. */
  const char *path;
  /* Query string without '?', NULL when none. Each name and value is
   * decoded then re-encoded; pairs sorted by name then value. */
  const char *query;
  /* Every header to sign, host and x-amz-date included. */
  const struct spot__sigv4_header *headers;
  size_t n_headers;
  const char *payload_hash; /* hex SHA-256, or "UNSIGNED-PAYLOAD" */
};

/* Appends the SigV4 encoding of n bytes of p (unreserved A-Za-z0-9-._~
 * kept, '/' kept when keep_slash, everything else %XX upper case). */
int spot__uri_encode_n(const char *p, size_t n, bool keep_slash,
                       struct spot_buf *out);
/* Percent-decodes n bytes into out ('+' stays '+'). -EINVAL on a bad
 * escape. */
int spot__uri_decode_n(const char *p, size_t n, struct spot_buf *out);

int spot__sigv4_canonical_query(const char *query, struct spot_buf *out);
/* The canonical request; signed_headers (may be NULL) receives the
 * "host;x-amz-date" list. Returns 0 or negative errno. */
int spot__sigv4_canonical_request(const struct spot__sigv4_request *req,
                                  struct spot_buf *out,
                                  struct spot_buf *signed_headers);
/* amz_date is "YYYYMMDDTHHMMSSZ". */
int spot__sigv4_string_to_sign(const char *amz_date, const char *region,
                               const char *service, const char *creq,
                               struct spot_buf *out);
int spot__sigv4_signature(const char *secret, const char *amz_date,
                          const char *region, const char *service,
                          const char *string_to_sign, char hex[65]);
/* The whole header value, in the form curl and the AWS SDKs write:
 * "AWS4-HMAC-SHA256 Credential=AK/DATE/REGION/SERVICE/aws4_request,
 * SignedHeaders=..., Signature=...". */
int spot__sigv4_authorization(const char *access_key, const char *secret,
                              const char *amz_date, const char *region,
                              const char *service,
                              const struct spot__sigv4_request *req,
                              struct spot_buf *out);

void spot__sha256_hex(const void *p, size_t n, char hex[65]);

#endif
