"""A data-parallel job, one process per GPU (run by torchrun): a small MLP trained with
DistributedDataParallel over NCCL from fixed seeds, then an all-reduce bandwidth probe.

Rank 0 prints one line per result, for gpu-ddp.sh to compare a consolidated run with a direct
one: `devices N` (what torch counts), `step_loss I VALUE` for some steps, `checksum VALUE` (a
hash of the trained weights' bytes), `allreduce_gbps VALUE` (bus bandwidth of a 256 MiB
float32 all-reduce, the median of the timed rounds, as nccl-tests counts it: 2(n-1)/n of the
bytes over the time)."""

import hashlib
import os
import statistics
import time

import torch
import torch.distributed as dist


def main():
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", local)
    if rank == 0:
        print(f"devices {torch.cuda.device_count()}", flush=True)

    torch.manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)
    ).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator(device="cpu").manual_seed(99 + rank)
    for step in range(int(os.environ.get("DDP_STEPS", "200"))):
        x = torch.randn(64, 512, generator=gen).to(dev)
        y = torch.randn(64, 512, generator=gen).to(dev)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if rank == 0 and step % 50 == 0:
            print(f"step_loss {step} {loss.item():.9g}", flush=True)
    torch.cuda.synchronize()
    if rank == 0:
        h = hashlib.sha256()
        for p in model.parameters():
            h.update(p.detach().cpu().numpy().tobytes())
        print(f"checksum {h.hexdigest()[:16]}", flush=True)

    n = 64 << 20  # float32 elements: 256 MiB
    buf = torch.ones(n, device=dev)
    for _ in range(5):
        dist.all_reduce(buf)
    torch.cuda.synchronize()
    times = []
    for _ in range(int(os.environ.get("DDP_ROUNDS", "20"))):
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(buf)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    if rank == 0:
        busbw = 2 * (world - 1) / world * n * 4 / statistics.median(times) / 1e9
        print(f"allreduce_gbps {busbw:.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
