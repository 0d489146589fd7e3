#!/usr/bin/env bash
# partrain installs like a library: `cmake --install` into a temporary
# prefix, examples/train_tiny.c built against it with pkg-config alone (and
# statically with pkg-config --static), both run and learn. Usage:
#   test_install.sh BUILD_DIR SOURCE_DIR
set -eu
B=${1:?usage: test_install.sh BUILD_DIR SOURCE_DIR} S=${2:?}
T=$(mktemp -d /tmp/pt-test-install-XXXXXX)
trap 'rm -rf "$T"' EXIT
cmake --install "$B" --prefix "$T/prefix" >/dev/null
for f in bin/partrain lib/libpartrain.so lib/libpartrain.a include/partrain/train.h \
         lib/pkgconfig/partrain.pc; do
    [ -e "$T/prefix/$f" ] || { echo "FAIL: $f not installed" >&2; exit 1; }
done
"$T/prefix/bin/partrain" --version | grep -q '^partrain [0-9]' ||
    { echo "FAIL: partrain --version" >&2; exit 1; }
export PKG_CONFIG_PATH="$T/prefix/lib/pkgconfig"
cd "$T"
cc -std=c11 -Wall -Wextra -Werror -o tiny "$S/examples/train_tiny.c" $(pkg-config --cflags --libs partrain)
cc -std=c11 -Wall -Wextra -Werror -o tiny_static "$S/examples/train_tiny.c" \
    $(pkg-config --cflags partrain) "$T/prefix/lib/libpartrain.a" $(pkg-config --static --libs-only-other --libs-only-l partrain | sed 's/-lpartrain//')
# the shared one must use the installed library, not the tree's
LD_LIBRARY_PATH="$T/prefix/lib" ldd ./tiny | grep -q "$T/prefix/lib/libpartrain.so" ||
    { echo "FAIL: tiny does not load the installed libpartrain.so" >&2; exit 1; }
OPENBLAS_NUM_THREADS=1 LD_LIBRARY_PATH="$T/prefix/lib" ./tiny
OPENBLAS_NUM_THREADS=1 ./tiny_static | tail -1
echo "ok   installed, built with pkg-config, learns (shared and static)"
