/* The entry point every harness in fuzz/ defines: libFuzzer's, so that the
 * same file links against libFuzzer (scripts/fuzz.sh) or against
 * fuzz_main.c, which replays saved inputs in the quick test tier. */
#ifndef PT_FUZZ_H
#define PT_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
