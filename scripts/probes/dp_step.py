"""torch.nn.DataParallel over every visible GPU in one process: an MLP trained from fixed seeds,
20 steps to warm up, then 100 timed. Prints `dp_step_ms MEDIAN` (per step, synchronized) and
`dp_weights HASH`, to set a run under `gpushare run --gpus N` against a direct one."""

import hashlib
import statistics
import time

import torch


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).cuda(0)
    dp = torch.nn.DataParallel(model)
    opt = torch.optim.SGD(dp.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device="cuda:0")
    times = []
    for i in range(120):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = dp(x).square().mean()
        loss.backward()
        opt.step()
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)
        if i >= 20:
            times.append((time.perf_counter() - t0) * 1000)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    print(f"dp_step_ms {statistics.median(times):.3f}")
    print(f"dp_weights {h.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
