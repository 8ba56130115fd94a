"""A small decoder-only transformer (GPT-2's shape) and sampling from it.

The built-in ``gpt`` task trains it on a token dataset. The layout follows GPT-2 and nanoGPT:
token and learned position embeddings, pre-norm blocks (LayerNorm, causal self-attention, a 4x
GELU MLP, each added back to the residual stream), a final LayerNorm and a language-model head
that is the token embedding's weight (tied, stored once). Attention goes through
:func:`torch.nn.functional.scaled_dot_product_attention` with ``is_causal=True``, so a GPU uses
its fused (flash) kernel. Initialisation is GPT-2's: N(0, 0.02) weights, zero biases, and the
projections that write into the residual stream scaled by ``1/sqrt(2 * layers)`` so the stream's
variance does not grow with depth.

    model = GPT(GptConfig(vocab_size=256, layers=4, heads=4, width=128, context=128))
    logits = model(tokens)                        # [batch, time] -> [batch, time, vocab]
    new = generate(model, [72, 105], 20, generator=torch.Generator().manual_seed(0))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

INIT_STD = 0.02  # GPT-2's weight scale
MAX_NEW_TOKENS = 100_000  # what one generate() call may produce


@dataclass(frozen=True)
class GptConfig:
    """A GPT's shape: vocabulary, depth, heads, width (``width % heads == 0``), context and dropout."""

    vocab_size: int
    layers: int = 4
    heads: int = 4
    width: int = 128
    context: int = 128
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.layers, self.heads, self.width, self.context) < 1:
            raise ValueError(f"every size of a GPT must be at least 1: {self}")
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not a multiple of heads {self.heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout {self.dropout} is outside [0, 1)")


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GptConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)  # writes into the residual stream
        self.proj_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # [B, T, W] -> [B, heads, T, W / heads]
        q, k, v = (t.view(batch, time, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(batch, time, width)
        return self.proj_dropout(self.proj(y))


class Mlp(nn.Module):
    def __init__(self, config: GptConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.width, 4 * config.width)
        self.proj = nn.Linear(4 * config.width, config.width)  # writes into the residual stream
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.up(x))))


class Block(nn.Module):
    """Pre-norm: each sub-layer reads a normalised copy of the stream and adds its output back."""

    def __init__(self, config: GptConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(config.width)
        self.attn = CausalSelfAttention(config)
        self.mlp_norm = nn.LayerNorm(config.width)
        self.mlp = Mlp(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """Tokens ``[batch, time]`` (``time <= config.context``) to next-token logits ``[batch, time, vocab]``."""

    def __init__(self, config: GptConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.width)
        self.position_embedding = nn.Embedding(config.context, config.width)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.final_norm = nn.LayerNorm(config.width)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        residual_std = INIT_STD / math.sqrt(2 * self.config.layers)
        for block in self.blocks:
            assert isinstance(block, Block)
            nn.init.normal_(block.attn.proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.proj.weight, mean=0.0, std=residual_std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [batch, time], got shape {tuple(tokens.shape)}")
        time = tokens.shape[1]
        if not 1 <= time <= self.config.context:
            raise ValueError(f"a sequence of {time} tokens does not fit the context of {self.config.context}")
        positions = torch.arange(time, device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        # The head is the token embedding itself (tied): one matrix reads and writes tokens, and the
        # state dict holds it once, so nothing travels twice and safetensors sees no shared storage.
        return F.linear(self.final_norm(x), self.token_embedding.weight)


@torch.no_grad()
def generate(model: GPT, prompt: list[int], max_new_tokens: int, *, temperature: float = 0.8,
             top_k: int | None = 40, generator: torch.Generator | None = None) -> list[int]:
    """``max_new_tokens`` tokens sampled after ``prompt`` (only the new ones are returned).

    The model sees at most its context: a longer prompt keeps its last tokens. ``temperature`` 0
    is greedy decoding; ``top_k`` samples among the k likeliest tokens (None: all of them). With a
    seeded ``generator`` (on the CPU) the same call returns the same tokens."""
    vocab = model.config.vocab_size
    if not prompt:
        raise ValueError("generate needs a prompt of at least one token")
    if any(not 0 <= t < vocab for t in prompt):
        raise ValueError(f"prompt tokens must lie in [0, {vocab})")
    if not 0 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"max_new_tokens must lie in [0, {MAX_NEW_TOKENS}], got {max_new_tokens}")
    if not (math.isfinite(temperature) and temperature >= 0.0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be at least 1 (or None), got {top_k}")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    tokens = list(prompt)
    try:
        for _ in range(max_new_tokens):
            window = torch.tensor([tokens[-model.config.context:]], dtype=torch.long, device=device)
            logits = model(window)[0, -1].float().cpu()
            tokens.append(_next_token(logits, temperature, top_k, generator))
    finally:
        model.train(was_training)
    return tokens[len(prompt):]


def _next_token(logits: torch.Tensor, temperature: float, top_k: int | None,
                generator: torch.Generator | None) -> int:
    if temperature == 0.0:
        return int(logits.argmax())
    logits = logits / temperature
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return int(torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator))
