#!/usr/bin/env bash
# Installs the Debian packages partrain needs (idempotent, quiet) and builds
# the release tree in build/. Run as root on Debian 12.
#   bash scripts/setup.sh            # packages + build
#   PT_SKIP_APT=1 bash scripts/setup.sh   # build only
#   PT_FULL=1 bash scripts/setup.sh       # also clang, for the full tier's fuzzing
set -euo pipefail
cd "$(dirname "$0")/.."

# chromium and nodejs: test_report_browser opens `partrain report`'s page
# in headless Chromium, driven by a Node script (tests/cli/report_browser.js).
packages=(build-essential cmake pkg-config libopenblas-dev libcjson-dev
          libopenmpi-dev openmpi-bin fortunes iproute2 chromium nodejs)
# The full tier fuzzes the parsers with clang's libFuzzer (scripts/fuzz.sh).
[ "${PT_FULL:-0}" = 1 ] && packages+=(clang)

if [ "${PT_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs" >/dev/null
echo "setup: built build/src/cli/partrain"
