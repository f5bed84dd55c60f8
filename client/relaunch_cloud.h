/* The cloud backends of `spotctl relaunch` (relaunch_aws.c,
 * relaunch_gcp.c) and what they share (relaunch_cloud.c): the preemption
 * from spotd's variables, a loop with HTTP and AWS credentials, the job's
 * relaunch record in the store, one log line per step. */
#ifndef SPOTCTL_RELAUNCH_CLOUD_H
#define SPOTCTL_RELAUNCH_CLOUD_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "core/ec2.h"
#include "io/aws.h"
#include "io/http.h"
#include "io/s3.h"
#include "spotctl.h"

struct cloud {
  /* the preemption (SPOTD_*) */
  const char *job, *store_url, *ckpt, *reason, *deadline;
  char *bucket, *prefix; /* of the job root */
  char store[600];       /* s3://BUCKET/PREFIX, for the new node */
  int64_t deadline_ms;
  uint64_t end_mono;
  /* options shared by the backends */
  const char *s3_endpoint, *region, *metadata_url;
  bool no_record, dry_run;
  bool aws_optional; /* gcp: no store credentials = no record */
  int64_t timeout_s;
  int64_t failed_ttl_s; /* pools/zones that failed this recently: skipped */
  /* the engine: its aws gives S3 (record) and EC2 credentials */
  struct spotctl_s3 conn;
  /* the record */
  struct spot_relaunch_record rec;
  bool rec_loaded;
};

/* Options every cloud backend takes, after the backend's own (whose ids
 * start at CLOUD_OPT_LAST). */
enum {
  CLOUD_OPT_BACKEND = 256,
  CLOUD_OPT_FAILED_TTL,
  CLOUD_OPT_METADATA_URL,
  CLOUD_OPT_ENDPOINT,
  CLOUD_OPT_REGION,
  CLOUD_OPT_NO_RECORD,
  CLOUD_OPT_TIMEOUT,
  CLOUD_OPT_DRY_RUN,
  CLOUD_OPT_LAST,
};
#define CLOUD_DEFAULT_FAILED_TTL_S 3600
#define CLOUD_LONG_OPTIONS                                                     \
  {"backend", required_argument, NULL, CLOUD_OPT_BACKEND},                     \
      {"failed-ttl", required_argument, NULL, CLOUD_OPT_FAILED_TTL},           \
      {"metadata-url", required_argument, NULL, CLOUD_OPT_METADATA_URL},       \
      {"endpoint", required_argument, NULL, CLOUD_OPT_ENDPOINT},               \
      {"region", required_argument, NULL, CLOUD_OPT_REGION},                   \
      {"no-record", no_argument, NULL, CLOUD_OPT_NO_RECORD},                   \
      {"timeout", required_argument, NULL, CLOUD_OPT_TIMEOUT},                 \
      {"dry-run", no_argument, NULL, CLOUD_OPT_DRY_RUN},                       \
      {"help", no_argument, NULL, 'h'},                                        \
  {                                                                            \
    NULL, 0, NULL, 0                                                           \
  }
/* One of the options above: 0 when taken, 1 when not one of them, else an
 * exit status (message printed). */
int cloud_option(struct cloud *c, int opt, const char *arg);
/* An integer option in [min, max]: 0, or the usage exit status. */
int cloud_parse_num(const char *opt, const char *v, int64_t min, int64_t max,
                    int64_t *out);

/* Every attempt and outcome of every backend: one line on stderr with a
 * UTC timestamp. */
void relaunch_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The variables spotd passes its relaunch step. SPOTD_CHECKPOINT and
 * SPOTD_DEADLINE may be empty (no committed checkpoint, no deadline) but
 * must be set. 0 or an exit status (message printed). */
int relaunch_read_env(const char **job, const char **store, const char **ckpt,
                      const char **reason, const char **deadline,
                      int64_t *deadline_ms);
/* Reads SPOTD_*; 0 or an exit status (message printed). */
int cloud_read_env(struct cloud *c);
/* Loop + HTTP; with_aws: credentials and S3 for the record. 0 or an exit
 * status (message printed). */
int cloud_open(struct cloud *c, bool with_aws);
void cloud_close(struct cloud *c);
uint64_t cloud_ms_left(const struct cloud *c);
/* The record: load (missing = empty) and save; best effort, warn on
 * failure. */
void cloud_record_load(struct cloud *c);
void cloud_record_save(struct cloud *c);
/* A hex key of the preemption, for the record ("spotd-" + 32 hex). */
int cloud_key(const struct cloud *c, char *buf, size_t size);

int spotctl_relaunch_aws(int argc, char **argv);
int spotctl_relaunch_gcp(int argc, char **argv);
/* argv names --backend aws or gcp (relaunch.c hands those over). */
int spotctl_relaunch_cloud_backend(int argc, char **argv);

#endif
