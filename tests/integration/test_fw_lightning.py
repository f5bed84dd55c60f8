"""spotd.lightning on a real PyTorch Lightning Trainer (CPU, a tiny model
with dropout, a plain shuffled DataLoader), one process and 2-rank DDP
(gloo), each under `spotd run`: a spot notice mid-epoch, the checkpoint
committed to the store (exit 75), a fresh node restores it and resumes
with fit(ckpt_path=spotd.lightning.ckpt_path()); every later step (the
batch's sample ids, the loss) and the final weights of every rank equal
an uninterrupted run's (fwlib.run). The committed folder holds last.ckpt,
each rank's data position and the marker.

Needs the Lightning package: tools/test gives it (the frameworks archive,
$SPOTD_TEST_PYTHONUSERBASE; then a missing import fails); otherwise skips
(77) when /usr/bin/python3 does not import lightning.pytorch. Skips
without the test S3 server."""
import os
import re
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402
import fwlib  # noqa: E402

TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "fw_lightning_trainer.py")
STEPS = 28  # 64 samples in batches of 4: 16 per epoch, 8 per rank in DDP


def one(c, env, devices):
    what = "Lightning, %s" % ("1 process" if devices == 1 else
                              "%d-rank DDP" % devices)
    cmd = [sl.PY3, TRAINER, "--steps", str(STEPS), "--devices", str(devices)]

    def folder(c, path):
        files = sorted(os.listdir(path)) if os.path.isdir(path) else []
        want = sorted(["SPOTD_COMPLETE", "last.ckpt"] +
                      ["spotd-data-rank%d.pt" % r for r in range(devices)])
        c.check(files == want, "%s: the committed folder holds last.ckpt, "
                "each rank's data position and the marker" % what,
                repr(files))

    lines = fwlib.run(c, what, cmd + ["--sleep", "0.3"], env, STEPS, devices,
                      notice_at=5, resume_cmd=cmd, folder_check=folder)
    if lines is None:
        return
    skipped = {int(m.group(1)): int(m.group(2)) for m in
               (re.match(r"^skipped rank (\d+) (\d+)$", x) for x in lines)
               if m}
    c.check(sorted(skipped) == list(range(devices)) and
            all(v > 0 for v in skipped.values()),
            "%s: every rank replayed its epoch's consumed batches (%s)" %
            (what, skipped), "\n".join(lines[-20:]))


def main():
    sl.daemon_env()
    env = fwlib.fw_env(["torch", "lightning.pytorch"],
                       "the Lightning integration (spotd.lightning)")
    c = sl.Checks()
    threads = [threading.Thread(target=one, args=(c, env, d))
               for d in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sl.kill_started()
    c.finish()


if __name__ == "__main__":
    main()
