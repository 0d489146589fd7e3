#!/usr/bin/env bash
# From a fresh clone to a planned, measured training run: installs packages,
# builds, prepares the default dataset (English text from Debian's fortunes
# package), lets the planner pick the layout of the default model over this
# machine's cores (partrain train --layout auto: it calibrates this machine
# once, about a minute, then says its choice and why), trains it with one
# rank per core, prints the predicted and the measured step time and
# memory, writes the report (one HTML file of charts) and says what to run
# next. About 3 minutes on 2 cores, the first time.
# Extra arguments go to `partrain train` (e.g. --set train.steps=50).
#   PT_QUICKSTART_STEPS=N   steps to train (default 200)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/prepare-data.sh
P=./build/src/cli/partrain
# the lines a newcomer reads (progress, the plan, the measurements); PT_LOG=info shows the rest
export PT_LOG=${PT_LOG:-warn}
run=runs/quickstart
ranks=$(nproc)
mkdir -p "$run"
start=$(date +%s)
"$P" train --config configs/default.json --layout auto --nproc "$ranks" \
  --set train.threads=1 --set train.steps="${PT_QUICKSTART_STEPS:-200}" \
  --set log.metrics="$run/metrics.jsonl" --set log.trace="$run/trace.json" \
  --set checkpoint.dir="$run/ckpt" "$@"
"$P" report "$run"
# the calibrated profile the planner used (the run record's), for the plan below
profile=$(sed -n '1s/.*"profile":{"path":"\([^"]*\)".*/\1/p' "$run/metrics.jsonl")
cat <<EOF

quickstart: done in $(($(date +%s) - start)) s. The report: $run/report.html (open it in a browser;
its trace link opens $run/trace.json in Perfetto). Next:

  $P sample --checkpoint $run/ckpt --prompt "The computer"
  $P eval --checkpoint $run/ckpt --data data/fortunes/val.txt
  $P plan --config configs/default.json --cluster clusters/dgx-h100.json --world 8
      # the same model planned for a DGX H100 (8 GPUs; clusters/ has more)
  $P plan --config configs/default.json --cluster ${profile:-PROFILE.json} --world 2 --set train.threads=1 --write plan.json
  mpirun -np 2 --host HOST1,HOST2 $P train --plan plan.json --backend mpi
      # the same run on 2 hosts, one rank each, over MPI (docs/mpi.md)
  $P report $run runs/OTHER    # several runs overlaid on the same axes
EOF
