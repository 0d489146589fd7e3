#!/usr/bin/env bash
# partrain report without a browser (test_report_browser.sh opens one): a
# run with a trace, a run without one, a run killed half-way (its metrics
# cut mid-line), a run of an older version (partrain 0.5.0's metrics: no run
# record, no parts), the metrics file given itself, several runs overlaid:
# each gets a report of what it has, a line saying what is missing, and
# nothing in the file that loads from the network. A path that is not a
# run, and an output that cannot be written, get one line and exit 1.
# Usage: test_report.sh PATH/TO/partrain
set -u
P=${1:?usage: test_report.sh PATH/TO/partrain}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$HERE/expect.sh"
T=$(mktemp -d /tmp/pt-test-report-XXXXXX)
trap 'rm -rf "$T"' EXIT
cd "$T"

for i in $(seq 1 300); do echo "the quick brown fox $i jumps over the lazy dog"; done >train.txt
head -c 3000 train.txt >val.txt
cat >tiny.json <<'EOF'
{
  "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 256, "seq_len": 16},
  "data": {"train": "train.txt", "val": "val.txt"},
  "train": {"steps": 12, "batch_size": 4, "warmup_steps": 1, "val_every": 4, "val_batches": 1,
            "threads": 1},
  "log": {"every": 100}
}
EOF
mkdir -p a b
expect_ok "train dp 2 with a trace" "$P" train --config tiny.json --set parallel.dp=2 --nproc 2 \
    --set log.metrics=a/metrics.jsonl --set log.trace=a/trace.json --set checkpoint.dir=a/ck \
    --set checkpoint.every=6
expect_ok "train one worker, no trace" "$P" train --config tiny.json --set log.metrics=b/metrics.jsonl

# no_net FILE: nothing in the page loads from elsewhere (a src= or a <link>),
# the policy forbids it, and the perfetto link is the one plain link out
no_net() {
    ! grep -qiE '<link|src="(https?:)?//|@import|url\((https?:)?//' "$1" &&
        grep -q "Content-Security-Policy\" content=\"default-src 'none'" "$1"
}

expect_ok "report of a run directory" "$P" report a
[ -s a/report.html ] && no_net a/report.html || bad "report a" "no report, or a network reference"
grep -q "wrote a/report.html" out || bad "report a" "no path printed: $(cat out)"
grep -q "report: a:" err && bad "report a" "a complete run with notes: $(cat err)" || ok "complete run: no notes"
grep -q '"parts":{' a/report.html && grep -q '"trace":{"path":' a/report.html ||
    bad "report a" "the data lacks parts or the trace"

expect_ok "report of a run without a trace" "$P" report b
grep -q "report: b: no trace (log.trace was not set)" err || bad "no trace" "no line says so: $(cat err)"

# killed half-way: the metrics cut in the middle of a step line
mkdir -p cut
size=$(wc -c <a/metrics.jsonl)
head -c $((size * 2 / 3)) a/metrics.jsonl >cut/metrics.jsonl
tail -c 1 cut/metrics.jsonl | od -c | grep -q '\\n' && printf '{"step":99,"lo' >>cut/metrics.jsonl
expect_ok "report of a run killed half-way" "$P" report cut
grep -q "report: cut: the last line ([0-9]*) is cut short" err || bad "cut" "no line says so: $(cat err)"
grep -q '"loss":\[' cut/report.html || bad "cut" "no loss series"

# a run of partrain 0.5.0 (no run record, no parts, no elapsed times)
mkdir -p old
cp "$HERE/data/metrics-0.5.0.jsonl" old/metrics.jsonl
expect_ok "report of an older version's run" "$P" report old
grep -q "report: old: no run record" err && grep -q "no step-time parts" err ||
    bad "older run" "missing lines: $(cat err)"
grep -q '"elapsed":"steps"' old/report.html || bad "older run" "time is not the summed step times"

# the metrics file itself, and two runs overlaid (default: report.html here)
expect_ok "report of a metrics file" "$P" report a/metrics.jsonl --out file.html
[ -s file.html ] || bad "metrics file" "no file.html"
expect_ok "two runs overlaid" "$P" report a b
[ -s report.html ] && [ "$(grep -o '"name":"[ab]"' report.html | sort -u | wc -l)" -eq 2 ] ||
    bad "overlay" "not both runs in report.html"
expect_ok "report --help" "$P" report --help

# not a run: one line, exit 1 (usage: exit 2)
expect_fail "missing path" "nope: no such file or directory" "$P" report nope
mkdir -p empty
expect_fail "directory without metrics" "empty: not a run directory" "$P" report empty
expect_fail "a file that is not metrics" "tiny.json: not a partrain metrics file" "$P" report tiny.json
"$P" report >/dev/null 2>&1
[ $? -eq 2 ] && ok "no run given: usage error" || bad "no run given" "exit not 2"
expect_fail "--out in a missing folder" "--out" "$P" report a --out nodir/r.html
expect_fail "--out is a directory" "--out" "$P" report a --out empty
mkfifo fifo
expect_fail "run is a FIFO" "fifo" timeout 10 "$P" report fifo

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
