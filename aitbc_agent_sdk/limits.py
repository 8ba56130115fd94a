"""Size limits on what strangers send, and the model-size estimate checked before a model is built.

Every record that crosses the bus is validated against these (see records/), so a
provider never allocates for a model, a string or a list larger than this, whoever
signed it. Pure arithmetic, no torch: the provider daemon checks a job before it
starts the training process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ID_MAX_LENGTH = 64  # ids name directories and MQTT topic levels; generated ones are 16-51 characters
TEXT_MAX_LENGTH = 1024  # reasons and errors are read by people; a longer one is padding or an attack
NAME_MAX_LENGTH = 256  # hardware and model names: NVML names are under 100 characters
CID_MAX_LENGTH = 128  # a CIDv1 of a sha2-256 block is 59 characters in base32
MAX_CLASSES = 10_000  # the classifier head is hidden x classes; a label of 1e9 once asked for 512 GB
MAX_VOCAB = 1 << 20  # a tokenizer's vocabulary: a task's own model (a job declares its size), not a head of classes
MAX_HIDDEN = 8192  # hidden width of the registry's small models
MAX_INPUT_RANK = 4  # features are [C, H, W] at most (plus the batch dimension)
MAX_FEATURES = 1 << 20  # features per sample: a 1024 x 1024 image
MAX_TOKENS = 1024  # the transformer's attention is tokens^2 per head and sample
# No bound on a model's size here: a job declares its own (models.footprint) and each provider
# checks it against its memory and disk. These only keep the declared integers sane.
MAX_DECLARED_PARAMETERS = 1 << 42  # 4.4e12: ten times the largest models trained anywhere
MAX_MODEL_BYTES = 1 << 45  # 32 TiB: MAX_DECLARED_PARAMETERS in float64
LEGACY_MAX_PARAMETERS = 25_000_000  # a job that declares no footprint (an older coordinator) is held to this
MAX_ACTIVATIONS = 8_000_000  # floats per sample in a forward pass: 32 MB, x batch size in training
MAX_SHARDS = 4096  # shards in a manifest: target workers (<= 1024) and elastic re-splits
MAX_RANGES = 4096  # sample ranges one elastic worker holds after rebalancing
MAX_WORKERS = 4096  # contributors and workers listed in one round or report
MAX_GPUS = 64  # GPUs in one offer: more than any single host has
MAX_ROUNDS = 10_000  # the training spec's own bound on rounds


@dataclass(frozen=True)
class ModelSize:
    parameters: int
    activations: int  # floats per sample in one forward pass (an estimate)
    tokens: int  # sequence length of a transformer; 0 for the others


def _square_side(features: int) -> int | None:
    side = math.isqrt(features)
    return side if side * side == features and side >= 4 else None


def model_size(name: str, input_shape: tuple[int, ...], num_classes: int, hidden: int) -> ModelSize:
    """What training/networks.py builds for this spec; unknown names are sized as the MLP.

    Parameter counts are exact (tests compare them with the built models); activations are
    an upper estimate of the floats a forward pass keeps per sample.
    """
    f, h, c = math.prod(input_shape), hidden, num_classes
    head = h * c + c
    if name == "cnn":
        side = _square_side(f) or math.isqrt(f)
        ch = max(h // 8, 4)
        pooled = 2 * ch * (side // 2) ** 2
        params = (9 * ch + ch) + (9 * ch * 2 * ch + 2 * ch) + (pooled * h + h) + head
        return ModelSize(params, f + 6 * ch * f + pooled + 2 * h + c, 0)
    if name == "transformer":
        side = _square_side(f)
        tokens, token_dim = (side, side) if side else (f, 1)
        d = 32 if h < 64 else 64
        layer = 4 * d * d + 9 * d + 2 * d * h + h
        params = token_dim * d + d + tokens * d + 2 * layer + 2 * d + d * c + c
        per_layer = 8 * tokens * d + 4 * tokens * tokens + 2 * tokens * h
        return ModelSize(params, f + 2 * per_layer + c, tokens)
    return ModelSize(f * h + h + head, 2 * f + 2 * h + c, 0)


def model_size_problem(name: str, input_shape: tuple[int, ...], num_classes: int, hidden: int) -> str | None:
    """Why a model of this spec is too large to build, or None."""
    size = model_size(name, input_shape, num_classes, hidden)
    what = f"model {name!r} with input {input_shape}, hidden {hidden} and {num_classes} classes"
    if size.tokens > MAX_TOKENS:
        return f"{what} would attend over {size.tokens} tokens, above the limit of {MAX_TOKENS}"
    if size.parameters > MAX_DECLARED_PARAMETERS:
        return f"{what} would have {size.parameters:,} parameters, above the limit of {MAX_DECLARED_PARAMETERS:,}"
    if size.activations > MAX_ACTIVATIONS:
        return (f"{what} would keep about {size.activations:,} activations per sample, "
                f"above the limit of {MAX_ACTIVATIONS:,}")
    return None
