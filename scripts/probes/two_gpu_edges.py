"""What one process on two GPUs meets at the edges of what gpushare serves (issue 32): run
directly and under `gpushare run --gpus 2`, it prints one line per case.

- `peer_kernel OK|ERR …`: a copy PyTorch does with a kernel on one GPU that reads the other's
  memory (a transposed tensor copied into a contiguous one on the other device, which takes
  that path where peer access is on), checked against the CPU's result;
- `ipc OK|ERR …`: a tensor on cuda:1 shared with a child process through
  torch.multiprocessing (CUDA IPC), changed by the child and read back;
- `data_parallel OK|ERR … SUM`: `torch.nn.DataParallel` over both devices (parameters
  broadcast with NCCL in one process, inputs scattered, outputs gathered) trained 20 steps
  from fixed seeds; SUM hashes the weights, to set against a direct run;
- `jax_devices OK|ERR … SUM`: JAX placing an array on each device, a jitted function run on
  both, the result moved back (SUM: the result's sum);
- `jax_pmap OK|ERR … SUM`: a `jax.pmap` over both devices with a `psum` (XLA's collective
  between the devices of one process, NCCL).
Each case runs in a child process of its own, so that a fault in one does not end the rest;
cases named on the command line run alone."""

import sys

import torch
import torch.multiprocessing as mp


def peer_kernel(out):
    a = torch.randn(512, 768, device="cuda:0")
    b = torch.empty(768, 512, device="cuda:1")
    b.copy_(a.t())
    torch.cuda.synchronize(1)
    same = torch.equal(b.cpu(), a.cpu().t())
    out.put(f"peer_kernel {'OK' if same else 'ERR wrong values'} "
            f"p2p={torch.cuda.can_device_access_peer(1, 0)}")


def child(t):
    t.add_(1)
    torch.cuda.synchronize(t.device)


def ipc(out):
    t = torch.zeros(1 << 20, device="cuda:1")
    p = mp.get_context("spawn").Process(target=child, args=(t,))
    p.start()
    p.join(120)
    ok = p.exitcode == 0 and float(t.sum()) == float(1 << 20)
    out.put(f"ipc {'OK' if ok else f'ERR exit {p.exitcode}, sum {float(t.sum())}'}")


def data_parallel(out):
    import hashlib

    torch.manual_seed(5)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)
    ).to("cuda:0")
    dp = torch.nn.DataParallel(model, device_ids=[0, 1])
    opt = torch.optim.SGD(dp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(6)
    for _ in range(20):
        x = torch.randn(64, 256, generator=gen).to("cuda:0")
        loss = dp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    out.put(f"data_parallel OK loss {loss.item():.9g} {h.hexdigest()[:16]}")


def jax_devices(out):
    import os

    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    import jax
    import jax.numpy as jnp
    import numpy as np

    devs = jax.devices()
    x = jnp.arange(1 << 20, dtype=jnp.float32) / (1 << 20)
    a = jax.device_put(x, devs[0])
    b = jax.device_put(a, devs[1])
    f = jax.jit(lambda v: jnp.sin(v) * 2 + 1)
    r0, r1 = f(a), f(b)
    same = np.array_equal(np.asarray(r0), np.asarray(r1))
    back = jax.device_put(r1, devs[0])
    out.put(f"jax_devices {'OK' if same else 'ERR results differ'} {len(devs)} "
            f"{float(jnp.sum(back)):.6f}")


def jax_pmap(out):
    import os

    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    import jax
    import jax.numpy as jnp

    n = jax.device_count()
    xs = jnp.arange(n * 1024, dtype=jnp.float32).reshape(n, 1024)
    total = jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")(xs)
    out.put(f"jax_pmap OK {float(total.sum()):.1f}")


def main():
    ctx = mp.get_context("spawn")
    cases = (peer_kernel, ipc, data_parallel, jax_devices, jax_pmap)
    named = [c for c in cases if c.__name__ in sys.argv[1:]] or cases
    for case in named:
        q = ctx.Queue()
        p = ctx.Process(target=case, args=(q,))
        p.start()
        p.join(180)
        print(q.get() if not q.empty() else f"{case.__name__} ERR exit {p.exitcode}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
