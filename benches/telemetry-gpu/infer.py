# A PyTorch inference loop like shared/gpu-notes.md's high-priority client: 6 x Linear 2048 +
# GELU, batch 8, for a few seconds; then it lingers so the watcher reads it alive.
import sys, time, torch
secs = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
layers = []
for _ in range(6):
    layers += [torch.nn.Linear(2048, 2048), torch.nn.GELU()]
model = torch.nn.Sequential(*layers).cuda().eval()
x = torch.randn(8, 2048, device="cuda")
n = 0
t0 = time.perf_counter()
with torch.no_grad():
    while time.perf_counter() - t0 < secs:
        y = model(x)
        torch.cuda.synchronize()
        n += 1
print(f"infer: {n} iterations in {secs:.1f} s ({n * 12} kernels launched by the model)", flush=True)
time.sleep(0.5)
