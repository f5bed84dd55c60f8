/* The libcurl <-> libuv glue. A CURLM is driven entirely by
 * CURLMOPT_SOCKETFUNCTION (one uv_poll_t per socket, kept as curl's
 * per-socket pointer through curl_multi_assign) and
 * CURLMOPT_TIMERFUNCTION (one uv_timer_t).
 *
 * Why the timer callback only (re)arms the uv timer: curl forbids calling
 * curl_multi_socket_action() from inside its own callbacks, and it asks
 * for a 0 ms timeout from inside curl_multi_add_handle(). Arming a uv
 * timer with 0 defers the work to the next loop iteration.
 *
 * Lifetime: spot_http owns the multi handle, the timer and every socket
 * context. spot_http_close() removes every transfer (their callbacks run),
 * cleans up the multi handle (which asks us to drop the remaining
 * sockets), closes every uv handle and frees the struct in the last close
 * callback.
 *
 * Delayed ACKs: a server that writes an answer in two pieces with Nagle's
 * algorithm on (Ceph RGW's beast frontend does by default: headers, then
 * body) holds the second piece until the first is acknowledged, while
 * Linux, seeing request and answer alternate on a kept-alive connection,
 * delays that ACK by up to 40 ms. Every request after the first on a
 * connection then took about 44 ms instead of under 1 ms, and a commit's
 * serial requests paid it each. So once curl has read what a readable
 * socket held, the socket is asked to acknowledge at once (TCP_QUICKACK:
 * it sends the pending ACK now, and is not permanent, hence each time). */
#include "io/http.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "core/log.h"
#include "core/util.h"

struct sock_ctx {
  struct spot_http *h;
  struct sock_ctx *prev, *next;
  curl_socket_t fd;
  bool released; /* curl said CURL_POLL_REMOVE: fd may be closed */
  uv_poll_t poll;
};

struct xfer {
  struct xfer *next;
  CURL *easy;
  spot_http_done_cb cb;
  void *data;
};

struct spot_http {
  uv_loop_t *loop;
  CURLM *multi;
  uv_timer_t timer;
  struct sock_ctx *socks;
  struct xfer *xfers;
  unsigned n_active;
  unsigned pending_closes;
  bool closing;
  spot_http_close_cb close_cb;
  void *close_data;
};

static void check_done(struct spot_http *h);

static void
maybe_free(struct spot_http *h)
{
  spot_http_close_cb cb;
  void *data;

  if (!h->closing || h->pending_closes > 0)
    return;
  cb = h->close_cb;
  data = h->close_data;
  free(h);
  if (cb != NULL)
    cb(data);
}

static void
sock_close_cb(uv_handle_t *handle)
{
  struct sock_ctx *s = spot_container_of(handle, struct sock_ctx, poll);
  struct spot_http *h = s->h;

  free(s);
  h->pending_closes--;
  maybe_free(h);
}

static void
sock_release(struct sock_ctx *s)
{
  struct spot_http *h = s->h;

  if (s->prev != NULL)
    s->prev->next = s->next;
  else
    h->socks = s->next;
  if (s->next != NULL)
    s->next->prev = s->prev;
  s->prev = s->next = NULL;
  s->released = true;
  /* uv_close stops the poll and forgets the fd right away, so curl may
   * hand us the same fd number again before sock_close_cb runs. */
  h->pending_closes++;
  uv_close((uv_handle_t *)&s->poll, sock_close_cb);
}

static void
poll_cb(uv_poll_t *poll, int status, int events)
{
  struct sock_ctx *s = spot_container_of(poll, struct sock_ctx, poll);
  struct spot_http *h = s->h;
  curl_socket_t fd = s->fd;
  int flags = 0, running = 0;
  CURLMcode mc;

  if (status < 0) {
    /* libuv stopped the poll; curl finds out what went wrong itself. */
    log_debug("http: poll fd=%d: %s", (int)fd, uv_strerror(status));
    flags = CURL_CSELECT_ERR;
  } else {
    if (events & UV_READABLE)
      flags |= CURL_CSELECT_IN;
    if (events & UV_WRITABLE)
      flags |= CURL_CSELECT_OUT;
  }
  /* s stays allocated until its close callback, a later loop phase; a
   * CURL_POLL_REMOVE in here marks it released. */
  mc = curl_multi_socket_action(h->multi, fd, flags, &running);
  if (mc != CURLM_OK)
    log_warn("http: curl_multi_socket_action: %s", curl_multi_strerror(mc));
  if ((flags & CURL_CSELECT_IN) && !s->released) {
    int one = 1;

    /* best effort: a socket that is not TCP refuses it, and that is all */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
  }
  check_done(h);
}

static int
socket_fn(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
  struct spot_http *h = userp;
  struct sock_ctx *s = socketp;
  int events = 0, r;

  if (what == CURL_POLL_REMOVE) {
    if (s != NULL) {
      curl_multi_assign(h->multi, fd, NULL);
      sock_release(s);
    }
    return 0;
  }
  if (s == NULL) {
    if (h->closing)
      return -1;
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
      log_err("http: out of memory for a socket context");
      return -1;
    }
    s->h = h;
    s->fd = fd;
    r = uv_poll_init_socket(h->loop, &s->poll, fd);
    if (r < 0) {
      log_err("http: uv_poll_init_socket fd=%d: %s", (int)fd, uv_strerror(r));
      free(s);
      return -1;
    }
    if (curl_multi_assign(h->multi, fd, s) != CURLM_OK) {
      log_err("http: curl_multi_assign fd=%d failed", (int)fd);
      h->pending_closes++;
      uv_close((uv_handle_t *)&s->poll, sock_close_cb);
      return -1;
    }
    s->next = h->socks;
    if (h->socks != NULL)
      h->socks->prev = s;
    h->socks = s;
  }
  if (what == CURL_POLL_IN || what == CURL_POLL_INOUT)
    events |= UV_READABLE;
  if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT)
    events |= UV_WRITABLE;
  r = uv_poll_start(&s->poll, events, poll_cb);
  if (r < 0) {
    log_err("http: uv_poll_start fd=%d: %s", (int)fd, uv_strerror(r));
    return -1;
  }
  return 0;
}

static void
timeout_cb(uv_timer_t *timer)
{
  struct spot_http *h = spot_container_of(timer, struct spot_http, timer);
  int running = 0;
  CURLMcode mc;

  mc = curl_multi_socket_action(h->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  if (mc != CURLM_OK)
    log_warn("http: curl_multi_socket_action: %s", curl_multi_strerror(mc));
  check_done(h);
}

static int
timer_fn(CURLM *multi, long timeout_ms, void *userp)
{
  struct spot_http *h = userp;
  int r;

  if (h->closing)
    return 0;
  if (timeout_ms < 0) {
    uv_timer_stop(&h->timer);
    return 0;
  }
  r = uv_timer_start(&h->timer, timeout_cb, (uint64_t)timeout_ms, 0);
  if (r < 0) {
    log_err("http: uv_timer_start: %s", uv_strerror(r));
    return -1;
  }
  return 0;
}

static struct xfer *
find_xfer(struct spot_http *h, CURL *easy)
{
  for (struct xfer *x = h->xfers; x != NULL; x = x->next)
    if (x->easy == easy)
      return x;
  return NULL;
}

/* Removes x from the multi and the list, frees it and runs its callback
 * (last, so the callback may reuse the easy handle or close h). */
static void
finish_xfer(struct spot_http *h, struct xfer *x, CURLcode rc)
{
  spot_http_done_cb cb = x->cb;
  void *data = x->data;
  CURL *easy = x->easy;
  CURLMcode mc;

  mc = curl_multi_remove_handle(h->multi, easy);
  if (mc != CURLM_OK)
    log_warn("http: curl_multi_remove_handle: %s", curl_multi_strerror(mc));
  /* a handful of transfers: a singly linked list is enough */
  for (struct xfer **pp = &h->xfers; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == x) {
      *pp = x->next;
      break;
    }
  }
  h->n_active--;
  free(x);
  cb(easy, rc, data);
}

static void
check_done(struct spot_http *h)
{
  CURLMsg *msg;
  int left;

  while (!h->closing && (msg = curl_multi_info_read(h->multi, &left)) != NULL) {
    struct xfer *x;

    if (msg->msg != CURLMSG_DONE)
      continue;
    x = find_xfer(h, msg->easy_handle);
    if (x == NULL) {
      log_warn("http: completion for an unknown transfer");
      continue;
    }
    finish_xfer(h, x, msg->data.result);
  }
}

int
spot_http_new(uv_loop_t *loop, struct spot_http **out)
{
  struct spot_http *h;
  int r;

  h = calloc(1, sizeof(*h));
  if (h == NULL)
    return -ENOMEM;
  h->loop = loop;
  h->multi = curl_multi_init();
  if (h->multi == NULL) {
    free(h);
    return -ENOMEM;
  }
  if (curl_multi_setopt(h->multi, CURLMOPT_SOCKETFUNCTION, socket_fn) !=
          CURLM_OK ||
      curl_multi_setopt(h->multi, CURLMOPT_SOCKETDATA, h) != CURLM_OK ||
      curl_multi_setopt(h->multi, CURLMOPT_TIMERFUNCTION, timer_fn) !=
          CURLM_OK ||
      curl_multi_setopt(h->multi, CURLMOPT_TIMERDATA, h) != CURLM_OK) {
    log_err("http: curl_multi_setopt failed");
    curl_multi_cleanup(h->multi);
    free(h);
    return -EINVAL;
  }
  r = uv_timer_init(loop, &h->timer);
  if (r < 0) {
    curl_multi_cleanup(h->multi);
    free(h);
    return r;
  }
  *out = h;
  return 0;
}

uv_loop_t *
spot_http_loop(const struct spot_http *h)
{
  return h->loop;
}

/* Every socket curl opens is close-on-exec: no child of spotd or spotctl
 * inherits a connection (children also close every descriptor above 2,
 * lib/io/child.c). */
static curl_socket_t
open_socket_cb(void *clientp, curlsocktype purpose, struct curl_sockaddr *a)
{
  (void)clientp;
  (void)purpose;
  return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

int
spot_http_add(struct spot_http *h, CURL *easy, spot_http_done_cb cb, void *data)
{
  struct xfer *x;
  CURLMcode mc;

  if (h->closing)
    return -ESHUTDOWN;
  if (easy == NULL || cb == NULL)
    return -EINVAL;
  if (find_xfer(h, easy) != NULL)
    return -EALREADY;
  if (curl_easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, open_socket_cb) !=
      CURLE_OK)
    return -EINVAL;
  x = calloc(1, sizeof(*x));
  if (x == NULL)
    return -ENOMEM;
  x->easy = easy;
  x->cb = cb;
  x->data = data;
  mc = curl_multi_add_handle(h->multi, easy);
  if (mc != CURLM_OK) {
    log_warn("http: curl_multi_add_handle: %s", curl_multi_strerror(mc));
    free(x);
    return mc == CURLM_OUT_OF_MEMORY ? -ENOMEM : -EINVAL;
  }
  x->next = h->xfers;
  h->xfers = x;
  h->n_active++;
  return 0;
}

void
spot_http_cancel(struct spot_http *h, CURL *easy)
{
  struct xfer *x = find_xfer(h, easy);

  if (x != NULL)
    finish_xfer(h, x, CURLE_ABORTED_BY_CALLBACK);
}

unsigned
spot_http_active(const struct spot_http *h)
{
  return h->n_active;
}

static void
timer_close_cb(uv_handle_t *handle)
{
  struct spot_http *h =
      spot_container_of((uv_timer_t *)handle, struct spot_http, timer);

  h->pending_closes--;
  maybe_free(h);
}

void
spot_http_close(struct spot_http *h, spot_http_close_cb cb, void *data)
{
  if (h == NULL || h->closing)
    return;
  /* From here spot_http_add() refuses, so the callbacks run below cannot
   * queue new transfers. */
  h->closing = true;
  while (h->xfers != NULL)
    finish_xfer(h, h->xfers, CURLE_ABORTED_BY_CALLBACK);
  h->close_cb = cb;
  h->close_data = data;
  h->pending_closes++; /* held while we tear down */
  /* Closes the cached connections; curl tells us CURL_POLL_REMOVE for
   * each socket it still watches. */
  curl_multi_cleanup(h->multi);
  h->multi = NULL;
  while (h->socks != NULL)
    sock_release(h->socks);
  uv_timer_stop(&h->timer);
  h->pending_closes++;
  uv_close((uv_handle_t *)&h->timer, timer_close_cb);
  h->pending_closes--;
}
