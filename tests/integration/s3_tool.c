/* s3_tool: drives lib/s3 on a libuv loop, for the integration tests.
 *
 *   s3_tool [OPTIONS] put BUCKET KEY FILE [--if-none-match]
 *   s3_tool [OPTIONS] put-multipart BUCKET KEY FILE [--part-size N] [--parallel
 * P] s3_tool [OPTIONS] get BUCKET KEY OFF LEN OUT      (LEN 0 = to the end)
 *   s3_tool [OPTIONS] head BUCKET KEY
 *   s3_tool [OPTIONS] list BUCKET PREFIX [--max-keys N] [--delimiter D]
 *   s3_tool [OPTIONS] list-uploads BUCKET PREFIX
 *   s3_tool [OPTIONS] delete BUCKET KEY...
 *   s3_tool [OPTIONS] abort-test BUCKET KEY    (create, 2 parts, list parts,
 * abort) s3_tool [OPTIONS] sigcheck BUCKET KEY      (our SigV4 == what curl
 * sent) s3_tool [OPTIONS] cancel-test BUCKET KEY   (cancel while sending / in
 * backoff)
 *
 * OPTIONS: --retries N --backoff-ms N --connect-timeout-ms N --endpoint URL
 *          -v (debug log)
 * Endpoint and credentials come from SPOT_TEST_S3_ENDPOINT (or
 * AWS_ENDPOINT_URL), AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
 * AWS_SESSION_TOKEN and AWS_REGION. On failure one line on stderr:
 *   error: <spot_s3_strerror line> [err=-N ENAME retries=R]
 * and exit 1; exit 2 on usage errors. The loop must close cleanly. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "core/sigv4.h"
#include "core/util.h"
#include "io/http.h"
#include "io/s3.h"
#include "io/s3_internal.h"

#define MAX_PARTS_TOOL 10000

struct tool {
  uv_loop_t *loop;
  struct spot_http *http;
  struct spot_s3 *s3;
  struct spot_creds creds;
  struct spot_creds_provider provider;
  const char *region;
  int status; /* exit status */
  int pending;
  /* command state */
  const char *bucket, *key;
  const unsigned char *data;
  size_t size;
  /* multipart */
  char upload_id[1024];
  size_t part_size;
  int n_parts, next_part, parallel, in_flight, done_parts, max_in_flight;
  struct spot_s3_part_info *parts;
  bool failed;
  /* get */
  int out_fd;
  /* list */
  const char *prefix, *delimiter;
  unsigned max_keys;
  int pages;
  size_t n_listed;
  char *token;
  /* sigcheck */
  int sig_checked, sig_bad;
  /* abort-test / cancel-test */
  int step;
};

static const char *
errname(int err)
{
  switch (-err) {
  case EIO:
    return "EIO";
  case EACCES:
    return "EACCES";
  case ENOENT:
    return "ENOENT";
  case EEXIST:
    return "EEXIST";
  case EINVAL:
    return "EINVAL";
  case ECANCELED:
    return "ECANCELED";
  case EBUSY:
    return "EBUSY";
  case ERANGE:
    return "ERANGE";
  case EBADMSG:
    return "EBADMSG";
  default:
    return "E?";
  }
}

static void
report(struct tool *t, const struct spot_s3_result *res)
{
  char line[1024];

  fprintf(stderr, "error: %s [err=%d %s retries=%u]\n",
          spot_s3_strerror(res, line, sizeof(line)), res->err,
          errname(res->err), res->retries);
  t->status = 1;
}

static int
creds_get(struct spot_creds_provider *p, const struct spot_creds **out)
{
  struct tool *t = p->data;

  if (t->creds.access_key == NULL || t->creds.secret_key == NULL)
    return -ENOKEY;
  *out = &t->creds;
  return 0;
}

static int
map_file(struct tool *t, const char *path)
{
  struct stat st;
  int fd = open(path, O_RDONLY | O_CLOEXEC);

  if (fd < 0 || fstat(fd, &st) < 0) {
    fprintf(stderr, "error: %s: %s\n", path, strerror(errno));
    if (fd >= 0)
      close(fd);
    return -1;
  }
  t->size = (size_t)st.st_size;
  if (t->size > 0) {
    t->data = mmap(NULL, t->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (t->data == MAP_FAILED) {
      fprintf(stderr, "error: mmap %s: %s\n", path, strerror(errno));
      close(fd);
      return -1;
    }
  } else {
    t->data = (const unsigned char *)"";
  }
  close(fd);
  return 0;
}

/* ---- put / head / get ------------------------------------------------ */

static void
print_etag_cb(const struct spot_s3_result *res, void *data)
{
  struct tool *t = data;

  if (res->err < 0) {
    report(t, res);
    return;
  }
  printf("ok etag=%s length=%llu retries=%u\n", res->etag,
         (unsigned long long)res->content_length, res->retries);
}

static int
sink_cb(const void *p, size_t n, uint64_t offset, void *data)
{
  struct tool *t = data;
  const char *c = p;

  while (n > 0) {
    ssize_t w = pwrite(t->out_fd, c, n, (off_t)offset);

    if (w < 0)
      return -errno;
    c += w;
    n -= (size_t)w;
    offset += (uint64_t)w;
  }
  return 0;
}

/* ---- multipart --------------------------------------------------------- */

static void pump_parts(struct tool *t);

static void
complete_cb(const struct spot_s3_result *res, void *data)
{
  struct tool *t = data;

  if (res->err < 0) {
    report(t, res);
    return;
  }
  printf("ok parts=%d max_in_flight=%d etag=%s\n", t->n_parts, t->max_in_flight,
         res->etag);
}

static void
abort_after_failure_cb(const struct spot_s3_result *res, void *data)
{
  struct tool *t = data;

  if (res->err < 0)
    report(t, res);
}

static void
part_cb(const struct spot_s3_result *res, void *data)
{
  struct tool *t = data;
  int r;

  t->in_flight--;
  if (res->err < 0) {
    report(t, res);
    t->failed = true;
  } else {
    /* the part number is in the key of our bookkeeping: find by etag slot */
    t->done_parts++;
  }
  if (t->failed) {
    if (t->in_flight == 0) {
      r = spot_s3_mpu_abort(t->s3, t->bucket, t->key, t->upload_id,
                            abort_after_failure_cb, t, NULL);
      if (r < 0)
        t->status = 1;
    }
    return;
  }
  if (t->done_parts == t->n_parts) {
    r = spot_s3_mpu_complete(t->s3, t->bucket, t->key, t->upload_id, t->parts,
                             (size_t)t->n_parts, complete_cb, t, NULL);
    if (r < 0) {
      fprintf(stderr, "error: complete: %s\n", strerror(-r));
      t->status = 1;
    }
    return;
  }
  pump_parts(t);
}

struct part_ctx {
  struct tool *t;
  int index;
};

static void
part_ctx_cb(const struct spot_s3_result *res, void *data)
{
  struct part_ctx *pc = data;
  struct tool *t = pc->t;

  if (res->err == 0) {
    spot_strlcpy(t->parts[pc->index].etag, res->etag,
                 sizeof(t->parts[pc->index].etag));
    printf("part %d retries=%u etag=%s\n", pc->index + 1, res->retries,
           res->etag);
  }
  free(pc);
  part_cb(res, t);
}

static void
pump_parts(struct tool *t)
{
  while (!t->failed && t->in_flight < t->parallel &&
         t->next_part < t->n_parts) {
    int i = t->next_part++;
    size_t off = (size_t)i * t->part_size;
    size_t len = t->size - off < t->part_size ? t->size - off : t->part_size;
    struct part_ctx *pc = malloc(sizeof(*pc));
    int r;

    if (pc == NULL) {
      t->failed = true;
      t->status = 1;
      break;
    }
    pc->t = t;
    pc->index = i;
    t->parts[i].number = i + 1;
    t->parts[i].size = len;
    r = spot_s3_mpu_part(t->s3, t->bucket, t->key, t->upload_id, i + 1,
                         t->data + off, len, part_ctx_cb, pc, NULL);
    if (r < 0) {
      free(pc);
      fprintf(stderr, "error: part %d: %s\n", i + 1, strerror(-r));
      t->failed = true;
      t->status = 1;
      break;
    }
    t->in_flight++;
  }
  if (t->in_flight > t->max_in_flight)
    t->max_in_flight = t->in_flight;
}

static void
create_cb(const struct spot_s3_result *res, void *data)
{
  struct tool *t = data;

  if (res->err < 0) {
    report(t, res);
    return;
  }
  spot_strlcpy(t->upload_id, res->upload_id, sizeof(t->upload_id));
  printf("upload_id=%s\n", t->upload_id);
  pump_parts(t);
}

/* ---- list -------------------------------------------------------------- */

static void
list_cb(const struct spot_s3_result *res, void *data)
{
  struct tool *t = data;
  int r;

  if (res->err < 0) {
    report(t, res);
    return;
  }
  t->pages++;
  for (size_t i = 0; i < res->n_objects; i++)
    printf("key %s %llu\n", res->objects[i].key,
           (unsigned long long)res->objects[i].size);
  for (size_t i = 0; i < res->n_common_prefixes; i++)
    printf("prefix %s\n", res->common_prefixes[i]);
  t->n_listed += res->n_objects;
  if (res->next_token == NULL) {
    printf("pages %d objects %zu\n", t->pages, t->n_listed);
    return;
  }
  free(t->token);
  t->token = strdup(res->next_token);
  if (t->token == NULL) {
    t->status = 1;
    return;
  }
  r = spot_s3_list(t->s3, t->bucket, t->prefix, t->delimiter, t->token,
                   t->max_keys, list_cb, t, NULL);
  if (r < 0) {
    fprintf(stderr, "error: list: %s\n", strerror(-r));
    t->status = 1;
  }
}

static void
uploads_cb(const struct spot_s3_result *res, void *data)
{
  struct tool *t = data;

  if (res->err < 0) {
    report(t, res);
    return;
  }
  for (size_t i = 0; i < res->n_uploads; i++)
    printf("upload %s %s\n", res->uploads[i].key, res->uploads[i].upload_id);
  printf("uploads %zu\n", res->n_uploads);
}

static void
delete_cb(const struct spot_s3_result *res, void *data)
{
  struct tool *t = data;

  if (res->err < 0) {
    report(t, res);
    return;
  }
  for (size_t i = 0; i < res->n_failed_keys; i++)
    printf("failed %s\n", res->failed_keys[i]);
  printf("ok failed=%zu\n", res->n_failed_keys);
  if (res->n_failed_keys > 0)
    t->status = 1;
}

/* ---- abort-test: create, two parts, list parts, abort, check gone ------ */

static void abort_step_cb(const struct spot_s3_result *res, void *data);

static void
abort_next(struct tool *t)
{
  static const size_t psz = 5 * 1024 * 1024;
  int r = 0;

  switch (t->step) {
  case 0:
    r = spot_s3_mpu_create(t->s3, t->bucket, t->key, abort_step_cb, t, NULL);
    break;
  case 1:
  case 2:
    r = spot_s3_mpu_part(t->s3, t->bucket, t->key, t->upload_id, t->step,
                         t->data, psz, abort_step_cb, t, NULL);
    break;
  case 3:
    r = spot_s3_mpu_list_parts(t->s3, t->bucket, t->key, t->upload_id,
                               abort_step_cb, t, NULL);
    break;
  case 4:
    r = spot_s3_mpu_abort(t->s3, t->bucket, t->key, t->upload_id, abort_step_cb,
                          t, NULL);
    break;
  case 5:
    r = spot_s3_list_uploads(t->s3, t->bucket, t->key, abort_step_cb, t, NULL);
    break;
  case 6:
    r = spot_s3_head(t->s3, t->bucket, t->key, abort_step_cb, t, NULL);
    break;
  default:
    return;
  }
  if (r < 0) {
    fprintf(stderr, "error: step %d: %s\n", t->step, strerror(-r));
    t->status = 1;
  }
}

static void
abort_step_cb(const struct spot_s3_result *res, void *data)
{
  struct tool *t = data;

  if (t->step == 6) {
    /* after the abort nothing may be there */
    if (res->err != -ENOENT) {
      fprintf(stderr, "error: object exists after abort (err=%d)\n", res->err);
      t->status = 1;
      return;
    }
    printf("head after abort: ENOENT\nok\n");
    return;
  }
  if (res->err < 0) {
    report(t, res);
    return;
  }
  switch (t->step) {
  case 0:
    spot_strlcpy(t->upload_id, res->upload_id, sizeof(t->upload_id));
    printf("upload_id=%s\n", t->upload_id);
    break;
  case 3:
    printf("parts %zu\n", res->n_parts);
    if (res->n_parts != 2 || res->parts[0].number != 1 ||
        res->parts[1].number != 2 || res->parts[0].size != 5 * 1024 * 1024) {
      fprintf(stderr, "error: list parts gave %zu parts\n", res->n_parts);
      t->status = 1;
      return;
    }
    break;
  case 5:
    for (size_t i = 0; i < res->n_uploads; i++)
      if (strcmp(res->uploads[i].upload_id, t->upload_id) == 0) {
        fprintf(stderr, "error: upload still listed after abort\n");
        t->status = 1;
        return;
      }
    printf("uploads after abort: %zu\n", res->n_uploads);
    break;
  default:
    break;
  }
  t->step++;
  abort_next(t);
}

/* ---- sigcheck: recompute the Authorization curl sent ------------------- */

static char *
header_value(const char *headers, const char *name)
{
  size_t n = strlen(name);

  for (const char *l = headers; l != NULL && *l != '\0';) {
    const char *eol = strstr(l, "\r\n");
    size_t len = eol != NULL ? (size_t)(eol - l) : strlen(l);

    if (len > n && strncasecmp(l, name, n) == 0 && l[n] == ':') {
      const char *v = l + n + 1;

      while (*v == ' ')
        v++;
      return strndup(v, len - (size_t)(v - l));
    }
    l = eol != NULL ? eol + 2 : NULL;
  }
  return NULL;
}

static void
sig_hook(const char *raw, size_t len, void *data)
{
  struct tool *t = data;
  char *h = strndup(raw, len), *auth = NULL, *date = NULL, *sh = NULL;
  char method[16], target[4096];
  struct spot__sigv4_header hdrs[32];
  char *vals[32];
  size_t n = 0;
  struct spot_buf mine;
  const char *p;
  char *q, *names = NULL, *save = NULL;

  spot_buf_init(&mine, 8192);
  if (h == NULL || sscanf(h, "%15s %4095s", method, target) != 2)
    goto bad;
  auth = header_value(h, "Authorization");
  date = header_value(h, "x-amz-date");
  if (auth == NULL || date == NULL)
    goto bad;
  p = strstr(auth, "SignedHeaders=");
  if (p == NULL)
    goto bad;
  p += strlen("SignedHeaders=");
  names = strndup(p, strcspn(p, ","));
  sh = header_value(h, "x-amz-content-sha256");
  if (names == NULL || sh == NULL)
    goto bad;
  for (char *name = names; name != NULL && *name != '\0' && n < 32;
       name = save) {
    save = strchr(name, ';');
    if (save != NULL)
      *save++ = '\0';
    vals[n] = header_value(h, name);
    if (vals[n] == NULL)
      goto bad_vals;
    hdrs[n].name = name;
    hdrs[n].value = vals[n];
    n++;
  }
  q = strchr(target, '?');
  if (q != NULL)
    *q++ = '\0';
  {
    struct spot__sigv4_request req = {
        .method = method,
        .path = target,
        .query = q,
        .headers = hdrs,
        .n_headers = n,
        .payload_hash = sh,
    };

    if (spot__sigv4_authorization(t->creds.access_key, t->creds.secret_key,
                                  date, t->region, "s3", &req, &mine) < 0)
      goto bad_vals;
  }
  t->sig_checked++;
  if (strcmp(spot_buf_str(&mine), auth) != 0) {
    fprintf(stderr, "sigcheck: MISMATCH for %s %s\n  curl: %s\n  ours: %s\n",
            method, target, auth, spot_buf_str(&mine));
    t->sig_bad++;
  } else {
    printf("sigcheck: match %s %s%s%s (signed: %s)\n", method, target,
           q != NULL ? "?" : "", q != NULL ? q : "", p);
  }
  for (size_t i = 0; i < n; i++)
    free(vals[i]);
  goto out;
bad_vals:
  for (size_t i = 0; i < n; i++)
    free(vals[i]);
bad:
  fprintf(stderr, "sigcheck: could not read the request headers\n");
  t->sig_bad++;
out:
  spot_buf_fini(&mine);
  free(names);
  free(sh);
  free(auth);
  free(date);
  free(h);
}

static void sig_step_cb(const struct spot_s3_result *res, void *data);

static void
sig_next(struct tool *t)
{
  static const char body[] = "signed body \xe2\x82\xac";
  static struct spot_buf got;
  int r = 0;

  switch (t->step) {
  case 0:
    r = spot_s3_put(t->s3, t->bucket, t->key, body, sizeof(body) - 1, 0,
                    sig_step_cb, t, NULL);
    break;
  case 1:
    spot_buf_init(&got, 4096);
    r = spot_s3_get(t->s3, t->bucket, t->key, 2, 4, NULL, &got, sig_step_cb, t,
                    NULL);
    break;
  case 2:
    spot_buf_fini(&got);
    r = spot_s3_list(t->s3, t->bucket, t->key, "/", NULL, 7, sig_step_cb, t,
                     NULL);
    break;
  case 3:
    r = spot_s3_mpu_create(t->s3, t->bucket, t->key, sig_step_cb, t, NULL);
    break;
  case 4:
    r = spot_s3_mpu_abort(t->s3, t->bucket, t->key, t->upload_id, sig_step_cb,
                          t, NULL);
    break;
  case 5: {
    const char *keys[] = {t->key};

    r = spot_s3_delete_objects(t->s3, t->bucket, keys, 1, sig_step_cb, t, NULL);
    break;
  }
  default:
    if (t->sig_bad > 0 || t->sig_checked < 6) {
      fprintf(stderr, "error: sigcheck: %d checked, %d mismatched\n",
              t->sig_checked, t->sig_bad);
      t->status = 1;
    } else {
      printf("ok sigcheck %d requests\n", t->sig_checked);
    }
    return;
  }
  if (r < 0) {
    fprintf(stderr, "error: sigcheck step %d: %s\n", t->step, strerror(-r));
    t->status = 1;
  }
}

static void
sig_step_cb(const struct spot_s3_result *res, void *data)
{
  struct tool *t = data;

  if (res->err < 0) {
    report(t, res);
    return;
  }
  if (t->step == 3)
    spot_strlcpy(t->upload_id, res->upload_id, sizeof(t->upload_id));
  if (t->step == 2 &&
      (res->n_objects != 1 || strcmp(res->objects[0].key, t->key) != 0)) {
    fprintf(stderr, "error: listing by the key as prefix found %zu objects\n",
            res->n_objects);
    t->status = 1;
    return;
  }
  t->step++;
  sig_next(t);
}

/* ---- cancel-test -------------------------------------------------------- */

static void
cancelled_cb(const struct spot_s3_result *res, void *data)
{
  struct tool *t = data;

  t->pending--;
  if (res->err != -ECANCELED) {
    fprintf(stderr, "error: expected -ECANCELED, got %d\n", res->err);
    t->status = 1;
  } else {
    printf("cancelled ok (retries=%u)\n", res->retries);
  }
}

static void
free_handle_cb(uv_handle_t *handle)
{
  free(handle);
}

static void
cancel_timer_cb(uv_timer_t *timer)
{
  struct spot_s3_op *op = timer->data;

  spot_s3_cancel(op);
  uv_close((uv_handle_t *)timer, free_handle_cb);
}

static int
cancel_test(struct tool *t)
{
  static char big[1 << 20];
  struct spot_s3_op *op = NULL;
  uv_timer_t *timer;
  int r;

  /* 1: cancel right after starting (SENDING) */
  r = spot_s3_put(t->s3, t->bucket, t->key, big, sizeof(big), 0, cancelled_cb,
                  t, &op);
  if (r < 0)
    return r;
  t->pending++;
  spot_s3_cancel(op);
  /* The callback runs from the loop, never inside the cancel (s3.h);
   * uv_run() delivers it, and main() checks that every one came. */
  if (t->pending != 1) {
    fprintf(stderr, "error: the callback ran inside cancel\n");
    return -EIO;
  }
  /* 2: cancel later from a timer: when the endpoint is closed, the op is
   * then waiting in BACKOFF */
  r = spot_s3_head(t->s3, t->bucket, t->key, cancelled_cb, t, &op);
  if (r < 0)
    return r;
  t->pending++;
  timer = malloc(sizeof(*timer));
  if (timer == NULL)
    return -ENOMEM;
  uv_timer_init(t->loop, timer);
  timer->data = op;
  uv_timer_start(timer, cancel_timer_cb, 150, 0);
  return 0;
}

/* ---- main --------------------------------------------------------------- */

static void
usage(void)
{
  fprintf(stderr,
          "usage: s3_tool [--retries N] [--backoff-ms N] "
          "[--connect-timeout-ms N] [--endpoint URL] [-v] COMMAND ...\n"
          "  (see the comment at the top of tests/integration/s3_tool.c)\n");
  exit(2);
}

static long
num(const char *s)
{
  int64_t v;

  if (spot_parse_int64(s, 0, INT64_MAX, &v) < 0) {
    fprintf(stderr, "error: not a number: %s\n", s);
    exit(2);
  }
  return (long)v;
}

int
main(int argc, char **argv)
{
  struct tool t;
  struct spot_s3_config cfg;
  const char *endpoint = getenv("SPOT_TEST_S3_ENDPOINT");
  const char *cmd;
  int i = 1, r = 0;

  memset(&t, 0, sizeof(t));
  memset(&cfg, 0, sizeof(cfg));
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return 1;
  spot_log_init("s3_tool", SPOT_LOG_INFO);
  if (endpoint == NULL)
    endpoint = getenv("AWS_ENDPOINT_URL");
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (strcmp(argv[i], "-v") == 0) {
      spot_log_set_level(SPOT_LOG_DEBUG);
      continue;
    }
    /* every other option takes a value */
    if (i + 1 >= argc)
      usage();
    if (strcmp(argv[i], "--retries") == 0)
      cfg.max_retries = (unsigned)num(argv[++i]);
    else if (strcmp(argv[i], "--backoff-ms") == 0)
      cfg.retry_base_ms = cfg.retry_cap_ms = (uint64_t)num(argv[++i]);
    else if (strcmp(argv[i], "--connect-timeout-ms") == 0)
      cfg.connect_timeout_ms = num(argv[++i]);
    else if (strcmp(argv[i], "--endpoint") == 0)
      endpoint = argv[++i];
    else
      usage();
  }
  if (i >= argc)
    usage();
  cmd = argv[i++];
  if (endpoint == NULL) {
    fprintf(stderr, "error: SPOT_TEST_S3_ENDPOINT is not set\n");
    return 2;
  }
  t.region = getenv("AWS_REGION") != NULL ? getenv("AWS_REGION") : "us-east-1";
  t.creds.access_key = getenv("AWS_ACCESS_KEY_ID");
  t.creds.secret_key = getenv("AWS_SECRET_ACCESS_KEY");
  t.creds.session_token = getenv("AWS_SESSION_TOKEN");
  t.provider.get = creds_get;
  t.provider.data = &t;
  cfg.endpoint = endpoint;
  cfg.region = t.region;
  cfg.path_style = true;
  cfg.creds = &t.provider;
  t.out_fd = -1;
  t.part_size = 8 * 1024 * 1024;
  t.parallel = 4;

  t.loop = malloc(sizeof(*t.loop));
  assert(t.loop != NULL);
  assert(uv_loop_init(t.loop) == 0);
  r = spot_http_new(t.loop, &t.http);
  assert(r == 0);
  r = spot_s3_new(t.http, &cfg, &t.s3);
  if (r < 0) {
    fprintf(stderr, "error: s3 config: %s\n", strerror(-r));
    t.status = 2;
    goto out;
  }

  if (strcmp(cmd, "put") == 0 && argc - i >= 3) {
    unsigned flags = 0;

    t.bucket = argv[i];
    t.key = argv[i + 1];
    if (argc - i >= 4 && strcmp(argv[i + 3], "--if-none-match") == 0)
      flags |= SPOT_S3_IF_NONE_MATCH;
    if (map_file(&t, argv[i + 2]) < 0) {
      t.status = 1;
      goto out;
    }
    r = spot_s3_put(t.s3, t.bucket, t.key, t.data, t.size, flags, print_etag_cb,
                    &t, NULL);
  } else if (strcmp(cmd, "put-multipart") == 0 && argc - i >= 3) {
    t.bucket = argv[i];
    t.key = argv[i + 1];
    if (map_file(&t, argv[i + 2]) < 0) {
      t.status = 1;
      goto out;
    }
    for (int j = i + 3; j + 1 < argc; j += 2) {
      if (strcmp(argv[j], "--part-size") == 0)
        t.part_size = (size_t)num(argv[j + 1]);
      else if (strcmp(argv[j], "--parallel") == 0)
        t.parallel = (int)num(argv[j + 1]);
      else
        usage();
    }
    if (t.part_size == 0 || t.parallel < 1)
      usage();
    t.n_parts = (int)((t.size + t.part_size - 1) / t.part_size);
    if (t.n_parts < 1 || t.n_parts > MAX_PARTS_TOOL)
      usage();
    t.parts = calloc((size_t)t.n_parts, sizeof(*t.parts));
    assert(t.parts != NULL);
    r = spot_s3_mpu_create(t.s3, t.bucket, t.key, create_cb, &t, NULL);
  } else if (strcmp(cmd, "get") == 0 && argc - i == 5) {
    t.bucket = argv[i];
    t.key = argv[i + 1];
    t.out_fd =
        open(argv[i + 4], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (t.out_fd < 0) {
      fprintf(stderr, "error: %s: %s\n", argv[i + 4], strerror(errno));
      t.status = 1;
      goto out;
    }
    r = spot_s3_get(t.s3, t.bucket, t.key, (uint64_t)num(argv[i + 2]),
                    (uint64_t)num(argv[i + 3]), sink_cb, NULL, print_etag_cb,
                    &t, NULL);
  } else if (strcmp(cmd, "head") == 0 && argc - i == 2) {
    r = spot_s3_head(t.s3, argv[i], argv[i + 1], print_etag_cb, &t, NULL);
  } else if (strcmp(cmd, "list") == 0 && argc - i >= 2) {
    t.bucket = argv[i];
    t.prefix = argv[i + 1];
    for (int j = i + 2; j + 1 < argc; j += 2) {
      if (strcmp(argv[j], "--max-keys") == 0)
        t.max_keys = (unsigned)num(argv[j + 1]);
      else if (strcmp(argv[j], "--delimiter") == 0)
        t.delimiter = argv[j + 1];
      else
        usage();
    }
    r = spot_s3_list(t.s3, t.bucket, t.prefix, t.delimiter, NULL, t.max_keys,
                     list_cb, &t, NULL);
  } else if (strcmp(cmd, "list-uploads") == 0 && argc - i == 2) {
    r = spot_s3_list_uploads(t.s3, argv[i], argv[i + 1], uploads_cb, &t, NULL);
  } else if (strcmp(cmd, "delete") == 0 && argc - i >= 2) {
    r = spot_s3_delete_objects(t.s3, argv[i], (const char *const *)&argv[i + 1],
                               (size_t)(argc - i - 1), delete_cb, &t, NULL);
  } else if (strcmp(cmd, "abort-test") == 0 && argc - i == 2) {
    static unsigned char part[5 * 1024 * 1024];

    memset(part, 'a', sizeof(part));
    t.bucket = argv[i];
    t.key = argv[i + 1];
    t.data = part;
    abort_next(&t);
  } else if (strcmp(cmd, "sigcheck") == 0 && argc - i == 2) {
    t.bucket = argv[i];
    t.key = argv[i + 1];
    spot__s3_set_request_hook(t.s3, sig_hook, &t);
    sig_next(&t);
  } else if (strcmp(cmd, "cancel-test") == 0 && argc - i == 2) {
    t.bucket = argv[i];
    t.key = argv[i + 1];
    r = cancel_test(&t);
  } else {
    usage();
  }
  if (r < 0) {
    fprintf(stderr, "error: %s: %s\n", cmd, strerror(-r));
    t.status = 1;
  }
  uv_run(t.loop, UV_RUN_DEFAULT);
  if (strcmp(cmd, "cancel-test") == 0 && t.pending != 0) {
    fprintf(stderr, "error: %d cancelled callbacks never came from the loop\n",
            t.pending);
    t.status = 1;
  }

out:
  spot_s3_free(t.s3);
  spot_http_close(t.http, NULL, NULL);
  uv_run(t.loop, UV_RUN_DEFAULT);
  /* a leaked handle fails the test */
  r = uv_loop_close(t.loop);
  if (r != 0) {
    fprintf(stderr, "error: uv_loop_close: %s\n", uv_strerror(r));
    t.status = 3;
  }
  free(t.loop);
  if (t.out_fd >= 0)
    close(t.out_fd);
  if (t.data != NULL && t.size > 0 && strcmp(cmd, "abort-test") != 0)
    munmap((void *)t.data, t.size);
  free(t.parts);
  free(t.token);
  curl_global_cleanup();
  return t.status;
}
