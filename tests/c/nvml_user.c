/*
 * An NVML user, as pynvml and PyTorch are (tests/nvml.rs): opens libnvidia-ml.so.1 by its
 * soname (found on LD_LIBRARY_PATH), looks the functions up by name, and lists the GPUs.
 *
 *   nvml_user [UUID-or-PCI-bus-id...]
 *
 * Prints, one line each:
 *   error string 6 = Not Found        (asked by 8 threads at once, before nvmlInit: the
 *                                      first calls into the library)
 *   count N
 *   nvml device I uuid=U pci=P name=S index=J temp=T
 *   handle N -> error E               (the index just past the last GPU)
 *   lookup X -> found index I | lookup X -> error E     (by UUID, or by PCI bus id)
 *   nearest N: UUID...                (GPUs near GPU 0: size asked first, then filled)
 *   gpu set N: UUID...                (GPUs near CPU 0)
 * and exits 0; 3 if nvmlInit_v2 fails ("init error E (string)"), 2 if the library or a
 * function is missing.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml_types.h"



static nvmlReturn_t (*Init)(void);
static nvmlReturn_t (*Shutdown)(void);
static const char *(*ErrorString)(nvmlReturn_t);
static nvmlReturn_t (*GetCount)(unsigned int *);
static nvmlReturn_t (*ByIndex)(unsigned int, nvmlDevice_t *);
static nvmlReturn_t (*ByUuid)(const char *, nvmlDevice_t *);
static nvmlReturn_t (*ByPci)(const char *, nvmlDevice_t *);
static nvmlReturn_t (*GetIndex)(nvmlDevice_t, unsigned int *);
static nvmlReturn_t (*GetUuid)(nvmlDevice_t, char *, unsigned int);
static nvmlReturn_t (*GetName)(nvmlDevice_t, char *, unsigned int);
static nvmlReturn_t (*GetPci)(nvmlDevice_t, nvmlPciInfo_t *);
static nvmlReturn_t (*GetTemperature)(nvmlDevice_t, int, unsigned int *);
static nvmlReturn_t (*Nearest)(nvmlDevice_t, int, unsigned int *, nvmlDevice_t *);
static nvmlReturn_t (*GpuSet)(unsigned int, unsigned int *, nvmlDevice_t *);

static void *lib;

static void *need(const char *name) {
    void *f = dlsym(lib, name);
    if (f == NULL) {
        printf("missing %s\n", name);
        exit(2);
    }
    return f;
}

#define CHECK(call)                                                                        \
    do {                                                                                   \
        nvmlReturn_t r_ = (call);                                                          \
        if (r_ != 0) {                                                                     \
            printf("%s failed: %d\n", #call, r_);                                          \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static void *ask_error_string(void *out) {
    *(const char **)out = ErrorString(6);
    return NULL;
}

/* Prints `label N: UUID...` for a set of GPUs: its size asked with a count of 0, then filled. */
static void print_set(const char *label, nvmlDevice_t near, int system) {
    unsigned int n = 0;
    CHECK(system ? GpuSet(0, &n, NULL) : Nearest(near, 50, &n, NULL));
    nvmlDevice_t set[16];
    unsigned int filled = n < 16 ? n : 16;
    if (filled != 0)
        CHECK(system ? GpuSet(0, &filled, set) : Nearest(near, 50, &filled, set));
    printf("%s %u:", label, n);
    for (unsigned int i = 0; i < filled; i++) {
        char uuid[96];
        CHECK(GetUuid(set[i], uuid, sizeof uuid));
        printf(" %s", uuid);
    }
    printf("\n");
}

int main(int argc, char **argv) {
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (lib == NULL) {
        printf("dlopen: %s\n", dlerror());
        return 2;
    }
    Init = need("nvmlInit_v2");
    Shutdown = need("nvmlShutdown");
    ErrorString = need("nvmlErrorString");
    GetCount = need("nvmlDeviceGetCount_v2");
    ByIndex = need("nvmlDeviceGetHandleByIndex_v2");
    ByUuid = need("nvmlDeviceGetHandleByUUID");
    ByPci = need("nvmlDeviceGetHandleByPciBusId_v2");
    GetIndex = need("nvmlDeviceGetIndex");
    GetUuid = need("nvmlDeviceGetUUID");
    GetName = need("nvmlDeviceGetName");
    GetPci = need("nvmlDeviceGetPciInfo_v3");
    GetTemperature = need("nvmlDeviceGetTemperature");
    Nearest = need("nvmlDeviceGetTopologyNearestGpus");
    GpuSet = need("nvmlSystemGetTopologyGpuSet");

    /* The first calls, from 8 threads at once: each must get the string. */
    pthread_t threads[8];
    const char *strings[8] = {0};
    for (int i = 0; i < 8; i++)
        if (pthread_create(&threads[i], NULL, ask_error_string, &strings[i]) != 0)
            return 2;
    for (int i = 0; i < 8; i++)
        pthread_join(threads[i], NULL);
    for (int i = 1; i < 8; i++)
        if (strings[i] == NULL || strings[0] == NULL || strcmp(strings[i], strings[0]) != 0)
            printf("threads disagree on error string 6\n");
    printf("error string 6 = %s\n", strings[0] ? strings[0] : "(null)");

    nvmlReturn_t r = Init();
    if (r != 0) {
        printf("init error %d (%s)\n", r, ErrorString(r));
        return 3;
    }
    unsigned int count = 0;
    CHECK(GetCount(&count));
    printf("count %u\n", count);
    nvmlDevice_t first = NULL;
    for (unsigned int i = 0; i < count; i++) {
        nvmlDevice_t d;
        CHECK(ByIndex(i, &d));
        if (i == 0)
            first = d;
        char uuid[96], name[96];
        nvmlPciInfo_t pci;
        unsigned int index = 0, temp = 0;
        CHECK(GetUuid(d, uuid, sizeof uuid));
        CHECK(GetName(d, name, sizeof name));
        CHECK(GetPci(d, &pci));
        CHECK(GetIndex(d, &index));
        CHECK(GetTemperature(d, 0, &temp));
        printf("nvml device %u uuid=%s pci=%s name=%s index=%u temp=%u\n", i, uuid, pci.busId,
               name, index, temp);
    }
    nvmlDevice_t past = NULL;
    printf("handle %u -> error %d\n", count, ByIndex(count, &past));

    for (int a = 1; a < argc; a++) {
        nvmlDevice_t d = NULL;
        int by_uuid = strncmp(argv[a], "GPU-", 4) == 0;
        r = by_uuid ? ByUuid(argv[a], &d) : ByPci(argv[a], &d);
        unsigned int index = 0;
        if (r == 0)
            r = GetIndex(d, &index);
        if (r == 0)
            printf("lookup %s -> found index %u\n", argv[a], index);
        else
            printf("lookup %s -> error %d\n", argv[a], r);
    }

    if (first != NULL)
        print_set("nearest", first, 0);
    print_set("gpu set", NULL, 1);
    CHECK(Shutdown());
    return 0;
}
