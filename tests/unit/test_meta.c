/* Metadata parsers, date layouts, de-duplication and backoff. Bodies are
 * the providers' documented examples plus garbage. */
#include "cmocka-compat.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/notice.h"
#include "core/util.h"

#define NOW 1796206430000LL /* 2026-12-02T10:13:50Z */
#define S(lit) lit, sizeof(lit) - 1

static void
test_dates(void **state)
{
  int64_t ms;
  char buf[40];

  /* the AWS layout, "2 Jan 2006 15:04:05 GMT", one or two day digits */
  assert_int_equal(spot_time_parse_aws_event("21 Jan 2019 09:00:43 GMT", &ms),
                   0);
  assert_int_equal(ms, 1548061243000LL);
  assert_int_equal(spot_time_parse_aws_event("2 Jan 2006 15:04:05 GMT", &ms),
                   0);
  assert_int_equal(ms, 1136214245000LL);
  assert_int_equal(
      spot_time_format_aws_event(1136214245000LL, buf, sizeof(buf)), 0);
  assert_string_equal(buf, "2 Jan 2006 15:04:05 GMT");
  assert_int_equal(spot_time_parse_aws_event("21 Jan 2019 09:00:43", &ms),
                   -EINVAL);
  assert_int_equal(spot_time_parse_aws_event("21 Foo 2019 09:00:43 GMT", &ms),
                   -EINVAL);
  assert_int_equal(spot_time_parse_aws_event("32 Jan 2019 09:00:43 GMT", &ms),
                   -EINVAL);
  assert_int_equal(spot_time_parse_aws_event("2019-01-21T09:00:43Z", &ms),
                   -EINVAL);
  assert_int_equal(spot_time_parse_aws_event("", &ms), -EINVAL);
  assert_int_equal(spot_time_parse_aws_event(NULL, &ms), -EINVAL);

  /* Azure's NotBefore, RFC 1123 */
  assert_int_equal(
      spot_time_parse_rfc1123("Mon, 19 Sep 2016 18:29:47 GMT", &ms), 0);
  assert_int_equal(ms, 1474309787000LL);
  assert_int_equal(spot_time_format_rfc1123(ms, buf, sizeof(buf)), 0);
  assert_string_equal(buf, "Mon, 19 Sep 2016 18:29:47 GMT");
  assert_int_equal(spot_time_format_rfc1123(NOW, buf, sizeof(buf)), 0);
  assert_string_equal(buf, "Wed, 02 Dec 2026 10:13:50 GMT");
  assert_int_equal(spot_time_format_rfc1123(NOW, buf, 10), -ENOSPC);
  assert_int_equal(spot_time_parse_rfc1123("19 Sep 2016 18:29:47 GMT", &ms),
                   -EINVAL);
  assert_int_equal(spot_time_parse_rfc1123("Mon, 9 Sep 2016 18:29:47 GMT", &ms),
                   -EINVAL);
  assert_int_equal(
      spot_time_parse_rfc1123("Mon, 19 Sep 2016 18:29:47 UTC", &ms), -EINVAL);
  assert_int_equal(
      spot_time_parse_rfc1123("Mon, 19 Sep 2016 25:29:47 GMT", &ms), -EINVAL);
}

static void
test_aws_instance_action(void **state)
{
  struct spot_notice n;

  memset(&n, 0x5a, sizeof(n));
  assert_int_equal(spot_meta_aws_parse_instance_action(
                       S("{\"action\": \"terminate\", "
                         "\"time\": \"2017-09-18T08:22:00Z\"}"),
                       NOW, &n),
                   0);
  assert_int_equal(n.provider, SPOT_PROVIDER_AWS);
  assert_int_equal(n.kind, SPOT_NOTICE_TERMINATE);
  assert_int_equal(n.deadline_wall_ms, 1505722920000LL);
  assert_int_equal(n.deadline_mono_ms, 0);
  assert_string_equal(n.reason, "aws-spot-terminate");
  assert_string_equal(n.id, "spot:terminate@2017-09-18T08:22:00Z");
  assert_non_null(strstr(n.detail, "terminate"));

  assert_int_equal(spot_meta_aws_parse_instance_action(
                       S("{\"action\":\"stop\",\"time\":\"2026-12-02T10:15:"
                         "50Z\"}"),
                       NOW, &n),
                   0);
  assert_int_equal(n.kind, SPOT_NOTICE_STOP);
  assert_int_equal(n.deadline_wall_ms, NOW + 120000);
  assert_string_equal(n.reason, "aws-spot-stop");
  assert_int_equal(spot_meta_aws_parse_instance_action(
                       S("{\"action\":\"hibernate\",\"time\":\"2026-12-02T10:"
                         "13:50Z\"}"),
                       NOW, &n),
                   0);
  assert_int_equal(n.kind, SPOT_NOTICE_HIBERNATE);

  /* garbage leaves *out alone */
  memset(&n, 0, sizeof(n));
  assert_int_equal(spot_meta_aws_parse_instance_action(
                       S("{\"action\":\"reboot\",\"time\":\"2026-12-02T10:"
                         "13:50Z\"}"),
                       NOW, &n),
                   -EINVAL);
  assert_int_equal(spot_meta_aws_parse_instance_action(
                       S("{\"action\":\"stop\",\"time\":\"soon\"}"), NOW, &n),
                   -EINVAL);
  assert_int_equal(spot_meta_aws_parse_instance_action(
                       S("{\"action\":\"stop\",\"time\":7}"), NOW, &n),
                   -EINVAL);
  assert_int_equal(
      spot_meta_aws_parse_instance_action(
          S("{\"action\":\"stop\",\"time\":\"2026-12-02T1"), NOW, &n),
      -EINVAL);
  assert_int_equal(spot_meta_aws_parse_instance_action(S("[]"), NOW, &n),
                   -EINVAL);
  assert_int_equal(spot_meta_aws_parse_instance_action(S(""), NOW, &n),
                   -EINVAL);
  assert_int_equal(spot_meta_aws_parse_instance_action(
                       S("<html>404 - Not Found</html>"), NOW, &n),
                   -EINVAL);
  assert_int_equal(spot_meta_aws_parse_instance_action(
                       "{}", SPOT_META_BODY_MAX + 1, NOW, &n),
                   -E2BIG);
  assert_int_equal(n.kind, 0);
  assert_string_equal(n.id, "");
}

static void
test_aws_rebalance(void **state)
{
  struct spot_notice n;

  assert_int_equal(
      spot_meta_aws_parse_rebalance(
          S("{\"noticeTime\": \"2020-10-27T08:22:00Z\"}"), NOW, &n),
      0);
  assert_int_equal(n.kind, SPOT_NOTICE_REBALANCE);
  assert_string_equal(n.reason, "aws-rebalance");
  assert_string_equal(n.id, "rebalance@2020-10-27T08:22:00Z");
  assert_int_equal(n.deadline_wall_ms, 0); /* advisory */
  assert_int_equal(
      spot_meta_aws_parse_rebalance(S("{\"noticeTime\": 1}"), NOW, &n),
      -EINVAL);
  assert_int_equal(
      spot_meta_aws_parse_rebalance(S("{\"noticeTime\":"), NOW, &n), -EINVAL);
}

/* The user guide's example, plus a canceled and a completed event. */
static const char maint_doc[] =
    "[ {\n"
    "  \"NotBefore\" : \"21 Jan 2019 09:00:43 GMT\",\n"
    "  \"Code\" : \"system-reboot\",\n"
    "  \"Description\" : \"scheduled reboot\",\n"
    "  \"EventId\" : \"instance-event-0d59937288b749b32\",\n"
    "  \"NotAfter\" : \"21 Jan 2019 09:17:23 GMT\",\n"
    "  \"State\" : \"active\"\n"
    "}, {\n"
    "  \"NotBefore\" : \"20 Jan 2019 09:00:43 GMT\",\n"
    "  \"Code\" : \"system-reboot\",\n"
    "  \"Description\" : \"[Canceled] scheduled reboot\",\n"
    "  \"EventId\" : \"instance-event-0dbb9e8d5bb12a3a4\",\n"
    "  \"NotAfter\" : \"20 Jan 2019 09:17:23 GMT\",\n"
    "  \"State\" : \"canceled\"\n"
    "}, {\n"
    "  \"NotBefore\" : \"19 Jan 2019 09:00:43 GMT\",\n"
    "  \"Code\" : \"instance-stop\",\n"
    "  \"Description\" : \"[Completed] stop\",\n"
    "  \"EventId\" : \"instance-event-0c5fe0d1a9f2e0b00\",\n"
    "  \"State\" : \"completed\"\n"
    "}, {\n"
    "  \"NotBefore\" : \"3 Feb 2019 09:00:00 GMT\",\n"
    "  \"Code\" : \"instance-retirement\",\n"
    "  \"EventId\" : \"instance-event-1\",\n"
    "  \"State\" : \"active\"\n"
    "} ]";

static void
test_aws_maintenance(void **state)
{
  struct spot_notice n[4];
  size_t count = 99;

  assert_int_equal(spot_meta_aws_parse_maintenance(maint_doc, strlen(maint_doc),
                                                   NOW, n, 4, &count),
                   0);
  assert_int_equal(count, 2); /* canceled and completed are not reported */
  assert_string_equal(n[0].id, "instance-event-0d59937288b749b32");
  assert_int_equal(n[0].kind, SPOT_NOTICE_MAINTENANCE);
  assert_string_equal(n[0].reason, "aws-maintenance");
  assert_int_equal(n[0].deadline_wall_ms, 1548061243000LL);
  assert_non_null(strstr(n[0].detail, "system-reboot"));
  assert_string_equal(n[1].id, "instance-event-1");
  assert_int_equal(n[1].kind, SPOT_NOTICE_TERMINATE);
  assert_string_equal(n[1].reason, "aws-instance-retirement");

  /* max caps the output, soonest first */
  assert_int_equal(spot_meta_aws_parse_maintenance(maint_doc, strlen(maint_doc),
                                                   NOW, n, 1, &count),
                   0);
  assert_int_equal(count, 1);
  assert_string_equal(n[0].id, "instance-event-0d59937288b749b32");

  count = 99;
  assert_int_equal(spot_meta_aws_parse_maintenance(S("[]"), NOW, n, 4, &count),
                   1);
  assert_int_equal(spot_meta_aws_parse_maintenance(S(" \n"), NOW, n, 4, &count),
                   1);
  assert_int_equal(count, 99);
  assert_int_equal(spot_meta_aws_parse_maintenance(
                       S("[{\"NotBefore\":\"x\",\"EventId\":\"e\","
                         "\"State\":\"canceled\"}]"),
                       NOW, n, 4, &count),
                   -EINVAL);
  assert_int_equal(spot_meta_aws_parse_maintenance(
                       S("[{\"NotBefore\":\"21 Jan 2019 09:00:43 GMT\"}]"), NOW,
                       n, 4, &count),
                   -EINVAL);
  assert_int_equal(spot_meta_aws_parse_maintenance(S("{}"), NOW, n, 4, &count),
                   -EINVAL);
  assert_int_equal(spot_meta_aws_parse_maintenance(S("[1,"), NOW, n, 4, &count),
                   -EINVAL);
}

static void
test_aws_lifecycle(void **state)
{
  struct spot_notice n;

  assert_int_equal(spot_meta_aws_parse_lifecycle(S("InService"), NOW, &n), 1);
  assert_int_equal(spot_meta_aws_parse_lifecycle(S("Warmed:Stopped"), NOW, &n),
                   1);
  assert_int_equal(spot_meta_aws_parse_lifecycle(S("Terminated\n"), NOW, &n),
                   0);
  assert_int_equal(n.kind, SPOT_NOTICE_TERMINATE);
  assert_int_equal(n.deadline_wall_ms, NOW);
  assert_string_equal(n.reason, "aws-asg-terminate");
  assert_int_equal(spot_meta_aws_parse_lifecycle(S("{\"x\":1}"), NOW, &n),
                   -EINVAL);
  assert_int_equal(spot_meta_aws_parse_lifecycle(S(""), NOW, &n), -EINVAL);
}

static void
test_gcp(void **state)
{
  struct spot_notice n;

  assert_int_equal(spot_meta_gcp_parse_preempted(S("FALSE"), NOW, &n), 1);
  assert_int_equal(spot_meta_gcp_parse_preempted(S("TRUE"), NOW, &n), 0);
  assert_int_equal(n.provider, SPOT_PROVIDER_GCP);
  assert_int_equal(n.kind, SPOT_NOTICE_PREEMPT);
  assert_int_equal(n.deadline_wall_ms, NOW + 30000);
  assert_string_equal(n.reason, "gcp-preempted");
  assert_string_equal(n.id, "preempted");
  assert_int_equal(spot_meta_gcp_parse_preempted(S("TRUE\n"), NOW, &n), 0);
  assert_int_equal(spot_meta_gcp_parse_preempted(S("true"), NOW, &n), -EINVAL);
  assert_int_equal(spot_meta_gcp_parse_preempted(S("TRUEX"), NOW, &n), -EINVAL);
  assert_int_equal(spot_meta_gcp_parse_preempted(S(""), NOW, &n), -EINVAL);
  assert_int_equal(spot_meta_gcp_parse_preempted("TRUE\0", 5, NOW, &n),
                   -EINVAL);

  assert_int_equal(spot_meta_gcp_parse_maintenance(S("NONE"), NOW, &n), 1);
  assert_int_equal(spot_meta_gcp_parse_maintenance(
                       S("MIGRATE_ON_HOST_MAINTENANCE"), NOW, &n),
                   0);
  assert_int_equal(n.kind, SPOT_NOTICE_MAINTENANCE);
  assert_int_equal(n.deadline_wall_ms, NOW + 60000);
  assert_string_equal(n.id, "maintenance:MIGRATE_ON_HOST_MAINTENANCE");
  assert_int_equal(spot_meta_gcp_parse_maintenance(
                       S("TERMINATE_ON_HOST_MAINTENANCE"), NOW, &n),
                   0);
  assert_int_equal(n.kind, SPOT_NOTICE_TERMINATE);
  assert_string_equal(n.reason, "gcp-maintenance-terminate");
  assert_int_equal(spot_meta_gcp_parse_maintenance(S("{\"a\":1}"), NOW, &n),
                   -EINVAL);
}

/* The Scheduled Events documentation's example, with a second VM's event
 * and a Freeze. */
static const char azure_doc[] =
    "{\n"
    "  \"DocumentIncarnation\": 3,\n"
    "  \"Events\": [\n"
    "    {\n"
    "      \"EventId\": \"C7061BAC-AFDC-4513-B24B-AA5F13A16123\",\n"
    "      \"EventStatus\": \"Scheduled\",\n"
    "      \"EventType\": \"Freeze\",\n"
    "      \"ResourceType\": \"VirtualMachine\",\n"
    "      \"Resources\": [\"WestNO_0\", \"WestNO_1\"],\n"
    "      \"NotBefore\": \"Mon, 11 Apr 2022 22:26:58 GMT\",\n"
    "      \"Description\": \"Virtual machine is being paused\",\n"
    "      \"EventSource\": \"Platform\",\n"
    "      \"DurationInSeconds\": 5\n"
    "    },\n"
    "    {\n"
    "      \"EventId\": \"A123BC45-1234-5678-AB90-ABCDEF123456\",\n"
    "      \"EventStatus\": \"Scheduled\",\n"
    "      \"EventType\": \"Preempt\",\n"
    "      \"ResourceType\": \"VirtualMachine\",\n"
    "      \"Resources\": [\"WestNO_0\"],\n"
    "      \"NotBefore\": \"Wed, 02 Dec 2026 10:14:20 GMT\",\n"
    "      \"Description\": \"\",\n"
    "      \"EventSource\": \"Platform\",\n"
    "      \"DurationInSeconds\": -1\n"
    "    },\n"
    "    {\n"
    "      \"EventId\": \"B0000000-0000-0000-0000-000000000001\",\n"
    "      \"EventStatus\": \"Started\",\n"
    "      \"EventType\": \"Reboot\",\n"
    "      \"ResourceType\": \"VirtualMachine\",\n"
    "      \"Resources\": [\"WestNO_1\"],\n"
    "      \"NotBefore\": \"\",\n"
    "      \"Description\": \"\",\n"
    "      \"EventSource\": \"User\",\n"
    "      \"DurationInSeconds\": -1\n"
    "    }\n"
    "  ]\n"
    "}\n";

static void
test_azure(void **state)
{
  struct spot_notice n[4];
  size_t count = 0;
  int64_t inc = -1;
  char *ack;

  assert_int_equal(spot_meta_azure_parse(azure_doc, strlen(azure_doc),
                                         "WestNO_0", NOW, n, 4, &count, &inc),
                   0);
  assert_int_equal(inc, 3);
  assert_int_equal(count, 1); /* Freeze ignored, Reboot is another VM's */
  assert_int_equal(n[0].provider, SPOT_PROVIDER_AZURE);
  assert_int_equal(n[0].kind, SPOT_NOTICE_PREEMPT);
  assert_string_equal(n[0].reason, "azure-preempt");
  assert_string_equal(n[0].id, "A123BC45-1234-5678-AB90-ABCDEF123456");
  assert_int_equal(n[0].deadline_wall_ms, NOW + 30000);

  /* the other VM sees only its started reboot, due now */
  assert_int_equal(spot_meta_azure_parse(azure_doc, strlen(azure_doc),
                                         "WestNO_1", NOW, n, 4, &count, &inc),
                   0);
  assert_int_equal(count, 1);
  assert_int_equal(n[0].kind, SPOT_NOTICE_MAINTENANCE);
  assert_string_equal(n[0].reason, "azure-reboot");
  assert_int_equal(n[0].deadline_wall_ms, NOW);

  /* no filter: both, soonest first */
  assert_int_equal(spot_meta_azure_parse(azure_doc, strlen(azure_doc), NULL,
                                         NOW, n, 4, &count, &inc),
                   0);
  assert_int_equal(count, 2);
  assert_string_equal(n[0].reason, "azure-reboot");
  assert_string_equal(n[1].reason, "azure-preempt");

  inc = -1;
  assert_int_equal(spot_meta_azure_parse(azure_doc, strlen(azure_doc),
                                         "OtherVM", NOW, n, 4, &count, &inc),
                   1);
  assert_int_equal(inc, 3);
  assert_int_equal(
      spot_meta_azure_parse(S("{\"DocumentIncarnation\":1,\"Events\":[]}"),
                            "vm", NOW, n, 4, &count, &inc),
      1);
  assert_int_equal(inc, 1);

  /* garbage */
  inc = -1;
  assert_int_equal(spot_meta_azure_parse(S("{\"Events\":[]}"), "vm", NOW, n, 4,
                                         &count, &inc),
                   -EINVAL);
  assert_int_equal(
      spot_meta_azure_parse(S("{\"DocumentIncarnation\":1,\"Events\":[{}]}"),
                            "vm", NOW, n, 4, &count, &inc),
      -EINVAL);
  assert_int_equal(
      spot_meta_azure_parse(
          S("{\"DocumentIncarnation\":1,\"Events\":[{\"EventId\":\"a\","
            "\"EventType\":\"Preempt\",\"EventStatus\":\"Scheduled\","
            "\"Resources\":[\"vm\"],\"NotBefore\":\"tomorrow\"}]}"),
          "vm", NOW, n, 4, &count, &inc),
      -EINVAL);
  assert_int_equal(spot_meta_azure_parse(S("{\"DocumentIncarnation\":"), "vm",
                                         NOW, n, 4, &count, &inc),
                   -EINVAL);
  assert_int_equal(inc, -1);

  assert_int_equal(spot_meta_azure_ack_body("A123", &ack), 0);
  assert_string_equal(ack, "{\"StartRequests\":[{\"EventId\":\"A123\"}]}");
  free(ack);
  assert_int_equal(spot_meta_azure_ack_body("", &ack), -EINVAL);
}

static void
test_dedup(void **state)
{
  struct spot_notice_dedup d;
  struct spot_notice n;

  memset(&n, 0, sizeof(n));
  spot_notice_dedup_init(&d);
  n.provider = SPOT_PROVIDER_AWS;
  spot_strlcpy(n.id, "spot:terminate@t", sizeof(n.id));
  assert_int_equal(spot_notice_seen(&d, &n), 0);
  assert_int_equal(spot_notice_seen(&d, &n), 1);
  assert_int_equal(spot_notice_seen(&d, &n), 1);
  /* same id, other provider: a different notice */
  n.provider = SPOT_PROVIDER_GCP;
  assert_int_equal(spot_notice_seen(&d, &n), 0);
  spot_notice_forget(&d, SPOT_PROVIDER_GCP, "spot:terminate@t");
  assert_int_equal(spot_notice_seen(&d, &n), 0);
  assert_int_equal(spot_notice_seen(&d, &n), 1);

  /* the ring keeps the last SPOT_NOTICE_DEDUP_SLOTS keys */
  spot_notice_dedup_init(&d);
  for (int i = 0; i < SPOT_NOTICE_DEDUP_SLOTS + 1; i++) {
    snprintf(n.id, sizeof(n.id), "e%d", i);
    assert_int_equal(spot_notice_seen(&d, &n), 0);
  }
  snprintf(n.id, sizeof(n.id), "e%d", SPOT_NOTICE_DEDUP_SLOTS);
  assert_int_equal(spot_notice_seen(&d, &n), 1);
  snprintf(n.id, sizeof(n.id), "e0");
  assert_int_equal(spot_notice_seen(&d, &n), 0); /* evicted */
}

static void
test_names_and_mono(void **state)
{
  enum spot_provider p;
  struct spot_notice n;

  assert_int_equal(spot_provider_from_name("azure", &p), 0);
  assert_int_equal(p, SPOT_PROVIDER_AZURE);
  assert_int_equal(spot_provider_from_name("auto", &p), 0);
  assert_int_equal(p, SPOT_PROVIDER_AUTO);
  assert_int_equal(spot_provider_from_name("ibm", &p), -EINVAL);
  assert_string_equal(spot_provider_name(SPOT_PROVIDER_GCP), "gcp");
  assert_string_equal(spot_provider_name(SPOT_PROVIDER_LAST), "invalid");
  assert_string_equal(spot_notice_kind_name(SPOT_NOTICE_REBALANCE),
                      "rebalance");
  assert_string_equal(spot_notice_kind_name(SPOT_NOTICE_LAST), "invalid");

  memset(&n, 0, sizeof(n));
  n.deadline_wall_ms = NOW + 120000;
  spot_notice_set_mono(&n, 5000, NOW);
  assert_int_equal(n.deadline_mono_ms, 125000);
  n.deadline_wall_ms = NOW - 1000; /* already past: due now */
  spot_notice_set_mono(&n, 5000, NOW);
  assert_int_equal(n.deadline_mono_ms, 5000);
  n.deadline_wall_ms = 0;
  spot_notice_set_mono(&n, 5000, NOW);
  assert_int_equal(n.deadline_mono_ms, 0);
}

/* The clock: deadlines are armed on the monotonic clock when a notice is
 * first seen; a wall-clock step afterwards (NTP, a VM resumed) neither
 * fires nor delays them. A fake time source plays the poller's part:
 * parse with the wall clock, report once (dedup), arm on mono. */
struct fake_clock {
  uint64_t mono;
  int64_t wall;
  uint64_t armed; /* mono deadline in force, 0 = none */
  struct spot_notice_dedup dedup;
};

static void
poll_once(struct fake_clock *k, int which, const char *body, size_t len)
{
  struct spot_notice n;
  int r = which == 0
              ? spot_meta_aws_parse_instance_action(body, len, k->wall, &n)
              : spot_meta_gcp_parse_preempted(body, len, k->wall, &n);

  assert_int_equal(r, 0);
  if (spot_notice_seen(&k->dedup, &n))
    return; /* reported once: the armed deadline stays */
  spot_notice_set_mono(&n, k->mono, k->wall);
  k->armed = n.deadline_mono_ms;
}

static bool
fired(const struct fake_clock *k)
{
  return k->armed != 0 && k->mono >= k->armed;
}

static void
test_wall_clock_jump(void **state)
{
  static const char aws[] =
      "{\"action\":\"terminate\",\"time\":\"2026-12-02T10:15:50Z\"}";
  struct fake_clock k;

  /* AWS, 120 s notice; the wall clock jumps an hour forward 1 s later */
  memset(&k, 0, sizeof(k));
  spot_notice_dedup_init(&k.dedup);
  k.mono = 5000000;
  k.wall = NOW;
  poll_once(&k, 0, S(aws));
  assert_int_equal(k.armed, 5000000 + 120000);
  k.mono += 1000;
  k.wall += 3600 * 1000 + 1000;
  poll_once(&k, 0, S(aws));
  assert_int_equal(k.armed, 5000000 + 120000); /* not re-armed */
  assert_true(k.wall > NOW + 120000);          /* the wall says "past" */
  assert_false(fired(&k));                     /* mono does not */
  k.mono = 5000000 + 119999;
  assert_false(fired(&k));
  k.mono = 5000000 + 120000;
  assert_true(fired(&k)); /* on time, not an hour early */

  /* GCP preempted (deadline = now + 30 s); the wall clock jumps an hour
   * back: the deadline still comes 30 s after the notice */
  memset(&k, 0, sizeof(k));
  spot_notice_dedup_init(&k.dedup);
  k.mono = 7000;
  k.wall = NOW;
  poll_once(&k, 1, S("TRUE"));
  assert_int_equal(k.armed, 7000 + 30000);
  k.mono += 2000;
  k.wall -= 3600 * 1000;
  poll_once(&k, 1, S("TRUE"));
  assert_int_equal(k.armed, 7000 + 30000);
  k.mono = 7000 + 29999;
  assert_false(fired(&k));
  k.mono = 7000 + 30000;
  assert_true(fired(&k));    /* not missed by an hour */
  assert_true(k.wall < NOW); /* though the wall clock is behind the notice */
}

/* The poller's retry schedule: jittered, growing, capped. */
static void
test_backoff_growth(void **state)
{
  uint64_t prev_max = 0;

  for (unsigned a = 0; a < 12; a++) {
    uint64_t lo = spot_backoff_ms(a, 200, 30000, 0);
    uint64_t hi = spot_backoff_ms(a, 200, 30000, UINT32_MAX);
    uint64_t mid = spot_backoff_ms(a, 200, 30000, UINT32_MAX / 2);

    assert_true(lo >= 100);
    assert_true(hi <= 30000);
    assert_true(lo <= mid && mid <= hi);
    assert_true(hi >= prev_max); /* never shrinks */
    prev_max = hi;
  }
  assert_int_equal(spot_backoff_ms(20, 200, 30000, UINT32_MAX), 30000);
  assert_true(spot_backoff_ms(3, 200, 30000, UINT32_MAX) >
              spot_backoff_ms(1, 200, 30000, UINT32_MAX));
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dates),
      cmocka_unit_test(test_aws_instance_action),
      cmocka_unit_test(test_aws_rebalance),
      cmocka_unit_test(test_aws_maintenance),
      cmocka_unit_test(test_aws_lifecycle),
      cmocka_unit_test(test_gcp),
      cmocka_unit_test(test_azure),
      cmocka_unit_test(test_dedup),
      cmocka_unit_test(test_names_and_mono),
      cmocka_unit_test(test_wall_clock_jump),
      cmocka_unit_test(test_backoff_growth),
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
