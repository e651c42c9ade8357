/* Memory freed while the program's own queued work still writes it goes to no one before that
 * work has ended, as CUDA's cuMemFree waits for it. `free-busy` queues on a stream, behind a
 * host function that holds the stream, a memset of a small allocation, frees the allocation
 * and starts a process of its own (`reuse-check`) that allocates as much and fills it with
 * ones; only then does the host function return. The other process reads its memory back
 * after the memset has run: all ones, wherever its allocation lies. */
#include "cuda_standin.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define REUSE_BYTES (64u << 10)
#define MEMSET_WORD 0x07070707u

static int held;
static void CUDA_CB hold_the_stream(void *p) {
    (void)p;
    /* At most 20 s: a program that never lets go would hang the test instead of failing it. */
    for (int i = 0; i < 20000 && __atomic_load_n(&held, __ATOMIC_ACQUIRE); i++) usleep(1000);
}

void run_free_busy(const char *self) {
    section_begin("free busy");
    CUdeviceptr keep = 0, busy = 0;
    CUstream s = NULL;
    /* Other memory of the user's, so that the freed bytes' chunk stays for their next one. */
    OK(cuMemAlloc(&keep, 4096));
    OK(cuMemAlloc(&busy, REUSE_BYTES));
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    __atomic_store_n(&held, 1, __ATOMIC_RELEASE);
    OK(cuLaunchHostFunc(s, hold_the_stream, NULL));
    OK(cuMemsetD32Async(busy, MEMSET_WORD, REUSE_BYTES / 4, s));
    OK(cuMemFree(busy));
    int up[2], down[2];
    CHECK(pipe(up) == 0 && pipe(down) == 0, "pipes");
    pid_t child = fork();
    if (child == 0) {
        char in[16], out[16];
        snprintf(in, sizeof in, "%d", down[0]);
        snprintf(out, sizeof out, "%d", up[1]);
        close(up[0]);
        close(down[1]);
        execl(self, self, "reuse-check", in, out, (char *)NULL);
        _exit(8);
    }
    close(up[1]);
    close(down[0]);
    char line[64] = {0};
    ssize_t got = read(up[0], line, sizeof line - 1);
    CHECK(got > 0, "the other process allocated and wrote its memory");
    /* Now the memset may run: the stream goes on, and its work ends. */
    __atomic_store_n(&held, 0, __ATOMIC_RELEASE);
    OK(cuStreamSynchronize(s));
    CHECK(write(down[1], "go\n", 3) == 3, "told the other process");
    close(down[1]);
    close(up[0]);
    int status = -1;
    CHECK(child > 0 && waitpid(child, &status, 0) == child, "the other process ran");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the other process failed: %#x",
          status);
    OK(cuStreamDestroy(s));
    OK(cuMemFree(keep));
    section_end();
}

void run_reuse_check(int in, int out) {
    section_begin("reuse check");
    CUdeviceptr mine = 0;
    unsigned *host = malloc(REUSE_BYTES);
    CHECK(host != NULL, "host buffer");
    if (!host) return;
    for (size_t i = 0; i < REUSE_BYTES / 4; i++) host[i] = 1;
    OK(cuMemAlloc(&mine, REUSE_BYTES));
    OK(cuMemcpyHtoD(mine, host, REUSE_BYTES));
    OK(cuCtxSynchronize(NULL));
    char line[64];
    int n = snprintf(line, sizeof line, "allocated %#llx\n", (unsigned long long)mine);
    CHECK(write(out, line, (size_t)n) == n, "told the freeing process");
    close(out);
    CHECK(read(in, line, sizeof line) > 0, "the freeing process's memset has run");
    close(in);
    memset(host, 0, REUSE_BYTES);
    OK(cuMemcpyDtoH(host, mine, REUSE_BYTES));
    size_t at = 0;
    while (at < REUSE_BYTES / 4 && host[at] == 1) at++;
    CHECK(at == REUSE_BYTES / 4,
          "word %zu of this process's memory is %#x: another process's memset, queued before "
          "it freed that memory, ran in it",
          at, at < REUSE_BYTES / 4 ? host[at] : 0);
    OK(cuMemFree(mine));
    free(host);
    section_end();
}
