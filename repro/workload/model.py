"""A small GPT-like model and its deterministic synthetic data.

Small on purpose: a 4-rank CPU run of 10 steps should take seconds. Every weight is a plain
Linear/Embedding/LayerNorm parameter so ZeRO-3 and MiCS partition all of them (the config sets
the persistence threshold to 0). Attention is written out rather than using a fused kernel, so
the same code runs in fp32/bf16/fp16 on every torch release the lab covers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class ModelShape:
    vocab: int = 512
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    seq_len: int = 32

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if min(self.vocab, self.hidden, self.layers, self.heads, self.seq_len) < 1:
            raise ValueError(f"every model dimension must be positive: {self}")


class CausalSelfAttention(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.heads = shape.heads
        self.qkv = nn.Linear(shape.hidden, 3 * shape.hidden)
        self.proj = nn.Linear(shape.hidden, shape.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(x).split(hidden, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, torch.finfo(scores.dtype).min)
        out = scores.float().softmax(dim=-1).to(v.dtype) @ v
        return self.proj(out.transpose(1, 2).reshape(batch, seq, hidden))


class Block(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(shape.hidden)
        self.attn = CausalSelfAttention(shape)
        self.ln2 = nn.LayerNorm(shape.hidden)
        self.fc = nn.Linear(shape.hidden, 4 * shape.hidden)
        self.out = nn.Linear(4 * shape.hidden, shape.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """forward(tokens[batch, seq_len + 1]) -> mean next-token cross-entropy (fp32 scalar).

    Computes in the weights' dtype. fp16 on a CPU torch without Half kernels (torch 2.1) runs
    through the CPU twin's Half kernels adapter (repro/workload/cpu/half_kernels.py), like any job.
    """

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.shape = shape
        self.tok = nn.Embedding(shape.vocab, shape.hidden)
        self.pos = nn.Embedding(shape.seq_len, shape.hidden)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(shape.hidden)
        self.head = nn.Linear(shape.hidden, shape.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        positions = torch.arange(inputs.shape[1], device=tokens.device)
        x = self.tok(inputs) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def synthetic_batch(shape: ModelShape, seed: int, step: int, global_rows: int) -> torch.Tensor:
    """The global batch of one step: [global_rows, seq_len + 1] int64, on CPU.

    Depends only on (shape, seed, step, global_rows), so every scenario and every rank sees the
    same global batch; a rank takes its rows with `rank_rows`. Sequences follow a fixed affine
    rule with 10% noise, so the loss falls steadily when training works.
    """
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    length = shape.seq_len + 1
    tokens = torch.empty(global_rows, length, dtype=torch.int64)
    tokens[:, 0] = torch.randint(shape.vocab, (global_rows,), generator=gen)
    noise = torch.randint(shape.vocab, (global_rows, length), generator=gen)
    noisy = torch.rand(global_rows, length, generator=gen) < 0.1
    for t in range(1, length):
        follow = (tokens[:, t - 1] * 5 + 3) % shape.vocab
        tokens[:, t] = torch.where(noisy[:, t], noise[:, t], follow)
    return tokens


def rank_rows(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    if batch.shape[0] % world_size:
        raise ValueError(f"global batch of {batch.shape[0]} rows does not split over {world_size} ranks")
    per_rank = batch.shape[0] // world_size
    return batch[rank * per_rank : (rank + 1) * per_rank]
