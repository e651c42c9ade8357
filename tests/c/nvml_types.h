/* The few NVML types the tests' NVML programs use (there is no nvml.h here): the stand-in
 * NVML (nvml_standin.c) and the program that lists GPUs through it (nvml_user.c). */
#ifndef GPUSHARE_TESTS_NVML_TYPES_H
#define GPUSHARE_TESTS_NVML_TYPES_H

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

/* nvml.h's nvmlPciInfo_t (the v3 layout). */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

#endif
