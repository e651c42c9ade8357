/* What the C probes beside this file share: the CUDA driver, as the program finds it
 * (dlopen of libcuda.so.1, so under `gpushare run` it is gpushare's), its entry points by
 * name, and a check that ends the probe at the first failing call. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;

/* The driver: `lib = dlopen("libcuda.so.1", RTLD_NOW)` in main. */
static void *lib;

/* An entry point of the driver; the probe ends (exit 2) without it. */
static void *sym(const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "no %s\n", name);
        exit(2);
    }
    return p;
}

/* A driver call that must succeed; the probe ends (exit 3) naming it otherwise. */
#define CALL(call)                                                                            \
    do {                                                                                      \
        CUresult r_ = (call);                                                                 \
        if (r_) {                                                                             \
            fprintf(stderr, "%s: %d\n", #call, r_);                                           \
            exit(3);                                                                          \
        }                                                                                     \
    } while (0)
