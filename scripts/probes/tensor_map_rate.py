"""How long cuTensorMapEncodeTiled takes, as XLA calls it before its TMA kernels' launches:
the maps of a few buffers over and over. Prints the median and p90 microseconds per call over
N calls (default 3000) cycling over three addresses, through whatever libcuda.so.1 the loader
finds (directly, or gpushare's driver under `gpushare run`). On the sim device, which makes no
tensor maps, every call fails (CUDA_ERROR_NOT_SUPPORTED) and gpushare's driver keeps no
failure, so each call is one control request to gpushared: what this then times.

    python3 tensor_map_rate.py [N]
"""
import ctypes
import sys
import time

cuda = ctypes.CDLL("libcuda.so.1")


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    assert cuda.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    buf = ctypes.create_string_buffer(256)
    m = ctypes.c_void_p((ctypes.addressof(buf) + 63) & ~63)
    dims = (ctypes.c_uint64 * 2)(256, 128)
    strides = (ctypes.c_uint64 * 1)(256 * 4)
    box = (ctypes.c_uint32 * 2)(32, 32)
    elem = (ctypes.c_uint32 * 2)(1, 1)
    encode = cuda.cuTensorMapEncodeTiled
    times = []
    first = None
    for i in range(n):
        address = ctypes.c_void_p((1 << 40) + (i % 3) * (1 << 20))
        t = time.perf_counter()
        r = encode(m, 7, 2, address, dims, strides, box, elem, 0, 3, 0, 0)
        times.append(time.perf_counter() - t)
        first = r if first is None else first
        assert r == first, f"CUresult {r}, where the first call gave {first}"
    times.sort()
    said = "" if first == 0 else f" (each failed: CUresult {first})"
    print(f"encode calls {n} median_us {times[n // 2] * 1e6:.2f} p90_us {times[9 * n // 10] * 1e6:.2f}{said}")


if __name__ == "__main__":
    main()
