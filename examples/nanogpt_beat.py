"""A nanoGPT-style training script (a tiny GPT on characters, DDP), as a user brings it, with
the two lines that give it slurmgen's heartbeats, timeline, curves and goodput (marked
`slurmgen:`). It knows nothing else of slurmgen: the launcher's torchrun environment (RANK,
WORLD_SIZE, MASTER_ADDR, ...) is all it reads, as nanoGPT's train.py does. CPU patches as in
nanoGPT's own CPU mode: device cpu, backend gloo, a model a few thousand parameters small.

    python examples/nanogpt_beat.py [max_iters]
"""

import gc
import math
import os
import sys

import torch
import torch.nn as nn
from torch.nn import functional as F  # noqa: N812  (nanoGPT's spelling)

from slurmgen import beat  # slurmgen: line 1 of 2

TEXT = "the quick brown fox jumps over the lazy dog. " * 40
BLOCK, EMBED, HEADS, BATCH = 16, 32, 2, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(EMBED), nn.LayerNorm(EMBED)
        self.attn = nn.MultiheadAttention(EMBED, HEADS, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(EMBED, 4 * EMBED), nn.GELU(), nn.Linear(4 * EMBED, EMBED))
        self.register_buffer("mask", torch.triu(torch.ones(BLOCK, BLOCK, dtype=torch.bool), 1))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[: x.size(1), : x.size(1)], need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, EMBED), nn.Embedding(BLOCK, EMBED)
        self.block, self.ln, self.head = Block(), nn.LayerNorm(EMBED), nn.Linear(EMBED, vocab)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        logits = self.head(self.ln(self.block(x)))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main(max_iters):
    ddp = int(os.environ.get("RANK", -1)) != -1
    if ddp:
        torch.distributed.init_process_group(backend="gloo")
        rank = torch.distributed.get_rank()
    else:
        rank = 0
    torch.manual_seed(1337 + rank)
    chars = sorted(set(TEXT))
    data = torch.tensor([chars.index(c) for c in TEXT])
    model = GPT(len(chars))
    if ddp:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for it in range(1, max_iters + 1):
        ix = torch.randint(len(data) - BLOCK - 1, (BATCH,))
        x = torch.stack([data[i : i + BLOCK] for i in ix])
        y = torch.stack([data[i + 1 : i + BLOCK + 1] for i in ix])
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        beat(step=it, loss=loss.item())  # slurmgen: line 2 of 2
        if rank == 0 and (it % 20 == 0 or it == max_iters):
            print(f"iter {it}: loss {loss.item():.4f} (ppl {math.exp(loss.item()):.1f})", flush=True)
    if ddp:
        # DDP holds the process group (in reference cycles): free it first, or the group outlives
        # destroy_process_group and gloo (torch 2.13, CPU) aborts about 1 exit in 5 ("terminate
        # called without an active exception") while the interpreter shuts down.
        del model, opt, loss
        gc.collect()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 60)
