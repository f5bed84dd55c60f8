"""lib/meta against `spotd-emulate --provider gcp`: the Metadata-Flavor
check, long poll with ETag, preempted with its 30 s deadline, maintenance
events, and faults."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from metalib import Emulator, Watch, cycle_faults, expect, run, stats  # noqa: E402

KEY = "/computeMetadata/v1/instance/preempted"
FLAVOR = {"Metadata-Flavor": "Google"}


def test_contract():
    e = Emulator("gcp")
    st, _, _ = e.request(KEY)
    expect(st == 403, st)  # header missing
    st, _, _ = e.request(KEY, headers={"Metadata-Flavor": "Google",
                                       "X-Forwarded-For": "1.2.3.4"})
    expect(st == 403, st)
    st, body, h = e.request(KEY, headers=FLAVOR)
    expect(st == 200 and body == "FALSE", (st, body))
    expect(h.get("Metadata-Flavor") == "Google", h)
    etag = h["ETag"]
    # same ETag: blocks until timeout_sec, then the same value
    t0 = time.time()
    st, body, h2 = e.request(
        KEY + "?wait_for_change=true&last_etag=%s&timeout_sec=1" % etag,
        headers=FLAVOR)
    expect(st == 200 and body == "FALSE" and h2["ETag"] == etag)
    expect(0.9 < time.time() - t0 < 3, time.time() - t0)
    # a change ends the wait early with a new ETag
    e.control("notice", after="0.5")
    t0 = time.time()
    st, body, h3 = e.request(
        KEY + "?wait_for_change=true&last_etag=%s&timeout_sec=30" % etag,
        headers=FLAVOR)
    expect(body == "TRUE" and h3["ETag"] != etag, (body, h3))
    expect(time.time() - t0 < 3)
    e.stop()


def test_preempted_deadline():
    e = Emulator("gcp")
    w = Watch(e.url, "auto", "--gcp-wait", "30")
    time.sleep(0.5)  # both long polls are waiting
    t0 = time.time()
    e.control("notice")
    _, n = w.notice(5)
    expect(n is not None, "preemption not detected")
    expect(n["kind"] == "preempt" and n["reason"] == "gcp-preempted", n)
    detect = int(n["wall_ms"])
    expect(abs(int(n["deadline_wall_ms"]) - (detect + 30000)) < 100, n)
    stats("gcp preempted latency (long poll)", [detect - t0 * 1000])
    w.stop()
    e.stop()


def test_maintenance_latency_and_dedup():
    """Each maintenance episode reported once, through the long poll."""
    e = Emulator("gcp")
    w = Watch(e.url, "gcp", "--gcp-wait", "30")
    lat = []
    start = 0
    for i in range(8):
        time.sleep(0.3)
        t0 = time.time()
        e.control("maintenance", deadline="60")
        idx, n = w.notice(5, start)
        expect(n is not None, "maintenance %d not detected" % i)
        start = idx + 1
        expect(n["kind"] == "maintenance", n)
        lat.append(int(n["wall_ms"]) - t0 * 1000)
        time.sleep(0.3)
        e.control("cancel")  # back to NONE: the next one is new
    med = stats("gcp maintenance-event latency (long poll)", lat)
    expect(med < 1000, lat)  # generous; the target is 200 ms
    expect(len(w.notices()) == 8)
    w.stop()
    e.stop()


def test_faults():
    """Throttling, resets, stalls longer than the long-poll timeout and
    garbage: logged, survived, notice not missed."""
    e = Emulator("gcp")
    w = Watch(e.url, "gcp", "--gcp-wait", "2", "--warn-after", "3",
              "--poll-ms", "300")
    cycle_faults(e, w, throttle="0.4", reset="0.2", malformed="0.3")
    mark = w.err.count()
    e.control("fault", clear="1", stall="6")
    _, line = w.err.wait("timed out", 20, mark)
    expect(line is not None, "stall not logged")
    e.control("fault", clear="1", stall="6", stall_fraction="0.5")
    time.sleep(4)
    e.control("fault", clear="1")
    e.control("notice")
    _, n = w.notice(30)
    expect(n is not None, "preemption missed after faults")
    expect(w.err.matching("HTTP 503"), "throttling not logged")
    expect(w.err.matching("malformed document"), "garbage not logged")
    expect(w.err.matching("timed out"), "stall not logged")
    expect(w.p.poll() is None)
    w.stop()
    e.stop()


run([test_contract, test_preempted_deadline,
     test_maintenance_latency_and_dedup, test_faults])
