/* Interruption notices from the cloud metadata services, and the pure
 * parsers that turn a provider's response body into one ("request spec
 * in, notice out": no I/O, no clock reads, the caller passes now).
 *
 * Parser outcomes, shared by every spot_meta_*_parse_* function:
 *   0        a notice is pending: *out (or out[0..*n)) is filled;
 *   1        the document is valid and says nothing is pending;
 *   -EINVAL  the body is garbage (not the documented shape);
 *   -E2BIG   the body is larger than SPOT_META_BODY_MAX.
 * Out-parameters are written only when 0 is returned (the Azure
 * incarnation is also written on 1). */
#ifndef SPOT_NOTICE_H
#define SPOT_NOTICE_H

#include <stddef.h>
#include <stdint.h>

enum spot_provider {
  SPOT_PROVIDER_NONE,
  SPOT_PROVIDER_AWS,
  SPOT_PROVIDER_GCP,
  SPOT_PROVIDER_AZURE,
  SPOT_PROVIDER_AUTO,
  SPOT_PROVIDER_LAST,
};

enum spot_notice_kind {
  SPOT_NOTICE_TERMINATE,
  SPOT_NOTICE_STOP,
  SPOT_NOTICE_HIBERNATE,
  SPOT_NOTICE_REBALANCE,   /* advisory: no fixed deadline */
  SPOT_NOTICE_MAINTENANCE, /* host maintenance, reboot, redeploy */
  SPOT_NOTICE_PREEMPT,
  SPOT_NOTICE_LAST,
};

#define SPOT_NOTICE_ID_MAX 128
#define SPOT_NOTICE_REASON_MAX 32
#define SPOT_NOTICE_DETAIL_MAX 512
/* Largest metadata body any parser accepts. */
#define SPOT_META_BODY_MAX (64 * 1024)
/* GCP gives 30 s between the preempted flag and the stop (ACPI G2). */
#define SPOT_META_GCP_PREEMPT_MS 30000
/* GCP's maintenance-event changes 60 s before the maintenance. */
#define SPOT_META_GCP_MAINTENANCE_MS 60000

struct spot_notice {
  enum spot_provider provider;
  enum spot_notice_kind kind;
  /* 0 in both means "no deadline" (rebalance recommendations). Parsers set
   * only the wall deadline; spot_notice_set_mono() derives the other. */
  uint64_t deadline_mono_ms;
  int64_t deadline_wall_ms;
  /* For de-duplication: the provider's event id, or action@time. Azure:
   * exactly the EventId (what spot_meta_ack() sends back). */
  char id[SPOT_NOTICE_ID_MAX];
  /* SPOTD_REASON: "aws-spot-terminate", "aws-rebalance", "gcp-preempted",
   * "azure-preempt", ... */
  char reason[SPOT_NOTICE_REASON_MAX];
  /* The raw document (or the relevant element), truncated. */
  char detail[SPOT_NOTICE_DETAIL_MAX];
};

const char *spot_provider_name(enum spot_provider p);
/* "auto", "aws", "gcp", "azure", "none". Returns 0 or -EINVAL. */
int spot_provider_from_name(const char *s, enum spot_provider *out);
const char *spot_notice_kind_name(enum spot_notice_kind k);

/* Sets deadline_mono_ms from deadline_wall_ms given both clocks now; a
 * deadline in the past maps to now_mono. No-op when there is no deadline. */
void spot_notice_set_mono(struct spot_notice *n, uint64_t now_mono_ms,
                          int64_t now_wall_ms);

/* De-duplication: a small ring of "provider:id" keys already reported.
 * spot_notice_seen() returns 1 if the key was seen before, else records it
 * and returns 0. The oldest key is dropped when the ring is full. */
#define SPOT_NOTICE_DEDUP_SLOTS 32
struct spot_notice_dedup {
  char keys[SPOT_NOTICE_DEDUP_SLOTS][SPOT_NOTICE_ID_MAX + 8];
  unsigned next;
  unsigned used;
};
void spot_notice_dedup_init(struct spot_notice_dedup *d);
int spot_notice_seen(struct spot_notice_dedup *d, const struct spot_notice *n);
/* Forgets a key so the same id may be reported again (a GCP maintenance
 * value that went back to NONE). */
void spot_notice_forget(struct spot_notice_dedup *d, enum spot_provider p,
                        const char *id);

/* Dates. AWS scheduled events: "2 Jan 2006 15:04:05 GMT" (day 1 or 2
 * digits). Azure NotBefore (RFC 1123): "Mon, 19 Sep 2016 18:29:47 GMT".
 * Milliseconds since the epoch; 0 or -EINVAL. */
int spot_time_parse_aws_event(const char *s, int64_t *out_ms);
int spot_time_parse_rfc1123(const char *s, int64_t *out_ms);
/* Formats RFC 1123 ("Mon, 19 Sep 2016 18:29:47 GMT"); buf needs 30 bytes. */
int spot_time_format_rfc1123(int64_t ms, char *buf, size_t size);
/* Formats the AWS event layout ("21 Jan 2019 09:00:43 GMT"). */
int spot_time_format_aws_event(int64_t ms, char *buf, size_t size);

/* AWS IMDS. */
/* spot/instance-action (HTTP 200; the caller maps 404 to "nothing"):
 * {"action":"terminate|stop|hibernate","time":"RFC3339"}. */
int spot_meta_aws_parse_instance_action(const char *body, size_t len,
                                        int64_t now_wall_ms,
                                        struct spot_notice *out);
/* events/recommendations/rebalance: {"noticeTime":"RFC3339"}. */
int spot_meta_aws_parse_rebalance(const char *body, size_t len,
                                  int64_t now_wall_ms, struct spot_notice *out);
/* events/maintenance/scheduled: a JSON array of events (Code, EventId,
 * NotBefore, NotAfter, State, Description). State canceled or completed
 * (or a "[Canceled]"/"[Completed]" description) is not a notice. Fills up
 * to max notices, soonest first; *n is their count. */
int spot_meta_aws_parse_maintenance(const char *body, size_t len,
                                    int64_t now_wall_ms,
                                    struct spot_notice *out, size_t max,
                                    size_t *n);
/* autoscaling/target-lifecycle-state: plain text; "Terminated" is a
 * terminate notice due now, any other state ("InService", ...) is 1. */
int spot_meta_aws_parse_lifecycle(const char *body, size_t len,
                                  int64_t now_wall_ms, struct spot_notice *out);

/* GCP metadata server (plain text values). */
/* instance/preempted: TRUE (notice, deadline now + 30 s) or FALSE (1). */
int spot_meta_gcp_parse_preempted(const char *body, size_t len,
                                  int64_t now_wall_ms, struct spot_notice *out);
/* instance/maintenance-event: NONE is 1; MIGRATE_ON_HOST_MAINTENANCE and
 * other upper-case values are a maintenance notice,
 * TERMINATE_ON_HOST_MAINTENANCE a terminate notice, both due in 60 s. */
int spot_meta_gcp_parse_maintenance(const char *body, size_t len,
                                    int64_t now_wall_ms,
                                    struct spot_notice *out);

/* Azure Scheduled Events (api-version 2020-07-01). Considers EventType
 * Preempt (kind preempt), Terminate (terminate), Reboot and Redeploy
 * (maintenance) whose Resources contain vm_name (NULL or "" = every
 * event), EventStatus Scheduled or Started. Deadline = NotBefore; an
 * empty NotBefore means the event has started: due now. Fills up to max
 * notices, soonest first. *incarnation gets DocumentIncarnation (on 0 and
 * on 1). */
int spot_meta_azure_parse(const char *body, size_t len, const char *vm_name,
                          int64_t now_wall_ms, struct spot_notice *out,
                          size_t max, size_t *n, int64_t *incarnation);
/* Builds {"StartRequests":[{"EventId":"..."}]} into a malloc'd string. */
int spot_meta_azure_ack_body(const char *event_id, char **out);

/* Internal, shared by the meta_*.c parsers. */
struct json_t;
/* json_loadb with the size cap; returns 0, -EINVAL or -E2BIG. */
int spot__meta_json_load(const char *body, size_t len, struct json_t **out);
/* Copies at most len bytes of body into n->detail, terminated. */
void spot__notice_detail(struct spot_notice *n, const char *body, size_t len);
/* Strips ASCII whitespace at both ends of [*p, *p + *len). */
void spot__meta_trim(const char **p, size_t *len);
/* Sorts the count notices of tmp by deadline and copies the first max of
 * them to out, *n their number: 0, or 1 when there are none. */
int spot__notice_sort_out(struct spot_notice *tmp, size_t count,
                          struct spot_notice *out, size_t max, size_t *n);

#endif
