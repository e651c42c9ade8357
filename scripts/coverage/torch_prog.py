"""PyTorch programs for the coverage matrix (scripts/gpu-coverage.sh) that the consolidated
PyTorch check (scripts/gpu-pytorch-consolidated.sh) does not run: each prints one JSON line,
{"ok": true, "values": [...]}.

    python3 torch_prog.py expandable    training whose batches change size, with
                                        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
                                        (the caching allocator maps memory itself)
    python3 torch_prog.py ipc           a CUDA tensor passed to a spawned process through
                                        torch.multiprocessing (CUDA IPC), changed there in
                                        place, and seen changed here
"""
import json
import os
import sys


def main(case):
    import torch

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    if case == "expandable":
        if "expandable_segments:True" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
            raise RuntimeError("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
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
        print(json.dumps({"ok": True, "values": main(sys.argv[1])}))
    except Exception as e:
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}))
