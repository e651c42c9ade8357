"""PyTorch programs for the coverage matrix (scripts/gpu-coverage.sh) that the consolidated
PyTorch check (scripts/gpu-pytorch-consolidated.sh) does not run: each prints one JSON line,
{"ok": true, "values": [...]}.

    python3 torch_prog.py expandable    training whose batches change size, with
                                        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
                                        (the caching allocator maps memory itself)
    python3 torch_prog.py mallocasync   the same training with PYTORCH_CUDA_ALLOC_CONF=
                                        backend:cudaMallocAsync (CUDA's memory pools)
    python3 torch_prog.py ipc           a CUDA tensor passed to a spawned process through
                                        torch.multiprocessing (CUDA IPC), changed there in
                                        place, and seen changed here
    python3 torch_prog.py resnet        torchvision's resnet18 (weights=None, seeded) in eval
                                        mode on a fixed 4 x 3 x 224 x 224 batch, cuDNN
                                        deterministic and not benchmarking
    python3 torch_prog.py bert          transformers' BertModel of a small config made here
                                        (nothing downloaded), forward on fixed token ids
    python3 torch_prog.py compile       torch.compile (default mode) of an MLP's loss, 20
                                        steps forward and backward
    python3 torch_prog.py nccl          torch.distributed with NCCL in one process (world size
                                        1): all_reduce, broadcast and all_gather of a tensor
    python3 torch_prog.py graphs        an MLP's forward captured in a torch.cuda.CUDAGraph,
                                        replayed 10 times on new inputs copied in (and the
                                        time of a replay)
"""
import json
import os
import sys

TIMING = {}


def head(t, n=16):
    """The first n values of a tensor and the sum of all of it."""
    return [float(v) for v in t.flatten()[:n].tolist()] + [float(t.double().sum())]


def main(case):
    import torch

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    if case in ("expandable", "mallocasync"):
        want = {"expandable": "expandable_segments:True", "mallocasync": "backend:cudaMallocAsync"}
        if want[case] not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
            raise RuntimeError(f"set PYTORCH_CUDA_ALLOC_CONF={want[case]}")
        dev = torch.device("cuda")
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                    torch.nn.Linear(1024, 256)).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        losses = []
        for step in range(60):
            n = 64 * (1 + step % 7)  # batches of changing sizes grow and shrink the segments
            x = torch.randn(n, 256, device=dev)
            big = torch.empty((step % 5 + 1) * (8 << 20), dtype=torch.uint8, device=dev)
            loss = ((model(x) - x) ** 2).mean() + big[:1].float().sum() * 0
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
            del big
        torch.cuda.synchronize()
        return losses
    if case == "ipc":
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        t = torch.arange(1 << 20, dtype=torch.float32, device="cuda") / 7
        q_in, q_out = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=child, args=(q_in, q_out))
        p.start()
        q_in.put(t)
        seen = q_out.get(timeout=120)
        q_in.put(None)  # the child may go: it no longer holds the tensor
        p.join(timeout=120)
        torch.cuda.synchronize()
        return [seen, float(t.sum()), float(t[12345]), float(p.exitcode)]
    if case == "resnet":
        import torchvision

        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        model = torchvision.models.resnet18(weights=None).cuda().eval()
        x = torch.randn(4, 3, 224, 224).cuda()  # made on the CPU: the same numbers anywhere
        with torch.no_grad():
            y = model(x)
        torch.cuda.synchronize()
        return head(y)
    if case == "bert":
        from transformers import BertConfig, BertModel

        config = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=256)
        model = BertModel(config).cuda().eval()
        ids = torch.randint(0, config.vocab_size, (2, 64)).cuda()
        with torch.no_grad():
            h = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        torch.cuda.synchronize()
        return head(h)
    if case == "compile":
        dev = torch.device("cuda")
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                    torch.nn.Linear(256, 64)).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x = torch.randn(128, 64).to(dev)
        target = torch.sin(x)

        @torch.compile
        def loss_of(x, target):
            return ((model(x) - target) ** 2).mean()

        losses = []
        for _ in range(20):
            loss = loss_of(x, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        torch.cuda.synchronize()
        return losses
    if case == "nccl":
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        dist.init_process_group("nccl", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
        t = torch.arange(4096, dtype=torch.float32, device="cuda") / 7
        dist.all_reduce(t)
        dist.broadcast(t, 0)
        out = [torch.empty_like(t)]
        dist.all_gather(out, t)
        torch.cuda.synchronize()
        dist.destroy_process_group()
        return head(out[0])
    if case == "graphs":
        import time

        dev = torch.device("cuda")
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 256)).to(dev).eval()
        inputs = [torch.randn(64, 256) for _ in range(10)]
        static_in = torch.zeros(64, 256, device=dev)
        with torch.no_grad():
            side = torch.cuda.Stream()  # warm-up on a side stream, as capture wants
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    model(static_in)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = model(static_in)
        sums = []
        for x in inputs:
            static_in.copy_(x)
            graph.replay()
            sums.append(float(static_out.sum()))
        # Time per replay once warm (reported beside the values, not compared).
        times = []
        for _ in range(200):
            t = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        TIMING["ms"] = sorted(times)[len(times) // 2] * 1e3
        return sums
    raise SystemExit(f"unknown case {case}")


def child(q_in, q_out):
    """Takes the tensor, reports its sum, doubles it in place (the parent sees it)."""
    import torch

    t = q_in.get()
    s = float(t.sum())
    t.mul_(2)
    torch.cuda.synchronize()
    del t
    q_out.put(s)
    q_in.get()


if __name__ == "__main__":
    try:
        values = main(sys.argv[1])
        print(json.dumps({"ok": True, "values": values, **TIMING}))
    except Exception as e:
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}))
