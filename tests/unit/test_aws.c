#include "cmocka-compat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "core/buf.h"
#include "core/log.h"
#include "core/util.h"
#include "io/aws.h"

#define SECRET "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
#define SECRET2 "je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY"

static char home_dir[64];
static char tmp_files[8][64];
static unsigned n_tmp_files;
static struct spot_buf log_lines;

static const char *const aws_vars[] = {
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_EC2_METADATA_DISABLED",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
};

static void
log_capture(int level, const char *line, void *data)
{
  spot_buf_printf(&log_lines, "%s\n", line);
}

/* Every test starts from an empty AWS environment and a HOME without
 * ~/.aws, so the machine's own settings never leak in. */
static int
setup(void **state)
{
  for (size_t i = 0; i < sizeof(aws_vars) / sizeof(aws_vars[0]); i++)
    unsetenv(aws_vars[i]);
  snprintf(home_dir, sizeof(home_dir), "/tmp/spot-aws-home-%s",
           SPOT_MKTEMP_SUFFIX);
  if (mkdtemp(home_dir) == NULL)
    return -1;
  setenv("HOME", home_dir, 1);
  n_tmp_files = 0;
  spot_buf_init(&log_lines, 1 << 20);
  spot_log_set_level(SPOT_LOG_DEBUG);
  spot_log_set_sink(log_capture, NULL);
  return 0;
}

static int
teardown(void **state)
{
  for (unsigned i = 0; i < n_tmp_files; i++)
    unlink(tmp_files[i]);
  rmdir(home_dir);
  /* No secret ever reaches a log line, whatever the test did. */
  assert_null(strstr(spot_buf_str(&log_lines), SECRET));
  assert_null(strstr(spot_buf_str(&log_lines), SECRET2));
  spot_log_set_sink(NULL, NULL);
  spot_log_set_level(SPOT_LOG_INFO);
  spot_buf_fini(&log_lines);
  return 0;
}

static const char *
tmp_file(const char *content)
{
  char *path;
  int fd;

  assert_true(n_tmp_files < sizeof(tmp_files) / sizeof(tmp_files[0]));
  path = tmp_files[n_tmp_files++];
  snprintf(path, sizeof(tmp_files[0]), "/tmp/spot-aws-test-%s",
           SPOT_MKTEMP_SUFFIX);
  fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, content, strlen(content)),
                   (ssize_t)strlen(content));
  close(fd);
  return path;
}

static int
resolve(struct spot_creds *c, enum spot_aws_source *src, char *err,
        size_t errlen)
{
  memset(c, 0, sizeof(*c));
  *src = SPOT_AWS_SOURCE_NONE;
  err[0] = '\0';
  return spot_aws_creds_resolve_sync(NULL, c, src, err, errlen);
}

static void
test_env_beats_profile(void **state)
{
  struct spot_creds c;
  enum spot_aws_source src;
  char err[512];

  setenv("AWS_SHARED_CREDENTIALS_FILE",
         tmp_file("[default]\naws_access_key_id = AKIAFILE\n"
                  "aws_secret_access_key = " SECRET2 "\n"),
         1);
  setenv("AWS_ACCESS_KEY_ID", "AKIAENV", 1);
  setenv("AWS_SECRET_ACCESS_KEY", SECRET, 1);
  setenv("AWS_SESSION_TOKEN", "tok-env", 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), 0);
  assert_int_equal(src, SPOT_AWS_SOURCE_ENV);
  assert_string_equal(spot_aws_source_name(src), "env");
  assert_string_equal(c.access_key, "AKIAENV");
  assert_string_equal(c.secret_key, SECRET);
  assert_string_equal(c.session_token, "tok-env");
  assert_int_equal(c.expires_ms, 0);
  spot_aws_creds_clear(&c);
  assert_null(c.access_key);
  assert_null(c.secret_key);

  /* Without the environment, the file wins; no token there. */
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  unsetenv("AWS_SESSION_TOKEN");
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), 0);
  assert_int_equal(src, SPOT_AWS_SOURCE_PROFILE);
  assert_string_equal(c.access_key, "AKIAFILE");
  assert_string_equal(c.secret_key, SECRET2);
  assert_null(c.session_token);
  spot_aws_creds_clear(&c);

  /* Empty variables count as unset. */
  setenv("AWS_ACCESS_KEY_ID", "", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "", 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), 0);
  assert_int_equal(src, SPOT_AWS_SOURCE_PROFILE);
  spot_aws_creds_clear(&c);
}

static void
test_env_half_set(void **state)
{
  struct spot_creds c;
  enum spot_aws_source src;
  char err[512];

  setenv("AWS_ACCESS_KEY_ID", "AKIAENV", 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "AWS_SECRET_ACCESS_KEY is not"));
  assert_null(c.access_key);
  unsetenv("AWS_ACCESS_KEY_ID");
  setenv("AWS_SECRET_ACCESS_KEY", SECRET, 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "AWS_ACCESS_KEY_ID is not"));
  assert_null(strstr(err, SECRET));
  /* A newline in a value would inject a header. */
  setenv("AWS_ACCESS_KEY_ID", "AKIA\nX-Evil: 1", 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), -EINVAL);
  assert_null(strstr(err, SECRET));
}

static void
test_profile_sections(void **state)
{
  struct spot_creds c;
  enum spot_aws_source src;
  char err[512];
  const char *cred = tmp_file(
      "# comment\n"
      "[default]\naws_access_key_id=AKIADEF\naws_secret_access_key=" SECRET "\n"
      "[dev]\nAWS_ACCESS_KEY_ID = AKIADEV\n"
      "aws_secret_access_key = " SECRET2 "\naws_session_token = tokdev\n"
      "[profile prod]\naws_access_key_id=AKIAWRONG\n"
      "aws_secret_access_key=" SECRET "\n");
  const char *conf =
      tmp_file("[default]\nregion = eu-west-1\n"
               "[profile prod]\naws_access_key_id = AKIAPROD\n"
               "aws_secret_access_key = " SECRET "\nregion = us-west-2\n"
               "[bare]\naws_access_key_id = AKIABARE\n"
               "aws_secret_access_key = " SECRET "\n"
               "[profile   spaced  ]\naws_access_key_id = AKIASPACED\n"
               "aws_secret_access_key = " SECRET "\n");

  setenv("AWS_SHARED_CREDENTIALS_FILE", cred, 1);
  setenv("AWS_CONFIG_FILE", conf, 1);

  assert_int_equal(resolve(&c, &src, err, sizeof(err)), 0);
  assert_string_equal(c.access_key, "AKIADEF");
  spot_aws_creds_clear(&c);

  /* Credentials file: [NAME]; key names are case-insensitive. */
  setenv("AWS_PROFILE", "dev", 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), 0);
  assert_string_equal(c.access_key, "AKIADEV");
  assert_string_equal(c.secret_key, SECRET2);
  assert_string_equal(c.session_token, "tokdev");
  spot_aws_creds_clear(&c);

  /* [profile prod] in the credentials file is not "prod"; the config
   * file's [profile prod] is. */
  setenv("AWS_PROFILE", "prod", 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), 0);
  assert_string_equal(c.access_key, "AKIAPROD");
  spot_aws_creds_clear(&c);

  setenv("AWS_PROFILE", "spaced", 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), 0);
  assert_string_equal(c.access_key, "AKIASPACED");
  spot_aws_creds_clear(&c);

  /* A bare [bare] in the config file is not a profile. */
  setenv("AWS_PROFILE", "bare", 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), -ENOENT);
  assert_non_null(strstr(err, "AWS profile 'bare' not found in"));
  assert_non_null(strstr(err, cred));
  assert_non_null(strstr(err, conf));

  /* The argument beats AWS_PROFILE. */
  memset(&c, 0, sizeof(c));
  assert_int_equal(
      spot_aws_creds_resolve_sync("dev", &c, &src, err, sizeof(err)), 0);
  assert_string_equal(c.access_key, "AKIADEV");
  spot_aws_creds_clear(&c);

  setenv("AWS_PROFILE", "bad]name", 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), -EINVAL);
  setenv("AWS_PROFILE", "a-profile-name-that-is-far-too-long-for-inih-sections",
         1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "too long"));
}

static void
test_credentials_file_beats_config(void **state)
{
  struct spot_creds c;
  enum spot_aws_source src;
  char err[512];
  char region[SPOT_AWS_REGION_MAX + 1];

  setenv("AWS_SHARED_CREDENTIALS_FILE",
         tmp_file("[default]\naws_access_key_id=AKIACRED\n"
                  "aws_secret_access_key=" SECRET "\n"),
         1);
  setenv("AWS_CONFIG_FILE",
         tmp_file("[default]\naws_access_key_id=AKIACONF\n"
                  "aws_secret_access_key=" SECRET2 "\n"
                  "aws_session_token=conftok\nregion=ap-south-1\n"),
         1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), 0);
  assert_string_equal(c.access_key, "AKIACRED");
  assert_string_equal(c.secret_key, SECRET);
  /* The token belongs to the other key pair: not mixed in. */
  assert_null(c.session_token);
  spot_aws_creds_clear(&c);
  /* The region still comes from the config file. */
  assert_int_equal(spot_aws_region_resolve_sync(
                       NULL, NULL, region, sizeof(region), err, sizeof(err)),
                   0);
  assert_string_equal(region, "ap-south-1");
}

static void
test_profile_half_and_unsupported(void **state)
{
  struct spot_creds c;
  enum spot_aws_source src;
  char err[512];
  const char *cred =
      tmp_file("[default]\naws_access_key_id=AKIAHALF\n"
               "[role]\nrole_arn=arn:aws:iam::1:role/x\nsource_profile=a\n"
               "[regiononly]\nregion=eu-north-1\n");

  setenv("AWS_SHARED_CREDENTIALS_FILE", cred, 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "has aws_access_key_id but no "
                              "aws_secret_access_key"));
  assert_non_null(strstr(err, cred));

  setenv("AWS_PROFILE", "role", 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), -ENOTSUP);
  assert_non_null(strstr(err, "role_arn"));

  /* A profile with settings but no keys: the chain goes on (IMDS). */
  setenv("AWS_PROFILE", "regiononly", 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), 1);
  assert_string_equal(err, SPOT_AWS_NO_CREDS_MSG);
}

static void
test_unreadable_files(void **state)
{
  struct spot_creds c;
  enum spot_aws_source src;
  char err[512];
  char path[128];

  /* Root reads any mode-000 file; a directory is unreadable as a file
   * for everyone. */
  setenv("AWS_SHARED_CREDENTIALS_FILE", home_dir, 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), -EISDIR);
  assert_non_null(strstr(err, "cannot read AWS credentials file"));
  assert_non_null(strstr(err, home_dir));
  assert_non_null(strstr(err, "Is a directory"));

  /* A file named explicitly must exist. */
  snprintf(path, sizeof(path), "%s/nonexistent", home_dir);
  setenv("AWS_SHARED_CREDENTIALS_FILE", path, 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), -ENOENT);
  assert_non_null(strstr(err, path));
  assert_non_null(strstr(err, "No such file"));

  /* ... and so must the config file. */
  unsetenv("AWS_SHARED_CREDENTIALS_FILE");
  setenv("AWS_CONFIG_FILE", "/dev/null/x", 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), -ENOTDIR);
  assert_non_null(strstr(err, "cannot read AWS config file /dev/null/x"));

  /* Not a regular file. */
  setenv("AWS_CONFIG_FILE", "/dev/null", 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "not a regular file"));

  /* Missing files at the default paths are fine: nothing found. */
  unsetenv("AWS_CONFIG_FILE");
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), 1);
  assert_string_equal(err, SPOT_AWS_NO_CREDS_MSG);

  /* ~/.aws/credentials is read from HOME. */
  snprintf(path, sizeof(path), "%s/.aws", home_dir);
  assert_int_equal(mkdir(path, 0700), 0);
  snprintf(path, sizeof(path), "%s/.aws/credentials", home_dir);
  {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("[default]\naws_access_key_id=AKIAHOME\naws_secret_access_key=" SECRET
          "\n",
          f);
    fclose(f);
  }
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), 0);
  assert_string_equal(c.access_key, "AKIAHOME");
  spot_aws_creds_clear(&c);
  unlink(path);
  snprintf(path, sizeof(path), "%s/.aws", home_dir);
  rmdir(path);
}

static void
test_profile_parse_error_and_long_token(void **state)
{
  struct spot_creds c;
  enum spot_aws_source src;
  char err[512];
  char content[4096];
  char token[1601];
  const char *f;

  f = tmp_file("[default]\naws_access_key_id=AKIA\nthis line is junk\n");
  setenv("AWS_SHARED_CREDENTIALS_FILE", f, 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, ":3: cannot parse AWS credentials file"));

  /* Real session tokens are ~1 KiB: longer than inih's default line. */
  memset(token, 'T', sizeof(token) - 1);
  token[sizeof(token) - 1] = '\0';
  snprintf(content, sizeof(content),
           "[default]\naws_access_key_id = AKIALONG\n"
           "aws_secret_access_key = " SECRET "\naws_session_token = %s\n",
           token);
  setenv("AWS_SHARED_CREDENTIALS_FILE", tmp_file(content), 1);
  assert_int_equal(resolve(&c, &src, err, sizeof(err)), 0);
  assert_string_equal(c.session_token, token);
  spot_aws_creds_clear(&c);
}

static void
test_region(void **state)
{
  char region[SPOT_AWS_REGION_MAX + 1];
  char err[512];

  assert_true(spot_aws_region_valid("us-east-1"));
  assert_true(spot_aws_region_valid("cn-north-1"));
  assert_true(spot_aws_region_valid("a"));
  assert_true(spot_aws_region_valid("abcdefghijklmnopqrstuvwxyz012345"));
  assert_false(spot_aws_region_valid("abcdefghijklmnopqrstuvwxyz0123456"));
  assert_false(spot_aws_region_valid(""));
  assert_false(spot_aws_region_valid(NULL));
  assert_false(spot_aws_region_valid("US-EAST-1"));
  assert_false(spot_aws_region_valid("us_east_1"));
  assert_false(spot_aws_region_valid("us-east-1 "));

  setenv("AWS_CONFIG_FILE",
         tmp_file("[default]\nregion = eu-central-1\n"
                  "[profile p]\nregion = Not A Region\n"),
         1);
  assert_int_equal(spot_aws_region_resolve_sync(
                       NULL, NULL, region, sizeof(region), err, sizeof(err)),
                   0);
  assert_string_equal(region, "eu-central-1");
  setenv("AWS_DEFAULT_REGION", "us-west-1", 1);
  assert_int_equal(spot_aws_region_resolve_sync(
                       NULL, NULL, region, sizeof(region), err, sizeof(err)),
                   0);
  assert_string_equal(region, "us-west-1");
  setenv("AWS_REGION", "us-west-2", 1);
  assert_int_equal(spot_aws_region_resolve_sync(
                       NULL, NULL, region, sizeof(region), err, sizeof(err)),
                   0);
  assert_string_equal(region, "us-west-2");
  assert_int_equal(spot_aws_region_resolve_sync("sa-east-1", NULL, region,
                                                sizeof(region), err,
                                                sizeof(err)),
                   0);
  assert_string_equal(region, "sa-east-1");

  /* Invalid ones name their source. */
  assert_int_equal(spot_aws_region_resolve_sync(
                       "Mars!", NULL, region, sizeof(region), err, sizeof(err)),
                   -EINVAL);
  assert_non_null(strstr(err, "invalid AWS region 'Mars!' (from --region)"));
  setenv("AWS_REGION", "bad region", 1);
  assert_int_equal(spot_aws_region_resolve_sync(
                       NULL, NULL, region, sizeof(region), err, sizeof(err)),
                   -EINVAL);
  assert_non_null(strstr(err, "(from AWS_REGION)"));
  unsetenv("AWS_REGION");
  unsetenv("AWS_DEFAULT_REGION");
  assert_int_equal(spot_aws_region_resolve_sync(
                       NULL, "p", region, sizeof(region), err, sizeof(err)),
                   -EINVAL);
  assert_non_null(strstr(err, "profile 'p'"));

  /* Nothing set anywhere. */
  unsetenv("AWS_CONFIG_FILE");
  assert_int_equal(spot_aws_region_resolve_sync(
                       NULL, NULL, region, sizeof(region), err, sizeof(err)),
                   1);
}

static void
test_endpoint(void **state)
{
  char ep[SPOT_AWS_ENDPOINT_MAX + 1];
  char err[512];
  bool path_style = false, custom = false;

  /* Regional AWS endpoint, virtual-host style. */
  assert_int_equal(spot_aws_endpoint_resolve(NULL, "eu-west-1", ep, sizeof(ep),
                                             &path_style, &custom, err,
                                             sizeof(err)),
                   0);
  assert_string_equal(ep, "https://s3.eu-west-1.amazonaws.com");
  assert_false(path_style);
  assert_false(custom);
  assert_false(spot_aws_endpoint_is_custom(NULL));
  assert_int_equal(spot_aws_endpoint_resolve(NULL, "cn-north-1", ep, sizeof(ep),
                                             &path_style, &custom, err,
                                             sizeof(err)),
                   0);
  assert_string_equal(ep, "https://s3.cn-north-1.amazonaws.com.cn");
  assert_int_equal(spot_aws_endpoint_resolve(NULL, NULL, ep, sizeof(ep),
                                             &path_style, &custom, err,
                                             sizeof(err)),
                   -EINVAL);
  assert_non_null(strstr(err, "no AWS region"));

  /* AWS_ENDPOINT_URL < AWS_ENDPOINT_URL_S3 < --endpoint; path style. */
  setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/", 1);
  assert_true(spot_aws_endpoint_is_custom(NULL));
  assert_int_equal(spot_aws_endpoint_resolve(NULL, NULL, ep, sizeof(ep),
                                             &path_style, &custom, err,
                                             sizeof(err)),
                   0);
  assert_string_equal(ep, "http://127.0.0.1:9000");
  assert_true(path_style);
  assert_true(custom);
  setenv("AWS_ENDPOINT_URL_S3", "https://s3.example.com", 1);
  assert_int_equal(spot_aws_endpoint_resolve(NULL, "us-east-1", ep, sizeof(ep),
                                             &path_style, &custom, err,
                                             sizeof(err)),
                   0);
  assert_string_equal(ep, "https://s3.example.com");
  assert_int_equal(spot_aws_endpoint_resolve("HTTP://[::1]:7480", NULL, ep,
                                             sizeof(ep), &path_style, &custom,
                                             err, sizeof(err)),
                   0);
  assert_string_equal(ep, "http://[::1]:7480");

  /* Malformed ones. */
  assert_int_equal(spot_aws_endpoint_resolve("ftp://h", NULL, ep, sizeof(ep),
                                             &path_style, &custom, err,
                                             sizeof(err)),
                   -EINVAL);
  assert_non_null(strstr(err, "malformed endpoint 'ftp://h'"));
  assert_non_null(strstr(err, "(from --endpoint)"));
  setenv("AWS_ENDPOINT_URL_S3", "127.0.0.1:7480", 1);
  assert_int_equal(spot_aws_endpoint_resolve(NULL, NULL, ep, sizeof(ep),
                                             &path_style, &custom, err,
                                             sizeof(err)),
                   -EINVAL);
  assert_non_null(strstr(err, "(from AWS_ENDPOINT_URL_S3)"));
  assert_int_equal(
      spot_aws_endpoint_check("http://", ep, sizeof(ep), err, sizeof(err)),
      -EINVAL);
  assert_int_equal(spot_aws_endpoint_check("", NULL, 0, err, sizeof(err)),
                   -EINVAL);
  assert_int_equal(
      spot_aws_endpoint_check("http://h/bucket", NULL, 0, err, sizeof(err)),
      -EINVAL);
  assert_non_null(strstr(err, "a path"));
  assert_int_equal(
      spot_aws_endpoint_check("http://h?x=1", NULL, 0, err, sizeof(err)),
      -EINVAL);
  assert_int_equal(
      spot_aws_endpoint_check("http://h#f", NULL, 0, err, sizeof(err)),
      -EINVAL);
  assert_int_equal(
      spot_aws_endpoint_check("http://h:99999", NULL, 0, err, sizeof(err)),
      -EINVAL);
  assert_int_equal(
      spot_aws_endpoint_check("http://a b", NULL, 0, err, sizeof(err)),
      -EINVAL);
  /* A password in the URL is refused and never echoed. */
  assert_int_equal(spot_aws_endpoint_check("http://user:" SECRET "@h", NULL, 0,
                                           err, sizeof(err)),
                   -EINVAL);
  assert_non_null(strstr(err, "user or password"));
  assert_null(strstr(err, SECRET));
  assert_null(strstr(err, "user:"));
  assert_int_equal(spot_aws_endpoint_check("https://s3.example.com:443", NULL,
                                           0, err, sizeof(err)),
                   0);
}

static const char imds_ok[] =
    "{\n  \"Code\" : \"Success\",\n"
    "  \"LastUpdated\" : \"2026-12-02T09:00:00Z\",\n"
    "  \"Type\" : \"AWS-HMAC\",\n"
    "  \"AccessKeyId\" : \"ASIAIMDS\",\n"
    "  \"SecretAccessKey\" : \"" SECRET "\",\n"
    "  \"Token\" : \"IQoJb3JpZ2luX2VjEXAMPLE==\",\n"
    "  \"Expiration\" : \"2026-12-02T15:13:50Z\"\n}\n";

static void
test_imds_json(void **state)
{
  struct spot_creds c = {0};
  char err[512];
  char doc[1024];

  assert_int_equal(
      spot_aws_imds_creds_parse(imds_ok, strlen(imds_ok), &c, err, sizeof(err)),
      0);
  assert_string_equal(c.access_key, "ASIAIMDS");
  assert_string_equal(c.secret_key, SECRET);
  assert_string_equal(c.session_token, "IQoJb3JpZ2luX2VjEXAMPLE==");
  assert_int_equal(c.expires_ms, 1796224430000LL);
  spot_aws_creds_clear(&c);

  /* Code is optional, but must say Success when present. */
  snprintf(doc, sizeof(doc),
           "{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"%s\","
           "\"Token\":\"t\",\"Expiration\":\"2026-12-02T15:13:50+01:00\"}",
           SECRET);
  assert_int_equal(
      spot_aws_imds_creds_parse(doc, strlen(doc), &c, err, sizeof(err)), 0);
  assert_int_equal(c.expires_ms, 1796220830000LL);
  spot_aws_creds_clear(&c);
  snprintf(doc, sizeof(doc),
           "{\"Code\":\"Failure\",\"AccessKeyId\":\"A\","
           "\"SecretAccessKey\":\"%s\",\"Token\":\"t\","
           "\"Expiration\":\"2026-12-02T15:13:50Z\"}",
           SECRET);
  assert_int_equal(
      spot_aws_imds_creds_parse(doc, strlen(doc), &c, err, sizeof(err)),
      -EINVAL);
  assert_non_null(strstr(err, "Failure"));
  assert_null(c.access_key);

  /* Missing fields. */
  snprintf(doc, sizeof(doc),
           "{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"%s\","
           "\"Expiration\":\"2026-12-02T15:13:50Z\"}",
           SECRET);
  assert_int_equal(
      spot_aws_imds_creds_parse(doc, strlen(doc), &c, err, sizeof(err)),
      -EINVAL);
  assert_non_null(strstr(err, "Token missing"));
  snprintf(doc, sizeof(doc),
           "{\"AccessKeyId\":\"A\",\"Token\":\"t\","
           "\"Expiration\":\"2026-12-02T15:13:50Z\"}");
  assert_int_equal(
      spot_aws_imds_creds_parse(doc, strlen(doc), &c, err, sizeof(err)),
      -EINVAL);
  assert_non_null(strstr(err, "SecretAccessKey missing"));
  snprintf(doc, sizeof(doc),
           "{\"AccessKeyId\":7,\"SecretAccessKey\":\"%s\",\"Token\":\"t\","
           "\"Expiration\":\"2026-12-02T15:13:50Z\"}",
           SECRET);
  assert_int_equal(
      spot_aws_imds_creds_parse(doc, strlen(doc), &c, err, sizeof(err)),
      -EINVAL);
  assert_non_null(strstr(err, "AccessKeyId not a string"));

  /* Bad Expiration. */
  snprintf(doc, sizeof(doc),
           "{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"%s\","
           "\"Token\":\"t\",\"Expiration\":\"tomorrow\"}",
           SECRET);
  assert_int_equal(
      spot_aws_imds_creds_parse(doc, strlen(doc), &c, err, sizeof(err)),
      -EINVAL);
  assert_non_null(strstr(err, "Expiration 'tomorrow'"));

  /* A header-injecting secret is refused, and not quoted. */
  snprintf(doc, sizeof(doc),
           "{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"%s\\r\\nX: y\","
           "\"Token\":\"t\",\"Expiration\":\"2026-12-02T15:13:50Z\"}",
           SECRET);
  assert_int_equal(
      spot_aws_imds_creds_parse(doc, strlen(doc), &c, err, sizeof(err)),
      -EINVAL);
  assert_null(strstr(err, SECRET));

  /* Malformed JSON: the position only, never the text. */
  snprintf(doc, sizeof(doc), "{\"SecretAccessKey\": %s}", SECRET);
  assert_int_equal(
      spot_aws_imds_creds_parse(doc, strlen(doc), &c, err, sizeof(err)),
      -EINVAL);
  assert_non_null(strstr(err, "malformed JSON at line 1"));
  assert_null(strstr(err, "wJal"));
  assert_int_equal(spot_aws_imds_creds_parse("[1]", 3, &c, err, sizeof(err)),
                   -EINVAL);
  assert_non_null(strstr(err, "not a JSON object"));
  assert_int_equal(spot_aws_imds_creds_parse("", 0, &c, err, sizeof(err)),
                   -EINVAL);
  /* Duplicate keys are rejected rather than guessed at. */
  snprintf(doc, sizeof(doc), "{\"AccessKeyId\":\"A\",\"AccessKeyId\":\"B\"}");
  assert_int_equal(
      spot_aws_imds_creds_parse(doc, strlen(doc), &c, err, sizeof(err)),
      -EINVAL);
  assert_null(c.access_key);
}

static void
test_refresh_delay(void **state)
{
  const int64_t now = 1796206430000LL, min = 60 * 1000;

  assert_int_equal(spot_aws_refresh_delay_ms(now, 0), -1);
  /* Six hours: five minutes before expiry. */
  assert_int_equal(spot_aws_refresh_delay_ms(now, now + 360 * min), 355 * min);
  assert_int_equal(spot_aws_refresh_delay_ms(now, now + 11 * min), 6 * min);
  /* Short lifetimes: at half-life. */
  assert_int_equal(spot_aws_refresh_delay_ms(now, now + 10 * min), 5 * min);
  assert_int_equal(spot_aws_refresh_delay_ms(now, now + 8 * min), 4 * min);
  assert_int_equal(spot_aws_refresh_delay_ms(now, now + 4000), 2000);
  /* Never sooner than a second, even once expired. */
  assert_int_equal(spot_aws_refresh_delay_ms(now, now + 1500), 1000);
  assert_int_equal(spot_aws_refresh_delay_ms(now, now - 5000), 1000);
}

static void
test_creds_copy(void **state)
{
  struct spot_creds a = {0}, b = {0};
  char err[512];

  assert_int_equal(
      spot_aws_imds_creds_parse(imds_ok, strlen(imds_ok), &a, err, sizeof(err)),
      0);
  assert_int_equal(spot_aws_creds_copy(&a, &b), 0);
  assert_string_equal(b.access_key, "ASIAIMDS");
  assert_string_equal(b.secret_key, SECRET);
  assert_ptr_not_equal(a.secret_key, b.secret_key);
  assert_int_equal(b.expires_ms, a.expires_ms);
  spot_aws_creds_clear(&a);
  spot_aws_creds_clear(&b);
  spot_aws_creds_clear(&b);
  spot_aws_creds_clear(NULL);
}

/* ---- The async object on a loop, no network (IMDS off or unneeded) ---- */

struct ready {
  int calls;
  int err;
  char msg[768];
  int closed;
};

static void
ready_cb(int err, const char *msg, void *data)
{
  struct ready *r = data;

  r->calls++;
  r->err = err;
  snprintf(r->msg, sizeof(r->msg), "%s", msg);
}

static void
closed_cb(void *data)
{
  struct ready *r = data;

  r->closed++;
}

static void
test_async_env(void **state)
{
  struct spot_aws_options o = {.endpoint = "http://127.0.0.1:7480"};
  struct spot_s3_config cfg = {0};
  struct ready rd = {0};
  const struct spot_creds *c;
  struct spot_aws *aws;
  uv_loop_t loop;

  setenv("AWS_ACCESS_KEY_ID", "AKIAENV", 1);
  setenv("AWS_SECRET_ACCESS_KEY", SECRET, 1);
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(spot_aws_new(&loop, NULL, &o, &aws), 0);
  assert_int_equal(spot_aws_start(aws, ready_cb, &rd), 0);
  assert_int_equal(spot_aws_start(aws, ready_cb, &rd), -EALREADY);
  assert_int_equal(rd.calls, 0); /* never from inside start */
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(rd.calls, 1);
  assert_int_equal(rd.err, 0);
  assert_string_equal(rd.msg, "");
  assert_int_equal(spot_aws_source(aws), SPOT_AWS_SOURCE_ENV);
  assert_string_equal(spot_aws_endpoint(aws), "http://127.0.0.1:7480");
  assert_string_equal(spot_aws_region(aws), SPOT_AWS_DEFAULT_CUSTOM_REGION);
  assert_true(spot_aws_path_style(aws));
  spot_aws_s3_config(aws, &cfg);
  assert_ptr_equal(cfg.creds, spot_aws_creds_provider(aws));
  assert_string_equal(cfg.endpoint, "http://127.0.0.1:7480");
  assert_int_equal(cfg.creds->get(cfg.creds, &c), 0);
  assert_string_equal(c->access_key, "AKIAENV");
  assert_string_equal(c->secret_key, SECRET);
  assert_null(c->session_token);
  assert_int_equal(spot_aws_refresh_count(aws), 0);
  spot_aws_close(aws, closed_cb, &rd);
  assert_int_equal(rd.closed, 0);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(rd.closed, 1);
  assert_int_equal(rd.calls, 1);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void
test_async_errors(void **state)
{
  struct spot_aws_options o = {.region = "eu-west-3"};
  struct ready rd = {0};
  const struct spot_creds *c;
  struct spot_aws *aws;
  uv_loop_t loop;

  assert_int_equal(uv_loop_init(&loop), 0);

  /* Nothing anywhere and IMDS disabled by the environment. */
  setenv("AWS_EC2_METADATA_DISABLED", "TRUE", 1);
  assert_int_equal(spot_aws_new(&loop, NULL, &o, &aws), 0);
  assert_int_equal(
      spot_aws_creds_provider(aws)->get(spot_aws_creds_provider(aws), &c),
      -ENOKEY);
  assert_int_equal(spot_aws_start(aws, ready_cb, &rd), 0);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(rd.calls, 1);
  assert_int_equal(rd.err, -ENOKEY);
  assert_non_null(strstr(rd.msg, SPOT_AWS_NO_CREDS_MSG));
  spot_aws_close(aws, closed_cb, &rd);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(rd.closed, 1);

  /* Bad region and endpoint: reported before anything else. */
  memset(&rd, 0, sizeof(rd));
  o.region = "EU";
  assert_int_equal(spot_aws_new(&loop, NULL, &o, &aws), 0);
  assert_int_equal(spot_aws_start(aws, ready_cb, &rd), 0);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(rd.err, -EINVAL);
  assert_non_null(strstr(rd.msg, "invalid AWS region 'EU'"));
  spot_aws_close(aws, NULL, NULL);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);

  memset(&rd, 0, sizeof(rd));
  o.region = NULL;
  o.endpoint = "s3.example.com";
  assert_int_equal(spot_aws_new(&loop, NULL, &o, &aws), 0);
  assert_int_equal(spot_aws_start(aws, ready_cb, &rd), 0);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(rd.err, -EINVAL);
  assert_non_null(strstr(rd.msg, "malformed endpoint"));
  spot_aws_close(aws, NULL, NULL);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);

  /* Credentials but no region for an AWS endpoint, IMDS off. */
  memset(&rd, 0, sizeof(rd));
  o.endpoint = NULL;
  setenv("AWS_ACCESS_KEY_ID", "AKIAENV", 1);
  setenv("AWS_SECRET_ACCESS_KEY", SECRET, 1);
  assert_int_equal(spot_aws_new(&loop, NULL, &o, &aws), 0);
  assert_int_equal(spot_aws_start(aws, ready_cb, &rd), 0);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(rd.err, -EINVAL);
  assert_non_null(strstr(rd.msg, "no AWS region"));
  spot_aws_close(aws, NULL, NULL);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);

  /* Closed before the loop ran: the ready callback says cancelled, once. */
  memset(&rd, 0, sizeof(rd));
  o.region = "us-east-2";
  assert_int_equal(spot_aws_new(&loop, NULL, &o, &aws), 0);
  assert_int_equal(spot_aws_start(aws, ready_cb, &rd), 0);
  spot_aws_close(aws, closed_cb, &rd);
  assert_int_equal(rd.calls, 1);
  assert_int_equal(rd.err, -ECANCELED);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(rd.calls, 1);
  assert_int_equal(rd.closed, 1);

  /* Bad IMDS URL at creation; never started objects close cleanly. */
  o.imds_url = "169.254.169.254";
  assert_int_equal(spot_aws_new(&loop, NULL, &o, &aws), -EINVAL);
  o.imds_url = NULL;
  assert_int_equal(spot_aws_new(&loop, NULL, &o, &aws), 0);
  spot_aws_close(aws, NULL, NULL);
  spot_aws_close(NULL, NULL, NULL);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_env_beats_profile, setup, teardown),
      cmocka_unit_test_setup_teardown(test_env_half_set, setup, teardown),
      cmocka_unit_test_setup_teardown(test_profile_sections, setup, teardown),
      cmocka_unit_test_setup_teardown(test_credentials_file_beats_config, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_profile_half_and_unsupported, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_unreadable_files, setup, teardown),
      cmocka_unit_test_setup_teardown(test_profile_parse_error_and_long_token,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_region, setup, teardown),
      cmocka_unit_test_setup_teardown(test_endpoint, setup, teardown),
      cmocka_unit_test_setup_teardown(test_imds_json, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refresh_delay, setup, teardown),
      cmocka_unit_test_setup_teardown(test_creds_copy, setup, teardown),
      cmocka_unit_test_setup_teardown(test_async_env, setup, teardown),
      cmocka_unit_test_setup_teardown(test_async_errors, setup, teardown),
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
