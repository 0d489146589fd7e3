#!/usr/bin/env bash
# From a fresh clone to a real training run: installs packages, builds,
# prepares the default dataset (English text from Debian's fortunes package)
# and trains the default model, printing progress and validation loss.
# Extra arguments go to `partrain train` (e.g. --set train.steps=50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/prepare-data.sh
mkdir -p runs
exec ./build/src/cli/partrain train --config configs/default.json \
  --set log.metrics=runs/default/metrics.jsonl --set checkpoint.dir=runs/default/ckpt "$@"
