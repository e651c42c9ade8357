"""One process working on two GPUs (no torchrun): tensors moved between cuda:0 and cuda:1,
a model split over both (model parallelism, activations and gradients crossing with .to()),
trained from fixed seeds, and the bandwidth of a 256 MiB copy from one device to the other.

Prints one line per result, for gpu-ddp.sh (`JOB=one`) to set a consolidated run beside a direct
one: `devices N`, `moved SUM` (a hash of a tensor sent to cuda:1, worked on there and sent
back), `step_loss I VALUE` for some steps, `checksum VALUE` (a hash of the trained weights),
`step_ms VALUE` (the median training step after 10, each ended by reading its loss),
`copy_gbps VALUE` (a 256 MiB float32 tensor cuda:0 -> cuda:1, the median of 10, each
synchronized), and last `transposed SUM` (a transposed, not contiguous, tensor sent across:
PyTorch copies it with a kernel on one GPU that reads the other's memory where peer access
is on)."""

import hashlib
import statistics
import time

import torch


def digest(t):
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def main():
    print(f"devices {torch.cuda.device_count()}", flush=True)
    d0, d1 = torch.device("cuda", 0), torch.device("cuda", 1)

    torch.manual_seed(7)
    a = torch.randn(1 << 20, device=d0)
    b = a.to(d1)
    c = (b * 2 + 1).sin().to(d0) + a
    print(f"moved {digest(c)}", flush=True)

    torch.manual_seed(1234)
    first = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU()).to(d0)
    second = torch.nn.Linear(1024, 512).to(d1)
    params = list(first.parameters()) + list(second.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    gen = torch.Generator(device="cpu").manual_seed(99)
    times = []
    for step in range(100):
        t = time.perf_counter()
        x = torch.randn(64, 512, generator=gen).to(d0)
        y = torch.randn(64, 512, generator=gen).to(d1)
        loss = torch.nn.functional.mse_loss(second(first(x).to(d1)), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.item()
        if step % 25 == 0:
            print(f"step_loss {step} {value:.9g}", flush=True)
        if step >= 10:
            times.append(time.perf_counter() - t)
    print(f"step_ms {statistics.median(times) * 1e3:.4f}", flush=True)
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().cpu().numpy().tobytes())
    print(f"checksum {h.hexdigest()[:16]}", flush=True)

    big = torch.ones(64 << 20, device=d0)
    rates = []
    for _ in range(10):
        torch.cuda.synchronize(d0)
        t = time.perf_counter()
        out = big.to(d1)
        torch.cuda.synchronize(d1)
        rates.append(big.numel() * 4 / (time.perf_counter() - t) / 1e9)
    del out
    print(f"copy_gbps {statistics.median(rates):.2f}", flush=True)

    torch.manual_seed(3)
    m = torch.randn(1024, 1024, device=d0)
    print(f"transposed {digest(m.t().to(d1))}", flush=True)


if __name__ == "__main__":
    main()
