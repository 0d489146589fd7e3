#!/usr/bin/env bash
# Prepare the default dataset: the English text files of Debian's `fortunes`
# package, concatenated (sorted by name, so the result is the same on every
# machine) into data/fortunes/train.txt and val.txt, the last ~5% being the
# validation split. Idempotent: rewrites both files from the package each time
# (through temporaries, so an interrupted run leaves no half files).
#
# Usage: scripts/prepare-data.sh [OUT_DIR]   (default: data/fortunes)
set -euo pipefail

SRC=${FORTUNES_DIR:-/usr/share/games/fortunes}
OUT=${1:-data/fortunes}

if [ ! -d "$SRC" ] || ! ls "$SRC" | grep -qv '\.\(dat\|u8\)$'; then
    echo "prepare-data: $SRC not found: install the Debian package 'fortunes' (apt-get install fortunes)" >&2
    exit 1
fi

mkdir -p "$OUT"
tmp=$(mktemp "$OUT/.all.XXXXXX")
trap 'rm -f "$tmp" "$tmp.train" "$tmp.val"' EXIT

# Plain text files only: skip the .dat indexes, the .u8 symlinks and any
# subdirectory (fortunes-off installs its files under off/).
find "$SRC" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print0 | sort -z |
    xargs -0 cat > "$tmp"

total=$(stat -c %s "$tmp")
if [ "$total" -lt 100000 ]; then
    echo "prepare-data: only $total bytes of text under $SRC; is the fortunes package complete?" >&2
    exit 1
fi
val=$((total / 20))
head -c $((total - val)) "$tmp" > "$tmp.train"
tail -c "$val" "$tmp" > "$tmp.val"
mv "$tmp.train" "$OUT/train.txt"
mv "$tmp.val" "$OUT/val.txt"
echo "prepare-data: $OUT/train.txt ($((total - val)) bytes), $OUT/val.txt ($val bytes)"
