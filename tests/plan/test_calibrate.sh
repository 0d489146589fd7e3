#!/usr/bin/env bash
# `partrain calibrate --quick`: the profile has every field of docs/plan.md's
# cluster description and profile, positive where a time or rate, and the
# cluster fields agree with the tables they come from; without --out it goes
# to the cache ($XDG_CACHE_HOME/partrain/); a bad --out fails at once with
# one line naming it and leaves nothing behind; plan on a profile that
# lacks the config's shape says so in one line.
# Usage: test_calibrate.sh PATH/TO/partrain
set -u
P=${1:?usage: test_calibrate.sh PATH/TO/partrain}
T=$(mktemp -d /tmp/pt-test-calib-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
bad() { fail=$((fail + 1)); echo "FAIL $1: $2" >&2; }
ok() { echo "ok   $1" >&2; }

if "$P" calibrate --quick --out "$T/p.json" >"$T/out" 2>"$T/err"; then
    ok "calibrate --quick runs"
else
    bad "calibrate --quick runs" "exit $?: $(cat "$T/err")"
fi
grep -q "^wrote $T/p.json\$" "$T/out" && ok "summary names the file" || bad "summary" "$(cat "$T/out")"
ls "$T" | grep -q tmp && bad "no temporary left" "$(ls "$T")" || ok "no temporary left"

if python3 - "$T/p.json" <<'PY'; then ok "every field, positive and consistent"; else bad "fields" "see above"; fi
import json, sys
d = json.load(open(sys.argv[1]))
errs = []
def num(obj, key, where, positive=True):
    v = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(v, (int, float)) or isinstance(v, bool) or (positive and not v > 0):
        errs.append("%s.%s = %r" % (where, key, v))
        return 0
    return v
def text(obj, key, where):
    if not isinstance(obj.get(key), str) or not obj[key]:
        errs.append("%s.%s = %r" % (where, key, obj.get(key)))
text(d, "name", "")
if d.get("nodes") != 1: errs.append("nodes %r" % d.get("nodes"))
dev = d.get("device", {})
text(dev, "name", "device")
peak = dev.get("peak_flops", {})
num(peak, "fp32", "device.peak_flops")
if peak.get("bf16") != 0: errs.append("device.peak_flops.bf16 %r (expected 0)" % peak.get("bf16"))
num(dev, "memory_bytes", "device"); num(dev, "memory_bw", "device")
for l in ("intra_node", "inter_node"):
    num(d.get("links", {}).get(l, {}), "bw", "links." + l)
    num(d.get("links", {}).get(l, {}), "latency", "links." + l)
p = d.get("profile", {})
if p.get("version") != 1: errs.append("profile.version %r" % p.get("version"))
text(p, "cpu", "profile"); text(p, "binary", "profile")
for k in ("cores", "memory_bw", "elementwise_s", "adamw_s", "sgd_s"): num(p, k, "profile")
if d.get("devices_per_node") != p.get("cores"): errs.append("devices_per_node != profile.cores")
if dev.get("name") != p.get("cpu"): errs.append("device.name != profile.cpu")
if dev.get("memory_bw") != p.get("memory_bw"): errs.append("device.memory_bw != profile.memory_bw")
gemm = p.get("gemm", [])
if not gemm: errs.append("no gemm")
for i, g in enumerate(gemm):
    for k in ("m", "n", "k", "threads", "flops_s"): num(g, k, "gemm[%d]" % i)
one = [g["flops_s"] for g in gemm if g.get("threads") == 1]
if not one or peak.get("fp32") != max(one): errs.append("peak_flops.fp32 is not the best 1-thread gemm")
if {g.get("threads") for g in gemm} != {1, p.get("cores")} and p.get("cores", 1) <= 2:
    errs.append("gemm threads %r" % sorted({g.get("threads") for g in gemm}))
mods = p.get("modules", [])
if {m.get("kind") for m in mods} != {"embedding", "block", "head"}: errs.append("module kinds")
for i, m in enumerate(mods):
    w = "modules[%d]" % i
    for k in ("n_embd", "n_head", "seq_len", "vocab_size", "tp", "tokens", "threads",
              "fwd_s", "bgrad_s", "wgrad_s"): num(m, k, w)
    r = m.get("recompute_s")
    if not (isinstance(r, list) and len(r) == 3 and r[0] == 0 and all(x >= 0 for x in r)):
        errs.append("%s.recompute_s %r" % (w, r))
    if m.get("kind") != "block" and r != [0, 0, 0]: errs.append("%s: only blocks recompute" % w)
    if m.get("tokens", 1) % m.get("seq_len", 1): errs.append("%s: tokens not whole sequences" % w)
num(p, "probe_flops_s", "profile")
for i, m in enumerate(mods):
    if m.get("ranks", m.get("tp")) not in (1, m.get("tp"), p.get("cores")):
        errs.append("modules[%d].ranks %r" % (i, m.get("ranks")))
# the groups: tp 2 shards timed in a group of 2, tp 1 again on every core
if not any(m.get("tp") == 2 and m.get("ranks", 2) == 2 and m.get("threads") == 1 for m in mods):
    errs.append("no tp 2 shard measured in its group")
if p.get("cores", 1) > 1 and not any(m.get("tp") == 1 and m.get("ranks") == p["cores"] for m in mods):
    errs.append("no tp 1 modules under load (ranks = cores)")
if not any(m.get("tp") == 1 and m.get("ranks", 1) == 1 for m in mods):
    errs.append("no tp 1 modules alone")
comm = p.get("comm", [])
for i, c in enumerate(comm):
    if c.get("backend") != "shm": errs.append("comm[%d].backend %r" % (i, c.get("backend")))
    for k in ("ranks", "bytes", "seconds"): num(c, k, "comm[%d]" % i)
for op in ("allreduce", "allgather", "reduce_scatter", "broadcast"):
    for n in (2, 4):
        if not any(c.get("op") == op and c.get("ranks") == n for c in comm):
            errs.append("no %s at %d ranks" % (op, n))
p2p = sorted((c["bytes"], c["seconds"]) for c in comm if c.get("op") == "p2p")
if not p2p or any(c.get("ranks") != 2 for c in comm if c.get("op") == "p2p"): errs.append("p2p")
elif d["links"]["intra_node"]["latency"] != p2p[0][1] or \
        abs(d["links"]["intra_node"]["bw"] - p2p[-1][0] / p2p[-1][1]) > 1e-6 * p2p[-1][0] / p2p[-1][1]:
    errs.append("links are not the p2p's smallest latency and largest bandwidth")
for e in errs: print("  " + e, file=sys.stderr)
sys.exit(1 if errs else 0)
PY

# the cache: no --out (a tiny shape: this run is about the path)
printf '{"model": {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 32, "seq_len": 16}}' \
    >"$T/tiny.json"
if XDG_CACHE_HOME="$T/cache" "$P" calibrate --quick --config "$T/tiny.json" >"$T/out" 2>"$T/err" &&
    ls "$T"/cache/partrain/profile-*.json >/dev/null 2>&1 &&
    grep -q "^wrote $T/cache/partrain/profile-[0-9a-f]*\.json\$" "$T/out"; then
    ok "default --out is the cache"
else
    bad "default --out is the cache" "$(cat "$T/out" "$T/err"; ls -R "$T/cache")"
fi

# plan on that profile: quiet for the shape it measured; for another (T 8)
# one note on stderr naming the shape, and the table all the same
prof=$(ls "$T"/cache/partrain/profile-*.json 2>/dev/null | head -1)
sed 's/"seq_len": 16/"seq_len": 8/' "$T/tiny.json" >"$T/tiny8.json"
if [ -n "$prof" ] && "$P" plan --config "$T/tiny.json" --cluster "$prof" --world 1 >"$T/out" 2>"$T/err" &&
    ! grep -q "note" "$T/err" && grep -q "^1 " "$T/out"; then
    ok "plan on the profile of its shape: no note"
else
    bad "plan on the profile of its shape" "$(cat "$T/out" "$T/err")"
fi
if [ -n "$prof" ] && "$P" plan --config "$T/tiny8.json" --cluster "$prof" --world 1 >"$T/out" 2>"$T/err" &&
    [ "$(grep -vc '^partrain info: OpenBLAS chose its' "$T/err")" -eq 1 ] &&
    grep -q "^partrain: note: .*no measured modules of this model's shape (C 32, NH 2, T 8, V 32)" "$T/err" &&
    grep -q "^1 " "$T/out"; then
    ok "plan on a profile of another shape: one note"
else
    bad "plan on a profile of another shape" "$(cat "$T/out" "$T/err")"
fi

# expect_fail NAME PATTERN ARGS...: non-zero exit before measuring, exactly one
# stderr line "partrain: ...PATTERN", nothing new in $T/w
expect_fail() {
    local name=$1 pattern=$2
    shift 2
    rm -rf "$T/w" && mkdir "$T/w"
    "$P" calibrate --quick "$@" >"$T/out" 2>"$T/err"
    local rc=$? lines
    lines=$(grep -vc '^partrain info: OpenBLAS chose its' "$T/err")
    if [ $rc -eq 0 ]; then
        bad "$name" "exit 0"
    elif [ "$lines" -ne 1 ] || ! grep -qF -- "$pattern" "$T/err"; then
        bad "$name" "expected one line with '$pattern': $(cat "$T/err")"
    elif [ -n "$(ls -A "$T/w")" ]; then
        bad "$name" "left $(ls -A "$T/w")"
    else
        ok "$name"
    fi
}
# the speed probe alone: one JSON line, median within its range
if "$P" calibrate --probe 0.1 >"$T/out" 2>"$T/err" && python3 -c '
import json, sys
d = json.loads(open(sys.argv[1]).read())
sys.exit(0 if 0 < d["lo"] <= d["probe_flops_s"] <= d["hi"] else 1)' "$T/out"; then
    ok "--probe prints its median"
else
    bad "--probe" "$(cat "$T/out" "$T/err")"
fi
for v in 0 -1 abc 1e9; do
    "$P" calibrate --probe "$v" >/dev/null 2>"$T/err"
    [ $? -eq 2 ] && grep -q -- "--probe '$v'" "$T/err" && ok "--probe $v refused" ||
        bad "--probe $v" "$(cat "$T/err")"
done

expect_fail "--out in a missing folder" "$T/w/nope/p.json" --out "$T/w/nope/p.json"
expect_fail "--out a directory" "$T/w: is a directory" --out "$T/w"
expect_fail "--config missing" "$T/w/none.json" --config "$T/w/none.json"
"$P" calibrate --bogus >/dev/null 2>&1
[ $? -eq 2 ] && ok "unknown option exits 2" || bad "unknown option" "exit not 2"
"$P" calibrate --help | grep -q -- "--quick" && ok "--help" || bad "--help" "no --quick"

[ $fail -eq 0 ] && echo "test_calibrate: all passed" || echo "test_calibrate: $fail failed"
exit $((fail > 0))
