# A GPU-ioctl-heavy loop: with PyTorch's caching allocator off, every tensor is a
# cudaMalloc/cudaFree, i.e. driver allocations that go to the kernel driver.
import os, sys, time, torch
assert os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"
n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
size = int(sys.argv[2]) if len(sys.argv) > 2 else (4 << 20)
torch.empty(1, device="cuda"); torch.cuda.synchronize()
for _ in range(50):
    y = torch.empty(size // 4, device="cuda"); del y
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(n):
    y = torch.empty(size // 4, device="cuda"); del y
torch.cuda.synchronize()
dt = time.perf_counter() - t0
print(f"alloc: {n} alloc+free of {size >> 20} MiB: {dt / n * 1e6:.2f} us each", flush=True)
time.sleep(0.3)
