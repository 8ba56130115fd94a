"""The built-in GPT as Hugging Face ``transformers``' ``GPT2LMHeadModel``: tensor names, layout and config.

Pure functions of a state dict and a :class:`~._gpt.GptConfig`; ``transformers`` itself is not needed to
write the files. The SDK's GPT is GPT-2's architecture, and every place it could differ has a config
switch that says what the SDK does instead of GPT-2's defaults:

- the MLP's GELU is ``F.gelu``, the exact erf form: ``activation_function="gelu"`` (GPT-2's own
  ``"gelu_new"`` is the tanh approximation, about 1e-3 away);
- LayerNorms use torch's default eps 1e-5: ``layer_norm_epsilon=1e-5``;
- attention is ``scaled_dot_product_attention``'s default 1/sqrt(head size), causal, no per-layer
  scaling: ``scale_attn_weights=True``, ``scale_attn_by_inverse_layer_idx=False``;
- learned positions over ``context`` places: ``n_positions=context``; every Linear has a bias, as GPT-2's;
- the head is the token embedding (tied): ``tie_word_embeddings=True`` and no ``lm_head.weight``
  stored, as ``save_pretrained`` writes a tied GPT-2.

GPT-2's projections are ``Conv1D`` modules, whose weight is ``[in, out]``: an ``nn.Linear`` weight transposed.
q, k and v sit in the same order in the fused projection in both, so ``qkv`` maps to ``c_attn`` as is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from aitbc_agent_sdk.tasks._gpt import GptConfig

LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which the SDK's GPT keeps

# SDK name -> (GPT-2 name, transposed): the model-wide tensors, then each block's (``{i}`` its index).
_TOP = {"token_embedding.weight": ("transformer.wte.weight", False),
        "position_embedding.weight": ("transformer.wpe.weight", False),
        "final_norm.weight": ("transformer.ln_f.weight", False),
        "final_norm.bias": ("transformer.ln_f.bias", False)}
_BLOCK = {"attn_norm.weight": ("ln_1.weight", False), "attn_norm.bias": ("ln_1.bias", False),
          "attn.qkv.weight": ("attn.c_attn.weight", True), "attn.qkv.bias": ("attn.c_attn.bias", False),
          "attn.proj.weight": ("attn.c_proj.weight", True), "attn.proj.bias": ("attn.c_proj.bias", False),
          "mlp_norm.weight": ("ln_2.weight", False), "mlp_norm.bias": ("ln_2.bias", False),
          "mlp.up.weight": ("mlp.c_fc.weight", True), "mlp.up.bias": ("mlp.c_fc.bias", False),
          "mlp.proj.weight": ("mlp.c_proj.weight", True), "mlp.proj.bias": ("mlp.c_proj.bias", False)}


def gpt2_names(layers: int) -> dict[str, tuple[str, bool]]:
    """Every tensor of an SDK GPT of ``layers`` blocks -> its GPT-2 name and whether it is transposed."""
    names = dict(_TOP)
    for i in range(layers):
        names.update({f"blocks.{i}.{ours}": (f"transformer.h.{i}.{theirs}", flip)
                      for ours, (theirs, flip) in _BLOCK.items()})
    return names


def gpt2_state_dict(state: Mapping[str, torch.Tensor], config: GptConfig) -> dict[str, torch.Tensor]:
    """``state`` (an SDK GPT's) under GPT-2's names and layout, contiguous for safetensors.

    ValueError when ``state`` is not exactly the tensors of a GPT of ``config``'s depth: a tensor left
    out would load as HF's random init without a word."""
    names = gpt2_names(config.layers)
    if set(state) != set(names):
        missing, extra = sorted(set(names) - set(state)), sorted(set(state) - set(names))
        raise ValueError(f"not the tensors of a {config.layers}-block GPT: missing {missing[:4]}, "
                         f"unexpected {extra[:4]}")
    return {theirs: (state[ours].t() if flip else state[ours]).contiguous()
            for ours, (theirs, flip) in names.items()}


def gpt2_config(config: GptConfig, *, eot: int, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """The ``config.json`` of a ``GPT2LMHeadModel`` that computes what an SDK GPT of ``config`` does
    (see the module's docstring for each switch); ``eot`` is the corpus's document separator."""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": config.vocab_size, "n_positions": config.context, "n_embd": config.width,
        "n_layer": config.layers, "n_head": config.heads, "n_inner": 4 * config.width,
        "activation_function": "gelu", "layer_norm_epsilon": LAYER_NORM_EPS,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "resid_pdrop": config.dropout, "embd_pdrop": config.dropout, "attn_pdrop": config.dropout,
        "tie_word_embeddings": True, "bos_token_id": eot, "eos_token_id": eot,
        "dtype": str(dtype).removeprefix("torch."), "use_cache": True,
    }


__all__ = ["LAYER_NORM_EPS", "gpt2_config", "gpt2_names", "gpt2_state_dict"]
