/* The stand-in program's stream checks: streams, events, the default streams' order, and
 * errors of work sent without waiting.
 *
 * Order is seen through event timings: on the sim device each operation takes modelled time
 * on its stream, and an event records where its stream stands, so an event recorded after a
 * wait is later by at least the work waited for. */
#define _GNU_SOURCE
#include "cuda_standin.h"

#include <unistd.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Bytes each ordering memset writes: long enough to show in an event timing. */
#define ORDER_BYTES (32u << 20)

static float elapsed(CUevent a, CUevent b) {
    float ms = -1;
    OK(cuEventSynchronize(b));
    OK(cuEventElapsedTime(&ms, a, b));
    return ms;
}

void check_streams(void) {
    section_begin("streams");
    int least = 1, greatest = 1;
    OK(cuCtxGetStreamPriorityRange(&least, &greatest));
    CHECK(greatest <= least, "priorities %d..%d", greatest, least);
    CUstream a = NULL, b = NULL, bad = NULL;
    OK(cuStreamCreateWithPriority(&a, CU_STREAM_NON_BLOCKING, greatest));
    OK(cuStreamCreate(&b, 0));
    EXPECT(cuStreamCreate(&bad, 0x10), CUDA_ERROR_INVALID_VALUE);
    unsigned flags = 99;
    int priority = 99;
    OK(cuStreamGetFlags(a, &flags));
    OK(cuStreamGetPriority(a, &priority));
    CHECK(flags == CU_STREAM_NON_BLOCKING && priority == greatest, "flags %u priority %d", flags,
          priority);
    OK(cuStreamGetFlags(b, &flags));
    OK(cuStreamGetPriority(b, &priority));
    CHECK(flags == 0 && priority == 0, "flags %u priority %d", flags, priority);
    unsigned long long ida = 0, idb = 0, idnull = 0;
    OK(cuStreamGetId(a, &ida));
    OK(cuStreamGetId(b, &idb));
    OK(cuStreamGetId(NULL, &idnull));
    CHECK(ida != idb && ida != idnull && idb != idnull, "ids %llu %llu %llu", ida, idb, idnull);

    CUdeviceptr d = 0;
    OK(cuMemAlloc(&d, 1 << 20));
    OK(cuMemsetD8Async(d, 1, 1 << 20, a));
    OK(cuMemsetD8Async(d, 2, 1 << 20, b));
    OK(cuStreamSynchronize(a));
    OK(cuStreamQuery(a));
    OK(cuStreamSynchronize(b));
    OK(cuStreamQuery(b));
    OK(cuStreamQuery(NULL));

    OK(cuStreamDestroy(a));
    EXPECT(cuStreamDestroy(a), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuStreamQuery(a), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuStreamSynchronize(a), CUDA_ERROR_INVALID_HANDLE);
    OK(cuStreamDestroy(b));
    OK(cuMemFree(d));

    section_end();
}

void check_events(void) {
    section_begin("events");
    CUevent e1 = NULL, e2 = NULL, untimed = NULL;
    OK(cuEventCreate(&e1, 0));
    OK(cuEventCreate(&e2, 0));
    OK(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
    CUstream s = NULL, a = NULL, b = NULL, c = NULL;
    OK(cuStreamCreate(&s, 0));
    CUdeviceptr d = 0;
    OK(cuMemAlloc(&d, ORDER_BYTES));

    /* Record, query, synchronize, time. */
    OK(cuEventRecord(e1, s));
    OK(cuMemsetD8Async(d, 1, ORDER_BYTES, s));
    OK(cuEventRecord(e2, s));
    OK(cuEventRecord(untimed, s));
    OK(cuEventSynchronize(e2));
    OK(cuEventQuery(e2));
    OK(cuEventQuery(untimed));
    float ms = elapsed(e1, e2);
    CHECK(ms > 0, "a memset between two events took %f ms", ms);
    EXPECT(cuEventElapsedTime(&ms, e1, untimed), CUDA_ERROR_INVALID_HANDLE);

    /* A stream waits for an event of another: what it records next is after that work. */
    CUevent a0 = NULL, a1 = NULL, done = NULL, c0 = NULL, c1 = NULL;
    OK(cuEventCreate(&a0, 0));
    OK(cuEventCreate(&a1, 0));
    OK(cuEventCreate(&done, 0));
    OK(cuEventCreate(&c0, 0));
    OK(cuEventCreate(&c1, 0));
    OK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    OK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
    OK(cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
    OK(cuEventRecord(a0, a));
    OK(cuEventRecord(c0, c));
    OK(cuMemsetD8Async(d, 2, ORDER_BYTES, b));
    OK(cuEventRecord(done, b));
    OK(cuStreamWaitEvent(a, done, 0));
    OK(cuEventRecord(a1, a));
    OK(cuEventRecord(c1, c)); /* c waits for nothing */
    float waited = elapsed(a0, a1), free_running = elapsed(c0, c1);
    CHECK(waited > 0 && free_running * 2 < waited,
          "the waiting stream moved %f ms, the other %f ms", waited, free_running);

    OK(cuEventDestroy(e1));
    EXPECT(cuEventDestroy(e1), CUDA_ERROR_INVALID_HANDLE);
    CUevent all[] = {e2, untimed, a0, a1, done, c0, c1};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) OK(cuEventDestroy(all[i]));
    CUstream streams[] = {s, a, b, c};
    for (size_t i = 0; i < sizeof streams / sizeof *streams; i++) OK(cuStreamDestroy(streams[i]));
    OK(cuMemFree(d));
    section_end();
}

/* How far a memset on `work` moves an event pair recorded on `watch` around it. */
static float moved(CUstream watch, CUstream work, CUdeviceptr d) {
    CUevent before = NULL, after = NULL;
    OK(cuEventCreate(&before, 0));
    OK(cuEventCreate(&after, 0));
    OK(cuEventRecord(before, watch));
    OK(cuMemsetD8Async(d, 3, ORDER_BYTES, work));
    OK(cuEventRecord(after, watch));
    float ms = elapsed(before, after);
    OK(cuEventDestroy(before));
    OK(cuEventDestroy(after));
    return ms;
}

struct thread_result {
    unsigned long long id;
    int failures;
};

/* Another thread's per-thread default stream: its own, and its work lands. */
static void *other_thread(void *arg) {
    struct thread_result *r = arg;
    int before = failures;
    OK(cuCtxSetCurrent(primary));
    OK(pt_cuStreamGetId(NULL, &r->id));
    CUdeviceptr d = 0;
    unsigned *h = calloc(1024, sizeof *h);
    OK(cuMemAlloc(&d, 1024 * sizeof *h));
    OK(pt_cuMemsetD32Async(d, 0x5a5a5a5a, 1024, NULL));
    OK(pt_cuStreamSynchronize(NULL));
    OK(pt_cuMemcpyDtoH(h, d, 1024 * sizeof *h));
    for (int i = 0; h && i < 1024; i++)
        if (h[i] != 0x5a5a5a5a) {
            CHECK(0, "per-thread memset: element %d is %#x", i, h[i]);
            break;
        }
    OK(cuMemFree(d));
    free(h);
    r->failures = failures - before;
    return NULL;
}

void check_default_streams(void) {
    section_begin("default streams");
    CUdeviceptr d = 0;
    OK(cuMemAlloc(&d, ORDER_BYTES));
    CUstream blocking = NULL, non_blocking = NULL;
    OK(cuStreamCreate(&blocking, 0));
    OK(cuStreamCreate(&non_blocking, CU_STREAM_NON_BLOCKING));

    /* The NULL (legacy) stream waits for blocking streams' work, and they for its; a
     * non-blocking stream and the NULL stream do not wait for each other. */
    float t;
    t = moved(NULL, blocking, d);
    CHECK(t > 0, "the NULL stream after a blocking stream's work: moved %f ms", t);
    float nb = moved(NULL, non_blocking, d);
    CHECK(nb * 2 < t, "the NULL stream after a non-blocking stream's work: moved %f ms", nb);
    t = moved(blocking, NULL, d);
    CHECK(t > 0, "a blocking stream after the NULL stream's work: moved %f ms", t);
    nb = moved(non_blocking, NULL, d);
    CHECK(nb * 2 < t, "a non-blocking stream after the NULL stream's work: moved %f ms", nb);
    t = moved(CU_STREAM_LEGACY, blocking, d);
    CHECK(t > 0, "CU_STREAM_LEGACY is the NULL stream: moved %f ms", t);

    /* The per-thread default stream (_ptsz forms): a stream of this thread's own, in order
     * with the legacy stream. */
    unsigned long long legacy = 0, mine = 0, legacy_pt = 0;
    OK(cuStreamGetId(NULL, &legacy));
    OK(pt_cuStreamGetId(NULL, &mine));
    OK(pt_cuStreamGetId(CU_STREAM_LEGACY, &legacy_pt));
    CHECK(mine != legacy && legacy_pt == legacy, "per-thread %llu, legacy %llu / %llu", mine,
          legacy, legacy_pt);
    /* Only the thread's end destroys its default stream, whatever handle a program makes up
     * for it (gpushare's stream handles are the id above the tag byte 0x5a). */
    EXPECT(cuStreamDestroy((CUstream)(size_t)(mine << 8 | 0x5a)), CUDA_ERROR_INVALID_HANDLE);
    CUevent before = NULL, after = NULL;
    OK(cuEventCreate(&before, 0));
    OK(cuEventCreate(&after, 0));
    OK(cuEventRecord(before, NULL));
    OK(pt_cuMemsetD32Async(d, 4, ORDER_BYTES / 4, NULL));
    OK(cuEventRecord(after, NULL));
    t = elapsed(before, after);
    CHECK(t > 0, "the legacy stream after the per-thread stream's work: moved %f ms", t);
    float none = -1;
    OK(cuEventElapsedTime(&none, after, after));
    CHECK(none == 0, "from an event to itself: %f ms", none);
    OK(pt_cuEventRecord(before, NULL));
    OK(cuMemsetD8Async(d, 5, ORDER_BYTES, NULL));
    OK(pt_cuEventRecord(after, NULL));
    t = elapsed(before, after);
    CHECK(t > 0, "the per-thread stream after the legacy stream's work: moved %f ms", t);
    OK(cuEventDestroy(before));
    OK(cuEventDestroy(after));
    pthread_t thread;
    struct thread_result other = {0, 0};
    CHECK(pthread_create(&thread, NULL, other_thread, &other) == 0, "a thread");
    pthread_join(thread, NULL);
    CHECK(other.failures == 0 && other.id != mine && other.id != legacy,
          "another thread's stream %llu (mine %llu, legacy %llu)", other.id, mine, legacy);

    /* cuCtxSynchronize waits for every stream of this program. */
    OK(cuMemsetD8Async(d, 6, ORDER_BYTES, blocking));
    OK(cuMemsetD8Async(d, 7, ORDER_BYTES, non_blocking));
    OK(cuCtxSynchronize(NULL));
    OK(cuStreamQuery(blocking));
    OK(cuStreamQuery(non_blocking));
    OK(cuStreamQuery(NULL));
    OK(cuStreamDestroy(blocking));
    OK(cuStreamDestroy(non_blocking));
    OK(cuMemFree(d));
    section_end();
}

void check_deferred_errors(void) {
    section_begin("deferred errors");
    CUdeviceptr d = 0;
    unsigned h[256];
    memset(h, 0xff, sizeof h);
    OK(cuMemAlloc(&d, sizeof h));
    OK(cuMemsetD32(d, 0, 256));
    CUstream gone = NULL;
    OK(cuStreamCreate(&gone, 0));
    OK(cuStreamDestroy(gone));
    /* Sent without waiting, the work cannot fail at once: it fails in gpushared, and the
     * error comes with the next call that synchronizes — once. */
    OK(cuMemsetD32Async(d, 7, 256, gone));
    EXPECT(cuCtxSynchronize(NULL), CUDA_ERROR_INVALID_HANDLE);
    OK(cuCtxSynchronize(NULL));
    OK(cuMemcpyHtoDAsync(d, h, sizeof h, gone));
    EXPECT(cuStreamSynchronize(NULL), CUDA_ERROR_INVALID_HANDLE);
    OK(cuStreamSynchronize(NULL));
    CUevent e = NULL, gone_event = NULL;
    OK(cuEventCreate(&e, 0));
    OK(cuEventCreate(&gone_event, 0));
    OK(cuEventDestroy(gone_event));
    OK(cuEventRecord(gone_event, NULL));
    OK(cuEventRecord(e, NULL));
    EXPECT(cuEventSynchronize(e), CUDA_ERROR_INVALID_HANDLE);
    OK(cuEventSynchronize(e));
    /* A synchronizing call that fails for its own reason leaves a pending error pending. */
    OK(cuMemsetD32Async(d, 7, 256, gone));
    EXPECT(cuStreamSynchronize(gone), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuCtxSynchronize(NULL), CUDA_ERROR_INVALID_HANDLE);
    OK(cuCtxSynchronize(NULL));
    /* Past gpushared's bound on streams a creation fails at once, with CUDA's error; the
     * streams made before work, and one destroyed makes room. */
    enum { MOST = 1024 };
    CUstream *many = calloc(MOST, sizeof *many);
    CHECK(many != NULL, "memory");
    int made = 0;
    CUresult last = CUDA_SUCCESS;
    while (many && made < MOST &&
           (last = cuStreamCreate(&many[made], CU_STREAM_NON_BLOCKING)) == CUDA_SUCCESS)
        made++;
    /* The default stream and the per-thread ones made earlier count too. */
    CHECK(made >= MOST - 8 && made < MOST && last == CUDA_ERROR_OUT_OF_MEMORY,
          "%d streams made, then %s", made, error_name(last));
    if (made > 0) {
        OK(cuStreamSynchronize(many[made - 1]));
        OK(cuStreamDestroy(many[made - 1]));
        OK(cuStreamCreate(&many[made - 1], 0));
        OK(cuStreamSynchronize(many[made - 1]));
    }
    for (int i = 0; i < made; i++) OK(cuStreamDestroy(many[i]));
    free(many);
    OK(cuCtxSynchronize(NULL));
    /* The failed work did nothing. */
    OK(cuMemcpyDtoH(h, d, sizeof h));
    for (int i = 0; i < 256; i++)
        if (h[i] != 0) {
            CHECK(0, "element %d is %#x after failed work", i, h[i]);
            break;
        }
    OK(cuEventDestroy(e));
    OK(cuMemFree(d));
    section_end();
}

/* ---- host functions ------------------------------------------------------------------ */

struct host_seen {
    unsigned char *in;  /* page-locked: what the stream copied down before the function */
    unsigned char *out; /* page-locked: what the stream copies up after it */
    unsigned char byte; /* what `in` held when the function ran */
    int calls;
    CUresult status;
};

static void CUDA_CB read_back(void *p) {
    struct host_seen *s = p;
    s->byte = s->in[0];
    s->out[0] = (unsigned char)(s->byte + 1);
    s->calls++;
}

/* Waits (up to 2 s) for the program's thread to say cuLaunchHostFunc returned. */
static int released;
static void CUDA_CB waits_for_release(void *p) {
    struct host_seen *s = p;
    for (int i = 0; i < 2000 && !__atomic_load_n(&released, __ATOMIC_ACQUIRE); i++) usleep(1000);
    s->status = __atomic_load_n(&released, __ATOMIC_ACQUIRE) ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

static void CUDA_CB stream_callback(CUstream stream, CUresult status, void *p) {
    (void)stream;
    struct host_seen *s = p;
    s->calls++;
    s->status = status;
}

/* A host function runs after the stream's earlier work and before its later work: it sees
 * what a copy before it brought down, and a copy after it takes up what it wrote. */
void check_host_functions(void) {
    section_begin("host functions");
    CUstream s = NULL;
    CUdeviceptr d = 0;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    struct host_seen seen = {NULL, NULL, 0, 0, -1};
    void *in = NULL, *out = NULL;
    OK(cuMemHostAlloc(&in, 4096, 0));
    OK(cuMemHostAlloc(&out, 4096, 0));
    OK(cuMemAlloc(&d, 1 << 20));
    if (failures) return;
    seen.in = in, seen.out = out;
    seen.out[0] = 0;
    for (int round = 0; round < 3; round++) {
        unsigned char v = (unsigned char)(0x5a + round);
        OK(cuMemsetD8Async(d, v, 1 << 20, s));
        OK(cuMemcpyDtoHAsync(in, d + 12345, 1, s));
        OK(cuLaunchHostFunc(s, read_back, &seen));
        OK(cuMemcpyHtoDAsync(d + 7, out, 1, s));
        OK(cuStreamSynchronize(s));
        unsigned char byte = 0;
        OK(cuMemcpyDtoH(&byte, d + 7, 1));
        CHECK(seen.calls == round + 1, "called %d times in round %d", seen.calls, round);
        CHECK(seen.byte == v, "the work before it was done: it saw %#x, not %#x", seen.byte, v);
        CHECK(byte == (unsigned char)(v + 1), "the work after it waited for it: %#x", byte);
    }
    /* The call returns without waiting for the stream, as CUDA's does. */
    OK(cuLaunchHostFunc(s, waits_for_release, &seen));
    __atomic_store_n(&released, 1, __ATOMIC_RELEASE);
    OK(cuStreamSynchronize(s));
    CHECK(seen.status == CUDA_SUCCESS, "cuLaunchHostFunc waited for its function to run");
    seen.status = -1;
    OK(cuStreamAddCallback(s, stream_callback, &seen, 0));
    OK(cuStreamSynchronize(s));
    CHECK(seen.calls == 4 && seen.status == CUDA_SUCCESS, "callback: %d calls, status %d",
          seen.calls, seen.status);
    EXPECT(cuLaunchHostFunc(s, NULL, &seen), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamAddCallback(s, stream_callback, &seen, 1), CUDA_ERROR_INVALID_VALUE);
    OK(cuStreamDestroy(s));
    OK(cuMemFree(d));
    OK(cuMemFreeHost(in));
    OK(cuMemFreeHost(out));
    section_end();
}

/* A host function that never returns, queued behind some work; the program then exits
 * without waiting (its stream would wait for the function forever: gpushared must let it
 * go when the session ends). */
static void CUDA_CB never_returns(void *p) {
    (void)p;
    for (;;) pause();
}

void run_host_hang(void) {
    CUstream s = NULL;
    CUdeviceptr d = 0;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cuMemAlloc(&d, 4096));
    OK(cuMemsetD8Async(d, 1, 4096, s));
    OK(cuLaunchHostFunc(s, never_returns, NULL));
    OK(cuMemsetD8Async(d, 2, 4096, s));
    printf("queued\n");
    fflush(stdout);
}

/* Records of timing events (`timer-records US`): one behind work on its way waits until that
 * work has reached gpushared's device worker (one more command: gpushared's answer comes from
 * the device, behind the work), but not for the work to finish; an untimed event's record,
 * and a timing event's with nothing sent since a wait or right after a question the program
 * waited for, go without waiting. The test counts
 * the commands between the go-aheads; a kernel runs US microseconds (the sim in real time). */
void run_timer_records(unsigned long long micros) {
    static const char image[] = "gpushare-sim-module 1\nkernel spin\n";
    CUmodule module = NULL;
    CUfunction spin = NULL;
    CUstream a = NULL;
    CUevent timed = NULL, untimed = NULL, start = NULL;
    void *args[] = {&micros};
    section_begin("timer records");
    OK(cuModuleLoadData(&module, image));
    OK(cuModuleGetFunction(&spin, module, "spin"));
    OK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    OK(cuEventCreate(&timed, 0));
    OK(cuEventCreate(&start, 0));
    OK(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
    if (failures) {
        section_end();
        return;
    }
    OK(cuStreamSynchronize(a));
    go_ahead("ready");
    OK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, a, args, NULL));
    OK(cuEventRecord(untimed, a));
    OK(cuStreamSynchronize(a));
    go_ahead("untimed");
    /* Nothing sent since the wait: the start goes without waiting. */
    OK(cuEventRecord(start, a));
    OK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, a, args, NULL));
    OK(cuEventRecord(timed, a));
    /* The record waited for the launch to reach the device, not for the kernel to end. */
    EXPECT(cuEventQuery(timed), CUDA_ERROR_NOT_READY);
    OK(cuStreamSynchronize(a));
    go_ahead("timed");
    /* Right after a question the program waited for, a record goes at once (a timer's start
     * after the program looked at its last result), even with a kernel just sent. */
    OK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, a, args, NULL));
    OK(cuEventQuery(untimed));
    OK(cuEventRecord(timed, a));
    OK(cuStreamSynchronize(a));
    go_ahead("after a question");
    float ms = -1;
    OK(cuEventElapsedTime(&ms, start, timed));
    CHECK(ms >= 0, "elapsed %f ms", ms);
    OK(cuEventDestroy(untimed));
    OK(cuEventDestroy(timed));
    OK(cuEventDestroy(start));
    OK(cuStreamDestroy(a));
    OK(cuModuleUnload(module));
    section_end();
}

/* A timing event's record behind a kernel the scheduler holds (`timer-held US`: gpushared's
 * policy lets one kernel run at a time, another client is connected, and the first kernel runs
 * US microseconds): the record's wait for the work before it is bounded, so it returns long
 * before the held kernel could be granted. */
void run_timer_held(unsigned long long micros) {
    static const char image[] = "gpushare-sim-module 1\nkernel spin\n";
    CUmodule module = NULL;
    CUfunction spin = NULL;
    CUstream a = NULL;
    CUevent timed = NULL;
    void *args[] = {&micros};
    section_begin("timer held");
    OK(cuModuleLoadData(&module, image));
    OK(cuModuleGetFunction(&spin, module, "spin"));
    OK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    OK(cuEventCreate(&timed, 0));
    if (failures) {
        section_end();
        return;
    }
    OK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, a, args, NULL));
    OK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, a, args, NULL));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    OK(cuEventRecord(timed, a));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double waited_us = (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
    CHECK(waited_us < micros / 2.0, "the record waited %.0f us behind a kernel held %llu us",
          waited_us, micros);
    OK(cuStreamSynchronize(a));
    OK(cuEventDestroy(timed));
    OK(cuStreamDestroy(a));
    OK(cuModuleUnload(module));
    section_end();
}
