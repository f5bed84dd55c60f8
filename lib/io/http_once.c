/* A single blocking request over the libuv/libcurl glue. */
#include "io/http_once.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <uv.h>

#include "core/util.h"
#include "spot-config.h"

#define DEFAULT_TIMEOUT_MS 10000
#define DEFAULT_MAX_REPLY (256 * 1024)

struct once {
  struct spot_http_reply *out;
  bool done, too_big;
  CURLcode rc;
  const char *body;
  size_t body_len, body_off;
};

static size_t
write_cb(char *p, size_t size, size_t n, void *data)
{
  struct once *o = data;

  if (spot_buf_append(&o->out->body, p, size * n) < 0) {
    o->too_big = true;
    return 0;
  }
  return size * n;
}

static size_t
read_cb(char *p, size_t size, size_t n, void *data)
{
  struct once *o = data;
  size_t left = o->body_len - o->body_off;
  size_t k = size * n < left ? size * n : left;

  if (k > 0)
    memcpy(p, o->body + o->body_off, k);
  o->body_off += k;
  return k;
}

static void
done_cb(CURL *easy, CURLcode rc, void *data)
{
  struct once *o = data;

  (void)easy;
  o->rc = rc;
  o->done = true;
}

#define SETOPT(opt, val)                                                       \
  do {                                                                         \
    if (curl_easy_setopt(e, (opt), (val)) != CURLE_OK)                         \
      goto bad_option;                                                         \
  } while (0)

static int
setup(CURL *e, const struct spot_http_req *req, struct once *o,
      struct curl_slist *hdrs)
{
  long tmo = req->timeout_ms > 0 ? req->timeout_ms : DEFAULT_TIMEOUT_MS;

  SETOPT(CURLOPT_URL, req->url);
  SETOPT(CURLOPT_PROTOCOLS_STR, "http,https");
  SETOPT(CURLOPT_NOSIGNAL, 1L);
  SETOPT(CURLOPT_FOLLOWLOCATION, 0L);
  SETOPT(CURLOPT_USERAGENT, "spotd/" SPOT_VERSION);
  SETOPT(CURLOPT_ERRORBUFFER, o->out->error);
  SETOPT(CURLOPT_TIMEOUT_MS, tmo);
  SETOPT(CURLOPT_CONNECTTIMEOUT_MS, tmo);
  SETOPT(CURLOPT_SSL_VERIFYPEER, 1L);
  SETOPT(CURLOPT_SSL_VERIFYHOST, 2L);
  SETOPT(CURLOPT_WRITEFUNCTION, write_cb);
  SETOPT(CURLOPT_WRITEDATA, o);
  if (hdrs != NULL)
    SETOPT(CURLOPT_HTTPHEADER, hdrs);
  if (req->no_proxy)
    SETOPT(CURLOPT_NOPROXY, "*");
  if (req->sigv4 != NULL) {
    SETOPT(CURLOPT_AWS_SIGV4, req->sigv4);
    SETOPT(CURLOPT_USERNAME, req->user);
    SETOPT(CURLOPT_PASSWORD, req->password);
  }
  if (strcmp(req->method, "POST") == 0) {
    /* curl hashes POSTFIELDS into the SigV4 payload hash */
    SETOPT(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    SETOPT(CURLOPT_POSTFIELDS, req->body != NULL ? req->body : "");
  } else if (strcmp(req->method, "PUT") == 0) {
    SETOPT(CURLOPT_UPLOAD, 1L);
    SETOPT(CURLOPT_INFILESIZE_LARGE, (curl_off_t)req->body_len);
    SETOPT(CURLOPT_READFUNCTION, read_cb);
    SETOPT(CURLOPT_READDATA, o);
  } else if (strcmp(req->method, "GET") != 0) {
    SETOPT(CURLOPT_CUSTOMREQUEST, req->method);
  }
  return 0;
bad_option:
  snprintf(o->out->error, sizeof(o->out->error), "cannot set up the request");
  return -EINVAL;
}

int
spot_http_once(struct spot_http *h, const struct spot_http_req *req,
               struct spot_http_reply *out)
{
  struct once o;
  struct curl_slist *hdrs = NULL, *l;
  uv_loop_t *loop = spot_http_loop(h);
  CURL *e;
  int r;

  memset(out, 0, sizeof(*out));
  spot_buf_init(&out->body,
                req->max_reply > 0 ? req->max_reply : DEFAULT_MAX_REPLY);
  memset(&o, 0, sizeof(o));
  o.out = out;
  o.body = req->body;
  o.body_len = req->body_len;
  for (size_t i = 0; i < req->n_headers; i++) {
    l = curl_slist_append(hdrs, req->headers[i]);
    if (l == NULL) {
      curl_slist_free_all(hdrs);
      return -ENOMEM;
    }
    hdrs = l;
  }
  e = curl_easy_init();
  if (e == NULL) {
    curl_slist_free_all(hdrs);
    return -ENOMEM;
  }
  r = setup(e, req, &o, hdrs);
  if (r == 0)
    r = spot_http_add(h, e, done_cb, &o);
  if (r == 0) {
    while (!o.done && uv_run(loop, UV_RUN_ONCE) != 0)
      ;
    if (!o.done) {
      spot_http_cancel(h, e);
      r = -EIO;
    } else if (o.too_big) {
      snprintf(out->error, sizeof(out->error), "reply over %zu bytes",
               out->body.cap);
      r = -EMSGSIZE;
    } else if (o.rc != CURLE_OK) {
      if (out->error[0] == '\0')
        snprintf(out->error, sizeof(out->error), "%s",
                 curl_easy_strerror(o.rc));
      r = o.rc == CURLE_OUT_OF_MEMORY ? -ENOMEM : -EIO;
    } else {
      curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &out->status);
    }
  }
  curl_easy_cleanup(e);
  curl_slist_free_all(hdrs);
  return r;
}
