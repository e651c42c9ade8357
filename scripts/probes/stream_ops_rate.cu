// What gpushared's own stream operations between a client's kernels cost the GPU, kernel
// after kernel (issue 31: FAIR's gated path holding nobody did 0.90-0.94 x FIFO's work, and
// without its marks and timings 0.94). Under a gated policy the device worker writes a done
// mark (cuStreamWriteValue32) after about one kernel in 8 and times some kernels with a timed
// event before and after them, all on the client's stream; candidate_gate.cu found a timed
// event costs the stream about 1.25 us and a write 1.6 us, while an untimed event that one
// other stream waits for costs nothing measurable. This probe queues 800 kernels of about
// 2 us back to back (a delay kernel holds the stream until all are queued) and times the whole
// sequence, with every 8th kernel:
//   plain             nothing else;
//   write             a cuStreamWriteValue32 after it (the done mark as it is);
//   write beside      an untimed event after it that a second stream waits for, then writes
//                     the word there;
//   timed             timed events before and after it (a kernel timed as it is);
//   timed beside      untimed events before and after it, each waited for by a stream of its
//                     own that records the timed event there.
// Prints the median over 30 sequences of the time per kernel (us) for each. Build on the GPU
// machine: nvcc -O2 -arch=sm_90a -o stream_ops_rate stream_ops_rate.cu -lcuda; run it
// directly (what the device worker's driver calls cost) or under `gpushare run` (where the
// stream memory operations the write rows need are not offered: they are skipped).
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gate.cuh"
#include "timing.h"

enum { KERNELS = 800, EVERY = 8, SEQUENCES = 30 };

// Spins about `ns` on the GPU's clock.
__global__ void work(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

enum { PLAIN, WRITE, WRITE_BESIDE, TIMED, TIMED_BESIDE, KINDS };
static const char *NAME[KINDS] = {"plain", "write", "write beside", "timed", "timed beside"};

int main(void) {
    CK(cuInit(0));
    cudaFree(0); // the runtime's primary context, current on this thread
    CUfunction fdelay = function_of((const void *)delay);
    CUfunction fwork = function_of((const void *)work);
    CUstream s, side[2];
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < 2; i++)
        CK(cuStreamCreate(&side[i], CU_STREAM_NON_BLOCKING));
    CUevent start, stop, mark[2], timed[2 * KERNELS / EVERY + 2];
    CK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    for (int i = 0; i < 2; i++)
        CK(cuEventCreate(&mark[i], CU_EVENT_DISABLE_TIMING));
    for (size_t i = 0; i < sizeof timed / sizeof timed[0]; i++)
        CK(cuEventCreate(&timed[i], CU_EVENT_DEFAULT));
    volatile unsigned *word;
    CK(cuMemHostAlloc((void **)&word, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CUdeviceptr dword;
    CK(cuMemHostGetDevicePointer(&dword, (void *)word, 0));
    unsigned long long limit = 500000000, ns = 2000;
    void *delay_args[] = {&dword, &limit};
    void *work_args[] = {&ns};
    int have_write = cuStreamWriteValue32(s, dword + 64, 0, 0) == CUDA_SUCCESS;
    CK(cuStreamSynchronize(s));
    static double t[KINDS][SEQUENCES];
    for (int q = 0; q < SEQUENCES + 1; q++) {
        for (int j = 0; j < KINDS; j++) {
            int k = (j + q) % KINDS; // the order rotates
            if (!have_write && (k == WRITE || k == WRITE_BESIDE))
                continue;
            *word = 0;
            CK(cuLaunchKernel(fdelay, 1, 1, 1, 1, 1, 1, 0, s, delay_args, NULL));
            CK(cuEventRecord(start, s));
            int used = 0;
            for (int i = 0; i < KERNELS; i++) {
                int special = i % EVERY == 0 && k != PLAIN;
                if (special && k == TIMED)
                    CK(cuEventRecord(timed[used++], s));
                if (special && k == TIMED_BESIDE) {
                    CK(cuEventRecord(mark[0], s));
                    CK(cuStreamWaitEvent(side[0], mark[0], 0));
                    CK(cuEventRecord(timed[used++], side[0]));
                }
                CK(cuLaunchKernel(fwork, 1, 1, 1, 32, 1, 1, 0, s, work_args, NULL));
                if (!special)
                    continue;
                switch (k) {
                case WRITE:
                    CK(cuStreamWriteValue32(s, dword + 64, (cuuint32_t)i, 0));
                    break;
                case WRITE_BESIDE:
                    CK(cuEventRecord(mark[1], s));
                    CK(cuStreamWaitEvent(side[1], mark[1], 0));
                    CK(cuStreamWriteValue32(side[1], dword + 64, (cuuint32_t)i, 0));
                    break;
                case TIMED:
                    CK(cuEventRecord(timed[used++], s));
                    break;
                case TIMED_BESIDE:
                    CK(cuEventRecord(mark[1], s));
                    CK(cuStreamWaitEvent(side[1], mark[1], 0));
                    CK(cuEventRecord(timed[used++], side[1]));
                    break;
                }
            }
            CK(cuEventRecord(stop, s));
            __sync_synchronize();
            *word = 1;
            CK(cuCtxSynchronize());
            if (*word == 2)
                fprintf(stderr, "the delay kernel timed out: the queue was not full\n");
            float ms;
            CK(cuEventElapsedTime(&ms, start, stop));
            if (q > 0) // the first sequence warms up
                t[k][q - 1] = ms * 1000.0 / KERNELS;
        }
    }
    printf("%d kernels of %llu ns, every %dth with the extra; us a kernel, median of %d\n",
           KERNELS, ns, EVERY, SEQUENCES);
    for (int k = 0; k < KINDS; k++) {
        if (!have_write && (k == WRITE || k == WRITE_BESIDE)) {
            printf("%-13s not offered\n", NAME[k]);
            continue;
        }
        qsort(t[k], SEQUENCES, sizeof t[k][0], by_value);
        printf("%-13s %.3f (%.3f .. %.3f)\n", NAME[k], t[k][SEQUENCES / 2], t[k][0],
               t[k][SEQUENCES - 1]);
    }
    return 0;
}
