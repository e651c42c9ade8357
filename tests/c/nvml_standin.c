/*
 * A stand-in for NVIDIA's NVML (libnvidia-ml.so.1), for the NVML shim's tests
 * (tests/nvml.rs): the few functions a device listing uses, over fake GPUs.
 *
 * The GPUs' UUIDs come from $GPUSHARE_TEST_NVML_UUIDS (comma-separated, at most 8), else
 * three: GPU-00000000-0000-0000-0000-00000000000{1,2,3}. GPU i (from 0) is on PCI bus
 * 00000000:0{i+1}:00.0, is named "Stand-in GPU {i}", and is at 40 + i degrees. A handle is a
 * pointer to the GPU's static struct. No nvml.h here: the few types are defined below, with
 * nvml.h's layouts.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml_types.h"

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
};

#define MAX_GPUS 8

struct nvmlDevice_st {
    unsigned int index;
    char uuid[80];
    char bus_id[32];
    char name[96];
};


static struct nvmlDevice_st gpus[MAX_GPUS];
static unsigned int gpu_count;
static int init_count;

static void add_gpu(const char *uuid, size_t len) {
    if (gpu_count == MAX_GPUS || len == 0 || len >= sizeof gpus[0].uuid)
        return;
    struct nvmlDevice_st *g = &gpus[gpu_count];
    g->index = gpu_count;
    memcpy(g->uuid, uuid, len);
    g->uuid[len] = 0;
    snprintf(g->bus_id, sizeof g->bus_id, "00000000:%02X:00.0", gpu_count + 1);
    snprintf(g->name, sizeof g->name, "Stand-in GPU %u", gpu_count);
    gpu_count++;
}

static void discover(void) {
    const char *list = getenv("GPUSHARE_TEST_NVML_UUIDS");
    if (list == NULL || *list == 0)
        list = "GPU-00000000-0000-0000-0000-000000000001,"
               "GPU-00000000-0000-0000-0000-000000000002,"
               "GPU-00000000-0000-0000-0000-000000000003";
    gpu_count = 0;
    while (*list) {
        const char *end = strchr(list, ',');
        size_t len = end ? (size_t)(end - list) : strlen(list);
        add_gpu(list, len);
        list += len;
        if (*list == ',')
            list++;
    }
}

static int valid(nvmlDevice_t d) {
    return d >= gpus && d < gpus + gpu_count;
}

#define NEED_INIT()                                                                        \
    do {                                                                                   \
        if (init_count == 0)                                                               \
            return NVML_ERROR_UNINITIALIZED;                                               \
    } while (0)

nvmlReturn_t nvmlInit_v2(void) {
    if (init_count++ == 0)
        discover();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void) {
    NEED_INIT();
    init_count--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    NEED_INIT();
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = gpu_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    NEED_INIT();
    if (device == NULL || index >= gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

static nvmlReturn_t find(const char *key, size_t field, nvmlDevice_t *device) {
    NEED_INIT();
    if (key == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < gpu_count; i++) {
        if (strcmp((const char *)&gpus[i] + field, key) == 0) {
            *device = &gpus[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    return find(uuid, offsetof(struct nvmlDevice_st, uuid), device);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    return find(bus_id, offsetof(struct nvmlDevice_st, bus_id), device);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig) {
    NEED_INIT();
    if (!valid(device) || is_mig == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    NEED_INIT();
    if (!valid(device) || index == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = device->index;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_out(const char *s, char *out, unsigned int length) {
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, s);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    NEED_INIT();
    if (!valid(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    return copy_out(device->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    NEED_INIT();
    if (!valid(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    return copy_out(device->name, name, length);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    NEED_INIT();
    if (!valid(device) || pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    pci->bus = device->index + 1;
    pci->pciDeviceId = 0x233510de;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", pci->bus);
    memcpy(pci->busId, device->bus_id, sizeof pci->busId);
    return NVML_SUCCESS;
}

/* Forwarded by the shim as it is: the temperature tells which GPU answered. */
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    NEED_INIT();
    if (!valid(device) || sensor != 0 || temp == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = 40 + device->index;
    return NVML_SUCCESS;
}

/* A count of 0 asks for the size; otherwise up to *count handles are written. */
static nvmlReturn_t answer_set(nvmlDevice_t skip, unsigned int *count, nvmlDevice_t *array) {
    if (count == NULL || (*count != 0 && array == NULL))
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    for (unsigned int i = 0; i < gpu_count; i++) {
        if (&gpus[i] == skip)
            continue;
        if (*count != 0 && n < *count)
            array[n] = &gpus[i];
        n++;
    }
    if (*count != 0 && n > *count)
        n = *count;
    *count = n;
    return NVML_SUCCESS;
}

/* Every other GPU is near, at any level. */
nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t device, int level, unsigned int *count,
                                              nvmlDevice_t *array) {
    NEED_INIT();
    (void)level;
    if (!valid(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    return answer_set(device, count, array);
}

/* Every GPU is near every CPU. */
nvmlReturn_t nvmlSystemGetTopologyGpuSet(unsigned int cpu, unsigned int *count,
                                         nvmlDevice_t *array) {
    NEED_INIT();
    (void)cpu;
    return answer_set(NULL, count, array);
}
