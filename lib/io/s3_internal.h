/* Internals of the S3 client shared between s3.c and the unit tests. */
#ifndef SPOT_S3_INTERNAL_H
#define SPOT_S3_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include <curl/curl.h>

#include "core/s3_xml.h"
#include "io/s3.h"

/* The retry policy: transient network failures (connect, send/recv
 * reset, timeout, empty reply, short body), HTTP 5xx and 429, and the
 * S3 codes that mean "try again" (SlowDown, InternalError,
 * ServiceUnavailable, RequestTimeout, Throttling...) even under 200 or
 * 400. Never other 4xx. */
bool spot__s3_should_retry(CURLcode rc, long status, const char *s3_code);
/* Negative errno for a finished request (rc == CURLE_OK: from the HTTP
 * status and S3 code). */
int spot__s3_map_error(CURLcode rc, long status, const char *s3_code);

/* The list query in canonical order (names sorted, values encoded). */
int spot__s3_list_query(const char *prefix, const char *delimiter,
                        const char *token, unsigned max_keys,
                        struct spot_buf *q);

/* Test seam: sees the request headers curl sends (CURLINFO_HEADER_OUT),
 * Authorization included, so a test can recompute the signature. */
typedef void (*spot__s3_request_hook_fn)(const char *headers, size_t len,
                                         void *data);
void spot__s3_set_request_hook(struct spot_s3 *s3, spot__s3_request_hook_fn fn,
                               void *data);

#endif
