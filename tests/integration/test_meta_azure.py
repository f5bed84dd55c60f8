"""lib/meta against `spotd-emulate --provider azure`: the Metadata
header, DocumentIncarnation, the Resources filter, NotBefore as the
deadline, and the ack sent only when asked."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from metalib import Emulator, Watch, cycle_faults, expect, run, stats  # noqa: E402

EVENTS = "/metadata/scheduledevents?api-version=2020-07-01"
MD = {"Metadata": "true"}


def test_contract():
    import json
    e = Emulator("azure", "--vm-name", "trainer-7")
    st, _, _ = e.request(EVENTS)
    expect(st == 400, st)  # Metadata: true missing
    st, _, _ = e.request("/metadata/scheduledevents", headers=MD)
    expect(st == 400, st)  # api-version missing
    st, body, _ = e.request(EVENTS, headers=MD)
    doc = json.loads(body)
    expect(doc["Events"] == [], doc)
    inc0 = doc["DocumentIncarnation"]
    st, body, _ = e.request(EVENTS, headers=MD)
    expect(json.loads(body)["DocumentIncarnation"] == inc0)  # no change
    e.control("notice", deadline="30")
    st, body, _ = e.request(EVENTS, headers=MD)
    doc = json.loads(body)
    expect(doc["DocumentIncarnation"] == inc0 + 1, doc)
    ev = doc["Events"][0]
    expect(ev["EventType"] == "Preempt" and ev["Resources"] == ["trainer-7"])
    expect(ev["EventStatus"] == "Scheduled" and ev["NotBefore"].endswith(
        " GMT"), ev)
    st, _, _ = e.request(EVENTS, method="POST", headers=MD, data=json.dumps(
        {"StartRequests": [{"EventId": ev["EventId"]}]}).encode())
    expect(st == 200, st)
    _, line = e.out.wait("^ack EventId=" + ev["EventId"], 5)
    expect(line is not None)
    st, body, _ = e.request(EVENTS, headers=MD)
    doc = json.loads(body)
    expect(doc["DocumentIncarnation"] == inc0 + 2, doc)
    expect(doc["Events"][0]["EventStatus"] == "Started", doc)
    expect(doc["Events"][0]["NotBefore"] == "", doc)
    e.stop()


def test_notice_no_ack_unless_asked():
    e = Emulator("azure", "--vm-name", "trainer-7")
    w = Watch(e.url, "auto", "--poll-ms", "1000")  # name from IMDS
    lat = []
    time.sleep(0.5)
    t0 = time.time()
    e.control("notice", deadline="30")
    _, n = w.notice(5)
    expect(n is not None, "preempt not detected")
    expect(n["kind"] == "preempt" and n["reason"] == "azure-preempt", n)
    # deadline = NotBefore (whole seconds)
    expect(abs(int(n["deadline_wall_ms"]) - (t0 + 30) * 1000) < 1500, n)
    lat.append(int(n["wall_ms"]) - t0 * 1000)
    time.sleep(2)
    expect(e.state()["acks"] == [], e.state())
    expect(not e.out.matching("^ack "), "ack sent without being asked")
    expect(len(w.notices()) == 1)  # reported once across polls
    stats("azure detection latency (poll 1 s)", lat)
    w.stop()
    e.stop()


def test_resource_filter():
    e = Emulator("azure", "--vm-name", "trainer-7")
    w = Watch(e.url, "azure", "--poll-ms", "300", "--vm-name", "trainer-7")
    e.control("notice", resource="another-vm")
    time.sleep(2)
    expect(not w.notices(), w.notices())
    e.control("maintenance", deadline="600")  # a Reboot for this VM
    _, n = w.notice(5)
    expect(n is not None and n["reason"] == "azure-reboot", n)
    w.stop()
    e.stop()


def test_ack_when_asked():
    e = Emulator("azure")
    w = Watch(e.url, "azure", "--poll-ms", "300", "--ack")
    e.control("notice")
    _, n = w.notice(5)
    expect(n is not None)
    _, line = w.out.wait("^ack status=0", 5)
    expect(line is not None, "ack not accepted")
    _, line = e.out.wait("^ack EventId=" + n["id"], 5)
    expect(line is not None, "emulator saw no ack")
    expect(e.state()["acks"] == [n["id"]], e.state())
    time.sleep(1)  # the Started event is the same notice: not re-reported
    expect(len(w.notices()) == 1, w.notices())
    w.stop()
    e.stop()


def test_faults():
    e = Emulator("azure")
    w = Watch(e.url, "azure", "--poll-ms", "300", "--warn-after", "3",
              "--vm-name", "spotd-vm")
    cycle_faults(e, w, throttle="0.5", malformed="0.3", reset="0.1")
    e.control("fault", clear="1")
    expect(w.healthy(10), "warning not cleared")
    mark = w.out.count()
    e.control("fault", stall="3")
    _, line = w.out.wait("^warning ", 15, mark)
    expect(line is not None, "no warning under stalls")
    e.control("fault", clear="1")
    e.control("notice")
    _, n = w.notice(30)
    expect(n is not None, "notice missed after faults")
    expect(w.err.matching("HTTP 503") and w.err.matching("malformed"))
    expect(w.healthy(10), "warning not cleared")
    w.stop()
    e.stop()


run([test_contract, test_notice_no_ack_unless_asked, test_resource_filter,
     test_ack_when_asked, test_faults])
