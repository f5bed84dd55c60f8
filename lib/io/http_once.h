/* One HTTP request run to its end on a loop of the caller's (client
 * commands and start-up code that may block: spotctl relaunch, spotd's
 * --job-from before the daemon starts). Never used on spotd's running
 * loop. */
#ifndef SPOT_HTTP_ONCE_H
#define SPOT_HTTP_ONCE_H

#include <stdbool.h>
#include <stddef.h>

#include <curl/curl.h>

#include "core/buf.h"
#include "io/http.h"

struct spot_http_req {
  const char *method; /* "GET", "PUT", "POST" */
  const char *url;
  const char *const *headers; /* "Name: value" */
  size_t n_headers;
  const char *body; /* POST/PUT body, may be NULL */
  size_t body_len;
  /* SigV4 through curl: "aws:amz:REGION:SERVICE", with user (access key)
   * and password (secret); NULL for none */
  const char *sigv4;
  const char *user;
  const char *password;
  long timeout_ms;  /* whole request; 0 = 10 s */
  size_t max_reply; /* body cap; 0 = 256 KiB */
  bool no_proxy;    /* metadata services: never through a proxy */
};

struct spot_http_reply {
  long status;          /* 0 when no response */
  struct spot_buf body; /* init'ed by spot_http_once, fini by the caller */
  char error[CURL_ERROR_SIZE];
};

/* Runs req on h's loop until it ends (uv_run(UV_RUN_ONCE) in a loop).
 * Returns 0 when an answer arrived (any status: out->status), or a
 * negative errno with out->error set: -EIO transport, -EMSGSIZE body over
 * the cap, -ENOMEM, -EINVAL bad option. out->body is always initialised
 * (free it with spot_buf_fini). */
int spot_http_once(struct spot_http *h, const struct spot_http_req *req,
                   struct spot_http_reply *out);

#endif
