"""A data-parallel job, one process per GPU (run by torchrun): a small MLP trained with
DistributedDataParallel over NCCL from fixed seeds, then an all-reduce bandwidth probe.

Rank 0 prints one line per result, for gpu-ddp.sh to compare a consolidated run with a direct
one: `devices N` (what torch counts), `step_loss I VALUE` for some steps, `checksum VALUE` (a
hash of the trained weights' bytes), `step_ms VALUE` (the median training step after 20, each
ended by a synchronization), and the bus bandwidth of a 256 MiB float32 all-reduce as
nccl-tests counts it (2(n-1)/n of the bytes over the time): `allreduce_gbps VALUE` for rounds
of 20 all-reduces in a row (as nccl-tests times them), the median round; `allreduce_each_gbps
VALUE` for one all-reduce waited for at a time (after a barrier), the median, with
`allreduce_each_ms MIN P50 MAX` of its wall time and `allreduce_each_device_ms MIN P50 MAX`
of the same between CUDA events on the program's stream."""

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
    step_times = []
    for step in range(int(os.environ.get("DDP_STEPS", "200"))):
        t = time.perf_counter()
        x = torch.randn(64, 512, generator=gen).to(dev)
        y = torch.randn(64, 512, generator=gen).to(dev)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if rank == 0 and step % 50 == 0:
            print(f"step_loss {step} {loss.item():.9g}", flush=True)
        torch.cuda.synchronize()
        if step >= 20:
            step_times.append(time.perf_counter() - t)
    if rank == 0 and step_times:
        print(f"step_ms {statistics.median(step_times) * 1e3:.4f}", flush=True)
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
    rounds = int(os.environ.get("DDP_ROUNDS", "20"))
    bus = 2 * (world - 1) / world * n * 4 / 1e9  # GB a rank moves per all-reduce
    in_a_row = []
    for _ in range(5):
        dist.barrier()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(rounds):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        in_a_row.append((time.perf_counter() - t) / rounds)
    each, device = [], []
    for _ in range(rounds):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        start.record()
        dist.all_reduce(buf)
        end.record()
        torch.cuda.synchronize()
        each.append(time.perf_counter() - t)
        device.append(start.elapsed_time(end) / 1e3)
    if rank == 0:
        print(f"allreduce_gbps {bus / statistics.median(in_a_row):.2f}", flush=True)
        print(f"allreduce_each_gbps {bus / statistics.median(each):.2f}", flush=True)
        for name, xs in (("allreduce_each_ms", each), ("allreduce_each_device_ms", device)):
            xs = sorted(x * 1e3 for x in xs)
            print(f"{name} {xs[0]:.3f} {statistics.median(xs):.3f} {xs[-1]:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
