/* What the stand-in program (cuda_standin.c) and the driver fuzzer (driver_fuzz.c) both use:
 * a CUresult's name, and the test data pattern. */
#include "cuda_standin.h"

const char *error_name(CUresult r) {
    const char *name = NULL;
    if (cuGetErrorName && cuGetErrorName(r, &name) == CUDA_SUCCESS && name) return name;
    return "?";
}

unsigned char pattern_byte(size_t i, unsigned seed) {
    return (unsigned char)((i * 2654435761u + seed * 40503u) >> 7);
}

void fill_pattern(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = pattern_byte(i, seed);
}

size_t pattern_mismatch(const unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != pattern_byte(i, seed)) return i;
    return n;
}
