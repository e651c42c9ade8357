/* CUDA's libraries through their C APIs, on the CUDA runtime's memory (cudaMalloc,
 * cudaMemcpy), as a C or C++ program links them: cuRAND makes normal numbers with a fixed
 * seed (its host API, a Philox generator), cuBLAS multiplies two matrices of them (sgemm),
 * cuFFT transforms a signal (1D, complex to complex), and cuDNN convolves a batch of images
 * (the legacy descriptor API, a fixed algorithm, FMA math). For the coverage matrix
 * (scripts/gpu-coverage.sh): prints one JSON line, {"ok": true, "values": [...]}, of each
 * library's first outputs and their sum.
 *
 * Built with -DNO_CUDNN (gpu-coverage.sh does when it finds no cuDNN) it prints the error the
 * matrix counts as a skipped case instead.
 *
 *   cc -O2 -I/usr/local/cuda/include -I$CUDNN/include libs.c -L/usr/local/cuda/lib64 \
 *      -lcublas -lcufft -lcurand -lcudart $CUDNN/lib/libcudnn.so.9 -lm
 * (no -lcuda: the runtime loads the driver, so that `gpushare run` can put its own first). */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cufft.h>
#include <curand.h>
#ifndef NO_CUDNN
#include <cudnn.h>
#endif
#include <stdio.h>
#include <stdlib.h>

static void fail(const char *call, const char *what, int code) {
    printf("{\"ok\": false, \"error\": \"%s: %s %d\"}\n", call, what, code);
    exit(1);
}

#define RT(call)                                                                              \
    do {                                                                                      \
        cudaError_t r_ = (call);                                                              \
        if (r_ != cudaSuccess) fail(#call, cudaGetErrorName(r_), (int)r_);                    \
    } while (0)
#define BLAS(call)                                                                            \
    do {                                                                                      \
        cublasStatus_t r_ = (call);                                                           \
        if (r_ != CUBLAS_STATUS_SUCCESS) fail(#call, "cublasStatus", (int)r_);                \
    } while (0)
#define FFT(call)                                                                             \
    do {                                                                                      \
        cufftResult r_ = (call);                                                              \
        if (r_ != CUFFT_SUCCESS) fail(#call, "cufftResult", (int)r_);                         \
    } while (0)
#define RAND(call)                                                                            \
    do {                                                                                      \
        curandStatus_t r_ = (call);                                                           \
        if (r_ != CURAND_STATUS_SUCCESS) fail(#call, "curandStatus", (int)r_);                \
    } while (0)
#define DNN(call)                                                                             \
    do {                                                                                      \
        cudnnStatus_t r_ = (call);                                                            \
        if (r_ != CUDNN_STATUS_SUCCESS) fail(#call, cudnnGetErrorString(r_), (int)r_);        \
    } while (0)

#define MAX_VALUES 64
static double values[MAX_VALUES];
static int nvalues;

/* The first `first` floats of a device buffer of n, then the sum of all n. */
static void report(const float *dev, size_t n, int first) {
    float *h = malloc(n * sizeof *h);
    RT(cudaMemcpy(h, dev, n * sizeof *h, cudaMemcpyDeviceToHost));
    double s = 0;
    for (size_t i = 0; i < n; i++) s += h[i];
    for (int i = 0; i < first && nvalues < MAX_VALUES; i++) values[nvalues++] = h[i];
    if (nvalues < MAX_VALUES) values[nvalues++] = s;
    free(h);
}

enum { M = 256, K = 192, N = 128, FFT_N = 4096 };
enum { IMG_N = 2, IMG_C = 3, IMG_H = 32, IMG_W = 32, OUT_C = 8, KH = 3, KW = 3 };

int main(void) {
#ifdef NO_CUDNN
    printf("{\"ok\": false, \"error\": \"No module named cudnn headers\"}\n");
    return 1;
#else
    /* cuRAND: every input below, normal numbers from one seeded generator. */
    size_t n_a = (size_t)M * K, n_b = (size_t)K * N, n_sig = 2 * FFT_N;
    size_t n_img = (size_t)IMG_N * IMG_C * IMG_H * IMG_W, n_w = (size_t)OUT_C * IMG_C * KH * KW;
    size_t n_rand = n_a + n_b + n_sig + n_img + n_w; /* even, as curandGenerateNormal wants */
    float *rnd;
    RT(cudaMalloc((void **)&rnd, n_rand * sizeof(float)));
    curandGenerator_t gen;
    RAND(curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    RAND(curandSetPseudoRandomGeneratorSeed(gen, 1234ULL));
    RAND(curandGenerateNormal(gen, rnd, n_rand, 0.0f, 1.0f));
    RT(cudaDeviceSynchronize());
    report(rnd, n_rand, 4);
    float *a = rnd, *b = a + n_a, *sig = b + n_b, *img = sig + n_sig, *w = img + n_img;

    /* cuBLAS: C (M x N) = A (M x K) B (K x N), column-major. */
    float *c;
    RT(cudaMalloc((void **)&c, (size_t)M * N * sizeof(float)));
    cublasHandle_t blas;
    BLAS(cublasCreate(&blas));
    const float one = 1.0f, zero = 0.0f;
    BLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, &one, a, M, b, K, &zero, c, M));
    RT(cudaDeviceSynchronize());
    report(c, (size_t)M * N, 4);

    /* cuFFT: the forward transform of FFT_N complex numbers, out of place. */
    cufftComplex *spec;
    RT(cudaMalloc((void **)&spec, FFT_N * sizeof(cufftComplex)));
    cufftHandle plan;
    FFT(cufftPlan1d(&plan, FFT_N, CUFFT_C2C, 1));
    FFT(cufftExecC2C(plan, (cufftComplex *)sig, spec, CUFFT_FORWARD));
    RT(cudaDeviceSynchronize());
    report((const float *)spec, 2 * FFT_N, 4);

    /* cuDNN: IMG_N x IMG_C x IMG_H x IMG_W images, OUT_C filters of 3 x 3, padding 1. */
    cudnnHandle_t dnn;
    DNN(cudnnCreate(&dnn));
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    DNN(cudnnCreateTensorDescriptor(&xd));
    DNN(cudnnCreateTensorDescriptor(&yd));
    DNN(cudnnCreateFilterDescriptor(&wd));
    DNN(cudnnCreateConvolutionDescriptor(&cd));
    DNN(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, IMG_N, IMG_C, IMG_H,
                                   IMG_W));
    DNN(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, OUT_C, IMG_C, KH, KW));
    DNN(cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                        CUDNN_DATA_FLOAT));
    DNN(cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH));
    int on, oc, oh, ow;
    DNN(cudnnGetConvolution2dForwardOutputDim(cd, xd, wd, &on, &oc, &oh, &ow));
    DNN(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, on, oc, oh, ow));
    cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    size_t ws_bytes = 0;
    DNN(cudnnGetConvolutionForwardWorkspaceSize(dnn, xd, wd, cd, yd, algo, &ws_bytes));
    void *ws = NULL;
    if (ws_bytes) RT(cudaMalloc(&ws, ws_bytes));
    size_t n_out = (size_t)on * oc * oh * ow;
    float *out;
    RT(cudaMalloc((void **)&out, n_out * sizeof(float)));
    DNN(cudnnConvolutionForward(dnn, &one, xd, img, wd, w, cd, algo, ws, ws_bytes, &zero, yd,
                                out));
    RT(cudaDeviceSynchronize());
    report(out, n_out, 4);

    DNN(cudnnDestroyTensorDescriptor(xd));
    DNN(cudnnDestroyTensorDescriptor(yd));
    DNN(cudnnDestroyFilterDescriptor(wd));
    DNN(cudnnDestroyConvolutionDescriptor(cd));
    DNN(cudnnDestroy(dnn));
    FFT(cufftDestroy(plan));
    BLAS(cublasDestroy(blas));
    RAND(curandDestroyGenerator(gen));
    if (ws) RT(cudaFree(ws));
    RT(cudaFree(out));
    RT(cudaFree(spec));
    RT(cudaFree(c));
    RT(cudaFree(rnd));
    printf("{\"ok\": true, \"values\": [");
    for (int i = 0; i < nvalues; i++) printf("%s%.17g", i ? ", " : "", values[i]);
    printf("]}\n");
    return 0;
#endif
}
