/* AWS credentials chain (environment, shared profile files), region and
 * endpoint resolution, and the pure IMDS helpers. The async IMDS part is
 * in aws_imds.c. No I/O here other than reading the two profile files. */
#include "core/aws_conf.h"

#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "core/util.h"

#define PROFILE_NAME_MAX 41 /* inih truncates section names at 49 chars */
#define PROFILE_FILE_MAX (1024 * 1024)
#define INI_LINE_MAX 16384
#define KEY_ID_MAX 128
#define SECRET_MAX 256
#define TOKEN_MAX 8192
#define IMDS_JSON_MAX (64 * 1024)

#define set_err spot_set_err

/* A user-supplied, non-secret value shown in a message: at most 40
 * characters, non-printable bytes as '?'. */
static const char *
shown(const char *in, char *buf, size_t size)
{
  size_t i, n = 0;

  for (i = 0; in[i] != '\0' && n + 4 < size && i < 40; i++)
    buf[n++] = (in[i] >= 0x20 && in[i] < 0x7f) ? in[i] : '?';
  if (in[i] != '\0' && n + 4 <= size) {
    memcpy(buf + n, "...", 3);
    n += 3;
  }
  buf[n] = '\0';
  return buf;
}

static const char *
getenv_set(const char *name)
{
  const char *v = getenv(name);

  return (v != NULL && v[0] != '\0') ? v : NULL;
}

/* Credentials go into HTTP headers: 1..max printable ASCII, no spaces. */
static bool
cred_value_ok(const char *s, size_t max)
{
  size_t n;

  for (n = 0; s[n] != '\0'; n++)
    if (s[n] <= 0x20 || s[n] >= 0x7f || n >= max)
      return false;
  return n > 0;
}

const char *
spot_aws_source_name(enum spot_aws_source s)
{
  switch (s) {
  case SPOT_AWS_SOURCE_ENV:
    return "env";
  case SPOT_AWS_SOURCE_PROFILE:
    return "profile";
  case SPOT_AWS_SOURCE_IMDS:
    return "imds";
  default:
    return "none";
  }
}

static void
free_secret(char *s)
{
  if (s == NULL)
    return;
  explicit_bzero(s, strlen(s));
  free(s);
}

void
spot_aws_creds_clear(struct spot_creds *c)
{
  if (c == NULL)
    return;
  free(c->access_key);
  free_secret(c->secret_key);
  free_secret(c->session_token);
  memset(c, 0, sizeof(*c));
}

int
spot_aws_creds_copy(const struct spot_creds *src, struct spot_creds *dst)
{
  struct spot_creds c = {.expires_ms = src->expires_ms};

  c.access_key = strdup(src->access_key != NULL ? src->access_key : "");
  c.secret_key = strdup(src->secret_key != NULL ? src->secret_key : "");
  if (src->session_token != NULL)
    c.session_token = strdup(src->session_token);
  if (c.access_key == NULL || c.secret_key == NULL ||
      (src->session_token != NULL && c.session_token == NULL)) {
    spot_aws_creds_clear(&c);
    return -ENOMEM;
  }
  *dst = c;
  return 0;
}

/* Builds creds from three borrowed strings (token may be NULL). */
static int
creds_fill(const char *kid, const char *secret, const char *token,
           int64_t expires_ms, struct spot_creds *out)
{
  struct spot_creds c = {
      .access_key = (char *)kid,
      .secret_key = (char *)secret,
      .session_token = (char *)token,
      .expires_ms = expires_ms,
  };

  return spot_aws_creds_copy(&c, out);
}

/* ---- Shared profile files ---- */

struct profile_vals {
  bool found; /* the profile's section exists in this file */
  char *key_id;
  char *secret;
  char *token;
  char *region;
  char unsupported[32]; /* first key needing a provider we lack */
};

struct profile_parse {
  const char *profile;
  bool config; /* config-file section naming */
  struct profile_vals *v;
  int err;
};

static void
profile_vals_fini(struct profile_vals *v)
{
  free(v->key_id);
  free_secret(v->secret);
  free_secret(v->token);
  free(v->region);
  memset(v, 0, sizeof(*v));
}

/* Compares s (trimmed of blanks at both ends) with name. */
static bool
trimmed_equal(const char *s, const char *name)
{
  size_t n;

  while (*s == ' ' || *s == '\t')
    s++;
  n = strlen(s);
  while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
    n--;
  return n == strlen(name) && strncmp(s, name, n) == 0;
}

/* Credentials file: [NAME]. Config file: [profile NAME], and [default]
 * (also [profile default]) for the default profile; a bare [NAME] there
 * is not a profile. */
static bool
section_matches(const char *section, const char *profile, bool config)
{
  if (!config)
    return trimmed_equal(section, profile);
  if (strcmp(profile, "default") == 0 && trimmed_equal(section, "default"))
    return true;
  while (*section == ' ' || *section == '\t')
    section++;
  if (strncmp(section, "profile", 7) != 0 ||
      (section[7] != ' ' && section[7] != '\t'))
    return false;
  return trimmed_equal(section + 7, profile);
}

static int
replace_value(char **slot, const char *value, bool secret)
{
  char *v = strndup(value, INI_LINE_MAX);

  if (v == NULL)
    return -ENOMEM;
  if (secret)
    free_secret(*slot);
  else
    free(*slot);
  *slot = v;
  return 0;
}

static int
profile_ini_cb(void *user, const char *section, const char *name,
               const char *value)
{
  static const char *const unsupported[] = {
      "role_arn",      "credential_source", "credential_process",
      "sso_start_url", "sso_session",       "web_identity_token_file",
  };
  struct profile_parse *pp = user;
  struct profile_vals *v = pp->v;
  int r = 0;

  if (!section_matches(section, pp->profile, pp->config))
    return 1;
  v->found = true;
  if (name == NULL || value == NULL)
    return 1;
  if (strcasecmp(name, "aws_access_key_id") == 0)
    r = replace_value(&v->key_id, value, false);
  else if (strcasecmp(name, "aws_secret_access_key") == 0)
    r = replace_value(&v->secret, value, true);
  else if (strcasecmp(name, "aws_session_token") == 0)
    r = replace_value(&v->token, value, true);
  else if (strcasecmp(name, "region") == 0)
    r = replace_value(&v->region, value, false);
  else if (v->unsupported[0] == '\0')
    for (size_t i = 0; i < SPOT_ARRAY_SIZE(unsupported); i++)
      if (strcasecmp(name, unsupported[i]) == 0)
        spot_strlcpy(v->unsupported, unsupported[i], sizeof(v->unsupported));
  if (r < 0 && pp->err == 0)
    pp->err = r;
  return r == 0;
}

/* inih's default line limit (200) is shorter than a session token. These
 * are process-wide settings of the shared library; raising the limit and
 * using a heap buffer does not change how any other file parses. */
static void
inih_allow_long_lines(void)
{
  ini_use_stack = false;
  ini_allow_realloc = true;
  if (ini_max_line < INI_LINE_MAX)
    ini_max_line = INI_LINE_MAX;
}

struct profile_file {
  const char *kind; /* "credentials" or "config" */
  char path[PATH_MAX];
  bool have;     /* a path is known */
  bool explicit; /* named by the environment: must be readable */
};

/* Returns 0 (also for a missing file at its default path) or a negative
 * errno with a message. */
static int
profile_file_load(const struct profile_file *pf, const char *profile,
                  bool config, struct profile_vals *v, char *err, size_t errlen)
{
  struct profile_parse pp = {.profile = profile, .config = config, .v = v};
  struct stat st;
  FILE *f;
  int fd, rc, r = 0;

  if (!pf->have)
    return 0;
  fd = open(pf->path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    r = -errno;
    if (r == -ENOENT && !pf->explicit)
      return 0;
    set_err(err, errlen, "cannot read AWS %s file %s: %s", pf->kind, pf->path,
            strerror(-r));
    return r;
  }
  if (fstat(fd, &st) < 0)
    r = -errno;
  else if (S_ISDIR(st.st_mode))
    r = -EISDIR;
  else if (!S_ISREG(st.st_mode))
    r = -EINVAL;
  else if (st.st_size > PROFILE_FILE_MAX)
    r = -EFBIG;
  if (r < 0) {
    close(fd);
    set_err(err, errlen, "cannot read AWS %s file %s: %s", pf->kind, pf->path,
            r == -EINVAL ? "not a regular file" : strerror(-r));
    return r;
  }
  f = fdopen(fd, "r");
  if (f == NULL) {
    r = -errno;
    close(fd);
    set_err(err, errlen, "cannot read AWS %s file %s: %s", pf->kind, pf->path,
            strerror(-r));
    return r;
  }
  inih_allow_long_lines();
  rc = ini_parse_file(f, profile_ini_cb, &pp);
  if (ferror(f))
    r = -EIO;
  fclose(f);
  if (pp.err < 0) {
    set_err(err, errlen, "cannot read AWS %s file %s: %s", pf->kind, pf->path,
            strerror(-pp.err));
    return pp.err;
  }
  if (r < 0) {
    set_err(err, errlen, "cannot read AWS %s file %s: %s", pf->kind, pf->path,
            strerror(-r));
    return r;
  }
  if (rc != 0) {
    set_err(err, errlen, "%s:%d: cannot parse AWS %s file", pf->path, rc,
            pf->kind);
    return -EINVAL;
  }
  return 0;
}

static void
profile_file_path(struct profile_file *pf, const char *kind,
                  const char *env_name, const char *home_rel)
{
  const char *p = getenv_set(env_name);
  const char *home = getenv_set("HOME");
  int n;

  pf->kind = kind;
  pf->have = false;
  pf->explicit = p != NULL;
  if (p != NULL)
    n = snprintf(pf->path, sizeof(pf->path), "%s", p);
  else if (home != NULL)
    n = snprintf(pf->path, sizeof(pf->path), "%s/%s", home, home_rel);
  else
    return;
  pf->have = n > 0 && (size_t)n < sizeof(pf->path);
}

struct profile {
  char name[PROFILE_NAME_MAX + 1];
  bool explicit; /* named by the caller or AWS_PROFILE */
  struct profile_file cred_file;
  struct profile_file conf_file;
  struct profile_vals cred; /* from the credentials file */
  struct profile_vals conf; /* from the config file */
};

static void
profile_fini(struct profile *p)
{
  profile_vals_fini(&p->cred);
  profile_vals_fini(&p->conf);
}

static int
profile_load(const char *name, struct profile *p, char *err, size_t errlen)
{
  char sb[64];
  int r;

  memset(p, 0, sizeof(*p));
  if (name == NULL || name[0] == '\0')
    name = getenv_set("AWS_PROFILE");
  p->explicit = name != NULL;
  if (name == NULL)
    name = "default";
  for (const char *c = name; *c != '\0'; c++)
    if (*c < 0x20 || *c >= 0x7f || *c == '[' || *c == ']') {
      set_err(err, errlen, "invalid AWS profile name '%s'",
              shown(name, sb, sizeof(sb)));
      return -EINVAL;
    }
  if (spot_strlcpy(p->name, name, sizeof(p->name)) >= sizeof(p->name)) {
    set_err(err, errlen, "AWS profile name '%s' is too long (at most %d)",
            shown(name, sb, sizeof(sb)), PROFILE_NAME_MAX);
    return -EINVAL;
  }
  profile_file_path(&p->cred_file, "credentials", "AWS_SHARED_CREDENTIALS_FILE",
                    ".aws/credentials");
  profile_file_path(&p->conf_file, "config", "AWS_CONFIG_FILE", ".aws/config");
  r = profile_file_load(&p->cred_file, p->name, false, &p->cred, err, errlen);
  if (r == 0)
    r = profile_file_load(&p->conf_file, p->name, true, &p->conf, err, errlen);
  if (r < 0)
    profile_fini(p);
  return r;
}

static int
creds_from_env(struct spot_creds *out, char *err, size_t errlen)
{
  const char *kid = getenv_set("AWS_ACCESS_KEY_ID");
  const char *secret = getenv_set("AWS_SECRET_ACCESS_KEY");
  const char *token = getenv_set("AWS_SESSION_TOKEN");

  if (kid == NULL && secret == NULL)
    return 1;
  if (secret == NULL) {
    set_err(err, errlen,
            "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY "
            "is not: set both, or neither");
    return -EINVAL;
  }
  if (kid == NULL) {
    set_err(err, errlen,
            "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID "
            "is not: set both, or neither");
    return -EINVAL;
  }
  if (!cred_value_ok(kid, KEY_ID_MAX) || !cred_value_ok(secret, SECRET_MAX) ||
      (token != NULL && !cred_value_ok(token, TOKEN_MAX))) {
    set_err(err, errlen,
            "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or "
            "AWS_SESSION_TOKEN holds spaces, control characters "
            "or is too long");
    return -EINVAL;
  }
  return creds_fill(kid, secret, token, 0, out);
}

static int
creds_from_profile(const struct profile *p, struct spot_creds *out, char *err,
                   size_t errlen)
{
  const struct profile_vals *v = NULL;
  const struct profile_file *pf = NULL;

  if (!p->cred.found && !p->conf.found) {
    if (!p->explicit)
      return 1;
    set_err(err, errlen, "AWS profile '%s' not found in %s or %s", p->name,
            p->cred_file.have ? p->cred_file.path : "~/.aws/credentials",
            p->conf_file.have ? p->conf_file.path : "~/.aws/config");
    return -ENOENT;
  }
  /* The key id and the secret come from one file, the credentials file
   * first: mixing halves of two key pairs would only fail later. */
  if (p->cred.key_id != NULL || p->cred.secret != NULL) {
    v = &p->cred;
    pf = &p->cred_file;
  } else if (p->conf.key_id != NULL || p->conf.secret != NULL) {
    v = &p->conf;
    pf = &p->conf_file;
  }
  if (v == NULL) {
    const char *u = p->cred.unsupported[0] != '\0' ? p->cred.unsupported
                                                   : p->conf.unsupported;
    if (u[0] == '\0')
      return 1;
    set_err(err, errlen,
            "AWS profile '%s' uses %s, which spotd does not "
            "support: give it aws_access_key_id/aws_secret_access_key or use "
            "the instance role",
            p->name, u);
    return -ENOTSUP;
  }
  if (v->key_id == NULL || v->secret == NULL) {
    set_err(err, errlen, "AWS profile '%s' in %s has %s but no %s", p->name,
            pf->path,
            v->key_id != NULL ? "aws_access_key_id" : "aws_secret_access_key",
            v->key_id != NULL ? "aws_secret_access_key" : "aws_access_key_id");
    return -EINVAL;
  }
  if (!cred_value_ok(v->key_id, KEY_ID_MAX) ||
      !cred_value_ok(v->secret, SECRET_MAX) ||
      (v->token != NULL && !cred_value_ok(v->token, TOKEN_MAX))) {
    set_err(err, errlen,
            "AWS profile '%s' in %s: a key or token holds "
            "spaces, control characters or is too long",
            p->name, pf->path);
    return -EINVAL;
  }
  return creds_fill(v->key_id, v->secret, v->token, 0, out);
}

int
spot_aws_creds_resolve_sync(const char *profile, struct spot_creds *out,
                            enum spot_aws_source *src, char *err, size_t errlen)
{
  struct spot_creds c = {0};
  struct profile p;
  int r;

  r = creds_from_env(&c, err, errlen);
  if (r == 0) {
    *out = c;
    *src = SPOT_AWS_SOURCE_ENV;
    return 0;
  }
  if (r < 0)
    return r;
  r = profile_load(profile, &p, err, errlen);
  if (r < 0)
    return r;
  r = creds_from_profile(&p, &c, err, errlen);
  if (r == 1)
    set_err(err, errlen, "%s", SPOT_AWS_NO_CREDS_MSG);
  if (r == 0) {
    log_debug("AWS credentials from profile '%s' key_id=%s", p.name,
              c.access_key);
    *out = c;
    *src = SPOT_AWS_SOURCE_PROFILE;
  }
  profile_fini(&p);
  return r;
}

bool
spot_aws_region_valid(const char *region)
{
  size_t n;

  if (region == NULL)
    return false;
  for (n = 0; region[n] != '\0'; n++) {
    char c = region[n];
    if (n >= SPOT_AWS_REGION_MAX ||
        !((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
      return false;
  }
  return n > 0;
}

static int
region_take(const char *region, const char *from, char *out, size_t outlen,
            char *err, size_t errlen)
{
  char sb[64];

  if (!spot_aws_region_valid(region)) {
    set_err(err, errlen,
            "invalid AWS region '%s' (from %s): expected "
            "lowercase letters, digits and '-', like us-east-1",
            shown(region, sb, sizeof(sb)), from);
    return -EINVAL;
  }
  if (spot_strlcpy(out, region, outlen) >= outlen) {
    set_err(err, errlen, "region buffer too small");
    return -ENOBUFS;
  }
  return 0;
}

int
spot_aws_region_resolve_sync(const char *opt_region, const char *profile,
                             char *out, size_t outlen, char *err, size_t errlen)
{
  static const char *const env_names[] = {"AWS_REGION", "AWS_DEFAULT_REGION"};
  struct profile p;
  char from[PATH_MAX + 64];
  int r;

  if (opt_region != NULL)
    return region_take(opt_region, "--region", out, outlen, err, errlen);
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(env_names); i++) {
    const char *v = getenv_set(env_names[i]);
    if (v != NULL)
      return region_take(v, env_names[i], out, outlen, err, errlen);
  }
  r = profile_load(profile, &p, err, errlen);
  if (r < 0)
    return r;
  r = 1;
  if (p.cred.region != NULL || p.conf.region != NULL) {
    const struct profile_file *pf =
        p.cred.region != NULL ? &p.cred_file : &p.conf_file;
    snprintf(from, sizeof(from), "profile '%s' in %s", p.name, pf->path);
    r = region_take(p.cred.region != NULL ? p.cred.region : p.conf.region, from,
                    out, outlen, err, errlen);
  }
  profile_fini(&p);
  return r;
}

/* Splits the part after "scheme://" into host and port: a DNS name or
 * IPv4 address ([A-Za-z0-9._-]) or a bracketed IPv6 address, then an
 * optional port 1-65535. Returns NULL, or why it is not valid. */
static const char *
split_authority(const char *a, size_t len, size_t *hostlen, const char **port,
                size_t *portlen)
{
  size_t i = 0;

  if (len > 0 && a[0] == '[') {
    while (i < len && a[i] != ']')
      i++;
    if (i == len || i == 1 ||
        strspn(a + 1, "0123456789abcdefABCDEF:.") != i - 1)
      return "not a valid URL";
    i++;
  } else {
    i = strspn(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                  "0123456789.-_");
    if (i > len)
      i = len;
  }
  *hostlen = i;
  *port = NULL;
  *portlen = 0;
  if (i == len)
    return i == 0 ? "no host" : NULL;
  if (a[i] != ':')
    return "not a valid URL";
  *port = a + i + 1;
  *portlen = len - i - 1;
  if (*portlen == 0 || *portlen > 5 || strspn(*port, "0123456789") < *portlen ||
      strtoul(*port, NULL, 10) > 65535 || strtoul(*port, NULL, 10) == 0)
    return "not a valid URL";
  return i == 0 ? "no host" : NULL;
}

int
spot_aws_endpoint_check(const char *url, char *out, size_t outlen, char *err,
                        size_t errlen)
{
  char sb[64];
  const char *rest, *port, *why = NULL;
  size_t alen, hostlen, portlen;
  bool tls;
  int n;

  if (url == NULL || url[0] == '\0') {
    set_err(err, errlen,
            "malformed endpoint '': expected http://HOST[:PORT] "
            "or https://HOST[:PORT]");
    return -EINVAL;
  }
  tls = strncasecmp(url, "https://", 8) == 0;
  if (!tls && strncasecmp(url, "http://", 7) != 0) {
    set_err(err, errlen,
            "malformed endpoint '%s': it must start with "
            "http:// or https://",
            shown(url, sb, sizeof(sb)));
    return -EINVAL;
  }
  if (strchr(url, '@') != NULL) {
    /* Never echo it: it may hold a password. */
    set_err(err, errlen,
            "malformed endpoint: user or password in the URL "
            "(credentials never go there)");
    return -EINVAL;
  }
  rest = url + (tls ? 8 : 7);
  alen = strcspn(rest, "/?#");
  if (strpbrk(rest, "?#") != NULL)
    why = "a query or fragment";
  else if (rest[alen] == '/' && rest[alen + 1] != '\0')
    why = "a path (give only scheme, host and port)";
  else
    why = split_authority(rest, alen, &hostlen, &port, &portlen);
  if (why != NULL) {
    set_err(err, errlen, "malformed endpoint '%s': %s",
            shown(url, sb, sizeof(sb)), why);
    return -EINVAL;
  }
  if (out == NULL)
    return 0;
  n = snprintf(out, outlen, "%s://%.*s%s%.*s", tls ? "https" : "http",
               (int)hostlen, rest, port != NULL ? ":" : "", (int)portlen,
               port != NULL ? port : "");
  if (n < 0 || (size_t)n >= outlen || (size_t)n > SPOT_AWS_ENDPOINT_MAX) {
    set_err(err, errlen, "malformed endpoint: longer than %d characters",
            SPOT_AWS_ENDPOINT_MAX);
    return -EINVAL;
  }
  return 0;
}

static const char *
custom_endpoint(const char *opt_endpoint, const char **from)
{
  const char *v;

  *from = "--endpoint";
  if (opt_endpoint != NULL)
    return opt_endpoint;
  *from = "AWS_ENDPOINT_URL_S3";
  if ((v = getenv_set("AWS_ENDPOINT_URL_S3")) != NULL)
    return v;
  *from = "AWS_ENDPOINT_URL";
  return getenv_set("AWS_ENDPOINT_URL");
}

bool
spot_aws_endpoint_is_custom(const char *opt_endpoint)
{
  const char *from;

  return custom_endpoint(opt_endpoint, &from) != NULL;
}

int
spot_aws_endpoint_resolve(const char *opt_endpoint, const char *region,
                          char *out, size_t outlen, bool *path_style,
                          bool *custom, char *err, size_t errlen)
{
  const char *from;
  const char *url = custom_endpoint(opt_endpoint, &from);
  char msg[256];
  int n, r;

  if (url != NULL) {
    r = spot_aws_endpoint_check(url, out, outlen, msg, sizeof(msg));
    if (r < 0) {
      set_err(err, errlen, "%s (from %s)", msg, from);
      return r;
    }
    *path_style = true;
    *custom = true;
    return 0;
  }
  if (!spot_aws_region_valid(region)) {
    set_err(err, errlen,
            "no AWS region: set --region, AWS_REGION or the "
            "profile's region");
    return -EINVAL;
  }
  n = snprintf(out, outlen, "https://s3.%s.amazonaws.com%s", region,
               strncmp(region, "cn-", 3) == 0 ? ".cn" : "");
  if (n < 0 || (size_t)n >= outlen) {
    set_err(err, errlen, "endpoint buffer too small");
    return -ENOBUFS;
  }
  *path_style = false;
  *custom = false;
  return 0;
}

bool
spot_aws_imds_disabled_by_env(void)
{
  const char *v = getenv("AWS_EC2_METADATA_DISABLED");

  return v != NULL && strcasecmp(v, "true") == 0;
}

static const char *
json_str(json_t *root, const char *name, size_t max, const char **why)
{
  json_t *j = json_object_get(root, name);
  const char *s;

  if (j == NULL) {
    *why = "missing";
    return NULL;
  }
  s = json_string_value(j);
  if (s == NULL) {
    *why = "not a string";
    return NULL;
  }
  if (!cred_value_ok(s, max)) {
    *why = "empty, too long or with spaces or control characters";
    return NULL;
  }
  return s;
}

int
spot_aws_imds_creds_parse(const char *json, size_t len, struct spot_creds *out,
                          char *err, size_t errlen)
{
  static const struct {
    const char *name;
    size_t max;
  } fields[] = {
      {"AccessKeyId", KEY_ID_MAX},
      {"SecretAccessKey", SECRET_MAX},
      {"Token", TOKEN_MAX},
      {"Expiration", 64},
  };
  const char *vals[SPOT_ARRAY_SIZE(fields)];
  json_error_t jerr;
  json_t *root, *code;
  int64_t expires;
  int r = -EINVAL;

  if (len > IMDS_JSON_MAX) {
    set_err(err, errlen,
            "instance role credentials: answer larger than %d "
            "bytes",
            IMDS_JSON_MAX);
    return -EINVAL;
  }
  /* jansson's error text may quote the input, which holds the secret:
   * report the position only. */
  root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (root == NULL) {
    set_err(err, errlen,
            "instance role credentials: malformed JSON at line "
            "%d column %d",
            jerr.line, jerr.column);
    return -EINVAL;
  }
  if (!json_is_object(root)) {
    set_err(err, errlen, "instance role credentials: not a JSON object");
    goto out;
  }
  code = json_object_get(root, "Code");
  if (code != NULL && (!json_is_string(code) ||
                       strcmp(json_string_value(code), "Success") != 0)) {
    char sb[64];
    set_err(err, errlen,
            "instance role credentials: Code is '%s', not "
            "Success",
            json_is_string(code)
                ? shown(json_string_value(code), sb, sizeof(sb))
                : "(not a string)");
    goto out;
  }
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(fields); i++) {
    const char *why = NULL;
    vals[i] = json_str(root, fields[i].name, fields[i].max, &why);
    if (vals[i] == NULL) {
      set_err(err, errlen, "instance role credentials: %s %s", fields[i].name,
              why);
      goto out;
    }
  }
  if (spot_rfc3339_parse(vals[3], &expires) < 0 || expires <= 0) {
    char sb[64];
    set_err(err, errlen,
            "instance role credentials: Expiration '%s' is not "
            "an RFC 3339 time",
            shown(vals[3], sb, sizeof(sb)));
    goto out;
  }
  r = creds_fill(vals[0], vals[1], vals[2], expires, out);
  if (r < 0)
    set_err(err, errlen, "instance role credentials: %s", strerror(-r));
out:
  json_decref(root);
  return r;
}

int64_t
spot_aws_refresh_delay_ms(int64_t now_ms, int64_t expires_ms)
{
  const int64_t ahead = 5 * 60 * 1000, min_delay = 1000;
  int64_t left, d;

  if (expires_ms == 0)
    return -1;
  left = expires_ms - now_ms;
  if (left > 2 * ahead)
    d = left - ahead;
  else
    d = left / 2;
  return d < min_delay ? min_delay : d;
}
