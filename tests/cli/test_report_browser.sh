#!/usr/bin/env bash
# The report in a real browser: headless Chromium (Debian's chromium, which
# scripts/setup.sh installs) opens the report of a dp 2 run of 1,000 steps
# with a trace, then that run overlaid with a one-worker run of the same
# model, and report_browser.js checks what a person would see: every chart
# drawn with its axes and a non-empty series, no console error, no network
# request. The overlay's loss curves are the same (the parity of layouts).
# The log says how large each file is and how long it took to render
# (measured, not asserted). Skipped (exit 77) where chromium or node is
# missing, saying which.
# Usage: test_report_browser.sh PATH/TO/partrain [SCREENSHOT.png]
set -u
P=${1:?usage: test_report_browser.sh PATH/TO/partrain [SCREENSHOT.png]}
SHOT=${2:-}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CHROMIUM=${PT_CHROMIUM:-/usr/bin/chromium}
if ! command -v node >/dev/null; then
    echo "test_report_browser: SKIPPED: node is not installed (scripts/setup.sh installs it)"
    exit 77
fi
if [ ! -x "$CHROMIUM" ]; then
    echo "test_report_browser: SKIPPED: $CHROMIUM is not installed (apt-get install chromium;" \
        "scripts/setup.sh installs it)"
    exit 77
fi
. "$HERE/expect.sh"
T=$(mktemp -d /tmp/pt-test-browser-XXXXXX)
trap 'rm -rf "$T"' EXIT
cd "$T"

for i in $(seq 1 400); do echo "the quick brown fox $i jumps over the lazy dog"; done >train.txt
head -c 4000 train.txt >val.txt
cat >tiny.json <<'EOF'
{
  "model": {"n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": 256, "seq_len": 16},
  "data": {"train": "train.txt", "val": "val.txt"},
  "train": {"steps": 1000, "batch_size": 4, "warmup_steps": 10, "val_every": 100,
            "val_batches": 1, "threads": 1},
  "log": {"every": 500}
}
EOF
mkdir -p dp2 one
start=$(date +%s%N)
expect_ok "train dp 2, 1000 steps, with a trace" "$P" train --config tiny.json --set parallel.dp=2 \
    --nproc 2 --set log.metrics=dp2/metrics.jsonl --set log.trace=dp2/trace.json \
    --set checkpoint.dir=dp2/ck --set checkpoint.every=250
expect_ok "train one worker, 1000 steps" "$P" train --config tiny.json --set log.metrics=one/metrics.jsonl
echo "trained both runs in $((($(date +%s%N) - start) / 1000000)) ms"
expect_ok "report of the dp 2 run" "$P" report dp2
expect_ok "report of dp 2 and one worker overlaid" "$P" report dp2 one --out overlay.html

# browse NAME FILE [ARGS]: the checks, and the measurements in the log
browse() {
    local name=$1 file=$2
    shift 2
    if node "$HERE/report_browser.js" "$file" "$@" >"$T/verdict" 2>"$T/verr"; then
        ok "$name"
    else
        local rc=$?
        if [ $rc -eq 77 ]; then
            echo "test_report_browser: SKIPPED: $(cat "$T/verdict")"
            exit 77
        fi
        bad "$name" "$(cat "$T/verdict") $(tail -3 "$T/verr")"
    fi
    sed -n 's/.*"render_ms":\([0-9]*\),"script_ms":\([0-9.]*\),"bytes":\([0-9]*\),.*/\1 \2 \3/p' \
        "$T/verdict" | while read -r ms script bytes; do
        echo "measured: $name: $bytes bytes, rendered in $ms ms (navigation to every chart drawn;" \
            "the page's script ${script%.*} ms)"
    done
}
browse "the dp 2 run's report in Chromium" dp2/report.html
browse "the overlay in Chromium, the same loss curve" overlay.html --same-loss 1e-3 ${SHOT:+--screenshot "$SHOT"}

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
