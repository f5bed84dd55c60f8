/* Test driver: resolves the AWS chain (lib/aws.h) on a uv loop and prints
 * which source won, the key id, SHA-256 prefixes of the key id and the
 * secret (never the secret itself), region and endpoint. With --watch-ms
 * it keeps the loop running, polls the credentials provider the way the S3
 * client does and prints each refreshed key id. Ends by closing every
 * handle and requiring uv_loop_close() == 0.
 *
 * Exit: 0 ok, 1 the chain failed (message on stderr), 2 usage,
 * 3 the loop did not close cleanly, 4 fewer refreshes than --want-refreshes.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <uv.h>

#include "core/log.h"
#include "core/util.h"
#include "io/aws.h"
#include "io/http.h"

struct driver {
  uv_loop_t loop;
  struct spot_http *http;
  struct spot_aws *aws;
  uv_timer_t poll;
  uint64_t watch_ms;
  uint64_t started_ms;
  unsigned want_refreshes;
  unsigned seen_refreshes;
  char last_key_id[256];
  int status;
};

static void
sha256_prefix(const char *s, char *out, size_t outlen)
{
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  size_t i;

  if (EVP_Digest(s, strlen(s), md, &n, EVP_sha256(), NULL) != 1)
    n = 0;
  for (i = 0; i < n && i * 2 + 2 < outlen && i < 6; i++)
    snprintf(out + i * 2, outlen - i * 2, "%02x", md[i]);
  out[i * 2] = '\0';
}

static void
print_creds(const char *what, const struct spot_creds *c)
{
  char kh[16], sh[16], when[32] = "never";

  sha256_prefix(c->access_key, kh, sizeof(kh));
  sha256_prefix(c->secret_key, sh, sizeof(sh));
  if (c->expires_ms != 0)
    spot_rfc3339_format(c->expires_ms, when, sizeof(when));
  printf("%s key_id=%s key_id_sha256=%s secret_sha256=%s session_token=%s "
         "expires=%s\n",
         what, c->access_key, kh, sh, c->session_token != NULL ? "yes" : "no",
         when);
  fflush(stdout);
}

static void
http_closed_cb(void *data)
{
}

static void
aws_closed_cb(void *data)
{
  struct driver *d = data;

  spot_http_close(d->http, http_closed_cb, NULL);
}

static void
shutdown_all(struct driver *d)
{
  if (!uv_is_closing((uv_handle_t *)&d->poll))
    uv_close((uv_handle_t *)&d->poll, NULL);
  spot_aws_close(d->aws, aws_closed_cb, d);
}

static void
poll_cb(uv_timer_t *t)
{
  struct driver *d = spot_container_of(t, struct driver, poll);
  struct spot_creds_provider *p = spot_aws_creds_provider(d->aws);
  const struct spot_creds *c;

  if (p->get(p, &c) == 0 && strcmp(c->access_key, d->last_key_id) != 0) {
    d->seen_refreshes++;
    spot_strlcpy(d->last_key_id, c->access_key, sizeof(d->last_key_id));
    print_creds("refresh", c);
  }
  if ((d->want_refreshes > 0 && d->seen_refreshes >= d->want_refreshes) ||
      spot_now_mono_ms() - d->started_ms >= d->watch_ms) {
    if (p->get(p, &c) == 0)
      print_creds("final", c);
    printf("refreshes=%u refresh_count=%u\n", d->seen_refreshes,
           spot_aws_refresh_count(d->aws));
    fflush(stdout);
    if (d->seen_refreshes < d->want_refreshes)
      d->status = 4;
    shutdown_all(d);
  }
}

static void
ready_cb(int err, const char *msg, void *data)
{
  struct driver *d = data;
  struct spot_creds_provider *p;
  const struct spot_creds *c;

  if (err < 0) {
    fprintf(stderr, "aws_creds: %s\n", msg);
    d->status = 1;
    shutdown_all(d);
    return;
  }
  p = spot_aws_creds_provider(d->aws);
  if (p->get(p, &c) < 0) {
    fprintf(stderr, "aws_creds: provider has no credentials after ready\n");
    d->status = 1;
    shutdown_all(d);
    return;
  }
  printf("source=%s region=%s endpoint=%s path_style=%d\n",
         spot_aws_source_name(spot_aws_source(d->aws)), spot_aws_region(d->aws),
         spot_aws_endpoint(d->aws), spot_aws_path_style(d->aws));
  print_creds("initial", c);
  spot_strlcpy(d->last_key_id, c->access_key, sizeof(d->last_key_id));
  if (d->watch_ms == 0) {
    shutdown_all(d);
    return;
  }
  d->started_ms = spot_now_mono_ms();
  uv_timer_start(&d->poll, poll_cb, 100, 100);
}

static int
usage(void)
{
  fprintf(stderr,
          "usage: aws_creds [--endpoint URL] [--region R] [--profile P]\n"
          "                 [--imds-url URL] [--no-imds] [--timeout-ms N]\n"
          "                 [--watch-ms N] [--want-refreshes N] [-v]\n");
  return 2;
}

int
main(int argc, char **argv)
{
  static const struct option longopts[] = {
      {"endpoint", required_argument, NULL, 'e'},
      {"region", required_argument, NULL, 'r'},
      {"profile", required_argument, NULL, 'p'},
      {"imds-url", required_argument, NULL, 'i'},
      {"no-imds", no_argument, NULL, 'n'},
      {"timeout-ms", required_argument, NULL, 't'},
      {"watch-ms", required_argument, NULL, 'w'},
      {"want-refreshes", required_argument, NULL, 'W'},
      {"verbose", no_argument, NULL, 'v'},
      {NULL, 0, NULL, 0},
  };
  struct spot_aws_options o = {0};
  struct driver d;
  int64_t v;
  int c, r, level = SPOT_LOG_INFO;

  memset(&d, 0, sizeof(d));
  while ((c = getopt_long(argc, argv, "v", longopts, NULL)) != -1) {
    switch (c) {
    case 'e':
      o.endpoint = optarg;
      break;
    case 'r':
      o.region = optarg;
      break;
    case 'p':
      o.profile = optarg;
      break;
    case 'i':
      o.imds_url = optarg;
      break;
    case 'n':
      o.imds_disabled = true;
      break;
    case 't':
      if (spot_parse_int64(optarg, 1, 60000, &v) < 0)
        return usage();
      o.imds_timeout_ms = (long)v;
      break;
    case 'w':
      if (spot_parse_int64(optarg, 0, 600000, &v) < 0)
        return usage();
      d.watch_ms = (uint64_t)v;
      break;
    case 'W':
      if (spot_parse_int64(optarg, 0, 1000, &v) < 0)
        return usage();
      d.want_refreshes = (unsigned)v;
      break;
    case 'v':
      level = SPOT_LOG_DEBUG;
      break;
    default:
      return usage();
    }
  }
  if (optind != argc)
    return usage();
  spot_log_init("aws_creds", level);

  if (uv_loop_init(&d.loop) != 0 || uv_timer_init(&d.loop, &d.poll) != 0)
    return 3;
  r = spot_http_new(&d.loop, &d.http);
  if (r < 0) {
    fprintf(stderr, "aws_creds: spot_http_new: %s\n", strerror(-r));
    return 1;
  }
  r = spot_aws_new(&d.loop, d.http, &o, &d.aws);
  if (r < 0) {
    fprintf(stderr, "aws_creds: spot_aws_new: %s\n", strerror(-r));
    uv_close((uv_handle_t *)&d.poll, NULL);
    spot_http_close(d.http, http_closed_cb, NULL);
    uv_run(&d.loop, UV_RUN_DEFAULT);
    return uv_loop_close(&d.loop) == 0 ? 1 : 3;
  }
  r = spot_aws_start(d.aws, ready_cb, &d);
  if (r < 0) {
    fprintf(stderr, "aws_creds: spot_aws_start: %s\n", strerror(-r));
    d.status = 1;
    shutdown_all(&d);
  }
  uv_run(&d.loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&d.loop) != 0) {
    fprintf(stderr, "aws_creds: uv_loop_close: handles left open\n");
    return 3;
  }
  return d.status;
}
