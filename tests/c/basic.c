/*
 * One C client against a real broker (the sim device): every kind of call through
 * libgpushare.so, results checked element by element against the same computation on the
 * host. Run by tests/c_abi.rs with GPUSHARE_SOCKET set; prints "c client: all checks
 * passed" and exits 0, or names the failed check and exits 1.
 */
#include "gpushare.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 4096
#define GEMM_M 32
#define GEMM_N 16
#define GEMM_K 8

static gpushare_client *client;

static void fail(const char *what) {
    fprintf(stderr, "c client: FAILED: %s\n", what);
    exit(1);
}

/* Fails unless `rc` is `want`, naming the call and the library's message. */
static void expect_rc(int rc, int want, const char *call) {
    if (rc != want) {
        fprintf(stderr, "c client: FAILED: %s returned %d (%s), expected %d (%s): %s\n", call,
                rc, gpushare_error_name(rc), want, gpushare_error_name(want),
                gpushare_last_error_message());
        exit(1);
    }
}

#define CHECK(call) expect_rc((call), GPUSHARE_OK, #call)

static void check_close(const char *what, size_t i, double got, double want, double rel) {
    double tol = rel * fmax(1.0, fabs(want));
    if (!(fabs(got - want) <= tol)) {
        fprintf(stderr, "c client: FAILED: %s[%zu] = %.9g, expected %.9g (tolerance %.3g)\n",
                what, i, got, want, tol);
        exit(1);
    }
}

/* Deterministic test data, like gpushare_tests::pattern: multiples of 0.01 in [0, 10). */
static void pattern(float *out, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        out[i] = (float)(((uint32_t)i * 2654435761u + seed) % 1000u) / 100.0f;
    }
}

static void download(uint32_t stream, float *dst, uint64_t src) {
    CHECK(gpushare_copy_dtoh(client, stream, dst, src, N * sizeof(float)));
}

int main(void) {
    static float ha[N], hb[N], hc[N], want[N], got[N];

    const char *socket = getenv("GPUSHARE_SOCKET");
    if (socket == NULL || socket[0] == '\0') {
        fail("GPUSHARE_SOCKET is not set");
    }

    /* Argument checks that need no broker. */
    expect_rc(gpushare_connect(NULL, "c-basic", NULL), GPUSHARE_E_NULL, "connect(out=NULL)");
    if (strlen(gpushare_last_error_message()) == 0) {
        fail("no message after a NULL out-pointer");
    }
    expect_rc(gpushare_synchronize(NULL), GPUSHARE_E_NULL, "synchronize(NULL)");
    gpushare_disconnect(NULL);
    if (strcmp(gpushare_error_name(GPUSHARE_E_INVALID_POINTER), "GPUSHARE_E_INVALID_POINTER")) {
        fail("gpushare_error_name(GPUSHARE_E_INVALID_POINTER)");
    }
    if (strcmp(gpushare_error_name(-7), "GPUSHARE_E_UNKNOWN")) {
        fail("gpushare_error_name(-7)");
    }

    /* Connect through $GPUSHARE_SOCKET (NULL path). */
    CHECK(gpushare_connect(NULL, "c-basic", &client));
    if (client == NULL) {
        fail("gpushare_connect succeeded without a client");
    }
    gpushare_session_info_t info;
    memset(&info, 0xff, sizeof info);
    CHECK(gpushare_session_info(client, &info));
    if (strcmp(info.backend, "sim") != 0 || info.sm_count == 0 || info.total_memory == 0 ||
        info.priority_class > GPUSHARE_CLASS_BEST_EFFORT || info.weight == 0) {
        fail("session info");
    }
    printf("c client: id %llu, backend %s, %u SMs, %llu bytes, class %u, weight %u, quota %s\n",
           (unsigned long long)info.client_id, info.backend, info.sm_count,
           (unsigned long long)info.total_memory, info.priority_class, info.weight,
           info.memory_quota == GPUSHARE_QUOTA_UNLIMITED ? "unlimited" : "limited");
    printf("c client: layout session_info size=%zu backend_offset=%zu\n",
           sizeof(gpushare_session_info_t), offsetof(gpushare_session_info_t, backend));

    uint32_t stream;
    CHECK(gpushare_stream_create(client, &stream));
    uint64_t a, b, c;
    CHECK(gpushare_alloc(client, N * sizeof(float), &a));
    CHECK(gpushare_alloc(client, N * sizeof(float), &b));
    CHECK(gpushare_alloc(client, N * sizeof(float), &c));
    expect_rc(gpushare_alloc(client, 16, NULL), GPUSHARE_E_NULL, "alloc(out_ptr=NULL)");

    pattern(ha, N, 1);
    pattern(hb, N, 2);
    CHECK(gpushare_copy_htod(client, stream, a, ha, sizeof ha));
    CHECK(gpushare_copy_htod(client, stream, b, hb, sizeof hb));

    /* Round trip. */
    download(stream, got, a);
    if (memcmp(got, ha, sizeof ha) != 0) {
        fail("upload/download round trip of a");
    }

    uint32_t start, end;
    CHECK(gpushare_event_create(client, &start));
    CHECK(gpushare_event_create(client, &end));
    CHECK(gpushare_event_record(client, start, stream));

    /* c = a + b; c = 2a + c. */
    CHECK(gpushare_vec_add_f32(client, stream, a, b, c, N));
    CHECK(gpushare_axpy_f32(client, stream, a, c, N, 2.0f));
    CHECK(gpushare_spin(client, stream, 50, 1));
    CHECK(gpushare_event_record(client, end, stream));
    CHECK(gpushare_stream_synchronize(client, stream));
    CHECK(gpushare_event_synchronize(client, end));
    int done = 0;
    CHECK(gpushare_event_query(client, end, &done));
    if (!done) {
        fail("event not done after synchronize");
    }
    uint64_t ns = 0;
    CHECK(gpushare_event_elapsed_ns(client, start, end, &ns));
    printf("c client: vec_add + axpy + spin took %llu ns of device time\n",
           (unsigned long long)ns);

    for (size_t i = 0; i < N; i++) {
        hc[i] = ha[i] + hb[i];
        hc[i] = 2.0f * ha[i] + hc[i];
    }
    download(stream, got, c);
    for (size_t i = 0; i < N; i++) {
        check_close("vec_add+axpy", i, got[i], hc[i], 1e-6);
    }

    /* C[0..m*n] = alpha * A.B + beta * C, with A = a[0..m*k], B = b[0..k*n]. */
    const float alpha = 0.5f, beta = 2.0f;
    CHECK(gpushare_gemm_f32(client, stream, a, b, c, GEMM_M, GEMM_N, GEMM_K, alpha, beta));
    memcpy(want, hc, sizeof hc);
    for (size_t i = 0; i < GEMM_M; i++) {
        for (size_t j = 0; j < GEMM_N; j++) {
            double acc = 0.0;
            for (size_t p = 0; p < GEMM_K; p++) {
                acc += (double)ha[i * GEMM_K + p] * (double)hb[p * GEMM_N + j];
            }
            want[i * GEMM_N + j] = (float)(alpha * acc + beta * (double)hc[i * GEMM_N + j]);
        }
    }
    download(stream, got, c);
    for (size_t i = 0; i < N; i++) {
        check_close("gemm", i, got[i], want[i], 1e-5);
    }

    /* b[0] = sum(a). */
    CHECK(gpushare_reduce_sum_f32(client, stream, a, b, N));
    double sum = 0.0;
    for (size_t i = 0; i < N; i++) {
        sum += ha[i];
    }
    download(stream, got, b);
    check_close("reduce_sum", 0, got[0], sum, 1e-4);
    for (size_t i = 1; i < N; i++) {
        check_close("reduce_sum untouched", i, got[i], hb[i], 0.0);
    }

    /* c = a (device copy), then the first quarter of c zeroed, then c[N-8..] = 7. */
    CHECK(gpushare_copy_dtod(client, stream, c, a, N * sizeof(float)));
    CHECK(gpushare_memset(client, stream, c, 0, N * sizeof(float) / 4));
    CHECK(gpushare_fill_f32(client, stream, c + (N - 8) * sizeof(float), 8, 7.0f));
    CHECK(gpushare_synchronize(client));
    /* Scheduling declarations: accepted, and a deadline past its period refused. */
    {
        uint64_t latency = 1;
        int missed = -1;
        CHECK(gpushare_declare_job(client, 1000000000ull, 1u << 20, 0));
        CHECK(gpushare_end_iteration(client, &latency, &missed));
        if (missed != 0) {
            fail("end_iteration reported a missed deadline without one declared");
        }
        CHECK(gpushare_end_iteration(client, NULL, NULL));
        expect_rc(gpushare_declare_deadline(client, 10000000ull, 20000000ull),
                  GPUSHARE_E_INVALID_ARGUMENT, "deadline past its period");
        CHECK(gpushare_declare_deadline(client, 33000000ull, 20000000ull));
    }
    download(stream, got, c);
    for (size_t i = 0; i < N; i++) {
        float w = i < N / 4 ? 0.0f : i >= N - 8 ? 7.0f : ha[i];
        check_close("dtod+memset+fill", i, got[i], w, 0.0);
    }

    /* An out-of-bounds fill is accepted and reported at the next synchronization. */
    CHECK(gpushare_fill_f32(client, stream, c, 2 * N, 1.0f));
    expect_rc(gpushare_stream_synchronize(client, stream), GPUSHARE_E_INVALID_POINTER,
              "stream_synchronize after an out-of-bounds fill");
    if (strlen(gpushare_last_error_message()) == 0) {
        fail("no message after an out-of-bounds fill");
    }
    printf("c client: out-of-bounds fill: %s\n", gpushare_last_error_message());
    /* Reported once; the client works on. */
    CHECK(gpushare_stream_synchronize(client, stream));

    /* Errors of synchronous calls. */
    expect_rc(gpushare_free(client, 0x1234), GPUSHARE_E_INVALID_POINTER, "free(0x1234)");
    expect_rc(gpushare_stream_synchronize(client, 999), GPUSHARE_E_INVALID_HANDLE,
              "stream_synchronize(999)");

    /* The sim device refuses modules with a typed error and a sentence. */
    static const char ptx[] = ".version 8.0\n.target sm_90\n";
    uint64_t module = 0;
    expect_rc(gpushare_module_load(client, GPUSHARE_MODULE_PTX, ptx, sizeof ptx - 1, &module),
              GPUSHARE_E_NOT_SUPPORTED, "module_load on sim");
    if (strlen(gpushare_last_error_message()) == 0) {
        fail("no message after a refused module");
    }
    printf("c client: module load: %s\n", gpushare_last_error_message());
    expect_rc(gpushare_module_load(client, 42, ptx, sizeof ptx - 1, &module),
              GPUSHARE_E_INVALID_ARGUMENT, "module_load(format=42)");
    uint32_t dims[3] = {1, 1, 1};
    expect_rc(gpushare_launch(client, stream, 1, NULL, dims, 0, NULL, 0), GPUSHARE_E_NULL,
              "launch(grid=NULL)");

    CHECK(gpushare_event_destroy(client, start));
    CHECK(gpushare_event_destroy(client, end));
    CHECK(gpushare_free(client, a));
    CHECK(gpushare_free(client, b));
    CHECK(gpushare_free(client, c));
    CHECK(gpushare_stream_destroy(client, stream));
    CHECK(gpushare_synchronize(client));
    gpushare_disconnect(client);
    client = NULL;

    printf("c client: all checks passed\n");
    return 0;
}
