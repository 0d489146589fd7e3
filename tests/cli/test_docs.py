#!/usr/bin/env python3
"""The docs against the code (CTest test_docs, label quick).

1. docs/reference.md's "Config keys" table is, byte for byte, what
   `partrain train --help=markdown` prints from config.c's table, and its
   keys are exactly the ones `partrain train --help` lists.
2. All of docs/*.md together stay under 2,500 lines.
3. Every command of README.md and docs/guide.md runs: each line of a ```sh
   (or bash) block, and each indented (code) line outside a block; a
   block without a language is an error (outputs go in ```text). They
   run in order, in one temporary directory that holds configs/ and clusters/ (links to the tree) and a
   tiny data/fortunes/{train,val}.txt, on a tiny model: a `train` or
   `plan` gets --set overrides appended (2 layers, 16 channels, 16 tokens,
   one thread; 4 steps unless the command sets train.steps), `calibrate`
   gets --quick, and `--layout auto` / `--elastic` without --cluster plan
   on a quick profile made first. A command must exit 0, or the status its
   line ends with (`# exit N`); an unknown key is a non-zero exit. A
   command that needs what CI lacks is on SKIP below with the reason, and
   nothing else is skipped.

usage: test_docs.py SOURCE_DIR PATH/TO/partrain
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

# (pattern on the command, why it is not run here)
SKIP = [
    (r"^bash scripts/quickstart\.sh", "about 3 minutes: installs, builds, calibrates fully; its train --layout auto and report are run below"),
    (r"^bash scripts/test\.sh", "the whole suite, this test included (.ci/run runs it)"),
    (r"^bash scripts/setup\.sh", "installs Debian packages as root (scripts/test.sh runs it first)"),
    (r"^bash scripts/prepare-data\.sh", "needs the fortunes package; this test writes tiny data"),
    (r"^bash scripts/fuzz\.sh", "needs clang's libFuzzer, minutes a target"),
    (r"^cmake ", "builds or installs the tree this test runs from (test_install installs)"),
    (r"^mpirun ", "mpirun: several hosts (tests/comm_mpi runs mpi jobs)"),
    (r"^scripts/mpirun-restart\.sh", "mpirun: several hosts (comm_mpi_restart runs it)"),
    (r"^(export PKG_CONFIG_PATH|cc |LD_LIBRARY_PATH=)", "the installed library (test_install runs these)"),
]

# what makes a train or plan tiny; train.steps only when the command sets none
TINY = ["model.n_layer=2", "model.n_embd=16", "model.n_head=4", "model.seq_len=16",
        "train.threads=1", "train.val_batches=1"]
STEPS = "train.steps=4"

LINE_LIMIT = 2500


def fail(msg):
    print("test_docs: FAIL: " + msg)
    return 1


def check_reference(src, P):
    bad = 0
    md = subprocess.run([P, "train", "--help=markdown"], capture_output=True, text=True)
    if md.returncode != 0:
        return fail("train --help=markdown exited %d" % md.returncode)
    ref = open(os.path.join(src, "docs/reference.md"), encoding="utf-8").read()
    m = re.search(r"<!-- keys: begin[^\n]*-->\n(.*?)<!-- keys: end -->", ref, re.S)
    if not m:
        return fail("docs/reference.md: no '<!-- keys: begin -->' ... '<!-- keys: end -->' section")
    if m.group(1) != md.stdout:
        import difflib
        d = difflib.unified_diff(m.group(1).splitlines(), md.stdout.splitlines(),
                                 "docs/reference.md", "partrain train --help=markdown", lineterm="")
        print("\n".join(list(d)[:40]))
        bad += fail("docs/reference.md's key table differs from `partrain train --help=markdown`:"
                    " paste its output between the markers")
    hl = subprocess.run([P, "train", "--help"], capture_output=True, text=True).stdout
    help_keys = set(re.findall(r"^  ([a-z_]+\.[a-z_0-9]+) ", hl, re.M))
    ref_keys = set(re.findall(r"^\| `([^`]+)` \|", m.group(1), re.M))
    if not help_keys or help_keys != ref_keys:
        bad += fail("keys in train --help but not in the reference: %s; in the reference only: %s"
                    % (sorted(help_keys - ref_keys), sorted(ref_keys - help_keys)))
    else:
        print("test_docs: ok: reference lists the %d keys of train --help, nothing else"
              % len(help_keys))
    return bad


def check_lines(src):
    d = os.path.join(src, "docs")
    n = 0
    for f in sorted(os.listdir(d)):
        if f.endswith(".md"):
            n += sum(1 for _ in open(os.path.join(d, f), encoding="utf-8"))
    if n >= LINE_LIMIT:
        return fail("docs/*.md hold %d lines, the limit is %d" % (n, LINE_LIMIT))
    print("test_docs: ok: docs/*.md hold %d lines (< %d)" % (n, LINE_LIMIT))
    return 0


def extract(path):
    """(file:line, command) for every command of a markdown file."""
    out = []
    fence = None
    pending, start = "", 0
    for i, raw in enumerate(open(path, encoding="utf-8"), 1):
        line = raw.rstrip("\n")
        if fence is None:
            m = re.match(r"^\s*```\s*(\S*)", line)
            if m:
                fence = m.group(1)
                if not fence:
                    out.append(("%s:%d" % (path, i), None))  # unlabelled block
                    fence = "-"
                continue
            if line.startswith("    ") and line.strip():
                # indented code: a command, never an unlabelled output (put
                # outputs in ```text blocks, so that no command hides here)
                out.append(("%s:%d" % (path, i), line.strip()))
            continue
        if re.match(r"^\s*```\s*$", line):
            fence = None
            continue
        if fence not in ("sh", "bash"):
            continue
        s = line.strip()
        if not pending and (not s or s.startswith("#")):
            continue
        if not pending:
            start = i
        if s.endswith("\\"):
            pending += s[:-1] + " "
            continue
        out.append(("%s:%d" % (path, start), pending + s))
        pending = ""
    return out


def set_keys(words):
    keys = set()
    for k, w in enumerate(words):
        if w == "--set" and k + 1 < len(words):
            keys.add(words[k + 1].split("=", 1)[0])
        elif w.startswith("--set="):
            keys.add(w[6:].split("=", 1)[0])
    return keys


def rewrite(cmd, P, quick_profile):
    """The command as run here: partrain's path, and a tiny model."""
    code = cmd.split(" #", 1)[0].strip()
    words = shlex.split(code)
    k = 0
    while k < len(words) and re.match(r"^[A-Z_][A-Z0-9_]*=", words[k]):
        k += 1  # VAR=value before the program
    if k >= len(words) or words[k] not in ("partrain", "./build/src/cli/partrain"):
        return code
    words[k] = P
    sub = words[k + 1] if k + 1 < len(words) else ""
    extra = []
    if sub in ("train", "plan") and "--help" not in words:
        have = set_keys(words)
        for kv in TINY:
            extra += ["--set", kv]
        if sub == "train" and "train.steps" not in have:
            extra += ["--set", STEPS]
        if sub == "train" and ("--layout" in words or "--elastic" in words) \
                and "--cluster" not in words:
            extra += ["--cluster", quick_profile]
    if sub == "calibrate" and "--help" not in words and "--quick" not in words:
        extra += ["--quick"]
    return " ".join(shlex.quote(w) for w in words + extra)


def tiny_data(d):
    os.makedirs(os.path.join(d, "data/fortunes"))
    lines = ["fortune %d: the quick brown fox jumps over the lazy dog, then naps." % i
             for i in range(400)]
    with open(os.path.join(d, "data/fortunes/train.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(d, "data/fortunes/val.txt"), "w") as f:
        f.write("\n".join(lines[:60]) + "\n")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    src, P = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    bad = check_reference(src, P) + check_lines(src)
    cmds = []
    for f in ("README.md", "docs/guide.md"):
        cmds += [(os.path.relpath(w, src), c) for w, c in extract(os.path.join(src, f))]
    with tempfile.TemporaryDirectory(prefix="pt-test-docs-") as T:
        for d in ("configs", "clusters"):
            os.symlink(os.path.join(src, d), os.path.join(T, d))
        tiny_data(T)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", XDG_CACHE_HOME=os.path.join(T, ".cache"))
        quick = os.path.join(T, ".quick-profile.json")
        r = subprocess.run([P, "calibrate", "--quick", "--threads", "1", "--out", quick],
                           cwd=T, env=env, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            return fail("calibrate --quick: " + r.stdout + r.stderr)
        ran = skipped = 0
        for where, cmd in cmds:
            if cmd is None:
                bad += fail("%s: a code block without a language: ```sh for commands, "
                            "```text for output" % where)
                continue
            why = next((w for p, w in SKIP if re.search(p, cmd)), None)
            if why:
                skipped += 1
                print("test_docs: skip %s: %s (%s)" % (where, cmd, why))
                continue
            m = re.search(r"#\s*exit (\d+)\s*$", cmd)
            want = int(m.group(1)) if m else 0
            run = rewrite(cmd, P, quick)
            try:
                r = subprocess.run(["bash", "-c", run], cwd=T, env=env, capture_output=True,
                                   text=True, errors="replace", timeout=120)
                rc, out = r.returncode, r.stdout + r.stderr
            except subprocess.TimeoutExpired:
                rc, out = -1, "timed out after 120 s"
            ran += 1
            if rc != want:
                tail = "\n".join(out.splitlines()[-15:])
                bad += fail("%s: exit %d, wanted %d:\n  %s\n  ran: %s\n%s"
                            % (where, rc, want, cmd, run, tail))
            elif want == 0 and "unknown key" in out:
                bad += fail("%s: an unknown key:\n  %s\n%s" % (where, cmd, out))
            else:
                print("test_docs: ok %s: %s" % (where, cmd))
        print("test_docs: %d commands run, %d skipped (listed above with the reason)"
              % (ran, skipped))
        if ran == 0:
            bad += fail("no command found in README.md and docs/guide.md")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
