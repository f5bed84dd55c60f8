/* GCE instances.insert for `spotctl relaunch --backend gcp`, pure (no
 * I/O, jansson): the request body (SPOT provisioning, the job in the
 * instance metadata, the template's metadata items kept), the Operation
 * and error documents, the metadata server's token document, the
 * requestId of a preemption in a zone, and error classes. Unit-tested
 * (tests/unit/test_gce.c) and fuzzed (tests/fuzz/fuzz_gce_json.c). */
#ifndef SPOT_GCE_H
#define SPOT_GCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"

#define SPOT_GCE_NAME_MAX 63
#define SPOT_GCE_REPLY_MAX (256 * 1024)

/* An Operation, or an error document ({"error": {"code", "message",
 * "status", "errors": [{"reason", "message"}]}}). */
struct spot_gce_op {
  bool is_error;       /* an error document (HTTP 4xx/5xx) */
  int http_code;       /* error.code */
  char name[128];      /* the operation's name */
  char status[16];     /* PENDING, RUNNING, DONE */
  char target[512];    /* targetLink */
  char code[96];       /* first error's code (op) or reason (error doc) */
  char message[256];   /* first error's message */
  char api_status[48]; /* error.status: PERMISSION_DENIED, NOT_FOUND... */
};

/* 0, or -EBADMSG (not a JSON object, neither an operation nor an
 * error). */
int spot_gce_op_parse(const char *json, size_t len, struct spot_gce_op *out);

enum spot_gce_class {
  SPOT_GCE_CLASS_CAPACITY, /* stockout in this zone: the next zone */
  SPOT_GCE_CLASS_RETRY,    /* rate limit, backend error: again later */
  SPOT_GCE_CLASS_AUTH,     /* 401/403, insufficient scopes */
  SPOT_GCE_CLASS_TEMPLATE, /* the instance template is missing or bad */
  SPOT_GCE_CLASS_EXISTS,   /* the instance exists already: done */
  SPOT_GCE_CLASS_OTHER,
  SPOT_GCE_CLASS_LAST,
};

enum spot_gce_class spot_gce_classify(const struct spot_gce_op *op);

/* {"access_token": "...", "expires_in": N, "token_type": "Bearer"}.
 * 0 with the token copied, or -EBADMSG. */
int spot_gce_token_parse(const char *json, size_t len, char *tok, size_t size);

/* A UUID (version 4 layout) from SHA-256(job NUL ckpt NUL reason NUL
 * zone): the same preemption in the same zone gives the same requestId,
 * so a retried insert returns the first operation. buf >= 37 bytes. */
int spot_gce_request_id(const char *job, const char *ckpt, const char *reason,
                        const char *zone, char *buf, size_t size);

/* "spotd-" + the job lower-cased, other characters as '-', cut, + "-" +
 * the first 8 hex of key: a valid instance name ([a-z][-a-z0-9]*, at most
 * 63). */
int spot_gce_instance_name(const char *job, const char *key, char *buf,
                           size_t size);

/* The instances.insert body: {"name", "metadata": {"items": template's
 * items (from the instanceTemplates.get document, may be NULL) with
 * spotd-job and spotd-store set}, "scheduling": {"provisioningModel":
 * "SPOT", "instanceTerminationAction": "DELETE"}}. 0, -EBADMSG (template
 * document unreadable) or -ENOMEM. */
int spot_gce_insert_body(const char *name, const char *job, const char *store,
                         const char *template_json, size_t template_len,
                         struct spot_buf *out);

#endif
