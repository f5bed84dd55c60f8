"""lib/meta against `spotd-emulate --provider aws`: IMDSv2 tokens,
spot notice with its deadline, rebalance, maintenance (cancelled ones not
reported), token expiry, throttling, stalls, resets and garbage."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from metalib import Emulator, Watch, expect, log, run, stats  # noqa: E402


def test_contract():
    """The emulator serves the documented IMDSv2 contract."""
    e = Emulator("aws")
    st, _, _ = e.request("/latest/api/token", method="PUT")
    expect(st == 400, st)  # TTL header missing
    for bad in ("0", "21601", "x"):
        st, _, _ = e.request("/latest/api/token", method="PUT", headers={
            "X-aws-ec2-metadata-token-ttl-seconds": bad})
        expect(st == 400, (bad, st))
    st, tok, h = e.request("/latest/api/token", method="PUT", headers={
        "X-aws-ec2-metadata-token-ttl-seconds": "21600"})
    expect(st == 200 and tok, st)
    expect(h.get("X-aws-ec2-metadata-token-ttl-seconds") == "21600", h)
    st, _, _ = e.request("/latest/meta-data/instance-id")
    expect(st == 401, st)  # IMDSv2 required by default
    st, _, _ = e.request("/latest/meta-data/instance-id",
                         headers={"X-aws-ec2-metadata-token": "bogus"})
    expect(st == 401, st)
    auth = {"X-aws-ec2-metadata-token": tok}
    st, _, _ = e.request("/latest/meta-data/spot/instance-action",
                         headers=auth)
    expect(st == 404, st)  # nothing pending
    e.control("notice", action="stop", deadline="120")
    st, body, _ = e.request("/latest/meta-data/spot/instance-action",
                            headers=auth)
    expect(st == 200 and '"action": "stop"' in body, (st, body))
    e.control("fault", token_expire="0")
    st, _, _ = e.request("/latest/meta-data/instance-id", headers=auth)
    expect(st == 401, st)  # forced expiry
    e.stop()


def test_notice_deadline_and_latency():
    """Notice detected with the right deadline; latency over 8 notices."""
    e = Emulator("aws", "--notice-deadline", "120")
    w = Watch(e.url, "auto", "--poll-ms", "1000")
    lat = []
    start = 0
    for i, action in enumerate(["terminate", "stop", "hibernate"] * 3):
        if i == 8:
            break
        time.sleep(0.37 * (i % 3))  # spread over the poll phase
        t0 = time.time()
        e.control("notice", action=action, deadline="120")
        idx, n = w.notice(8, start)
        expect(n is not None, "notice %d not detected" % i)
        start = idx + 1
        expect(n["kind"] == action, n)
        expect(n["reason"] == "aws-spot-" + action, n)
        deadline = int(n["deadline_wall_ms"])
        expect(abs(deadline - (t0 + 120) * 1000) < 1500, (deadline, t0))
        expect(115000 < int(n["deadline_in_ms"]) <= 121000, n)
        lat.append(int(n["wall_ms"]) - t0 * 1000)
        time.sleep(1.1)  # the next notice gets a new time, so a new id
    med = stats("aws detection latency (poll 1 s)", lat)
    expect(max(lat) < 1000 + 1200, lat)  # generous: poll interval + slack
    expect(med < 1500, med)
    # each notice once, though it stays visible for many polls
    expect(len(w.notices()) == 8, w.notices())
    w.stop()
    e.stop()


def test_rebalance_and_maintenance():
    """Rebalance reported; an active maintenance once; a cancelled one
    never."""
    e = Emulator("aws")
    w = Watch(e.url, "aws", "--poll-ms", "200")
    e.control("maintenance", after="0", deadline="600", cancelled="1")
    e.control("rebalance")
    _, n = w.notice(5)
    expect(n is not None and n["kind"] == "rebalance", n)
    expect(n["deadline_wall_ms"] == "0", n)
    time.sleep(2)
    expect(not [l for l in w.notices() if "maintenance" in l], w.notices())
    e.control("maintenance", after="0", deadline="600", cancel_after="3")
    _, n = w.notice(5, 0, "kind=maintenance")
    expect(n is not None and n["reason"] == "aws-maintenance", n)
    expect(n["id"].startswith("instance-event-"), n)
    time.sleep(3.5)  # cancelled after 3 s: no second report
    expect(len([l for l in w.notices() if "maintenance" in l]) == 1)
    w.stop()
    e.stop()


def test_token_expiry_mid_run():
    """Tokens the server expires after 2 s: 401, new token, retry once."""
    e = Emulator("aws", "--fault", "token-expire=2")
    w = Watch(e.url, "aws", "--poll-ms", "500", "--warn-after", "3")
    time.sleep(5)
    e.control("notice")
    _, n = w.notice(5)
    expect(n is not None, "notice missed after token expiry")
    expect(w.err.matching("HTTP 401, fetching a new token"), "no 401 seen")
    expect(not w.out.matching("^warning "), w.out.matching("^warning "))
    w.stop()
    e.stop()


def test_throttle_stall_reset():
    """503s, resets and stalls longer than the 2 s timeout: no crash, no
    missed notice, a warning while it lasts."""
    e = Emulator("aws")
    w = Watch(e.url, "aws", "--poll-ms", "500", "--warn-after", "3")
    e.control("fault", throttle="0.5", reset="0.2")
    time.sleep(3)
    e.control("notice", action="terminate")
    _, n = w.notice(30)
    expect(n is not None, "notice missed under throttling")
    expect(w.err.matching("HTTP 503"), "throttling not logged")
    e.control("fault", clear="1")
    expect(w.healthy(10), "warning not cleared after throttling")
    mark = w.out.count()
    e.control("fault", stall="3")
    _, line = w.out.wait("^warning ", 20, mark)
    expect(line is not None and "timed out" in line, line)
    time.sleep(1)
    e.control("fault", clear="1")
    time.sleep(1.2)  # the old notice time is in the id: move to a new second
    e.control("notice", action="stop")
    _, n = w.notice(30, 0, "kind=stop")
    expect(n is not None, "notice missed after stalls")
    expect(w.healthy(10), "warning not cleared after stalls")
    expect(w.p.poll() is None, "meta_watch died")
    w.stop()
    e.stop()


def test_malformed():
    """Garbage bodies are logged, retried, and survived."""
    e = Emulator("aws")
    w = Watch(e.url, "aws", "--poll-ms", "300", "--warn-after", "3")
    e.control("fault", malformed="1")
    e.control("notice")  # hidden behind garbage for now
    time.sleep(3)
    expect(w.err.matching("malformed document"), "garbage not logged")
    expect(not w.notices())
    e.control("fault", clear="1")
    _, n = w.notice(10)
    expect(n is not None, "notice missed after garbage")
    w.stop()
    e.stop()


def test_lifecycle_imdsv1():
    """Optional target-lifecycle-state watch; tokens optional here."""
    e = Emulator("aws", "--imdsv2", "optional")
    w = Watch(e.url, "aws", "--poll-ms", "300", "--lifecycle", "--imdsv1")
    time.sleep(1)
    expect(not w.notices())  # InService
    e.control("lifecycle", state="Terminated")
    _, n = w.notice(5)
    expect(n is not None and n["reason"] == "aws-asg-terminate", n)
    w.stop()
    e.stop()


def test_auto_none():
    """auto with nobody answering reports provider none."""
    import subprocess
    from metalib import META_WATCH
    out = subprocess.run(
        [META_WATCH, "--provider", "auto", "--url", "http://127.0.0.1:9",
         "--duration", "2"], capture_output=True, text=True, timeout=20)
    expect("provider none" in out.stdout, out.stdout)
    expect("loop_close=0" in out.stdout and out.returncode == 0, out)


run([test_contract, test_notice_deadline_and_latency,
     test_rebalance_and_maintenance, test_token_expiry_mid_run,
     test_throttle_stall_reset, test_malformed, test_lifecycle_imdsv1,
     test_auto_none])
