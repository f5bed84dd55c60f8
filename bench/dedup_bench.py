#!/usr/bin/python3
"""dedup_bench.py - what `spotctl push --dedup` uploads per checkpoint, and
what hashing costs (bench/results/dedup.md):

  /usr/bin/python3 bench/dedup_bench.py [BUILD] [--quick] [--cpu-only]

(torch is needed: /usr/bin/python3's.) Starts BUILD/bench/s3_mem (default
BUILD: build) on a free port and pushes with BUILD/client/spotctl:

1. bytes stored per checkpoint, 4 checkpoints each, torch.save of a
   state dict changed between steps as training changes it:
   - LoRA r=112 on 2048x2048 fp32 (10 % trainable, interleaved),
   - LoRA r=16 on 4096x4096 bf16 (0.8 % trainable),
   - full training (every tensor changes),
   for several --dedup-frame sizes, with the manifest's size;
2. CPU-s/GiB of the push (user + system of spotctl, wait4) for a fp32
   file: plain push, --dedup without a base (the first checkpoint),
   --dedup with a base where 10 % changed, alternated, median of 3.
Prints a markdown report on stdout."""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import torch

BUILD = next((a for a in sys.argv[1:] if not a.startswith("--")), "build")
QUICK = "--quick" in sys.argv
SPOTCTL = os.path.join(BUILD, "client", "spotctl")
S3MEM = os.path.join(BUILD, "bench", "s3_mem")
BUCKET = "bench"


def start_s3():
    p = subprocess.Popen([S3MEM, "0"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    port = int(p.stdout.readline().strip())
    return p, "http://127.0.0.1:%d" % port


def env(endpoint):
    e = dict(os.environ)
    e.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
             AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
             AWS_ENDPOINT_URL=endpoint)
    return e


def push(e, d, url, *args):
    t0 = time.monotonic()
    p = subprocess.Popen([SPOTCTL, "push", d, url, "-q"] + list(args), env=e,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    err = p.stderr.read().decode()
    p.returncode = 0
    if os.WEXITSTATUS(status) != 0:
        raise RuntimeError("push failed: " + err)
    return ru.ru_utime + ru.ru_stime, time.monotonic() - t0


def listing(e, url):
    out = subprocess.run([SPOTCTL, "list", url, "--json"], env=e, check=True,
                         capture_output=True, text=True).stdout
    return {c["name"]: c for c in json.loads(out)["checkpoints"]}


def manifest_len(endpoint, job, name):
    u = "%s/%s/%s/checkpoints/%s/MANIFEST.json" % (endpoint, BUCKET, job, name)
    with urllib.request.urlopen(u) as r:
        return len(r.read())


def lora_state(h, r, layers, dtype, g):
    sd = {}
    for i in range(layers):
        sd["layers.%d.q.base.weight" % i] = torch.randn(h, h, generator=g).to(dtype)
        sd["layers.%d.q.lora_A.weight" % i] = torch.randn(r, h, generator=g).to(dtype)
        sd["layers.%d.q.lora_B.weight" % i] = torch.zeros(h, r, dtype=dtype)
        sd["layers.%d.norm.weight" % i] = torch.ones(h, dtype=dtype)
    return sd


def train_step(sd, full, g):
    for k, t in sd.items():
        if full or "lora_" in k:
            t.add_((torch.randn(t.shape, generator=g) * 1e-3).to(t.dtype))


def bytes_per_ckpt(endpoint, e, tmp, what, sd, full, frame):
    job = "dedup-%s-%s-%d" % (what, frame or "off", int(time.time() * 1000))
    url = "s3://%s/%s" % (BUCKET, job)
    g = torch.Generator().manual_seed(7)
    names, whole, stored = [], 0, []
    for step in range(1, 5):
        if step > 1:
            train_step(sd, full, g)
        d = os.path.join(tmp, "%s-%d" % (job, step))
        os.makedirs(d)
        torch.save(sd, os.path.join(d, "model.pt"))
        whole = os.path.getsize(os.path.join(d, "model.pt"))
        n = "step-%d" % step
        args = ["-n", n, "--keep", "2"]
        if frame:
            args += ["--dedup-frame", frame]
        push(e, d, url, *args)
        names.append(n)
        stored.append(listing(e, url)[n]["stored_bytes"])
        subprocess.run(["rm", "-rf", d], check=True)
    mlen = manifest_len(endpoint, job, names[-1])
    return whole, stored, mlen


def gaussian_file(path, nbytes, g):
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(left, 64 << 20)
            f.write(torch.randn(n // 4, generator=g).numpy().tobytes())
            left -= n


def change_10pct(path, g):
    """Rewrites a 0.5 MiB run every 5 MiB: 10 % of the bytes, scattered."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        for off in range(3 << 20, size - (1 << 20), 5 << 20):
            f.seek(off)
            f.write(torch.randn((1 << 19) // 4, generator=g).numpy().tobytes())


def cpu_cost(e, tmp, size):
    g = torch.Generator().manual_seed(3)
    d = os.path.join(tmp, "cpu")
    os.makedirs(d)
    gaussian_file(os.path.join(d, "w.fp32"), size, g)
    res = {"plain": [], "dedup, no base": [], "dedup, base, 10 % changed": []}
    for rep in range(3):
        for what in res:
            job = "cpu-%d-%d" % (rep, int(time.time() * 1000))
            url = "s3://%s/%s" % (BUCKET, job)
            if what == "dedup, base, 10 % changed":
                push(e, d, url, "-n", "base", "--dedup")
                change_10pct(os.path.join(d, "w.fp32"), g)
                cpu, wall = push(e, d, url, "-n", "next", "--dedup")
            else:
                args = ["-n", "one"] + (["--dedup"] if what != "plain" else [])
                cpu, wall = push(e, d, url, *args)
            res[what].append((cpu, wall))
    return res


def main():
    s3, endpoint = start_s3()
    e = env(endpoint)
    try:
        with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
            print("# dedup bench\n")
            print("`%s` on %s, %d CPUs, s3_mem; torch %s.\n" % (
                " ".join(sys.argv), os.uname().nodename, os.cpu_count(),
                torch.__version__))
            g = torch.Generator().manual_seed(1)
            nl = 3 if QUICK else 8
            nb = 2 if QUICK else 4
            cases = [
                ("LoRA r=112, %d x 2048^2 fp32 (10 %% trainable)" % nl,
                 lambda: lora_state(2048, 112, nl, torch.float32, g), False),
                ("LoRA r=16, %d x 4096^2 bf16 (0.8 %% trainable)" % nb,
                 lambda: lora_state(4096, 16, nb, torch.bfloat16, g), False),
                ("full training, %d x 2048^2 fp32 (every tensor changes)" % nl,
                 lambda: lora_state(2048, 112, nl, torch.float32, g), True),
            ]
            frames = [None, "256K", "1M", "4M"]
            if "--cpu-only" in sys.argv:
                cases = []
            print("## Bytes stored per checkpoint (torch.save, 4 steps, "
                  "--keep 2)\n")
            print("| state dict | --dedup-frame | file | stored per checkpoint "
                  "(x of the first) | manifest |")
            print("|---|---|---|---|---|")
            for what, make, full in cases:
                for fr in (frames if not full else [None, "1M"]):
                    sd = make()
                    whole, stored, mlen = bytes_per_ckpt(
                        endpoint, e, tmp, what.split(",")[0].replace(" ", "")
                        .replace("=", ""), sd, full, fr)
                    first = stored[0] or 1
                    cell = ", ".join("%.1f MiB (%.3f)" % (s / 2**20, s / first)
                                     if s is not None else "-" for s in stored)
                    print("| %s | %s | %.1f MiB | %s | %.1f KiB |" % (
                        what, fr or "off (plain push)", whole / 2**20, cell,
                        mlen / 1024))
                    sys.stdout.flush()
            size = (256 if QUICK else 512) << 20
            print("\n## CPU of the push (spotctl user + system, %d MiB fp32)\n"
                  % (size >> 20))
            res = cpu_cost(e, tmp, size)
            print("| push | CPU-s/GiB (median) | wall s (median) | runs |")
            print("|---|---|---|---|")
            for what, runs in res.items():
                cpu = statistics.median(r[0] for r in runs) / (size / 2**30)
                wall = statistics.median(r[1] for r in runs)
                print("| %s | %.2f | %.2f | %s |" % (
                    what, cpu, wall,
                    " ".join("%.2f" % (r[0] / (size / 2**30)) for r in runs)))
    finally:
        s3.terminate()
        s3.wait()


if __name__ == "__main__":
    main()
