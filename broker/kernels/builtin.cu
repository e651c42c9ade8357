// gpushare built-in kernels for the `cuda` device backend.
//
// These are the CUDA versions of the kernels that the `sim` device runs on the CPU
// (broker/src/device/sim/kernels.rs); both backends must give the same results. The broker
// compiles this file with NVRTC at start when NVRTC is available, and otherwise loads the
// pre-built `builtin.ptx` next to it (regenerate with scripts/build-ptx.sh). Plain CUDA C
// only: no host code, no #include, nothing NVRTC does not provide built in.
//
// CONTRACT with broker/src/device/cuda: the kernel names (extern "C", unmangled), the parameter
// lists and their ORDER, and the launch shapes below. The Rust side packs parameters in this
// order; change them together or not at all. All pointers are device pointers to f32 data;
// `n` counts elements, not bytes. No kernel uses dynamic shared memory: launch with
// sharedMemBytes = 0 (the static shared memory each one declares is listed below).
//
// Build flags: do NOT use --use_fast_math, -ftz=true, -prec-div=false or -prec-sqrt=false. The
// CPU keeps subnormals and rounds every operation to nearest-even; so must we. Arithmetic
// whose rounding matters is written with __fmul_rn / __fadd_rn, which the compiler never
// contracts into an FMA, so the results are bit-identical to the CPU's separate multiply and
// add whatever --fmad says.
//
// Aliasing: no pointer is __restrict__ and no load goes through the read-only cache, so the
// same buffer may be passed as input and output (vec_add c == a or c == b, axpy x == y); each
// element is read before it is written by the same thread. Buffers that partly overlap at
// different offsets are a data race on the GPU (the sim copies inputs first); the broker
// should refuse or serialize those.
//
// Kernels, what they compute, and how to launch them:
//
//   gpushare_fill_f32(float* dst, unsigned long long n, float value)
//       dst[i] = value for i < n.                                  Bit-identical to the sim.
//   gpushare_axpy_f32(const float* x, float* y, unsigned long long n, float alpha)
//       y[i] = y[i] + alpha * x[i], rounded after the multiply and after the add (no FMA).
//                                                                  Bit-identical to the sim.
//   gpushare_vec_add_f32(const float* a, const float* b, float* c, unsigned long long n)
//       c[i] = a[i] + b[i].                                        Bit-identical to the sim.
//     Launch (all three element-wise kernels): block (256,1,1); grid (G,1,1) with
//     G = clamp(ceil(n / 256), 1, 65535) or any other G >= 1 (grid-stride loops, any grid
//     and any block size are correct). n == 0 is allowed (nothing is written); the broker
//     may also skip the launch. Static shared memory: none.
//
//   gpushare_reduce_sum_f32(const float* x, float* out, unsigned long long n)
//       out[0] = (float) sum(x[0..n]), the sum taken in double precision; n == 0 gives 0.
//     Launch: grid (1,1,1), block (1024,1,1) -- exactly ONE block. Blocks other than block 0
//     return at once, so a larger grid is harmless but wasted. blockDim.x may be anything
//     from 1 to 1024 (not only powers of two), but the rounding of the result depends on it:
//     use 1024 always. Static shared memory: 8 KiB (1024 doubles).
//     Each thread adds x[tid], x[tid + 1024], ... in double, then a fixed shared-memory tree
//     adds the 1024 partial sums in double, and thread 0 rounds once to float. No atomics, so
//     the result is deterministic (same input, same bits). The sim adds sequentially in
//     double and rounds once; the two double sums differ by a few double ulps at most, so
//     after rounding to float they agree to within 1e-6 relative (nearly always
//     bit-identical) unless the sum cancels heavily (|sum| << sum |x[i]|). One block reads
//     the whole input, so this is a correctness fallback, not a fast reduction.
//
//   gpushare_gemm_f32(const float* A, const float* B, float* C, unsigned int m,
//                     unsigned int n, unsigned int k, float alpha, float beta)
//       Row-major C = alpha * A.B + beta * C; A is m x k, B is k x n, C is m x n (lda = k,
//       ldb = n, ldc = n, no padding). For each C element the products A[i][p] * B[p][j] are
//       added in order p = 0, 1, ..., k-1 into a float starting at 0, each multiply and add
//       rounded separately, then C[i][j] = alpha * acc + (beta == 0 ? 0 : beta * C[i][j]):
//       the same operations in the same order as the sim, so bit-identical to it.
//       When beta == 0 (or -0) C is never read, so it may hold NaN or garbage.
//     Launch: block (16,16,1); grid (ceil(n / 16), min(ceil(m / 16), 65535), 1). The kernel
//     loops over row tiles (blockIdx.y, + gridDim.y, ...), so m above 1048560 needs no larger
//     grid; ceil(n / 16) always fits gridDim.x. m == 0 or n == 0 would give an empty grid:
//     skip the launch (nothing to do). k == 0 is fine (C = beta * C, or 0 when beta == 0).
//     Static shared memory: 2 KiB (two 16x16 float tiles). 16x16 tiles, one thread per C
//     element: a small, exact fallback; large GEMMs go to cuBLAS.
//
//   gpushare_spin(unsigned long long nanos)
//       Every thread of the block busy-waits until `nanos` ns of %globaltimer have passed
//       since thread 0 of that block read the start time. Writes no memory.
//     Launch: grid (blocks,1,1) from Kernel::Spin { blocks }, block (32,1,1);
//     nanos = micros * 1000 (saturating). Static shared memory: 8 bytes.
//
//   gpushare_empty()
//       Does nothing; for launch-overhead benchmarks.
//     Launch: any shape, e.g. grid (1,1,1), block (1,1,1). No parameters.

#define GPUSHARE_REDUCE_THREADS 1024
#define GPUSHARE_GEMM_TILE 16

// Index of this thread in a 1-D grid, and the grid-stride step, in 64 bits.
#define GPUSHARE_GLOBAL_INDEX \
    ((unsigned long long)blockIdx.x * (unsigned long long)blockDim.x + (unsigned long long)threadIdx.x)
#define GPUSHARE_GRID_STRIDE ((unsigned long long)gridDim.x * (unsigned long long)blockDim.x)

extern "C" __global__ void gpushare_fill_f32(float* dst, unsigned long long n, float value)
{
    const unsigned long long stride = GPUSHARE_GRID_STRIDE;
    for (unsigned long long i = GPUSHARE_GLOBAL_INDEX; i < n; i += stride) {
        dst[i] = value;
    }
}

extern "C" __global__ void gpushare_axpy_f32(const float* x, float* y, unsigned long long n, float alpha)
{
    const unsigned long long stride = GPUSHARE_GRID_STRIDE;
    for (unsigned long long i = GPUSHARE_GLOBAL_INDEX; i < n; i += stride) {
        const float xi = x[i];
        const float yi = y[i];
        // The sim computes `y += alpha * x`: a rounded multiply, then a rounded add.
        y[i] = __fadd_rn(yi, __fmul_rn(alpha, xi));
    }
}

extern "C" __global__ void gpushare_vec_add_f32(const float* a, const float* b, float* c, unsigned long long n)
{
    const unsigned long long stride = GPUSHARE_GRID_STRIDE;
    for (unsigned long long i = GPUSHARE_GLOBAL_INDEX; i < n; i += stride) {
        const float ai = a[i];
        const float bi = b[i];
        c[i] = __fadd_rn(ai, bi);
    }
}

extern "C" __global__ void gpushare_reduce_sum_f32(const float* x, float* out, unsigned long long n)
{
    __shared__ double partial[GPUSHARE_REDUCE_THREADS];

    // One block does the whole sum. Extra blocks leave before any barrier.
    if (blockIdx.x != 0 || blockIdx.y != 0 || blockIdx.z != 0) {
        return;
    }
    const unsigned int tid = threadIdx.x;
    const unsigned int threads = blockDim.x;

    double sum = 0.0;
    for (unsigned long long i = tid; i < n; i += threads) {
        sum += (double)x[i];
    }
    partial[tid] = sum;
    __syncthreads();

    // Fixed tree over the partial sums: correct for any blockDim.x <= 1024 (slots at or
    // beyond blockDim.x do not exist and are skipped), deterministic for a given blockDim.x.
    for (unsigned int s = GPUSHARE_REDUCE_THREADS / 2; s > 0; s >>= 1) {
        if (tid < s && tid + s < threads) {
            partial[tid] += partial[tid + s];
        }
        __syncthreads();
    }

    if (tid == 0) {
        out[0] = (float)partial[0];
    }
}

extern "C" __global__ void gpushare_gemm_f32(const float* A, const float* B, float* C, unsigned int m,
                                             unsigned int n, unsigned int k, float alpha, float beta)
{
    __shared__ float As[GPUSHARE_GEMM_TILE][GPUSHARE_GEMM_TILE];
    __shared__ float Bs[GPUSHARE_GEMM_TILE][GPUSHARE_GEMM_TILE];

    const unsigned int tx = threadIdx.x;
    const unsigned int ty = threadIdx.y;
    // 64-bit index math: m * k, k * n and m * n may exceed 2^32 elements.
    const unsigned long long col = (unsigned long long)blockIdx.x * GPUSHARE_GEMM_TILE + tx;
    // ceil(x / 16) without overflow for x near 2^32.
    const unsigned int row_tiles = m / GPUSHARE_GEMM_TILE + (m % GPUSHARE_GEMM_TILE != 0 ? 1u : 0u);
    const unsigned int k_tiles = k / GPUSHARE_GEMM_TILE + (k % GPUSHARE_GEMM_TILE != 0 ? 1u : 0u);

    // Loop over row tiles so that m needs no more than 65535 blocks in y. The loop bound is
    // the same for every thread of the block, so the barriers inside are uniform.
    for (unsigned int tile_row = blockIdx.y; tile_row < row_tiles; tile_row += gridDim.y) {
        const unsigned long long row = (unsigned long long)tile_row * GPUSHARE_GEMM_TILE + ty;
        const bool row_ok = row < m;
        const bool col_ok = col < n;

        float acc = 0.0f;
        for (unsigned int t = 0; t < k_tiles; ++t) {
            const unsigned long long p0 = (unsigned long long)t * GPUSHARE_GEMM_TILE;
            const unsigned long long a_col = p0 + tx;
            const unsigned long long b_row = p0 + ty;
            // Outside the matrices the tiles hold +0: the products there are +0 * +0 = +0 and
            // adding +0 to acc (which starts at +0 and so is never -0) leaves it unchanged.
            As[ty][tx] = (row_ok && a_col < k) ? A[row * k + a_col] : 0.0f;
            Bs[ty][tx] = (b_row < k && col_ok) ? B[b_row * n + col] : 0.0f;
            __syncthreads();

#pragma unroll
            for (unsigned int p = 0; p < GPUSHARE_GEMM_TILE; ++p) {
                // Rounded multiply, rounded add, in p order: exactly the sim's `acc += a * b`.
                acc = __fadd_rn(acc, __fmul_rn(As[ty][p], Bs[p][tx]));
            }
            __syncthreads();
        }

        if (row_ok && col_ok) {
            const unsigned long long idx = row * n + col;
            // beta == 0: C is write-only and is never read (it may hold NaN).
            const float prior = (beta == 0.0f) ? 0.0f : __fmul_rn(beta, C[idx]);
            C[idx] = __fadd_rn(__fmul_rn(alpha, acc), prior);
        }
    }
}

// %globaltimer: a 64-bit nanosecond clock shared by the whole GPU.
static __device__ __forceinline__ unsigned long long gpushare_globaltimer(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void gpushare_spin(unsigned long long nanos)
{
    __shared__ unsigned long long start;
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        start = gpushare_globaltimer();
    }
    __syncthreads();
    const unsigned long long begin = start;
    // Unsigned difference: correct even if the clock wraps.
    while (gpushare_globaltimer() - begin < nanos) {
    }
}

extern "C" __global__ void gpushare_empty(void)
{
}
