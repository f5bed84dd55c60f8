/* AWS Signature Version 4 canonical forms and signature. Pure. */
#include "core/sigv4.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#define SIGV4_ALGO "AWS4-HMAC-SHA256"
#define SIGV4_MAX_PARAMS 256
#define SIGV4_MAX_HEADERS 64
#define SIGV4_CAP (1024 * 1024)

static bool
is_unreserved(unsigned char c)
{
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
         (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
}

int
spot__uri_encode_n(const char *p, size_t n, bool keep_slash,
                   struct spot_buf *out)
{
  static const char hex[] = "0123456789ABCDEF";

  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)p[i];
    int r;

    if (is_unreserved(c) || (keep_slash && c == '/')) {
      r = spot_buf_append(out, &p[i], 1);
    } else {
      char esc[3] = {'%', hex[c >> 4], hex[c & 15]};

      r = spot_buf_append(out, esc, 3);
    }
    if (r < 0)
      return r;
  }
  return 0;
}

static int
hexval(char c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

int
spot__uri_decode_n(const char *p, size_t n, struct spot_buf *out)
{
  for (size_t i = 0; i < n; i++) {
    char c = p[i];
    int r;

    if (c == '%') {
      int hi, lo;

      if (n - i < 3)
        return -EINVAL;
      hi = hexval(p[i + 1]);
      lo = hexval(p[i + 2]);
      if (hi < 0 || lo < 0)
        return -EINVAL;
      c = (char)(hi << 4 | lo);
      i += 2;
    }
    r = spot_buf_append(out, &c, 1);
    if (r < 0)
      return r;
  }
  return 0;
}

/* decode then encode: idempotent on already-canonical input */
static int
reencode(const char *p, size_t n, bool keep_slash, struct spot_buf *out)
{
  struct spot_buf tmp;
  int r;

  spot_buf_init(&tmp, SIGV4_CAP);
  r = spot__uri_decode_n(p, n, &tmp);
  if (r == 0)
    r = spot__uri_encode_n(tmp.data != NULL ? tmp.data : "", tmp.len,
                           keep_slash, out);
  spot_buf_fini(&tmp);
  return r;
}

struct param {
  char *name;
  char *value;
};

static int
param_cmp(const void *a, const void *b)
{
  const struct param *x = a, *y = b;
  int c = strcmp(x->name, y->name);

  return c != 0 ? c : strcmp(x->value, y->value);
}

int
spot__sigv4_canonical_query(const char *query, struct spot_buf *out)
{
  struct param params[SIGV4_MAX_PARAMS];
  size_t n = 0;
  const char *p = query;
  int r = 0;

  if (query == NULL || query[0] == '\0')
    return 0;
  while (r == 0 && *p != '\0') {
    const char *amp = strchr(p, '&');
    size_t len = amp != NULL ? (size_t)(amp - p) : strlen(p);
    const char *eq = memchr(p, '=', len);
    size_t nlen = eq != NULL ? (size_t)(eq - p) : len;
    struct spot_buf name, value;

    if (len > 0) {
      if (n == SIGV4_MAX_PARAMS) {
        r = -E2BIG;
        break;
      }
      spot_buf_init(&name, SIGV4_CAP);
      spot_buf_init(&value, SIGV4_CAP);
      r = reencode(p, nlen, false, &name);
      if (r == 0 && eq != NULL)
        r = reencode(eq + 1, len - nlen - 1, false, &value);
      params[n].name = spot_buf_steal(&name);
      params[n].value = spot_buf_steal(&value);
      spot_buf_fini(&name);
      spot_buf_fini(&value);
      if (params[n].name == NULL || params[n].value == NULL) {
        free(params[n].name);
        free(params[n].value);
        r = r < 0 ? r : -ENOMEM;
        break;
      }
      n++;
    }
    p += len;
    if (*p == '&')
      p++;
  }
  if (r == 0) {
    qsort(params, n, sizeof(params[0]), param_cmp);
    for (size_t i = 0; r == 0 && i < n; i++)
      r = spot_buf_printf(out, "%s%s=%s", i > 0 ? "&" : "", params[i].name,
                          params[i].value);
  }
  for (size_t i = 0; i < n; i++) {
    free(params[i].name);
    free(params[i].value);
  }
  return r;
}

struct hdr {
  char name[128];
  const char *value;
  size_t index;
};

static int
hdr_cmp(const void *a, const void *b)
{
  const struct hdr *x = a, *y = b;
  int c = strcmp(x->name, y->name);

  if (c != 0)
    return c;
  return x->index < y->index ? -1 : x->index > y->index;
}

/* value trimmed, inner runs of spaces collapsed to one */
static int
append_trimmed(struct spot_buf *out, const char *v)
{
  bool space = false;
  int r = 0;

  while (*v == ' ' || *v == '\t')
    v++;
  for (; r == 0 && *v != '\0'; v++) {
    if (*v == ' ' || *v == '\t') {
      space = true;
      continue;
    }
    if (space)
      r = spot_buf_append(out, " ", 1);
    space = false;
    if (r == 0)
      r = spot_buf_append(out, v, 1);
  }
  return r;
}

int
spot__sigv4_canonical_request(const struct spot__sigv4_request *req,
                              struct spot_buf *out,
                              struct spot_buf *signed_headers)
{
  struct hdr hdrs[SIGV4_MAX_HEADERS];
  struct spot_buf names;
  const char *path =
      req->path != NULL && req->path[0] != '\0' ? req->path : "/";
  int r;

  if (req->n_headers > SIGV4_MAX_HEADERS)
    return -E2BIG;
  for (size_t i = 0; i < req->n_headers; i++) {
    size_t len = strlen(req->headers[i].name);

    if (len == 0 || len >= sizeof(hdrs[i].name))
      return -EINVAL;
    for (size_t j = 0; j <= len; j++) {
      char c = req->headers[i].name[j];

      hdrs[i].name[j] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    hdrs[i].value = req->headers[i].value;
    hdrs[i].index = i;
  }
  qsort(hdrs, req->n_headers, sizeof(hdrs[0]), hdr_cmp);

  r = spot_buf_printf(out, "%s\n", req->method);
  if (r == 0)
    r = reencode(path, strlen(path), true, out);
  if (r == 0)
    r = spot_buf_appends(out, "\n");
  if (r == 0)
    r = spot__sigv4_canonical_query(req->query, out);
  if (r == 0)
    r = spot_buf_appends(out, "\n");
  spot_buf_init(&names, 8192);
  for (size_t i = 0; r == 0 && i < req->n_headers; i++) {
    bool same = i > 0 && strcmp(hdrs[i].name, hdrs[i - 1].name) == 0;

    if (same) {
      r = spot_buf_appends(out, ",");
    } else {
      if (i > 0)
        r = spot_buf_appends(out, "\n");
      if (r == 0)
        r = spot_buf_printf(out, "%s:", hdrs[i].name);
      if (r == 0)
        r = spot_buf_printf(&names, "%s%s", i > 0 ? ";" : "", hdrs[i].name);
    }
    if (r == 0)
      r = append_trimmed(out, hdrs[i].value);
  }
  if (r == 0)
    r = spot_buf_printf(out, "\n\n%s\n%s", spot_buf_str(&names),
                        req->payload_hash);
  if (r == 0 && signed_headers != NULL)
    r = spot_buf_appends(signed_headers, spot_buf_str(&names));
  spot_buf_fini(&names);
  return r;
}

void
spot__sha256_hex(const void *p, size_t n, char hex[65])
{
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;

  if (EVP_Digest(p, n, md, &mdlen, EVP_sha256(), NULL) != 1 || mdlen != 32) {
    hex[0] = '\0';
    return;
  }
  for (unsigned i = 0; i < 32; i++) {
    static const char digits[] = "0123456789abcdef";

    hex[2 * i] = digits[md[i] >> 4];
    hex[2 * i + 1] = digits[md[i] & 15];
  }
  hex[64] = '\0';
}

static bool
valid_amz_date(const char *d)
{
  if (strlen(d) != 16 || d[8] != 'T' || d[15] != 'Z')
    return false;
  for (int i = 0; i < 15; i++)
    if (i != 8 && (d[i] < '0' || d[i] > '9'))
      return false;
  return true;
}

int
spot__sigv4_string_to_sign(const char *amz_date, const char *region,
                           const char *service, const char *creq,
                           struct spot_buf *out)
{
  char hash[65];

  if (!valid_amz_date(amz_date))
    return -EINVAL;
  spot__sha256_hex(creq, strlen(creq), hash);
  if (hash[0] == '\0')
    return -EIO;
  return spot_buf_printf(out, SIGV4_ALGO "\n%s\n%.8s/%s/%s/aws4_request\n%s",
                         amz_date, amz_date, region, service, hash);
}

static int
hmac(const void *key, size_t klen, const char *msg, unsigned char out[32])
{
  unsigned int len = 0;

  if (HMAC(EVP_sha256(), key, (int)klen, (const unsigned char *)msg,
           strlen(msg), out, &len) == NULL ||
      len != 32)
    return -EIO;
  return 0;
}

int
spot__sigv4_signature(const char *secret, const char *amz_date,
                      const char *region, const char *service,
                      const char *string_to_sign, char hex[65])
{
  unsigned char k[32] = {0}, sig[32] = {0};
  char date[9];
  struct spot_buf key;
  int r;

  if (!valid_amz_date(amz_date))
    return -EINVAL;
  memcpy(date, amz_date, 8);
  date[8] = '\0';
  spot_buf_init(&key, 4096);
  r = spot_buf_printf(&key, "AWS4%s", secret);
  if (r == 0)
    r = hmac(key.data, key.len, date, k);
  if (r == 0)
    r = hmac(k, sizeof(k), region, k);
  if (r == 0)
    r = hmac(k, sizeof(k), service, k);
  if (r == 0)
    r = hmac(k, sizeof(k), "aws4_request", k);
  if (r == 0)
    r = hmac(k, sizeof(k), string_to_sign, sig);
  if (key.data != NULL)
    OPENSSL_cleanse(key.data, key.len);
  spot_buf_fini(&key);
  OPENSSL_cleanse(k, sizeof(k));
  if (r < 0)
    return r;
  for (unsigned i = 0; i < 32; i++) {
    static const char digits[] = "0123456789abcdef";

    hex[2 * i] = digits[sig[i] >> 4];
    hex[2 * i + 1] = digits[sig[i] & 15];
  }
  hex[64] = '\0';
  return 0;
}

int
spot__sigv4_authorization(const char *access_key, const char *secret,
                          const char *amz_date, const char *region,
                          const char *service,
                          const struct spot__sigv4_request *req,
                          struct spot_buf *out)
{
  struct spot_buf creq, sts, names;
  char sig[65];
  int r;

  spot_buf_init(&creq, SIGV4_CAP);
  spot_buf_init(&sts, 4096);
  spot_buf_init(&names, 8192);
  r = spot__sigv4_canonical_request(req, &creq, &names);
  if (r == 0)
    r = spot__sigv4_string_to_sign(amz_date, region, service,
                                   spot_buf_str(&creq), &sts);
  if (r == 0)
    r = spot__sigv4_signature(secret, amz_date, region, service,
                              spot_buf_str(&sts), sig);
  if (r == 0)
    r = spot_buf_printf(out,
                        SIGV4_ALGO " Credential=%s/%.8s/%s/%s/aws4_request, "
                                   "SignedHeaders=%s, Signature=%s",
                        access_key, amz_date, region, service,
                        spot_buf_str(&names), sig);
  spot_buf_fini(&creq);
  spot_buf_fini(&sts);
  spot_buf_fini(&names);
  return r;
}
