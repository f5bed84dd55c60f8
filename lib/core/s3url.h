/* s3:// URLs and job ids: pure parsing, no I/O. Used by the config
 * (--store) and by the store tools (spotctl push DIR s3://BUCKET/PREFIX/JOB).
 *
 * Accepted form: s3://BUCKET[/PREFIX...][/]
 * - BUCKET follows the AWS general-purpose bucket naming rules: 3..63
 *   characters of [a-z0-9.-], starting and ending with a letter or digit,
 *   no "..", not shaped like an IPv4 address, none of the reserved
 *   prefixes/suffixes (xn--, sthree-, -s3alias, --ol-s3, .mrap, --x-s3).
 * - PREFIX is returned without leading or trailing slashes ("" when
 *   absent). Empty components ("a//b"), "." and ".." components, control
 *   characters, backslashes, '?' and '#' are refused, and it is at most
 *   SPOT_S3_URL_PREFIX_MAX bytes (object keys are capped at 1024 and the
 *   store appends JOB/checkpoints/NAME/<file> to it).
 *
 * Errors: -EINVAL, with one human line in err (never NULL-terminated
 * garbage: err is always terminated when errlen > 0). Out-parameters are
 * set only on success and are malloc'ed (free() them). */
#ifndef SPOT_S3URL_H
#define SPOT_S3URL_H

#include <stddef.h>

#define SPOT_S3_URL_PREFIX_MAX 512
#define SPOT_JOB_ID_MAX 128

int spot_s3_url_parse(const char *url, char **bucket, char **prefix, char *err,
                      size_t errlen);

/* For store commands whose URL names the job root: the last component of
 * the path is the job (checked with spot_s3_url_check_job), the rest the
 * prefix ("" when the job sits at the bucket root). */
int spot_s3_url_parse_job(const char *url, char **bucket, char **prefix,
                          char **job, char *err, size_t errlen);

/* Job ids: 1..SPOT_JOB_ID_MAX characters of [A-Za-z0-9._-], not "." or
 * "..". Returns 0 or -EINVAL with a message in err. */
int spot_s3_url_check_job(const char *job, char *err, size_t errlen);

/* Bucket name rules alone (see above). Returns 0 or -EINVAL. */
int spot_s3_url_check_bucket(const char *bucket, char *err, size_t errlen);

#endif
