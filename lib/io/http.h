/* The one libcurl <-> libuv glue: a CURLM driven by
 * CURLMOPT_SOCKETFUNCTION / CURLMOPT_TIMERFUNCTION, one uv_poll_t per
 * socket and one uv_timer_t. Used by the S3 client and the metadata
 * pollers, in spotd and in spotctl. */
#ifndef SPOT_HTTP_H
#define SPOT_HTTP_H

#include <curl/curl.h>
#include <uv.h>

struct spot_http;

/* Runs exactly once per spot_http_add() that returned 0, when the transfer
 * ends: rc is curl's result (CURLE_OK even for HTTP 4xx/5xx; read the
 * status with CURLINFO_RESPONSE_CODE), or CURLE_ABORTED_BY_CALLBACK when
 * the transfer was cancelled. The easy handle is already removed from the
 * multi handle, so the callback may free it or add it again. */
typedef void (*spot_http_done_cb)(CURL *easy, CURLcode rc, void *data);
typedef void (*spot_http_close_cb)(void *data);

int spot_http_new(uv_loop_t *loop, struct spot_http **out);
/* Starts a configured easy handle; the caller keeps owning it. Returns 0
 * or a negative errno (then cb never runs). */
int spot_http_add(struct spot_http *h, CURL *easy, spot_http_done_cb cb,
                  void *data);
/* Stops a transfer in progress. Its callback runs with
 * CURLE_ABORTED_BY_CALLBACK before this returns: the one place in lib/io
 * where a completion callback runs inside the call that cancels. Only the
 * clients built on this glue (s3.c, meta.c, aws_imds.c) see it, and each
 * defers its own users' callbacks to the loop. No-op if easy is not
 * active. */
void spot_http_cancel(struct spot_http *h, CURL *easy);
/* The loop h runs on (for callers that need timers next to it). */
uv_loop_t *spot_http_loop(const struct spot_http *h);
/* Number of transfers in progress. */
unsigned spot_http_active(const struct spot_http *h);
/* Cancels every transfer (callbacks run), closes the handles and frees
 * h once the last uv close callback has run, then calls cb (may be NULL). */
void spot_http_close(struct spot_http *h, spot_http_close_cb cb, void *data);

#endif
