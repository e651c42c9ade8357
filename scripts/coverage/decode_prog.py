"""A GPT-2-sized decoder (12 layers, width 768, 12 heads, vocabulary 50,257; seeded weights,
nothing downloaded) generating tokens greedily, one step per token over a fixed window of the
last 32 tokens, the way an LLM server's decode loop runs: each step is one CUDA graph. Prints
one JSON line, {"ok": true, "values": [tokens...], "ms": p50 step, "p99": p99 step, ...}.

    python3 decode_prog.py graph       the step captured once in a torch.cuda.CUDAGraph and
                                       replayed per token (what vLLM and SGLang do); also
                                       "capture_ms": capturing and instantiating the graph
    python3 decode_prog.py compiled    the step under torch.compile(mode="reduce-overhead")
                                       (Inductor with CUDA graph trees)
    python3 decode_prog.py eager       the step launched kernel by kernel (no graph)

STEPS (default 300) tokens are generated; the first 20 are not timed.
"""
import json
import os
import sys
import time

WINDOW, LAYERS, WIDTH, HEADS, VOCAB = 32, 12, 768, 12, 50257


def model(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
            self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
            self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(WIDTH, dim=2)
            q, k, v = (y.view(b, t, HEADS, WIDTH // HEADS).transpose(1, 2) for y in (q, k, v))
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, WIDTH))
            return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(WINDOW, WIDTH)
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.ln = nn.LayerNorm(WIDTH)

        def forward(self, window):
            x = self.tok(window) + self.pos.weight
            for b in self.blocks:
                x = b(x)
            # The next token: the most likely after the window's last.
            return (self.ln(x[:, -1]) @ self.tok.weight.t()).argmax(dim=-1)

    return Decoder()


def main(mode):
    import torch

    torch.manual_seed(0)
    steps = int(os.environ.get("STEPS", "300"))
    dev = torch.device("cuda")
    m = model(torch).to(dev).eval()
    window = torch.randint(0, VOCAB, (1, WINDOW), device=dev)
    out = {"ok": True}
    with torch.no_grad():
        if mode == "graph":
            static = window.clone()
            side = torch.cuda.Stream()  # warm-up on a side stream, as capture wants
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    m(static)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            t = time.perf_counter()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_next = m(static)
            torch.cuda.synchronize()
            out["capture_ms"] = (time.perf_counter() - t) * 1e3

            def step(w):
                static.copy_(w)
                graph.replay()
                return static_next
        elif mode == "compiled":
            step = torch.compile(m, mode="reduce-overhead")
        elif mode == "eager":
            step = m
        else:
            raise SystemExit(f"unknown mode {mode}")
        tokens, times = [], []
        for i in range(steps):
            t = time.perf_counter()
            nxt = step(window)
            token = int(nxt.item())  # waits for the step, as a server reading its token
            times.append(time.perf_counter() - t)
            tokens.append(token)
            window = torch.cat([window[:, 1:], nxt.view(1, 1)], dim=1)
        timed = sorted(times[20:])
        out["values"] = [float(v) for v in tokens]
        out["ms"] = timed[len(timed) // 2] * 1e3
        out["p99"] = timed[int(len(timed) * 0.99)] * 1e3
    return out


if __name__ == "__main__":
    try:
        print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "graph")))
    except Exception as e:  # one line a script can read, whatever went wrong
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}))
        sys.exit(1)
