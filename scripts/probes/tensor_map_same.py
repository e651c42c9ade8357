"""Whether a TMA tensor map is a function of its arguments alone: encodes maps with
cuTensorMapEncodeTiled (and one with cuTensorMapReplaceAddress) through whatever libcuda.so.1
the loader finds, and prints a digest of each map's 128 bytes. Run it twice (two processes,
two contexts): equal lines mean the same arguments gave the same bytes, which is what lets
gpushare's driver keep each map it was given (client-lib/cuda/src/memo.rs).

    python3 tensor_map_same.py        # directly
    gpushare run -- python3 tensor_map_same.py
"""
import ctypes
import hashlib

cuda = ctypes.CDLL("libcuda.so.1")


def check(r, what):
    if r != 0:
        raise SystemExit(f"{what} failed: CUresult {r}")


def digest(m):
    return hashlib.sha256(ctypes.string_at(m, 128)).hexdigest()[:16]


def main():
    check(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    # Fixed addresses (the driver checks only their alignment), the same in every process.
    for address in (1 << 40, (1 << 40) + 4096, 3 << 40):
        for swizzle in (0, 3):
            buf = ctypes.create_string_buffer(256)  # a CUtensorMap is 64-byte aligned
            m = ctypes.c_void_p((ctypes.addressof(buf) + 63) & ~63)
            dims = (ctypes.c_uint64 * 2)(256, 128)
            strides = (ctypes.c_uint64 * 1)(256 * 4)
            box = (ctypes.c_uint32 * 2)(32, 32)
            elem = (ctypes.c_uint32 * 2)(1, 1)
            check(cuda.cuTensorMapEncodeTiled(
                m, 7, 2, ctypes.c_void_p(address), dims, strides, box, elem,
                0, swizzle, 0, 0), "cuTensorMapEncodeTiled")
            print(f"tiled {address:#x} swizzle {swizzle}: {digest(m)}")
    check(cuda.cuTensorMapReplaceAddress(m, ctypes.c_void_p(5 << 40)), "cuTensorMapReplaceAddress")
    print(f"replaced: {digest(m)}")


if __name__ == "__main__":
    main()
