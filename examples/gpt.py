"""A small GPT, its character-level corpus, and the shardings a user writes for it.

Used by ``examples/train_gpt.py`` and its tests. Everything here is plain PyTorch: the
model runs unchanged on CPU and on the spmd device. Example::

    corpus = make_corpus(20_000, seed=0)
    tok = CharTokenizer(corpus)
    model = GPT(GPTConfig(vocab=tok.vocab_size, seq=64))
    logits = model(torch.zeros(2, 64, dtype=torch.long))   # (2, 64, vocab)
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# --- data ------------------------------------------------------------------------------

# A tiny English-like grammar: enough structure that a small model's loss keeps falling
# for a few hundred steps, generated on the spot (nothing to download or ship).
_GRAMMAR = {
    "S": [["NP", "VP", "."], ["NP", "VP", "PP", "."], ["PP", ",", "NP", "VP", "."]],
    "NP": [["DET", "N"], ["DET", "ADJ", "N"], ["NAME"]],
    "VP": [["V", "NP"], ["V"], ["ADV", "V", "NP"]],
    "PP": [["P", "DET", "N"], ["P", "DET", "ADJ", "N"]],
    "DET": [["the"], ["a"], ["every"], ["my"], ["her"], ["that"]],
    "ADJ": [["old"], ["small"], ["quiet"], ["bright"], ["green"], ["lazy"], ["brave"]],
    "N": [["cat"], ["dog"], ["river"], ["garden"], ["king"], ["bird"], ["lamp"],
          ["sailor"], ["house"], ["window"], ["teacher"], ["horse"]],
    "NAME": [["alice"], ["bob"], ["mara"], ["oskar"], ["june"]],
    "V": [["sees"], ["finds"], ["follows"], ["paints"], ["likes"], ["sings"],
          ["carries"], ["watches"], ["sleeps"]],
    "ADV": [["often"], ["never"], ["slowly"], ["gladly"]],
    "P": [["near"], ["under"], ["behind"], ["inside"], ["across"]],
}


def _expand(symbol: str, rng: random.Random) -> list[str]:
    if symbol not in _GRAMMAR:
        return [symbol]
    return [w for part in rng.choice(_GRAMMAR[symbol]) for w in _expand(part, rng)]


def _sentence(rng: random.Random) -> str:
    words = _expand("S", rng)
    text = " ".join(words).replace(" .", ".").replace(" ,", ",")
    return text[0].upper() + text[1:]


def make_corpus(n_chars: int, seed: int = 0) -> str:
    """At least ``n_chars`` characters of sentences from a tiny grammar (deterministic).

    Example::

        >>> make_corpus(40, seed=1)[:3].isprintable()
        True
    """
    rng = random.Random(seed)
    lines, size = [], 0
    while size < n_chars:
        line = " ".join(_sentence(rng) for _ in range(rng.randint(1, 4)))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


class CharTokenizer:
    """Characters <-> ids; the vocabulary is padded to a multiple of 8 (sharding-friendly).

    Example::

        >>> tok = CharTokenizer("abca")
        >>> tok.decode(tok.encode("cab"))
        'cab'
    """

    def __init__(self, text: str, multiple: int = 8):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = math.ceil(len(self.chars) / multiple) * multiple

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(self.chars[i] for i in ids.tolist())


class TokenBatches:
    """Next-token batches of random windows of ``tokens``: batch ``i`` depends only on ``i``.

    Each step's windows come from a generator seeded with ``(seed, step)``, so a run
    resumed at step ``k`` (``start=k``) sees exactly the batches the uninterrupted run saw.
    Yields ``(input, target)`` int64 tensors of shape ``(batch, seq)``.

    Example::

        >>> x, y = next(iter(TokenBatches(torch.arange(100), batch=2, seq=8, steps=1)))
        >>> bool((x[:, 1:] == y[:, :-1]).all())
        True
    """

    def __init__(self, tokens: torch.Tensor, batch: int, seq: int, steps: int,
                 seed: int = 0, start: int = 0):
        self.tokens, self.batch, self.seq = tokens, batch, seq
        self.steps, self.seed, self.start = steps, seed, start

    def __len__(self) -> int:
        return self.steps - self.start

    def batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.tokens) - self.seq - 1, (self.batch,), generator=gen)
        windows = torch.stack([self.tokens[s:s + self.seq + 1] for s in starts.tolist()])
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def __iter__(self):
        return (self.batch_at(step) for step in range(self.start, self.steps))


# --- model -----------------------------------------------------------------------------

@dataclass
class GPTConfig:
    """Sizes of a ``GPT``. ``tied``: the output head shares the token embedding."""

    vocab: int
    seq: int
    dim: int = 128
    layers: int = 4
    heads: int = 4
    tied: bool = True


class Attention(nn.Module):
    """Causal self-attention through ``F.scaled_dot_product_attention``.

    ``qkv``'s output features are laid out head by head (``[q_h, k_h, v_h]`` for each
    head ``h``), as in Megatron-LM: splitting them column-wise over a tensor-parallel
    axis then gives every device whole heads, and attention needs no communication.
    """

    def __init__(self, dim: int, heads: int):
        super().__init__()
        assert dim % heads == 0, f"dim {dim} must be a multiple of heads {heads}"
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        hd = d // self.heads
        qkv = self.qkv(x).view(b, t, self.heads, 3 * hd).transpose(1, 2)
        q, k, v = qkv.split(hd, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.ln2, self.mlp = nn.LayerNorm(dim), MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + position embedding, ``layers`` pre-LN blocks, final LayerNorm, LM head.

    Example::

        >>> m = GPT(GPTConfig(vocab=16, seq=8, dim=32, layers=1, heads=2))
        >>> m(torch.zeros(1, 8, dtype=torch.long)).shape
        torch.Size([1, 8, 16])
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.tok, self.pos = nn.Embedding(config.vocab, config.dim), nn.Embedding(config.seq, config.dim)
        self.blocks = nn.ModuleList(Block(config.dim, config.heads) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.dim)
        self.head = nn.Linear(config.dim, config.vocab, bias=False)
        self.apply(self._init)
        self.tie_weights()
        for name, p in self.named_parameters():
            if name.endswith(("proj.weight", "down.weight")):
                # GPT-2: residual branches scaled so the stream's variance does not grow.
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.layers))

    def tie_weights(self) -> None:
        """Share the token embedding with the output head (if ``config.tied``).

        Call again after ``model.to(device)``: ``Module.to`` moves each submodule's
        parameters on their own, so on a new device type a shared weight becomes two.
        """
        if self.config.tied:
            self.head.weight = self.tok.weight

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# --- shardings -------------------------------------------------------------------------

STRATEGIES = ("dp", "fsdp", "tp", "fsdp+tp")
AXES = ("data", "model")  # mesh axis names: the batch axis and the tensor-parallel axis

# Megatron-LM: the first matmul of a pair splits its output features (column parallel),
# the second its input features (row parallel), so the pair needs one all-reduce.
_COLUMN = ("attn.qkv", "mlp.up")
_ROW = ("attn.proj", "mlp.down")


def _tp_spec(name: str, p: torch.Tensor) -> list:
    """Megatron split of parameter ``name`` over ``'model'`` (nn.Linear weight is out x in)."""
    spec: list = [None] * p.dim()
    if name.rsplit(".", 1)[0].endswith(_COLUMN):
        spec[0] = "model"  # weight rows = output features; the bias follows them
    elif name.endswith(tuple(f"{r}.weight" for r in _ROW)):
        spec[1] = "model"  # weight columns = input features; the bias stays replicated
    return spec


def _fsdp_spec(spec: list, p: torch.Tensor, axis) -> list:
    """Split the largest dim that is still unsplit over ``axis`` (FSDPv2 picks the largest)."""
    free = [d for d in range(p.dim()) if spec[d] is None]
    if free:
        largest = max(free, key=lambda d: (p.shape[d], -d))
        spec[largest] = axis
    return spec


def param_spec(name: str, p: torch.Tensor, strategy: str) -> tuple:
    """The partition spec of parameter ``name`` under ``strategy`` on a ``('data','model')`` mesh.

    - ``dp``: replicated; ``tp``: Megatron column/row splits over ``'model'``;
    - ``fsdp``: the largest dim over every device (``('data', 'model')``);
    - ``fsdp+tp``: Megatron over ``'model'``, then the largest free dim over ``'data'``.

    Example::

        >>> w = torch.empty(384, 128)
        >>> param_spec("blocks.0.attn.qkv.weight", w, "fsdp+tp")
        ('model', 'data')
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {STRATEGIES}")
    spec: list = [None] * p.dim()
    if "tp" in strategy:
        spec = _tp_spec(name, p)
    if strategy == "fsdp":
        spec = _fsdp_spec(spec, p, AXES)
    elif strategy == "fsdp+tp":
        spec = _fsdp_spec(spec, p, "data")
    return tuple(spec)


def batch_spec(strategy: str) -> tuple:
    """The batch's partition spec: over every device unless ``'model'`` holds TP shards.

    Example::

        >>> batch_spec("tp"), batch_spec("dp")
        (('data', None), (('data', 'model'), None))
    """
    return ("data", None) if "tp" in strategy else (AXES, None)
