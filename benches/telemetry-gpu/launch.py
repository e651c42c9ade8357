# Kernel-launch-bound loop: tiny elementwise kernels, no ioctls in steady state; what a uprobe
# on cuLaunchKernel costs per launch.
import sys, time, torch
n = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
x = torch.zeros(256, device="cuda")
for _ in range(1000):
    x.add_(1)
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(n):
    x.add_(1)
torch.cuda.synchronize()
dt = time.perf_counter() - t0
print(f"launch: {n} launches: {dt / n * 1e6:.3f} us each", flush=True)
time.sleep(0.3)
