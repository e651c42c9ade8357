/* The stand-in program's library slots: the export-table slots cuBLAS, cuBLASLt, cuFFT and
 * NVRTC were seen calling on driver 580 (docs/consolidated.md, "The export tables"), called the
 * way those libraries call them. Run at the end of the export tables' section
 * (cuda_standin_memory.c). */
#define _GNU_SOURCE
#include "cuda_standin.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const void *table(const char *hex) {
    CUuuid id;
    for (int i = 0; i < 16; i++) {
        unsigned v = 0;
        sscanf(hex + 2 * i, "%2x", &v);
        id.bytes[i] = (unsigned char)v;
    }
    const void *t = NULL;
    OK(cuGetExportTable(&t, &id));
    CHECK(t != NULL, "table %s", hex);
    return t;
}

typedef void (*AnyFn)(void);
static AnyFn slot(const void *t, int i) {
    AnyFn f;
    memcpy(&f, (const char *)t + 8 * i, sizeof f);
    return f;
}
#define SLOT(T, t, i) ((T)slot((t), (i)))

/* An entry point the program does not otherwise use, as the runtime finds one. */
static AnyFn entry_point(const char *name) {
    typedef CUresult (*Gpa)(const char *, void **, int, unsigned long long, int *);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *sym = lib ? dlsym(lib, "cuGetProcAddress_v2") : NULL;
    Gpa gpa;
    AnyFn f = NULL;
    void *p = NULL;
    int status = -1;
    memcpy(&gpa, &sym, sizeof gpa);
    if (sym && gpa(name, &p, 13000, 0, &status) == CUDA_SUCCESS) memcpy(&f, &p, sizeof f);
    CHECK(f != NULL, "cuGetProcAddress(%s)", name);
    return f;
}

/* ---- table 21318c60: contexts and streams (cuBLAS, cuBLASLt, cuFFT) ------------------------ */

typedef CUresult (*ContextId)(CUcontext, unsigned long long *);
typedef CUresult (*PrivateStream)(CUcontext, CUstream, void **, int);
typedef CUresult (*PrivateStreamId)(CUcontext, void *, unsigned long long *);

static void check_contexts_and_streams(const void *t) {
    ContextId context_id = SLOT(ContextId, t, 4);
    ContextId get_id = (ContextId)entry_point("cuCtxGetId");
    if (!get_id) return;
    /* cuBLASLt: the current context's id (it keys its state on it), as cuCtxGetId says. */
    unsigned long long id = 0, want = 0, other_id = 0;
    OK(context_id(primary, &id));
    OK(get_id(primary, &want));
    CHECK(id == want && id != 0, "context id %llu, cuCtxGetId %llu", id, want);
    CUcontext other = NULL;
    OK(cuCtxCreate(&other, NULL, 0, device));
    OK(cuCtxSetCurrent(primary));
    OK(context_id(other, &other_id));
    OK(get_id(other, &want));
    CHECK(other_id == want && other_id != id, "another context's id %llu (%llu), primary %llu",
          other_id, want, id);
    OK(cuCtxDestroy(other));
    OK(cuCtxSetCurrent(primary));
    id = 5;
    OK(context_id(NULL, &id));
    CHECK(id == 0, "NULL's id %llu", id);
    EXPECT(context_id(primary, NULL), 999 /* CUDA_ERROR_UNKNOWN, as the driver answers */);
    EXPECT(context_id((CUcontext)&id, &id), CUDA_ERROR_INVALID_CONTEXT);

    /* cuBLAS: the stream's object, then its id (it keys its workspace on it). */
    PrivateStream private_stream = SLOT(PrivateStream, t, 51);
    PrivateStreamId private_id = SLOT(PrivateStreamId, t, 39);
    struct {
        CUstream h;
        int per_thread;
        int pt_form; /* which cuStreamGetId form names the same stream */
    } cases[] = {
        {NULL, 0, 0},                                  /* NULL: the legacy stream */
        {NULL, 1, 1},                                  /* NULL, per thread: the thread's own */
        {CU_STREAM_LEGACY, 1, 0},                      /* the flag only concerns NULL */
        {(CUstream)(uintptr_t)0x2 /* per thread */, 0, 1},
    };
    for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++) {
        void *p = NULL;
        unsigned long long sid = 12345;
        OK(private_stream(primary, cases[i].h, &p, cases[i].per_thread));
        CHECK(p != NULL, "case %u: an object", i);
        OK(private_id(primary, p, &sid));
        OK(cases[i].pt_form ? pt_cuStreamGetId(NULL, &want) : cuStreamGetId(NULL, &want));
        CHECK(sid == want, "case %u: stream id %llu, cuStreamGetId %llu", i, sid, want);
    }
    CUstream s1 = NULL, s2 = NULL;
    OK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    OK(cuStreamCreate(&s2, 0));
    unsigned long long sid1 = 0, sid2 = 0;
    void *p1 = NULL, *p2 = NULL;
    /* A stream of the program's needs no context: it has its own. */
    OK(private_stream(NULL, s1, &p1, 0));
    OK(private_stream(primary, s2, &p2, 1));
    OK(private_id(primary, p1, &sid1));
    OK(private_id(NULL, p2, &sid2));
    OK(cuStreamGetId(s1, &want));
    CHECK(sid1 == want, "stream id %llu, cuStreamGetId %llu", sid1, want);
    OK(cuStreamGetId(s2, &want));
    CHECK(sid2 == want && sid2 != sid1, "stream id %llu, cuStreamGetId %llu, other %llu", sid2,
          want, sid1);
    /* Misuse: refused, nothing read through a pointer that is not one of the driver's. */
    void *p = NULL;
    EXPECT(private_stream(primary, s1, NULL, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(private_stream(primary, (CUstream)(intptr_t)-1, &p, 0), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(private_stream(primary, (CUstream)&p, &p, 0), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(private_stream((CUcontext)&p, NULL, &p, 0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(private_id(primary, NULL, &sid1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(private_id(primary, p1, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(private_id(primary, &sid1, &sid1), CUDA_ERROR_INVALID_HANDLE);
    OK(cuStreamDestroy(s1));
    OK(cuStreamDestroy(s2));
}

/* ---- table da9151d3: NVRTC's compile cache --------------------------------------------- */

typedef CUresult (*MakeKey)(void **, unsigned, const void *, unsigned, const char *, const char *,
                            const char *, int, int);
typedef CUresult (*DropKey)(void *);
typedef CUresult (*Get)(void *, unsigned, void **, unsigned *);
typedef CUresult (*Put)(void *, unsigned, const void *, unsigned);
typedef CUresult (*FreeData)(void *);

static void check_compile_cache(const void *t) {
    MakeKey make_key = SLOT(MakeKey, t, 1);
    DropKey drop_key = SLOT(DropKey, t, 2);
    Get get = SLOT(Get, t, 3);
    Put put = SLOT(Put, t, 4);
    FreeData free_data = SLOT(FreeData, t, 6);
    /* What NVRTC passes: LLVM bitcode, its options, "HOST64", its build date, the target. */
    static const unsigned char bitcode[] = {'B', 'C', 0xc0, 0xde, 0x35, 0x14, 0x00, 0x00,
                                            0x05, 0x00, 0x00, 0x00, 0x62, 0x0c, 0x30, 0x24};
    const char *options = "-arch=compute_90 -ftz=1 -prec-sqrt=1 -prec-div=1 -fma=1";
    const char *host = "HOST64", *build = "Aug 20 202514:13:52";
    const char *ptx = "//\n// Generated by the stand-in\n//\n.version 9.0\n.target sm_90\n";
    unsigned ptx_len = (unsigned)strlen(ptx) + 1;
    void *key = NULL, *data = NULL;
    unsigned len = 0;
    /* Turned off, the driver's cache answers NOT_INITIALIZED (NVRTC then compiles uncached). */
    const char *off = getenv("CUDA_CACHE_DISABLE");
    if (off && !strcmp(off, "1")) {
        EXPECT(make_key(&key, 2, bitcode, sizeof bitcode, options, host, build, 90, 0),
               CUDA_ERROR_NOT_INITIALIZED);
        return;
    }

    /* First compile: a miss, then NVRTC stores what it compiled and frees the key. */
    OK(make_key(&key, 2, bitcode, sizeof bitcode, options, host, build, 90, 0));
    CHECK(key != NULL, "a key");
    EXPECT(get(key, 0, &data, &len), CUDA_ERROR_NOT_FOUND);
    OK(put(key, 0, ptx, ptx_len));
    OK(drop_key(key));
    /* The same compile again: a hit, the caller's to free. */
    OK(make_key(&key, 2, bitcode, sizeof bitcode, options, host, build, 90, 0));
    OK(get(key, 0, &data, &len));
    CHECK(data && len == ptx_len && !memcmp(data, ptx, len), "got %u bytes back", len);
    OK(free_data(data));
    EXPECT(free_data(data), CUDA_ERROR_INVALID_VALUE);
    OK(drop_key(key));
    EXPECT(drop_key(key), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(get(key, 0, &data, &len), CUDA_ERROR_INVALID_HANDLE);
    /* Anything else that shapes the result is another compile. */
    OK(make_key(&key, 2, bitcode, sizeof bitcode, "-arch=compute_80", host, build, 80, 0));
    EXPECT(get(key, 0, &data, &len), CUDA_ERROR_NOT_FOUND);
    OK(drop_key(key));
    OK(make_key(&key, 2, bitcode, sizeof bitcode - 1, options, host, build, 90, 0));
    EXPECT(get(key, 0, &data, &len), CUDA_ERROR_NOT_FOUND);
    /* Misuse. */
    EXPECT(get(key, 0, NULL, &len), CUDA_ERROR_INVALID_VALUE);
    EXPECT(put(key, 0, NULL, 4), CUDA_ERROR_INVALID_VALUE);
    EXPECT(put(key, 0, ptx, 0), CUDA_ERROR_INVALID_VALUE);
    OK(drop_key(key));
    EXPECT(make_key(NULL, 2, bitcode, sizeof bitcode, options, host, build, 90, 0),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(make_key(&key, 2, bitcode, 0, options, host, build, 90, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(make_key(&key, 4, bitcode, sizeof bitcode, options, host, build, 90, 0),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(make_key(&key, 2, bitcode, sizeof bitcode, NULL, host, build, 90, 0),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(make_key(&key, 2, bitcode, sizeof bitcode, options, host, build, 0, 0),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(free_data(&len), CUDA_ERROR_INVALID_VALUE);
}

/* ---- table 6e163fbe: a module's functions, one by one (cuFFT) ---------------------------- */

typedef void (*EachFunction)(void *, CUfunction, const char *);
typedef int (*ModuleFunctions)(CUcontext, CUmodule, EachFunction, void *);

/* What the callback was given, in order. */
struct listed {
    int n;
    CUfunction f[8];
    char name[8][64];
};

static void note_function(void *user, CUfunction f, const char *name) {
    struct listed *l = user;
    if (l->n < 8) {
        l->f[l->n] = f;
        snprintf(l->name[l->n], sizeof l->name[l->n], "%s", name ? name : "(null)");
    }
    l->n++;
}

/* Kernels named `k<index>_xxx…` (many, with long names): which were listed, and whether in
 * order. */
struct many {
    int n, in_order;
    unsigned char seen[256];
};

static void note_many(void *user, CUfunction f, const char *name) {
    struct many *m = user;
    int i = -1;
    if (f && name && sscanf(name, "k%d_", &i) == 1 && i >= 0 && i < 256) m->seen[i]++;
    if (i != m->n) m->in_order = 0;
    m->n++;
}

/* A module of `count` kernels with names of `len` bytes: more than one answer from gpushared
 * holds (48 KiB of names each). */
static void check_many_functions(ModuleFunctions module_functions, int sim, int count, int len) {
    size_t line = (size_t)len + 64, size = 128 + (size_t)count * line;
    char *image = malloc(size), *at = image;
    CHECK(image != NULL, "memory for the image");
    if (!image) return;
    at += sprintf(at, sim ? "gpushare-sim-module 1\n"
                          : ".version 8.0\n.target sm_90\n.address_size 64\n");
    for (int i = 0; i < count; i++) {
        at += sprintf(at, sim ? "kernel k%03d_" : ".visible .entry k%03d_", i);
        memset(at, 'x', (size_t)len - 5);
        at += len - 5;
        at += sprintf(at, sim ? "\n" : "(.param .u64 p) { ret; }\n");
    }
    CUmodule module = NULL;
    OK(cuModuleLoadData(&module, image));
    struct many m = {.in_order = 1};
    int n = module_functions(primary, module, note_many, &m);
    int each_once = 1;
    for (int i = 0; i < count; i++) each_once &= m.seen[i] == 1;
    CHECK(n == count && m.n == count && each_once && (m.in_order || !sim),
          "%d of %d functions listed (%d calls), each once %d, in order %d", n, count, m.n,
          each_once, m.in_order);
    OK(cuModuleUnload(module));
    free(image);
}

static void check_module_functions(const void *t) {
    ModuleFunctions module_functions = SLOT(ModuleFunctions, t, 7);
    typedef CUresult (*FuncGetName)(const char **, CUfunction);
    typedef CUresult (*FuncGetAttribute)(int *, int, CUfunction);
    typedef CUresult (*LibraryLoadData)(void **, const void *, void *, void *, unsigned, void *,
                                        void *, unsigned);
    typedef CUresult (*LibraryGetModule)(CUmodule *, void *);
    typedef CUresult (*LibraryUnload)(void *);
    FuncGetName get_name = (FuncGetName)entry_point("cuFuncGetName");
    FuncGetAttribute get_attribute = (FuncGetAttribute)entry_point("cuFuncGetAttribute");
    LibraryLoadData library_load = (LibraryLoadData)entry_point("cuLibraryLoadData");
    LibraryGetModule library_module = (LibraryGetModule)entry_point("cuLibraryGetModule");
    LibraryUnload library_unload = (LibraryUnload)entry_point("cuLibraryUnload");
    if (!get_name || !get_attribute || !library_load || !library_module || !library_unload) return;
    /* Three kernels, one named as cuFFT's are: the sim's module format, or PTX on a GPU. */
    static const char *const names[3] = {"spin", "_Z10vector_fftILj4096EEvPf", "tail_2"};
    static const char sim_image[] = "gpushare-sim-module 1\nkernel spin\n"
                                    "kernel _Z10vector_fftILj4096EEvPf\nkernel tail_2\n";
    static const char ptx_image[] =
        ".version 8.0\n.target sm_90\n.address_size 64\n"
        ".visible .entry spin(.param .u64 p) { ret; }\n"
        ".visible .entry _Z10vector_fftILj4096EEvPf(.param .u64 p) { ret; }\n"
        ".visible .entry tail_2(.param .u64 p) { ret; }\n";
    char device_name[256] = {0};
    OK(cuDeviceGetName(device_name, sizeof device_name, device));
    int sim = strstr(device_name, "sim") != NULL;
    const char *image = sim ? sim_image : ptx_image;

    /* As cuFFT does: load a module, list its kernels with the current context. */
    CUmodule module = NULL;
    OK(cuModuleLoadData(&module, image));
    if (!module) return;
    struct listed l = {0};
    int n = module_functions(primary, module, note_function, &l);
    CHECK(n == 3 && l.n == 3, "%d functions listed, %d calls", n, l.n);
    CUstream s = NULL;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < 3 && i < l.n; i++) {
        /* In the module's order (the sim keeps it; a GPU's driver may order PTX its own way). */
        int at = -1;
        for (int j = 0; j < 3; j++)
            if (!strcmp(l.name[i], names[j])) at = j;
        CHECK(sim ? at == i : at >= 0, "function %d is named %s", i, l.name[i]);
        if (at < 0) continue;
        /* The handle cuModuleGetFunction gives, which answers and launches as that one. */
        CUfunction f = NULL;
        const char *name = NULL;
        int threads = 0, want = 0;
        OK(cuModuleGetFunction(&f, module, l.name[i]));
        CHECK(f == l.f[i], "%s: handle %p, cuModuleGetFunction's %p", l.name[i], (void *)l.f[i],
              (void *)f);
        OK(get_name(&name, l.f[i]));
        CHECK(name && !strcmp(name, l.name[i]), "cuFuncGetName says %s", name ? name : "NULL");
        OK(get_attribute(&threads, 0 /* MAX_THREADS_PER_BLOCK */, l.f[i]));
        OK(get_attribute(&want, 0, f));
        CHECK(threads == want && threads > 0, "%s: %d threads a block, want %d", l.name[i],
              threads, want);
        unsigned long long micros = 1;
        void *args[] = {&micros};
        OK(cuLaunchKernel(l.f[i], 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
    }
    OK(cuStreamSynchronize(s));
    OK(cuStreamDestroy(s));
    /* No callback: only counted; any context, NULL too. */
    CHECK(module_functions(NULL, module, NULL, NULL) == 3, "counted without a callback");
    /* The public forms give the same functions. */
    unsigned count = 0;
    CUfunction listed[4] = {NULL, NULL, NULL, NULL};
    OK(cuModuleGetFunctionCount(&count, module));
    CHECK(count == 3, "cuModuleGetFunctionCount: %u", count);
    OK(cuModuleEnumerateFunctions(listed, 2, module));
    CHECK(listed[0] == l.f[0] && listed[1] == l.f[1] && listed[2] == NULL,
          "cuModuleEnumerateFunctions fills what it is given room for, in the same order");
    EXPECT(cuModuleEnumerateFunctions(NULL, 3, module), CUDA_ERROR_INVALID_VALUE);

    /* A library's module, as cuFFT loads some (cuLibraryLoadData). */
    void *library = NULL;
    CUmodule library_mod = NULL;
    OK(library_load(&library, image, NULL, NULL, 0, NULL, NULL, 0));
    OK(library_module(&library_mod, library));
    struct listed again = {0};
    CHECK(module_functions(primary, library_mod, note_function, &again) == 3 && again.n == 3,
          "a library's module lists %d", again.n);
    OK(library_unload(library));

    /* Not a module, or one unloaded: -1, and no call. */
    struct listed none = {0};
    CHECK(module_functions(primary, (CUmodule)&none, note_function, &none) == -1,
          "a pointer that is no module");
    CHECK(module_functions(primary, NULL, note_function, &none) == -1, "NULL");
    OK(cuModuleUnload(module));
    CHECK(module_functions(primary, module, note_function, &none) == -1, "an unloaded module");
    CHECK(none.n == 0, "%d calls for modules that are not", none.n);
    check_many_functions(module_functions, sim, 250, 300);
}

void check_library_slots(void) {
    section_begin("library slots");
    const void *contexts = table("21318c60971432488ca641ff7324c8f2");
    const void *cache = table("da9151d33ae6cc41a5c04f26d533e328");
    if (contexts) check_contexts_and_streams(contexts);
    if (cache) check_compile_cache(cache);
    const void *functions = table("6e163fbeb958444d835ce182aff1991e");
    if (functions) check_module_functions(functions);
    section_end();
}
