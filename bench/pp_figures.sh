#!/bin/sh
# The pipeline figures of docs/parallel.md from real runs: every schedule at
# p 2 and p 4, m 8 (small model: L 6, C 384, NH 6, V 256, T 128, batch 8,
# one thread per rank), one traced run each, drawn by
# scripts/pipeline_figure.py into docs/figures/pipeline_p{2,4}_m8.svg.
#
#   bench/pp_figures.sh        (PARTRAIN=path overrides the binary)
set -eu
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
BIN=${PARTRAIN:-$ROOT/build/src/cli/partrain}
DATA="$ROOT/data/fortunes/train.txt"
[ -f "$DATA" ] || { echo "pp_figures.sh: $DATA missing (scripts/prepare-data.sh)" >&2; exit 1; }
TMP=$(mktemp -d /tmp/pt-pp-figures-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
for p in 2 4; do
    set --
    for s in gpipe 1f1b interleaved zb1 zbv; do
        v=0
        [ $s = interleaved ] && v=2
        OPENBLAS_NUM_THREADS=1 "$BIN" train --nproc $p --set model.n_layer=6 --set model.n_embd=384 \
            --set model.n_head=6 --set model.vocab_size=256 --set model.seq_len=128 \
            --set train.batch_size=8 --set train.steps=4 --set train.threads=1 \
            --set train.val_every=0 --set data.train="$DATA" --set parallel.pp=$p \
            --set parallel.microbatches=8 --set parallel.schedule=$s \
            --set parallel.virtual_stages=$v --set log.trace="$TMP/p${p}_$s.json" >/dev/null 2>&1
        title=$s
        [ $s = interleaved ] && title="interleaved (v 2)"
        set -- "$@" "$TMP/p${p}_$s.json=$title"
    done
    python3 "$ROOT/scripts/pipeline_figure.py" --out "$ROOT/docs/figures/pipeline_p${p}_m8.svg" "$@"
    echo "docs/figures/pipeline_p${p}_m8.svg"
done
