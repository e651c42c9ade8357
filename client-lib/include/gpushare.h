/*
 * gpushare.h — C ABI of the gpushare client library (libgpushare.so).
 *
 * Share one GPU through the gpushared broker: device memory, copies, streams, events,
 * built-in kernels and (on CUDA devices) PTX/cubin/fatbin modules.
 *
 * Conventions
 * - Every function except gpushare_disconnect, gpushare_last_error_message and
 *   gpushare_error_name returns an int status: GPUSHARE_OK (0) on success, a broker error
 *   code (1..19) or a library error code (100 and up) on failure. After a failure,
 *   gpushare_last_error_message() says what went wrong, in a sentence.
 * - Synchronous calls return once the broker has answered. Asynchronous calls (device
 *   copies, memsets, event records, kernel launches) return once the command is queued;
 *   an error one meets while executing is reported by the next synchronizing call
 *   (gpushare_stream_synchronize, gpushare_synchronize, or a host copy).
 * - Out-parameters are written only on success. A required pointer that is NULL fails the
 *   call with GPUSHARE_E_NULL before anything is sent to the broker.
 * - Handles are plain numbers: streams and events are uint32_t (stream 0 is the default
 *   stream every client has), device pointers, modules and functions are uint64_t. The
 *   broker frees everything a session still holds when it ends.
 * - A gpushare_client may be used from several threads at once.
 * - Device pointers are checked against the caller's own allocations for copies, memsets,
 *   frees and built-in kernels; kernels from modules run unchecked in the shared context.
 */
#ifndef GPUSHARE_H
#define GPUSHARE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ------------------------------------------------------------------ */

#define GPUSHARE_OK 0

/* Broker error codes (wire-stable; the values of the protocol's ErrorCode). */
#define GPUSHARE_E_INVALID_COMMAND 1     /* unknown or malformed command */
#define GPUSHARE_E_INVALID_ARGUMENT 2    /* invalid argument (also raised by the library) */
#define GPUSHARE_E_INVALID_HANDLE 3      /* no such stream, event, module or function */
#define GPUSHARE_E_INVALID_POINTER 4     /* range not inside one of this client's allocations */
#define GPUSHARE_E_ARENA_OUT_OF_BOUNDS 5 /* range outside the shared data arena */
#define GPUSHARE_E_OUT_OF_MEMORY 6       /* device out of memory */
#define GPUSHARE_E_OUT_OF_QUOTA 7        /* allocation would exceed this client's quota */
#define GPUSHARE_E_NOT_SUPPORTED 8       /* not supported by this device backend */
#define GPUSHARE_E_DEVICE_ERROR 9        /* device error */
#define GPUSHARE_E_NOT_READY 10          /* not ready yet */
#define GPUSHARE_E_SHUTTING_DOWN 11      /* broker shutting down; the session is over */
#define GPUSHARE_E_VERSION_MISMATCH 12   /* protocol version mismatch */
#define GPUSHARE_E_PERMISSION_DENIED 13  /* permission denied */
#define GPUSHARE_E_TOO_MANY_HANDLES 14   /* too many handles of this kind */
#define GPUSHARE_E_LAUNCH_FAILED 15      /* kernel launch failed */
#define GPUSHARE_E_INTERNAL 16           /* internal error (broker, or a library bug) */
#define GPUSHARE_E_PROTOCOL_VIOLATION 17 /* protocol violation */
#define GPUSHARE_E_DEVICE_RESET 18       /* GPU reset after a fault: device state lost, session goes on
                                          * (with GPUSHARE_CONNECT_REBUILD: state rebuilt, submit again) */
#define GPUSHARE_E_ADDRESS_UNAVAILABLE 19 /* a rebuild could not get a buffer's device address back */
#define GPUSHARE_E_NOT_FOUND 20           /* the broker does not know the named module, kernel or global */
#define GPUSHARE_E_WORK_LOST 21           /* another program's GPU fault stopped work on the GPU: it may
                                          * have run in part and was not run again; memory and handles
                                          * are intact, the session goes on */

/* Library error codes. */
#define GPUSHARE_E_CONNECT 100     /* cannot reach the broker's socket */
#define GPUSHARE_E_BROKER_GONE 101 /* the connection was lost; the session is over */
#define GPUSHARE_E_EVICTED 102     /* the broker evicted this client; the session is over */
#define GPUSHARE_E_PROTOCOL 103    /* unintelligible broker reply; the session is over */
#define GPUSHARE_E_IO 104          /* I/O error on the connection */
#define GPUSHARE_E_NULL 105        /* a required pointer argument was NULL */
#define GPUSHARE_E_REBUILD_FAILED 106 /* rebuilding after a GPU reset failed; connect again */
#define GPUSHARE_E_BROKER_UNRESPONSIVE 107 /* no answer within GPUSHARE_TIMEOUT; connect again */

/* ---- constants --------------------------------------------------------------------- */

/* Module image formats for gpushare_module_load. */
#define GPUSHARE_MODULE_PTX 0
#define GPUSHARE_MODULE_CUBIN 1
#define GPUSHARE_MODULE_FATBIN 2

/* Priority classes (gpushare_session_info_t.priority_class). */
#define GPUSHARE_CLASS_HIGH 0
#define GPUSHARE_CLASS_NORMAL 1
#define GPUSHARE_CLASS_BEST_EFFORT 2

/* gpushare_session_info_t.memory_quota when the client has no quota. */
#define GPUSHARE_QUOTA_UNLIMITED UINT64_MAX

/* Size of gpushare_session_info_t.backend, terminating NUL included. */
#define GPUSHARE_BACKEND_NAME_LEN 16

/* The default stream. */
#define GPUSHARE_DEFAULT_STREAM 0u

/* gpushare_connect_with_flags flags. */
#define GPUSHARE_CONNECT_REBUILD 1u /* rebuild the device state by itself after a GPU reset */

/* ---- types ------------------------------------------------------------------------- */

/* A session with gpushared (opaque). */
typedef struct gpushare_client gpushare_client;

/* What the broker granted this session. */
typedef struct gpushare_session_info {
    uint64_t client_id;
    uint32_t priority_class; /* GPUSHARE_CLASS_* */
    uint32_t weight;         /* weight in fair-share scheduling */
    uint64_t memory_quota;   /* bytes; GPUSHARE_QUOTA_UNLIMITED if none */
    uint64_t total_memory;   /* the device's memory, bytes */
    uint32_t sm_count;       /* the device's streaming multiprocessors */
    char backend[GPUSHARE_BACKEND_NAME_LEN]; /* "sim", "cuda"; NUL-terminated */
} gpushare_session_info_t;

/* ---- connection and errors --------------------------------------------------------- */

/* Connects to gpushared (synchronous). socket_path NULL: $GPUSHARE_SOCKET, else
 * /run/gpushare/gpushare.sock. name NULL: the process name (shown by `gpushare status`).
 * On success *out is the new client; on failure *out is set to NULL. */
int gpushare_connect(const char *socket_path, const char *name, gpushare_client **out);

/* gpushare_connect with flags (0, or GPUSHARE_CONNECT_REBUILD; others are refused with
 * GPUSHARE_E_INVALID_ARGUMENT).
 *
 * GPUSHARE_CONNECT_REBUILD: after a GPU reset caused by another client (or a restart of
 * gpushared after one), the library makes this client's device state again by itself:
 * every allocation at its old device address holding the bytes last copied into it from
 * the host, every module, function, stream and event. Handles and device pointers keep
 * working, kernel parameters holding raw pointers included (stream, event, module and
 * function ids are then the library's own numbers, which it maps to the broker's). The call that meets the reset
 * fails once with GPUSHARE_E_DEVICE_RESET: work submitted before the fault was lost and is
 * not run again, so submit it again. Buffers only the device wrote come back without their
 * contents. If the rebuild fails (GPUSHARE_E_ADDRESS_UNAVAILABLE: an old address is taken;
 * GPUSHARE_E_REBUILD_FAILED: gpushared did not come back within 30 s, or refused), every
 * later call fails with that code: disconnect, connect again and upload again.
 * Cost: host memory for a copy of every buffer that was copied to from the host (its whole
 * size, from the first copy) and of every module image, and one extra host copy per
 * upload. */
int gpushare_connect_with_flags(const char *socket_path, const char *name, uint32_t flags,
                                gpushare_client **out);

/* Ends the session; the broker frees everything it still holds. NULL is ignored. The
 * client must not be in use by another thread, nor used again. */
void gpushare_disconnect(gpushare_client *client);

/* The message of the most recent failed call on this thread ("" if none failed). Valid
 * until the next gpushare call on this thread; never NULL. */
const char *gpushare_last_error_message(void);

/* The name of a status code, e.g. "GPUSHARE_E_INVALID_POINTER" ("GPUSHARE_E_UNKNOWN" for
 * an unknown code). A static string; never NULL. */
const char *gpushare_error_name(int code);

/* Fills *out with what the broker granted this session (local; no broker round trip). */
int gpushare_session_info(const gpushare_client *client, gpushare_session_info_t *out);

/* Waits for all of this client's work; reports the first error any asynchronous command
 * met (synchronous). Work a device reset took before the client saw it finish is reported
 * here, once, as GPUSHARE_E_DEVICE_RESET. */
int gpushare_synchronize(const gpushare_client *client);

/* ---- scheduling --------------------------------------------------------------------- */

/* Marks the end of one iteration (a training step, an inference request): where SRTF/PACK
 * may switch jobs and a declared deadline is checked. *out_latency_ns (may be NULL) gets the
 * iteration's latency as the scheduler saw it (0 under FIFO), *out_missed (may be NULL) 1
 * when it missed the deadline (synchronous). */
int gpushare_end_iteration(const gpushare_client *client, uint64_t *out_latency_ns,
                           int *out_missed);

/* Declares the job's expected remaining GPU time and memory for SRTF/PACK and memory
 * admission; all zero withdraws it (synchronous). */
int gpushare_declare_job(const gpushare_client *client, uint64_t remaining_ns,
                         uint64_t persistent_bytes, uint64_t ephemeral_bytes);

/* Declares a periodic deadline per iteration; a deadline longer than the period fails with
 * GPUSHARE_E_INVALID_ARGUMENT; both zero withdraw it (synchronous). */
int gpushare_declare_deadline(const gpushare_client *client, uint64_t period_ns,
                              uint64_t deadline_ns);

/* ---- memory ------------------------------------------------------------------------ */

/* Allocates bytes of device memory; *out_ptr is its device address (synchronous). */
int gpushare_alloc(const gpushare_client *client, uint64_t bytes, uint64_t *out_ptr);

/* Frees an allocation by its base address (synchronous). */
int gpushare_free(const gpushare_client *client, uint64_t ptr);

/* Copies bytes from host memory src to device address dst, ordered on stream; returns once
 * the data is on the device (synchronous: it synchronizes the stream, so it also reports
 * earlier asynchronous errors). src may be NULL only when bytes is 0. */
int gpushare_copy_htod(const gpushare_client *client, uint32_t stream, uint64_t dst,
                       const void *src, size_t bytes);

/* Copies bytes from device address src to host memory dst, ordered on stream; returns once
 * the data is in dst (synchronous; reports earlier asynchronous errors). dst may be NULL
 * only when bytes is 0. */
int gpushare_copy_dtoh(const gpushare_client *client, uint32_t stream, void *dst,
                       uint64_t src, size_t bytes);

/* Copies bytes within device memory on stream (asynchronous). */
int gpushare_copy_dtod(const gpushare_client *client, uint32_t stream, uint64_t dst,
                       uint64_t src, uint64_t bytes);

/* Sets bytes of device memory at dst to value on stream (asynchronous). */
int gpushare_memset(const gpushare_client *client, uint32_t stream, uint64_t dst,
                    uint8_t value, uint64_t bytes);

/* ---- streams ----------------------------------------------------------------------- */

/* Creates a stream; *out is its id (synchronous). */
int gpushare_stream_create(const gpushare_client *client, uint32_t *out);

/* Destroys a stream (synchronous). */
int gpushare_stream_destroy(const gpushare_client *client, uint32_t stream);

/* Waits for the stream's work; reports the first error any asynchronous command met
 * (synchronous). */
int gpushare_stream_synchronize(const gpushare_client *client, uint32_t stream);

/* ---- events ------------------------------------------------------------------------ */

/* Creates an event; *out is its id (synchronous). */
int gpushare_event_create(const gpushare_client *client, uint32_t *out);

/* Destroys an event (synchronous). */
int gpushare_event_destroy(const gpushare_client *client, uint32_t event);

/* Records event at the current end of stream (asynchronous). */
int gpushare_event_record(const gpushare_client *client, uint32_t event, uint32_t stream);

/* *done = 1 if the work before the event is complete, else 0 (synchronous). */
int gpushare_event_query(const gpushare_client *client, uint32_t event, int *done);

/* Waits until the work before the event is complete (synchronous). */
int gpushare_event_synchronize(const gpushare_client *client, uint32_t event);

/* *ns = device time in nanoseconds from start to end, both recorded and complete
 * (synchronous). */
int gpushare_event_elapsed_ns(const gpushare_client *client, uint32_t start, uint32_t end,
                              uint64_t *ns);

/* ---- built-in kernels (all asynchronous; float32, device addresses) ---------------- */

/* dst[i] = value for i < n. */
int gpushare_fill_f32(const gpushare_client *client, uint32_t stream, uint64_t dst,
                      uint64_t n, float value);

/* y[i] = alpha * x[i] + y[i] for i < n. */
int gpushare_axpy_f32(const gpushare_client *client, uint32_t stream, uint64_t x,
                      uint64_t y, uint64_t n, float alpha);

/* c[i] = a[i] + b[i] for i < n. */
int gpushare_vec_add_f32(const gpushare_client *client, uint32_t stream, uint64_t a,
                         uint64_t b, uint64_t c, uint64_t n);

/* out[0] = x[0] + ... + x[n-1]. */
int gpushare_reduce_sum_f32(const gpushare_client *client, uint32_t stream, uint64_t x,
                            uint64_t out, uint64_t n);

/* C = alpha * A.B + beta * C, row-major: A is m x k, B is k x n, C is m x n. */
int gpushare_gemm_f32(const gpushare_client *client, uint32_t stream, uint64_t a,
                      uint64_t b, uint64_t c, uint32_t m, uint32_t n, uint32_t k,
                      float alpha, float beta);

/* C = alpha * A.B + beta * C with A (m x k) and B (k x n) in bfloat16 (raw uint16 bits) and
 * C (m x n) in float, row-major, accumulated in float. GPUSHARE_E_NOT_SUPPORTED on a GPU
 * broker without cuBLAS. */
int gpushare_gemm_bf16(const gpushare_client *client, uint32_t stream, uint64_t a,
                       uint64_t b, uint64_t c, uint32_t m, uint32_t n, uint32_t k,
                       float alpha, float beta);

/* Occupies `blocks` thread blocks for `micros` microseconds and does nothing else. */
int gpushare_spin(const gpushare_client *client, uint32_t stream, uint64_t micros,
                  uint32_t blocks);

/* ---- modules (CUDA devices; the sim device answers GPUSHARE_E_NOT_SUPPORTED) -------- */

/* Loads a module image of len bytes in format GPUSHARE_MODULE_*; *out_module is its id
 * (synchronous). */
int gpushare_module_load(const gpushare_client *client, int format, const void *image,
                         size_t len, uint64_t *out_module);

/* Unloads a module; its functions become invalid (synchronous). */
int gpushare_module_unload(const gpushare_client *client, uint64_t module);

/* Looks up a kernel of a loaded module by its (mangled) name; *out_fn is its id
 * (synchronous). */
int gpushare_module_function(const gpushare_client *client, uint64_t module,
                             const char *name, uint64_t *out_fn);

/* Launches a module function on stream with grid[3] x block[3] threads, shared_mem bytes of
 * dynamic shared memory and params_len bytes of packed kernel parameters (asynchronous;
 * returns once the parameters are copied into the shared arena, without waiting for the
 * broker: an error the launch meets comes with the next synchronization). params may be
 * NULL only when params_len is 0. */
int gpushare_launch(const gpushare_client *client, uint32_t stream, uint64_t fn,
                    const uint32_t grid[3], const uint32_t block[3], uint32_t shared_mem,
                    const void *params, size_t params_len);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GPUSHARE_H */
