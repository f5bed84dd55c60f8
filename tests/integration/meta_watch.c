/* meta_watch: runs lib/meta against a metadata URL and prints one line per
 * event on stdout, for the integration tests and bench/idle_poll.sh.
 *
 *   meta_watch --provider auto|aws|gcp|azure [--url URL] [--poll-ms N]
 *              [--timeout-ms N] [--gcp-wait S] [--vm-name NAME]
 *              [--warn-after N] [--token-ttl S] [--imdsv1] [--lifecycle]
 *              [--ack] [--duration S]
 *
 * Lines: "provider NAME", "notice wall_ms=... kind=... reason=... id=...
 * deadline_wall_ms=... deadline=RFC3339", "warning TEXT", "warning-cleared",
 * "ack status=N", and last "loop_close=0". Stops on SIGINT/SIGTERM or
 * after --duration seconds; exits non-zero if the loop did not close. */
#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "core/log.h"
#include "core/util.h"
#include "io/http.h"
#include "io/meta.h"

struct watch {
  uv_loop_t loop;
  uv_signal_t sigint, sigterm;
  uv_timer_t duration;
  struct spot_http *http;
  struct spot_meta *meta;
  bool ack;
  bool stopping;
  bool had_warning;
  enum spot_provider last_provider;
};

static void
ack_cb(int status, void *data)
{
  printf("ack status=%d wall_ms=%" PRId64 "\n", status, spot_now_wall_ms());
  fflush(stdout);
}

static void
notice_cb(struct spot_meta *m, const struct spot_notice *n, void *data)
{
  struct watch *w = data;
  char when[32] = "none";
  int r;

  if (n->deadline_wall_ms != 0)
    spot_rfc3339_format(n->deadline_wall_ms, when, sizeof(when));
  printf("notice wall_ms=%" PRId64 " provider=%s kind=%s reason=%s id=%s "
         "deadline_wall_ms=%" PRId64 " deadline=%s deadline_in_ms=%" PRId64
         "\n",
         spot_now_wall_ms(), spot_provider_name(n->provider),
         spot_notice_kind_name(n->kind), n->reason, n->id, n->deadline_wall_ms,
         when,
         n->deadline_mono_ms != 0
             ? (int64_t)n->deadline_mono_ms - (int64_t)spot_now_mono_ms()
             : 0);
  fflush(stdout);
  if (w->ack && n->provider == SPOT_PROVIDER_AZURE) {
    r = spot_meta_ack(m, n->id, ack_cb, w);
    if (r < 0)
      printf("ack-error %d\n", r);
  }
}

static void
status_cb(struct spot_meta *m, void *data)
{
  struct watch *w = data;
  const char *warn = spot_meta_warning(m);

  if (spot_meta_provider(m) != w->last_provider) {
    w->last_provider = spot_meta_provider(m);
    printf("provider %s\n", spot_provider_name(w->last_provider));
  }
  if (warn != NULL && !w->had_warning)
    printf("warning %s\n", warn);
  else if (warn == NULL && w->had_warning)
    printf("warning-cleared\n");
  w->had_warning = warn != NULL;
  fflush(stdout);
}

static void
handle_closed_cb(uv_handle_t *h)
{
}

static void
http_closed_cb(void *data)
{
  struct watch *w = data;

  uv_close((uv_handle_t *)&w->sigint, handle_closed_cb);
  uv_close((uv_handle_t *)&w->sigterm, handle_closed_cb);
  uv_close((uv_handle_t *)&w->duration, handle_closed_cb);
}

static void
meta_closed_cb(void *data)
{
  struct watch *w = data;

  spot_http_close(w->http, http_closed_cb, w);
}

static void
stop(struct watch *w)
{
  if (w->stopping)
    return;
  w->stopping = true;
  uv_signal_stop(&w->sigint);
  uv_signal_stop(&w->sigterm);
  uv_timer_stop(&w->duration);
  spot_meta_close(w->meta, meta_closed_cb, w);
}

static void
signal_cb(uv_signal_t *s, int signum)
{
  struct watch *w = s->data;

  stop(w);
}

static void
duration_cb(uv_timer_t *t)
{
  stop(t->data);
}

static int
parse_u(const char *s, unsigned *out)
{
  int64_t v;

  if (spot_parse_int64(s, 0, 86400000, &v) < 0)
    return -EINVAL;
  *out = (unsigned)v;
  return 0;
}

int
main(int argc, char **argv)
{
  static const struct option opts[] = {
      {"provider", required_argument, NULL, 'p'},
      {"url", required_argument, NULL, 'u'},
      {"poll-ms", required_argument, NULL, 'i'},
      {"timeout-ms", required_argument, NULL, 't'},
      {"gcp-wait", required_argument, NULL, 'g'},
      {"vm-name", required_argument, NULL, 'n'},
      {"warn-after", required_argument, NULL, 'w'},
      {"token-ttl", required_argument, NULL, 'T'},
      {"imdsv1", no_argument, NULL, '1'},
      {"lifecycle", no_argument, NULL, 'l'},
      {"ack", no_argument, NULL, 'a'},
      {"duration", required_argument, NULL, 'd'},
      {"verbose", no_argument, NULL, 'v'},
      {NULL, 0, NULL, 0},
  };
  struct spot_meta_config cfg;
  struct watch w;
  unsigned duration = 0;
  int opt, r;

  memset(&w, 0, sizeof(w));
  spot_meta_config_init(&cfg);
  spot_log_init("meta_watch", SPOT_LOG_INFO);
  while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (opt) {
    case 'p':
      if (spot_provider_from_name(optarg, &cfg.provider) < 0)
        return 2;
      break;
    case 'u':
      cfg.base_url = optarg;
      break;
    case 'i':
      if (parse_u(optarg, &cfg.poll_interval_ms) < 0)
        return 2;
      break;
    case 't':
      if (parse_u(optarg, &cfg.http_timeout_ms) < 0)
        return 2;
      cfg.probe_timeout_ms = cfg.http_timeout_ms;
      break;
    case 'g':
      if (parse_u(optarg, &cfg.gcp_wait_sec) < 0)
        return 2;
      break;
    case 'n':
      cfg.vm_name = optarg;
      break;
    case 'w':
      if (parse_u(optarg, &cfg.warn_after) < 0)
        return 2;
      break;
    case 'T':
      if (parse_u(optarg, &cfg.token_ttl_sec) < 0)
        return 2;
      break;
    case '1':
      cfg.imdsv1_fallback = true;
      break;
    case 'l':
      cfg.aws_lifecycle = true;
      break;
    case 'a':
      w.ack = true;
      break;
    case 'd':
      if (parse_u(optarg, &duration) < 0)
        return 2;
      break;
    case 'v':
      spot_log_set_level(SPOT_LOG_DEBUG);
      break;
    default:
      return 2;
    }
  }
  cfg.status_cb = status_cb;

  curl_global_init(CURL_GLOBAL_DEFAULT);
  if (uv_loop_init(&w.loop) != 0)
    return 1;
  uv_signal_init(&w.loop, &w.sigint);
  uv_signal_init(&w.loop, &w.sigterm);
  uv_timer_init(&w.loop, &w.duration);
  w.sigint.data = w.sigterm.data = w.duration.data = &w;
  uv_signal_start(&w.sigint, signal_cb, SIGINT);
  uv_signal_start(&w.sigterm, signal_cb, SIGTERM);
  if (duration > 0)
    uv_timer_start(&w.duration, duration_cb, (uint64_t)duration * 1000, 0);

  r = spot_http_new(&w.loop, &w.http);
  if (r == 0)
    r = spot_meta_new(&w.loop, w.http, &cfg, notice_cb, &w, &w.meta);
  if (r == 0)
    r = spot_meta_start(w.meta);
  if (r < 0) {
    fprintf(stderr, "meta_watch: %s\n", strerror(-r));
    return 1;
  }
  printf("started wall_ms=%" PRId64 "\n", spot_now_wall_ms());
  w.last_provider = SPOT_PROVIDER_AUTO;
  status_cb(w.meta, &w); /* prints the provider unless auto */
  fflush(stdout);
  uv_run(&w.loop, UV_RUN_DEFAULT);
  r = uv_loop_close(&w.loop);
  printf("loop_close=%d\n", r);
  fflush(stdout);
  curl_global_cleanup();
  return r == 0 ? 0 : 1;
}
