"""cuda-python programs for the coverage matrix (scripts/gpu-coverage.sh): each prints one JSON
line, {"ok": true, "values": [...]}, that the run directly and the run through gpushare must
agree on.

    python3 cuda_python_prog.py ptx     the driver API through cuda.bindings.driver (cuda.cuda
                                        of cuda-python before 12.6): cuInit, the primary
                                        context, cuMemAlloc, a module of PTX written by hand
                                        (cuModuleLoadData), a saxpy and a sum reduced in
                                        shared memory per block (cuLaunchKernel), copies back
    python3 cuda_python_prog.py jitlink the same kernels linked to a cubin for the device by
                                        nvJitLink (cuda.bindings.nvjitlink) and loaded as one
"""
import array
import ctypes
import json
import sys

# y = a * x + y; and each block's sum of x (256 threads a block) into out[block].
PTX = b"""\
.version 7.0
.target sm_50
.address_size 64
.shared .align 4 .f32 buf[256];
.visible .entry saxpy(.param .u64 px, .param .u64 py, .param .u32 n, .param .f32 a) {
  .reg .pred %p; .reg .b32 %r<6>; .reg .f32 %f<5>; .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [px]; ld.param.u64 %rd2, [py]; ld.param.u32 %r1, [n]; ld.param.f32 %f1, [a];
  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4; setp.ge.u32 %p, %r5, %r1; @%p bra SAXPY_DONE;
  cvta.to.global.u64 %rd3, %rd1; cvta.to.global.u64 %rd4, %rd2; mul.wide.u32 %rd5, %r5, 4;
  add.s64 %rd6, %rd3, %rd5; add.s64 %rd7, %rd4, %rd5;
  ld.global.f32 %f2, [%rd6]; ld.global.f32 %f3, [%rd7];
  fma.rn.f32 %f4, %f1, %f2, %f3; st.global.f32 [%rd7], %f4;
SAXPY_DONE: ret;
}
.visible .entry block_sum(.param .u64 px, .param .u64 pout, .param .u32 n) {
  .reg .pred %p<3>; .reg .b32 %r<12>; .reg .f32 %f<4>; .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [px]; ld.param.u64 %rd2, [pout]; ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %tid.x; mov.u32 %r11, %ntid.x;
  mad.lo.s32 %r4, %r2, %r11, %r3;
  mov.f32 %f1, 0f00000000;
  setp.ge.u32 %p1, %r4, %r1; @%p1 bra SUM_STORE;
  cvta.to.global.u64 %rd3, %rd1; mul.wide.u32 %rd4, %r4, 4; add.s64 %rd5, %rd3, %rd4;
  ld.global.f32 %f1, [%rd5];
SUM_STORE:
  mov.u32 %r5, buf; shl.b32 %r6, %r3, 2; add.s32 %r7, %r5, %r6;
  st.shared.f32 [%r7], %f1;
  bar.sync 0;
  shr.u32 %r8, %r11, 1;
SUM_LOOP:
  setp.ge.u32 %p2, %r3, %r8; @%p2 bra SUM_SKIP;
  shl.b32 %r9, %r8, 2; add.s32 %r10, %r7, %r9;
  ld.shared.f32 %f2, [%r7]; ld.shared.f32 %f3, [%r10]; add.f32 %f2, %f2, %f3;
  st.shared.f32 [%r7], %f2;
SUM_SKIP:
  bar.sync 0;
  shr.u32 %r8, %r8, 1;
  setp.ne.u32 %p2, %r8, 0; @%p2 bra SUM_LOOP;
  setp.ne.u32 %p2, %r3, 0; @%p2 bra SUM_DONE;
  ld.shared.f32 %f2, [%r5];
  cvta.to.global.u64 %rd6, %rd2; mul.wide.u32 %rd7, %r2, 4; add.s64 %rd6, %rd6, %rd7;
  st.global.f32 [%rd6], %f2;
SUM_DONE: ret;
}
"""

THREADS = 256  # block_sum's shared array holds 256 floats


def driver_module():
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python before 12.6
        except ImportError:
            raise ModuleNotFoundError("No module named 'cuda.bindings' (cuda-python)") from None
    return driver


def jitlinked(call, driver, dev):
    """PTX linked by nvJitLink into a cubin for `dev`'s architecture."""
    try:
        from cuda.bindings import nvjitlink
    except ImportError:
        raise ModuleNotFoundError("No module named 'cuda.bindings.nvjitlink'") from None
    attr = driver.CUdevice_attribute
    major = call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    minor = call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    handle = nvjitlink.create(1, [f"-arch=sm_{major}{minor}"])
    try:
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, PTX, len(PTX), "kernels.ptx")
        nvjitlink.complete(handle)
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
    finally:
        nvjitlink.destroy(handle)
    return bytes(cubin)


def main(case):
    driver = driver_module()

    def call(name, *args):
        """The driver's `name`(args), its error raised, its one result (or results) returned."""
        err, *out = getattr(driver, name)(*args)
        if err != driver.CUresult.CUDA_SUCCESS:
            _, text = driver.cuGetErrorName(err)
            raise RuntimeError(f"{name}: {text.decode() if text else err}")
        return out[0] if len(out) == 1 else out

    if case in ("ptx", "jitlink"):
        n = 1 << 20
        nbytes = 4 * n
        call("cuInit", 0)
        dev = call("cuDeviceGet", 0)
        ctx = call("cuDevicePrimaryCtxRetain", dev)
        call("cuCtxSetCurrent", ctx)
        if case == "jitlink":
            image = ctypes.create_string_buffer(jitlinked(call, driver, dev))
        else:
            image = ctypes.create_string_buffer(PTX)  # NUL-terminated, as cuModuleLoadData wants
        module = call("cuModuleLoadData", ctypes.addressof(image))
        saxpy = call("cuModuleGetFunction", module, b"saxpy")
        block_sum = call("cuModuleGetFunction", module, b"block_sum")

        hx = array.array("f", (((i * 7) % 1000) / 100.0 - 5.0 for i in range(n)))
        hy = array.array("f", (((i * 13) % 577) / 50.0 for i in range(n)))
        dx = call("cuMemAlloc", nbytes)
        dy = call("cuMemAlloc", nbytes)
        blocks = (n + THREADS - 1) // THREADS
        dsum = call("cuMemAlloc", 4 * blocks)
        call("cuMemcpyHtoD", dx, hx.buffer_info()[0], nbytes)
        call("cuMemcpyHtoD", dy, hy.buffer_info()[0], nbytes)

        def launch(fn, grid, *args):
            # kernelParams as the C API takes them: an array of pointers to each argument.
            ptrs = (ctypes.c_void_p * len(args))(*(ctypes.addressof(a) for a in args))
            call("cuLaunchKernel", fn, grid, 1, 1, THREADS, 1, 1, 0, 0, ctypes.addressof(ptrs), 0)

        launch(saxpy, blocks, ctypes.c_uint64(int(dx)), ctypes.c_uint64(int(dy)),
               ctypes.c_uint32(n), ctypes.c_float(2.5))
        launch(block_sum, blocks, ctypes.c_uint64(int(dy)), ctypes.c_uint64(int(dsum)),
               ctypes.c_uint32(n))
        call("cuCtxSynchronize")
        ry = array.array("f", bytes(nbytes))
        rs = array.array("f", bytes(4 * blocks))
        call("cuMemcpyDtoH", ry.buffer_info()[0], dy, nbytes)
        call("cuMemcpyDtoH", rs.buffer_info()[0], dsum, 4 * blocks)
        for i in range(0, n, 4099):
            want = ctypes.c_float(2.5 * hx[i] + hy[i]).value
            if abs(ry[i] - want) > 1e-4 * (1 + abs(want)):
                raise RuntimeError(f"saxpy gave {ry[i]} at {i}, not {want}")
        total = sum(ry)
        if abs(sum(rs) - total) > 1e-3 * abs(total) + 1:
            raise RuntimeError("the blocks' sums do not add up to the saxpy's sum")
        for d in (dx, dy, dsum):
            call("cuMemFree", d)
        call("cuModuleUnload", module)
        call("cuDevicePrimaryCtxRelease", dev)
        return list(ry[:16]) + [total] + list(rs[:8]) + [sum(rs)]
    raise SystemExit(f"unknown case {case}")


if __name__ == "__main__":
    try:
        values = main(sys.argv[1])
        print(json.dumps({"ok": True, "values": values}))
    except Exception as e:  # the matrix records it; the run's stderr says more
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}))
