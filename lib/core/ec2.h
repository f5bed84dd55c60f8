/* EC2 CreateFleet for `spotctl relaunch --backend aws`, pure (no I/O):
 * the form-encoded request (Query API, Action=CreateFleet,
 * Version=2016-11-15), the XML answer parsed with expat (a
 * CreateFleetResponse or an error <Response>), the ClientToken of a
 * preemption, error classes, and the small JSON record of a job's
 * relaunches kept in the store (pools that failed lately, relaunches
 * done). Unit-tested (tests/unit/test_ec2.c) and fuzzed
 * (tests/fuzz/fuzz_ec2_xml.c). */
#ifndef SPOT_EC2_H
#define SPOT_EC2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"

#define SPOT_EC2_VERSION "2016-11-15"
#define SPOT_EC2_POOLS_MAX 64 /* overrides in one request */
#define SPOT_EC2_ITEMS_MAX 64 /* instances or errors kept from a reply */
#define SPOT_EC2_TOKEN_LEN 38 /* "spotd-" + 32 hex */
#define SPOT_EC2_REPLY_MAX (256 * 1024)

/* A capacity pool: an instance type in a zone (through a subnet of that
 * zone, or the zone itself). Empty strings: not given (the launch
 * template's). */
struct spot_ec2_pool {
  char type[32];
  char az[32];
  char subnet[32];
};

struct spot_ec2_fleet_req {
  const char *client_token;
  const char *lt_id;                 /* lt-..., or NULL */
  const char *lt_name;               /* or the template's name */
  const char *lt_version;            /* NULL: $Default */
  const struct spot_ec2_pool *pools; /* priority order, first = highest */
  size_t n_pools;                    /* 0: the template alone */
  bool on_demand;
  const char *const *tag_keys; /* tags of the new instance */
  const char *const *tag_values;
  size_t n_tags;
};

/* The request body: Action=CreateFleet&Version=...&ClientToken=...,
 * Type=instant, TargetCapacity 1, spot with capacity-optimized-prioritized
 * (on-demand: prioritized), one LaunchTemplateConfig whose overrides carry
 * Priority 1, 2, ... in pool order. 0, -EINVAL (no template, too many
 * pools) or -ENOMEM / -E2BIG. */
int spot_ec2_fleet_form(const struct spot_ec2_fleet_req *r,
                        struct spot_buf *out);

struct spot_ec2_item {
  struct spot_ec2_pool pool; /* from launchTemplateAndOverrides/overrides */
  char lifecycle[16];        /* spot | on-demand */
  char instance_id[32];      /* instances: the first id */
  char code[64];             /* errors */
  char message[256];
};

struct spot_ec2_reply {
  bool is_error; /* an error <Response>: code and message */
  char code[64];
  char message[256];
  char request_id[64];
  char fleet_id[64];
  struct spot_ec2_item instances[SPOT_EC2_ITEMS_MAX];
  size_t n_instances;
  struct spot_ec2_item errors[SPOT_EC2_ITEMS_MAX];
  size_t n_errors;
};

/* Parses a CreateFleetResponse or an EC2 error document
 * (<Response><Errors><Error><Code>, <Message>). Values longer than a field
 * are cut. 0, or -EBADMSG (not XML, another root, an error without Code),
 * -ENOMEM. */
int spot_ec2_reply_parse(const char *xml, size_t len,
                         struct spot_ec2_reply *out);

enum spot_ec2_class {
  SPOT_EC2_CLASS_CAPACITY, /* this pool now: try the others */
  SPOT_EC2_CLASS_RETRY,    /* throttled or internal: same request later */
  SPOT_EC2_CLASS_AUTH,     /* UnauthorizedOperation, AuthFailure, ... */
  SPOT_EC2_CLASS_TEMPLATE, /* the launch template is missing or bad */
  SPOT_EC2_CLASS_OTHER,    /* anything else: a clear failure */
  SPOT_EC2_CLASS_LAST,
};

enum spot_ec2_class spot_ec2_classify(const char *code);

/* "spotd-" + the first 128 bits of SHA-256(job NUL checkpoint NUL reason
 * NUL attempt) in hex: the same preemption and attempt give the same
 * token, so EC2 starts at most one fleet for it. buf >= 39 bytes. */
int spot_ec2_client_token(const char *job, const char *ckpt, const char *reason,
                          unsigned attempt, char *buf, size_t size);

/* "TYPE/AZ" ("-" for an empty part). */
const char *spot_ec2_pool_name(const struct spot_ec2_pool *p, char *buf,
                               size_t size);

/* ---- the job's relaunch record (PREFIX/JOB/relaunch.json) ---- */

#define SPOT_RELAUNCH_FAILED_MAX 32
#define SPOT_RELAUNCH_DONE_MAX 8
#define SPOT_RELAUNCH_RECORD_MAX (64 * 1024)

struct spot_relaunch_failed {
  char pool[80]; /* "TYPE/AZ" or a GCP zone */
  char code[64];
  int64_t at_ms;
};

struct spot_relaunch_done {
  char key[48];      /* the preemption's token */
  char instance[96]; /* instance id or name */
  char pool[80];
  int64_t at_ms;
};

struct spot_relaunch_record {
  struct spot_relaunch_failed failed[SPOT_RELAUNCH_FAILED_MAX];
  size_t n_failed;
  struct spot_relaunch_done done[SPOT_RELAUNCH_DONE_MAX];
  size_t n_done;
};

/* {"version":1,"failed":[{"pool","code","at"}],"done":[{"key","instance",
 * "pool","at"}]}; unknown keys are ignored, entries without an integer
 * "at" skipped, entries beyond the caps dropped (oldest first). A string
 * longer than its field, or a NUL byte anywhere, refuses the record, so
 * whatever parses formats back. 0, or -EBADMSG with one line in err (out
 * zeroed); err may be NULL. */
int spot_relaunch_record_parse(const char *json, size_t len,
                               struct spot_relaunch_record *out, char *err,
                               size_t errlen);
/* 0, -EINVAL (a string not terminated within its field or not UTF-8, a
 * count over its cap) or -ENOMEM; out receives compact JSON. */
int spot_relaunch_record_format(const struct spot_relaunch_record *r,
                                struct spot_buf *out);
/* Adds a failed pool (replacing an older entry for the same pool), dropping
 * the oldest when full. Strings longer than their field are cut between
 * whole UTF-8 characters (here and in spot_relaunch_record_done). */
void spot_relaunch_record_fail(struct spot_relaunch_record *r, const char *pool,
                               const char *code, int64_t at_ms);
/* True when pool failed at or after since_ms. */
bool spot_relaunch_record_failed(const struct spot_relaunch_record *r,
                                 const char *pool, int64_t since_ms);
void spot_relaunch_record_done(struct spot_relaunch_record *r, const char *key,
                               const char *instance, const char *pool,
                               int64_t at_ms);
/* The done entry of key, or NULL. */
const struct spot_relaunch_done *
spot_relaunch_record_find(const struct spot_relaunch_record *r,
                          const char *key);

#endif
