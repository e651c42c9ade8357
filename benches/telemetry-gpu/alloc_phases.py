# One process allocating and freeing without PyTorch's cache for a while, timing blocks of
# iterations with wall-clock stamps, so phases with and without telemetry (switched from
# outside) can be compared inside the same process.
import os, sys, time, torch
assert os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"
secs = float(sys.argv[1]); block = int(sys.argv[2]) if len(sys.argv) > 2 else 100
size = 4 << 20
torch.empty(1, device="cuda"); torch.cuda.synchronize()
end = time.time() + secs
out = []
while time.time() < end:
    t0 = time.time()
    for _ in range(block):
        y = torch.empty(size // 4, device="cuda"); del y
    torch.cuda.synchronize()
    t1 = time.time()
    out.append((t0, t1))
with open(sys.argv[3], "w") as f:
    for t0, t1 in out:
        f.write(f"{t0:.6f} {t1:.6f}\n")
