#!/usr/bin/env python3
"""Crash safety of sliced saves: SIGKILL of the whole job (every rank and
the launcher, one process group) at random moments of the saves of a run
that saves every step (once a random step's save has made its temporary
directory, after a random delay of up to 4 ms), then a resume: every time, the newest committed checkpoint (the
one `latest` names) loads and the resumed run ends bitwise where the
uninterrupted run ends (its last checkpoint's files equal byte for byte).

  test_ckpt_kill.py PARTRAIN [--kills N] [--seed S]

N kills with synchronous saves and N with checkpoint.async = true (the
writer thread killed mid-write too), at tp 2 on two ranks (each file
written by both ranks, interleaved by rows). A kill is counted as "in a
save" when it leaves the save's temporary directory behind. Exit 0 when
every resume ends bitwise; 77 (skipped) without python3's modules."""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

STEPS = 24


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)


def same_checkpoint(a, b):
    for f in ("model.safetensors", "optim_m.safetensors", "optim_v.safetensors"):
        with open(os.path.join(a, f), "rb") as x, open(os.path.join(b, f), "rb") as y:
            if x.read() != y.read():
                return "%s differs" % f
    sa, sb = (json.load(open(os.path.join(d, "state.json"))) for d in (a, b))
    for s in (sa, sb):
        del s["config"]["checkpoint"]["dir"]
    return None if sa == sb else "state.json differs"


def main():
    partrain = os.path.abspath(sys.argv[1])
    kills = int(sys.argv[sys.argv.index("--kills") + 1]) if "--kills" in sys.argv else 3
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 39
    rng = random.Random(seed)
    tmp = tempfile.mkdtemp(prefix="pt-test-ckpt-kill-")
    os.chdir(tmp)
    with open("train.txt", "w") as f:
        for i in range(400):
            f.write("the quick brown fox %d jumps over the lazy dog\n" % i)
    with open("cfg.json", "w") as f:
        json.dump({"model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256,
                             "seq_len": 32},
                   "data": {"train": "train.txt"},
                   "train": {"steps": STEPS, "batch_size": 4, "warmup_steps": 2,
                             "val_every": 0, "threads": 1},
                   "checkpoint": {"every": 1, "keep": 2},
                   "log": {"every": 1000}}, f)
    env = dict(os.environ, PT_LOG="warn", OPENBLAS_NUM_THREADS="1")
    failures = 0
    for mode in ("false", "true"):
        base = [partrain, "train", "--config", "cfg.json", "--nproc", "2", "--set",
                "parallel.tp=2", "--set", "checkpoint.async=" + mode]
        ref = "ref-" + mode
        t0 = time.time()
        r = run(base + ["--set", "checkpoint.dir=" + ref], env=env)
        span = time.time() - t0
        if r.returncode != 0:
            print("FAIL reference run (async %s): %s" % (mode, r.stderr.strip()))
            return 1
        in_save = finished = 0
        for k in range(kills):
            d = "kill-%s-%d" % (mode, k)
            p = subprocess.Popen(base + ["--set", "checkpoint.dir=" + d], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
            # a moment of a save: the temporary directory of a random step's
            # save has appeared, then a random part of a millisecond or a few
            # (a fixed delay from the start lands after the run's end on a
            # fast machine and before the first save on a slow one)
            step = rng.randint(1, STEPS)
            prefix = ".tmp-step_%08d-" % step
            deadline = time.time() + 10 * span + 5

            def saving():
                try:
                    return any(e.startswith(prefix) for e in os.listdir(d))
                except FileNotFoundError:
                    return False
            while p.poll() is None and not saving() and time.time() < deadline:
                time.sleep(0.0002)
            time.sleep(rng.uniform(0.0, 0.004))
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
            for _ in range(1000):  # the ranks gone too (their lock released)
                try:
                    os.killpg(p.pid, 0)
                    time.sleep(0.01)
                except ProcessLookupError:
                    break
            if p.returncode == 0:
                finished += 1
            left = [e for e in os.listdir(d)] if os.path.isdir(d) else []
            in_save += any(e.startswith(".tmp-step_") for e in left)
            latest = open(os.path.join(d, "latest")).read().strip() if "latest" in left else None
            r = run(base + ["--set", "checkpoint.dir=" + d, "--resume"], env=env)
            why = None
            if latest is None:
                why = None if r.returncode != 0 else "resumed with no latest"
                r = run(base + ["--set", "checkpoint.dir=" + d], env=env)  # from scratch
            if why is None and r.returncode != 0:
                why = "the resume failed: " + r.stderr.strip()
            if why is None:
                why = same_checkpoint(os.path.join(ref, "step_%08d" % STEPS),
                                      os.path.join(d, "step_%08d" % STEPS))
            if why:
                failures += 1
                print("FAIL async %s kill %d (latest %s): %s" % (mode, k, latest, why))
            shutil.rmtree(d, ignore_errors=True)
        print("async %s: %d kills (%d in a save, %d after the run ended), every resume bitwise%s"
              % (mode, kills, in_save, finished, "" if not failures else " but the failures above"))
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


sys.exit(main())
