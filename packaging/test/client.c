/*
 * The installed-package C client (scripts/package-check.sh): built with nothing but
 * `pkg-config --cflags --libs gpushare`, run against a broker started from the installed
 * package. Connects through $GPUSHARE_SOCKET, adds two vectors on the device, checks every
 * element against the host, and exits 0 ("client: ok"), or names what failed and exits 1.
 *
 *   client [--wait]
 *
 * --wait: after connecting, print "client: connected" and wait for a line on stdin before
 * doing the work, so that the check can reload the broker's policy under a live session.
 * The session's class is printed as "client: class NAME" for the check to compare with the
 * policy file.
 */
#include <gpushare.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 65536

static gpushare_client *client;

static void check(int rc, const char *call) {
    if (rc != GPUSHARE_OK) {
        fprintf(stderr, "client: FAILED: %s: %s (%s)\n", call, gpushare_error_name(rc),
                gpushare_last_error_message());
        exit(1);
    }
}

#define CHECK(call) check((call), #call)

static const char *class_name(uint32_t class) {
    switch (class) {
    case GPUSHARE_CLASS_HIGH:
        return "high";
    case GPUSHARE_CLASS_NORMAL:
        return "normal";
    case GPUSHARE_CLASS_BEST_EFFORT:
        return "best-effort";
    default:
        return "unknown";
    }
}

int main(int argc, char **argv) {
    static float a[N], b[N], c[N];
    int wait = argc > 1 && strcmp(argv[1], "--wait") == 0;

    CHECK(gpushare_connect(NULL, "package-check", &client));
    gpushare_session_info_t info;
    CHECK(gpushare_session_info(client, &info));
    printf("client: backend %s\n", info.backend);
    printf("client: class %s\n", class_name(info.priority_class));
    if (wait) {
        printf("client: connected\n");
        fflush(stdout);
        char line[16];
        if (fgets(line, sizeof line, stdin) == NULL) {
            fprintf(stderr, "client: FAILED: stdin closed before the go-ahead\n");
            return 1;
        }
    }

    for (size_t i = 0; i < N; i++) {
        a[i] = (float)(i % 1000) / 8.0f;
        b[i] = (float)(i % 77) * 3.0f;
    }
    uint64_t da, db, dc;
    CHECK(gpushare_alloc(client, sizeof a, &da));
    CHECK(gpushare_alloc(client, sizeof b, &db));
    CHECK(gpushare_alloc(client, sizeof c, &dc));
    CHECK(gpushare_copy_htod(client, GPUSHARE_DEFAULT_STREAM, da, a, sizeof a));
    CHECK(gpushare_copy_htod(client, GPUSHARE_DEFAULT_STREAM, db, b, sizeof b));
    CHECK(gpushare_vec_add_f32(client, GPUSHARE_DEFAULT_STREAM, da, db, dc, N));
    CHECK(gpushare_stream_synchronize(client, GPUSHARE_DEFAULT_STREAM));
    CHECK(gpushare_copy_dtoh(client, GPUSHARE_DEFAULT_STREAM, c, dc, sizeof c));
    for (size_t i = 0; i < N; i++) {
        if (c[i] != a[i] + b[i]) {
            fprintf(stderr, "client: FAILED: c[%zu] = %g, expected %g\n", i, c[i], a[i] + b[i]);
            return 1;
        }
    }
    CHECK(gpushare_free(client, da));
    CHECK(gpushare_free(client, db));
    CHECK(gpushare_free(client, dc));
    gpushare_disconnect(client);
    printf("client: ok\n");
    return 0;
}
