/* CUDA IPC between two processes, the way torch.multiprocessing passes a CUDA tensor: the
 * exporter fills an allocation on a stream and records an interprocess event after it, and
 * hands both handles (hex on the command line) to a process of its own that it starts (as
 * Unix user UID when not -1); the importer waits on the event, checks the pattern, writes
 * the next one, closes what it opened. EXPECT "refused" checks that opening is refused. */
#include "cuda_standin.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CU_EVENT_INTERPROCESS 0x4

static void to_hex(const unsigned char *h, char *out) {
    for (int i = 0; i < 64; i++) sprintf(out + 2 * i, "%02x", h[i]);
}

static int from_hex(const char *s, CUipcHandle *h) {
    if (strlen(s) != 128) return 0;
    for (int i = 0; i < 64; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) return 0;
        h->reserved[i] = (char)v;
    }
    return 1;
}

void run_ipc_export(const char *self, unsigned seed, long uid, const char *expect) {
    section_begin("ipc export");
    size_t n = 3 << 20;
    unsigned char *host = malloc(n);
    CHECK(host != NULL, "host buffer");
    if (!host) return;
    CUdeviceptr d = 0;
    CUstream s = NULL;
    CUevent ev = NULL, plain = NULL;
    OK(cuMemAlloc(&d, n));
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    EXPECT(cuEventCreate(&ev, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);
    OK(cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
    OK(cuEventCreate(&plain, 0));
    fill_pattern(host, n, seed);
    OK(cuMemcpyHtoDAsync(d, host, n, s));
    OK(cuEventRecord(ev, s));
    CUipcHandle mh, eh, bad;
    OK(cuIpcGetMemHandle(&mh, d + 4096)); /* any address inside: the allocation's handle */
    OK(cuIpcGetEventHandle(&eh, ev));
    EXPECT(cuIpcGetEventHandle(&bad, plain), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuIpcGetMemHandle(&bad, 0x1000), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr self_open = 0;
    EXPECT(cuIpcOpenMemHandle(&self_open, mh, 0), CUDA_ERROR_INVALID_VALUE);
    char mhex[129], ehex[129], seeds[16];
    to_hex((const unsigned char *)mh.reserved, mhex);
    to_hex((const unsigned char *)eh.reserved, ehex);
    snprintf(seeds, sizeof seeds, "%u", seed);
    pid_t child = fork();
    if (child == 0) {
        if (uid >= 0 && (setgid((gid_t)uid) != 0 || setuid((uid_t)uid) != 0)) _exit(9);
        execl(self, self, "ipc-import", mhex, ehex, seeds, expect, (char *)NULL);
        _exit(8);
    }
    int status = -1;
    CHECK(child > 0 && waitpid(child, &status, 0) == child, "the importing process ran");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the importing process failed: %#x",
          status);
    memset(host, 0, n);
    OK(cuMemcpyDtoH(host, d, n));
    unsigned want = strcmp(expect, "refused") ? seed + 1 : seed;
    size_t at = pattern_mismatch(host, n, want);
    CHECK(at == n, "after the other process: byte %zu is not pattern %u's", at, want);
    OK(cuEventDestroy(ev));
    OK(cuEventDestroy(plain));
    OK(cuStreamDestroy(s));
    OK(cuMemFree(d));
    free(host);
    section_end();
}

void run_ipc_import(const char *mhex, const char *ehex, unsigned seed, const char *expect) {
    section_begin("ipc import");
    CUipcHandle mh, eh;
    CHECK(from_hex(mhex, &mh) && from_hex(ehex, &eh), "handles on the command line");
    CUdeviceptr d = 0;
    CUevent ev = NULL;
    if (!strcmp(expect, "refused")) {
        EXPECT(cuIpcOpenMemHandle(&d, mh, 1), 800 /* NOT_PERMITTED */);
        EXPECT(cuIpcOpenEventHandle(&ev, eh), 800);
        section_end();
        return;
    }
    OK(cuIpcOpenMemHandle(&d, mh, 1));
    OK(cuIpcOpenEventHandle(&ev, eh));
    size_t n = 3 << 20;
    CUstream s = NULL;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cuStreamWaitEvent(s, ev, 0));
    unsigned char *host = malloc(n);
    CHECK(host != NULL, "host buffer");
    if (!host) return;
    OK(cuMemcpyDtoHAsync(host, d, n, s));
    OK(cuStreamSynchronize(s));
    size_t at = pattern_mismatch(host, n, seed);
    CHECK(at == n, "the shared memory differs at byte %zu", at);
    unsigned type = 0;
    OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 5));
    CHECK(type == CU_MEMORYTYPE_DEVICE, "memory type %u", type);
    EXPECT(cuMemFree(d), CUDA_ERROR_INVALID_VALUE); /* not this process's to free */
    fill_pattern(host, n, seed + 1);
    OK(cuMemcpyHtoD(d, host, n));
    OK(cuCtxSynchronize(NULL));
    OK(cuIpcCloseMemHandle(d));
    EXPECT(cuIpcCloseMemHandle(d), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpyHtoD(d, host, 16), CUDA_ERROR_INVALID_VALUE); /* closed */
    OK(cuEventDestroy(ev));
    OK(cuStreamDestroy(s));
    free(host);
    section_end();
}
