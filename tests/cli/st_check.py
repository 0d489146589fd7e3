#!/usr/bin/env python3
"""A checkpoint's safetensors files read with nothing of partrain's: the
8-byte little-endian header length, the JSON header, the data section.

  st_check.py STEPDIR                 check every file of the step directory
  st_check.py --diff A.safetensors B.safetensors TOL
                                      the largest |a - b| over every tensor <= TOL

Checks, for every *.safetensors of STEPDIR: the header is UTF-8 JSON padded
with spaces to 8 bytes; every tensor is F32 with GPT-2's shape for the
model of STEPDIR/state.json (config.model); the main files (model, optim_m,
optim_v) hold exactly GPT-2's tensor names, each once, and the rank-state
files (sync, replica<d>) exactly "<group>.<name>" for the groups that
state.json's rank_state.files lists; the data offsets tile the data section,
in order, to the file's last byte; every value is finite. Prints one line
per file; exits 1 with the reason on the first failure."""
import json
import math
import os
import struct
import sys
from array import array


def gpt2_tensors(m):
    L, C, V, T = m["n_layer"], m["n_embd"], m["vocab_size"], m["seq_len"]
    t = {"wte.weight": [V, C], "wpe.weight": [T, C]}
    for i in range(L):
        p = "h.%d." % i
        t.update({p + "ln_1.weight": [C], p + "ln_1.bias": [C],
                  p + "attn.c_attn.weight": [C, 3 * C], p + "attn.c_attn.bias": [3 * C],
                  p + "attn.c_proj.weight": [C, C], p + "attn.c_proj.bias": [C],
                  p + "ln_2.weight": [C], p + "ln_2.bias": [C],
                  p + "mlp.c_fc.weight": [C, 4 * C], p + "mlp.c_fc.bias": [4 * C],
                  p + "mlp.c_proj.weight": [4 * C, C], p + "mlp.c_proj.bias": [C]})
    t.update({"ln_f.weight": [C], "ln_f.bias": [C]})
    return t


def fail(msg):
    print("st_check: " + msg)
    sys.exit(1)


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        fail("%s: %d bytes, no header length" % (path, len(raw)))
    (n,) = struct.unpack("<Q", raw[:8])
    if n % 8 or 8 + n > len(raw):
        fail("%s: header length %d (file %d bytes)" % (path, n, len(raw)))
    head = json.loads(raw[8:8 + n].decode("utf-8"))
    return head, raw[8 + n:]


def tensors(path):
    head, data = read(path)
    out = {}
    for name, e in head.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = array("f", data[b:end])
    return out


def check(path, want):
    head, data = read(path)
    meta = head.pop("__metadata__", {})
    if not all(isinstance(v, str) for v in meta.values()):
        fail("%s: __metadata__ values must be strings" % path)
    if set(head) != set(want):
        extra, missing = sorted(set(head) - set(want)), sorted(set(want) - set(head))
        fail("%s: unexpected %s, missing %s" % (path, extra[:3], missing[:3]))
    at = 0
    for name, e in sorted(head.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, end = e["data_offsets"]
        n = 1
        for d in e["shape"]:
            n *= d
        if e["dtype"] != "F32" or e["shape"] != want[name]:
            fail("%s: %s is %s %s, expected F32 %s" % (path, name, e["dtype"], e["shape"],
                                                       want[name]))
        if b != at or end - b != 4 * n:
            fail("%s: %s at [%d, %d), expected [%d, %d)" % (path, name, b, end, at, at + 4 * n))
        vals = array("f", data[b:end])
        if not all(math.isfinite(x) for x in vals):
            fail("%s: %s holds a value that is not finite" % (path, name))
        at = end
    if at != len(data):
        fail("%s: tensors end at %d, the data section at %d" % (path, at, len(data)))
    print("%s: %d tensors, %d bytes of data, metadata %s" % (os.path.basename(path), len(head),
                                                             len(data), json.dumps(meta)))


def main():
    if sys.argv[1] == "--diff":
        a, b, tol = tensors(sys.argv[2]), tensors(sys.argv[3]), float(sys.argv[4])
        if set(a) != set(b):
            fail("--diff: the files hold different tensors")
        worst = max(max((abs(x - y) for x, y in zip(a[k], b[k])), default=0.0) for k in a)
        print("largest difference %.3g" % worst)
        sys.exit(0 if worst <= tol else 1)
    step = sys.argv[1]
    state = json.load(open(os.path.join(step, "state.json")))
    gpt2 = gpt2_tensors(state["config"]["model"])
    files = state.get("rank_state", {}).get("files", {})
    seen = 0
    for f in sorted(os.listdir(step)):
        if not f.endswith(".safetensors"):
            continue
        name = f[:-len(".safetensors")]
        if name in ("model", "optim_m", "optim_v"):
            want = gpt2
        elif name in files:
            want = {g + "." + k: v for g in files[name] for k, v in gpt2.items()}
        else:
            fail("%s: a file state.json does not list" % f)
        check(os.path.join(step, f), want)
        seen += 1
    if seen < 1 + len(files):
        fail("%s: %d files, state.json lists %d beside model" % (step, seen, len(files)))


main()
