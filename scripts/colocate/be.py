"""The best-effort side of scripts/gpu-pytorch-colocate.sh: a training loop.

--model mlp: 6 x (Linear 2048 + GELU) at batch --batch (512 by default), MSE loss, SGD.
--model transformer: token embedding, 4 encoder layers (d 512, 8 heads, FFN 2048, GELU),
a vocabulary head; sequence 256, batch --batch (16 by default), cross-entropy, AdamW, bf16
autocast on the GPU.

An iteration is zero_grad, forward, loss, backward, optimizer step and loss.item() (which
synchronizes). With --graph (mlp only) the iteration but its loss.item() is captured once in
a CUDA graph and replayed: each iteration is then one graph launch. The window's rate is the iterations finished inside it divided by the time
from the window's start to the last of them; the program goes on training --grace seconds
past the window so that the high-priority program's last requests still have company.
"""
import argparse
import itertools
import time

import torch
import torch.nn.functional as F

from common import CPU, DEVICE, add_common_args, wait_for_go, write_result

VOCAB = 1024


class Transformer(torch.nn.Module):
    def __init__(self, d, heads, layers):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, d)
        layer = torch.nn.TransformerEncoderLayer(d_model=d, nhead=heads, dim_feedforward=4 * d,
                                                 activation="gelu", batch_first=True,
                                                 norm_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, num_layers=layers,
                                               enable_nested_tensor=False)
        self.head = torch.nn.Linear(d, VOCAB)

    def forward(self, idx):
        return self.head(self.enc(self.emb(idx)))


def graphed(step_body):
    """The iteration captured in a CUDA graph (after warm-up on a side stream, as capture
    wants): a replay and its loss.item()."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step_body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step_body()

    def step():
        graph.replay()
        return static_loss.item()

    return step


def build(model, batch, graph=False, width=0):
    torch.manual_seed(0)
    if model == "mlp":
        width = width or (256 if CPU else 2048)
        mods = []
        for _ in range(6):
            mods += [torch.nn.Linear(width, width), torch.nn.GELU()]
        net = torch.nn.Sequential(*mods).to(DEVICE)
        opt = torch.optim.SGD(net.parameters(), lr=1e-4)
        x = torch.randn(batch, width, device=DEVICE)
        target = torch.randn(batch, width, device=DEVICE)

        def loss_fn():
            return F.mse_loss(net(x), target)
    else:
        d, heads, layers, seq = (128, 4, 2, 64) if CPU else (512, 8, 4, 256)
        net = Transformer(d, heads, layers).to(DEVICE)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(0)
        idx = torch.randint(0, VOCAB, (batch, seq), generator=gen).to(DEVICE)
        tgt = torch.randint(0, VOCAB, (batch, seq), generator=gen).to(DEVICE)

        def loss_fn():
            with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=not CPU):
                logits = net(idx)
            return F.cross_entropy(logits.float().view(-1, VOCAB), tgt.reshape(-1))

    def body():
        opt.zero_grad(set_to_none=not graph)
        loss = loss_fn()
        loss.backward()
        opt.step()
        return loss

    if graph:
        return graphed(body)

    def step():
        return body().item()  # synchronizes: one honest iteration

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "transformer"], required=True)
    ap.add_argument("--batch", type=int, default=0, help="default 512 for mlp, 16 for transformer")
    ap.add_argument("--warmup-iters", type=int, default=5)
    ap.add_argument("--warmup-s", type=float, default=1.0, help="and at least this long")
    ap.add_argument("--grace", type=float, default=0.3)
    ap.add_argument("--graph", action="store_true", help="each iteration one CUDA graph (mlp)")
    add_common_args(ap)
    args = ap.parse_args()
    batch = args.batch or (512 if args.model == "mlp" else 16)
    step = build(args.model, batch, args.graph and args.model == "mlp" and not CPU)
    warm_until = time.time() + args.warmup_s
    for i in itertools.count():
        if i >= args.warmup_iters and time.time() >= warm_until:
            break
        step()

    start = wait_for_go(args)
    end = start + args.seconds
    done, last, loss = 0, None, None
    while True:
        loss = step()
        now = time.time()
        if now <= end:
            done, last = done + 1, now
        if now >= end + args.grace:
            break
    elapsed = (last - start) if last else None
    write_result(args, {
        "role": "be", "model": args.model, "batch": batch, "window_s": args.seconds,
        "graph": args.graph,
        "iterations": done, "it_per_s": done / elapsed if elapsed else 0.0,
        "loss": loss, "finite": loss == loss,
    })


if __name__ == "__main__":
    main()
