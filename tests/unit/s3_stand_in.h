/* For unit tests of lib/io: an S3 stand-in on the test's own loop, and a
 * loop, http and S3 client pointed at it (no network beyond loopback).
 * Include it after cmocka-compat.h: failures are cmocka assertions. */
#ifndef SPOT_TEST_S3_STAND_IN_H
#define SPOT_TEST_S3_STAND_IN_H

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "core/util.h"
#include "io/http.h"
#include "io/s3.h"

/* An S3 stand-in on the test's own loop: every request but a PUT gets an
 * empty 404 (no such key, no uploads), a PUT gets no answer at all, and the
 * first PUT's headers call on_put, so a test cancels exactly while a PUT is
 * on the wire. */
struct stand_in {
  uv_tcp_t listener;
  struct sockaddr_in addr;
  void (*on_put)(struct stand_in *si);
  int puts;
  int conns_open;
  uv_tcp_t *conns[8];
  size_t nconns;
};

struct conn {
  uv_tcp_t tcp;
  struct stand_in *si;
  char buf[8192];
  size_t len;
};

static const char not_found[] =
    "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";

static inline void
alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
  struct conn *c = h->data;

  (void)hint;
  b->base = c->buf + c->len;
  b->len = sizeof(c->buf) - 1 - c->len;
}

static inline void
conn_closed_cb(uv_handle_t *h)
{
  struct conn *c = h->data;

  c->si->conns_open--;
  free(c);
}

static inline void
write_cb(uv_write_t *w, int status)
{
  (void)status;
  free(w);
}

static inline void
read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
  struct conn *c = s->data;
  char *end;

  (void)b;
  if (n < 0) {
    uv_close((uv_handle_t *)s, conn_closed_cb);
    return;
  }
  c->len += (size_t)n;
  c->buf[c->len] = '\0';
  while ((end = strstr(c->buf, "\r\n\r\n")) != NULL) {
    size_t used = (size_t)(end + 4 - c->buf);

    if (strncmp(c->buf, "PUT ", 4) == 0) {
      /* never answered: the PUT stays in flight until cancelled */
      if (c->si->puts++ == 0 && c->si->on_put != NULL)
        c->si->on_put(c->si);
      uv_read_stop(s);
      return;
    }
    uv_write_t *w = malloc(sizeof(*w));
    uv_buf_t out = uv_buf_init((char *)not_found, sizeof(not_found) - 1);

    assert_non_null(w);
    assert_int_equal(uv_write(w, s, &out, 1, write_cb), 0);
    memmove(c->buf, c->buf + used, c->len - used + 1);
    c->len -= used;
  }
  assert_true(c->len < sizeof(c->buf) - 1);
}

static inline void
accept_cb(uv_stream_t *server, int status)
{
  struct stand_in *si = server->data;
  struct conn *c = calloc(1, sizeof(*c));

  assert_int_equal(status, 0);
  assert_non_null(c);
  c->si = si;
  assert_int_equal(uv_tcp_init(server->loop, &c->tcp), 0);
  c->tcp.data = c;
  si->conns_open++;
  assert_int_equal(uv_accept(server, (uv_stream_t *)&c->tcp), 0);
  assert_true(si->nconns < sizeof(si->conns) / sizeof(si->conns[0]));
  si->conns[si->nconns++] = &c->tcp;
  assert_int_equal(uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb), 0);
}

static inline void
stand_in_start(uv_loop_t *loop, struct stand_in *si)
{
  int len = sizeof(si->addr);

  assert_int_equal(uv_tcp_init(loop, &si->listener), 0);
  si->listener.data = si;
  assert_int_equal(uv_ip4_addr("127.0.0.1", 0, &si->addr), 0);
  assert_int_equal(
      uv_tcp_bind(&si->listener, (const struct sockaddr *)&si->addr, 0), 0);
  assert_int_equal(
      uv_tcp_getsockname(&si->listener, (struct sockaddr *)&si->addr, &len), 0);
  assert_int_equal(uv_listen((uv_stream_t *)&si->listener, 8, accept_cb), 0);
}

static inline void
stand_in_stop(struct stand_in *si)
{
  uv_close((uv_handle_t *)&si->listener, NULL);
  for (size_t i = 0; i < si->nconns; i++)
    if (!uv_is_closing((uv_handle_t *)si->conns[i]))
      uv_close((uv_handle_t *)si->conns[i], conn_closed_cb);
}

static inline int
test_creds(struct spot_creds_provider *p, const struct spot_creds **out)
{
  static const struct spot_creds c = {(char *)"AKIDTEST", (char *)"secret",
                                      NULL, 0};

  (void)p;
  *out = &c;
  return 0;
}

/* One test's world: loop, http, S3 client on the stand-in. */
struct world {
  uv_loop_t loop;
  struct spot_http *http;
  struct spot_s3 *s3;
  struct stand_in si;
  struct spot_creds_provider creds;
  char endpoint[64];
  /* what the test watches */
  struct spot_s3_op *s3op;
  struct spot_store_op *storeop;
  struct spot_lease *lease;
  int calls, err;
  int calls_when_cancel_returned;
};

static inline void
world_init(struct world *w)
{
  struct spot_s3_config sc;

  memset(w, 0, sizeof(*w));
  w->calls_when_cancel_returned = -1;
  assert_int_equal(uv_loop_init(&w->loop), 0);
  stand_in_start(&w->loop, &w->si);
  snprintf(w->endpoint, sizeof(w->endpoint), "http://127.0.0.1:%d",
           ntohs(w->si.addr.sin_port));
  assert_int_equal(spot_http_new(&w->loop, &w->http), 0);
  w->creds.get = test_creds;
  memset(&sc, 0, sizeof(sc));
  sc.endpoint = w->endpoint;
  sc.region = "us-east-1";
  sc.path_style = true;
  sc.creds = &w->creds;
  sc.max_retries = 1;
  assert_int_equal(spot_s3_new(w->http, &sc, &w->s3), 0);
}

static inline void
world_fini(struct world *w)
{
  spot_s3_free(w->s3);
  spot_http_close(w->http, NULL, NULL);
  stand_in_stop(&w->si);
  assert_int_equal(uv_run(&w->loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(w->si.conns_open, 0);
  assert_int_equal(uv_loop_close(&w->loop), 0);
}

#endif
