/* `spotd --job-from auto|aws-tag|gcp-metadata`: a node that boots from a
 * generic launch template or image learns its job (and store) from its
 * own instance metadata, before the daemon starts:
 *   aws-tag       instance tags in IMDS (IMDSv2):
 *                 /latest/meta-data/tags/instance/spotd-job, .../spotd-store
 *                 (the instance needs InstanceMetadataTags=enabled)
 *   gcp-metadata  GCE instance attributes (Metadata-Flavor: Google):
 *                 /computeMetadata/v1/instance/attributes/spotd-job, ...
 *   auto          aws-tag, then gcp-metadata.
 * Blocking (its own loop): call it before the daemon's loop exists. */
#ifndef SPOT_JOBFROM_H
#define SPOT_JOBFROM_H

#include <stddef.h>

enum spot_job_from {
  SPOT_JOB_FROM_NONE,
  SPOT_JOB_FROM_AUTO,
  SPOT_JOB_FROM_AWS_TAG,
  SPOT_JOB_FROM_GCP_METADATA,
  SPOT_JOB_FROM_LAST,
};

#define SPOT_JOB_FROM_TAG_JOB "spotd-job"
#define SPOT_JOB_FROM_TAG_STORE "spotd-store"

/* base_url: the metadata service (--metadata-url), NULL for the
 * provider's ($AWS_EC2_METADATA_SERVICE_ENDPOINT or 169.254.169.254;
 * $GCE_METADATA_HOST or metadata.google.internal). On success returns 0
 * with *job (malloc'ed) and *store (malloc'ed, NULL when the instance has
 * no spotd-store) and *where ("aws-tag" or "gcp-metadata"); otherwise a
 * negative errno and one line in err: -ENOENT no such tag/attribute,
 * -EHOSTUNREACH no metadata service answered, -EACCES refused. */
int spot_job_from_resolve(enum spot_job_from mode, const char *base_url,
                          char **job, char **store, const char **where,
                          char *err, size_t errlen);

#endif
