// When can a fault be known? Launches a kernel that faults (illegal address, or `trap` as a
// device-side assert ends) and timestamps, from the launch: the NVML Xid event, the kernel
// log's NVRM line (/dev/kmsg, root), and the first failing cuStreamQuery (polled).
// Build: nvcc -o fault_notice fault_notice.c -lcuda -lnvidia-ml -lpthread
// Run:   ./fault_notice illegal|trap
#include <cuda.h>
#include <nvml.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static volatile double t_launch = 0;
static volatile int done = 0;

static void *xid_thread(void *arg) {
    nvmlDevice_t dev = *(nvmlDevice_t *)arg;
    nvmlEventSet_t set;
    if (nvmlEventSetCreate(&set) != NVML_SUCCESS) { printf("nvml: no event set\n"); return 0; }
    nvmlReturn_t r = nvmlDeviceRegisterEvents(dev, nvmlEventTypeXidCriticalError, set);
    if (r != NVML_SUCCESS) { printf("nvml: register: %s\n", nvmlErrorString(r)); return 0; }
    printf("nvml: registered\n");
    fflush(stdout);
    while (!done) {
        nvmlEventData_t d;
        r = nvmlEventSetWait_v2(set, &d, 200);
        if (r == NVML_SUCCESS) {
            printf("nvml: xid %llu at +%.3f ms\n", (unsigned long long)d.eventData, now_ms() - t_launch);
            fflush(stdout);
        }
    }
    return 0;
}

static void *kmsg_thread(void *arg) {
    (void)arg;
    int fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK);
    if (fd < 0) { printf("kmsg: cannot open\n"); return 0; }
    lseek(fd, 0, SEEK_END);
    char buf[8192];
    while (!done) {
        ssize_t n = read(fd, buf, sizeof buf - 1);
        if (n > 0) {
            buf[n] = 0;
            if (strstr(buf, "NVRM") || strstr(buf, "Xid")) {
                char *nl = strchr(buf, '\n');
                if (nl) *nl = 0;
                printf("kmsg: at +%.3f ms: %.200s\n", now_ms() - t_launch, buf);
                fflush(stdout);
            }
        } else {
            usleep(100);
        }
    }
    return 0;
}

static const char *ptx_illegal =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry k() {\n .reg .u64 a; .reg .u32 v;\n mov.u64 a, 16; mov.u32 v, 1;\n"
    " st.global.u32 [a], v;\n ret;\n}\n";
static const char *ptx_trap =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry k() {\n trap;\n ret;\n}\n";

#define CK(x) do { CUresult e = (x); if (e) { const char *s; cuGetErrorName(e, &s); \
    printf("%s: %s\n", #x, s); exit(1);} } while (0)

int main(int argc, char **argv) {
    int trap = argc > 1 && !strcmp(argv[1], "trap");
    nvmlInit_v2();
    nvmlDevice_t ndev;
    nvmlDeviceGetHandleByIndex_v2(0, &ndev);
    pthread_t tx, tk;
    pthread_create(&tx, 0, xid_thread, &ndev);
    pthread_create(&tk, 0, kmsg_thread, 0);
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUmodule m;
    CK(cuModuleLoadData(&m, trap ? ptx_trap : ptx_illegal));
    CUfunction f;
    CK(cuModuleGetFunction(&f, m, "k"));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    usleep(300000);
    t_launch = now_ms();
    CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, 0, 0));
    CUresult q;
    long polls = 0;
    while ((q = cuStreamQuery(s)) == CUDA_ERROR_NOT_READY) polls++;
    const char *name;
    cuGetErrorName(q, &name);
    printf("query: %s at +%.3f ms (%ld polls)\n", name, now_ms() - t_launch, polls);
    fflush(stdout);
    usleep(500000);
    done = 1;
    pthread_join(tx, 0);
    pthread_join(tk, 0);
    return 0;
}
