/* What the timing probes beside this file share: a monotonic clock in microseconds and an
 * order for sorting times (qsort). Needs no CUDA header, so probes built against cuda.h and
 * those that load the driver by name (probe.h) both include it. */
#include <time.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
