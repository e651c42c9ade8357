"""The models the consolidated-clients checks run (scripts/gpu-pytorch-consolidated.sh)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp(width=1024, layers=4, classes=10):
    mods, d = [], 512
    for _ in range(layers):
        mods += [nn.Linear(d, width), nn.GELU()]
        d = width
    mods.append(nn.Linear(d, classes))
    return nn.Sequential(*mods)


class Block(nn.Module):
    """Pre-norm transformer block: attention written out (deterministic backward), then MLP."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.reshape(shape).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        mask = torch.ones(t, t, device=x.device, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, vocab=1024, d=256, heads=4, layers=2, seq=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def tokens(batch, seq, vocab, gen):
    """Synthetic next-token data with structure to learn: runs of a repeated stride."""
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    stride = torch.randint(1, 7, (batch, 1), generator=gen)
    idx = (start + stride * torch.arange(seq + 1)) % vocab
    return idx[:, :-1], idx[:, 1:]
