"""The timed hardware challenge at hiring, as pure functions: the matrices, the product, its check, the deadline.

A provider that claims a GPU is asked to multiply A (rows x inner) by B (inner x cols), both defined by a
seed, on that GPU within a deadline: the claimed GPU's (conservative) speed plus an allowance for the bus
and the store. The coordinator checks the product it names with Freivalds' test, which costs about as
much as generating A and B once (no matrix product), so a check is far cheaper than the work.

The entries are small integers from a counter-based hash computed with torch integer ops, so every device
makes the same matrices (torch's own RNG differs between CPU and CUDA). All products and partial sums are
integers below 2**24 in magnitude, hence exact in float32 accumulation, and a GPU's fp16 tensor cores give
the exact answer when blocks of ``inner`` are small enough (see :func:`compute_product`).

What a passed challenge shows, and what it does not, is in docs/threat-model.md ("Hardware claims").
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np
import torch

M32 = 0xFFFFFFFF
M31 = 0x7FFFFFFF
# Multipliers below 2**31: a 32-bit value times one of them stays below 2**63, so int64 never overflows
# (overflow is where CPU and CUDA integer arithmetic could part ways).
_MIX1, _MIX2, _ELEMENT = 0x7FEB352D, 0x1B873593, 0x5BD1E995
_SALTS = {"a_rows": 0x1A, "a_inner": 0x2B, "b_inner": 0x3C, "b_cols": 0x4D}
MAX_ENTRY = 2  # entries are in {-2, -1, 0, 1}
EXACT_INNER = (1 << 24) // (MAX_ENTRY * MAX_ENTRY)  # |C| <= 4 * inner stays exact in float32
FP16_BLOCK = 2048 // (MAX_ENTRY * MAX_ENTRY)  # fp16 holds integers up to 2048 exactly: block sums stay there
CHUNK_ELEMENTS = 1 << 18  # elements of A or B generated at once: int64 temporaries of 2 MiB stay in cache
GPU_CHUNK_ELEMENTS = 1 << 24  # ... on a GPU, where launches cost more than memory (128 MiB temporaries)
PRODUCT_KEY = "product"  # the answer's safetensors entry: the int32 product
CHECK_BITS = 16  # Freivalds vectors are uniform in [0, 2**16): a wrong product passes a round w.p. <= 2**-16

# Conservative dense fp16/bf16 throughputs in FLOP/s, about half of each part's dense peak: a real GPU
# beats these, so an honest provider is never late because the table was optimistic.
GPU_FLOPS: Mapping[str, float] = {
    "H200": 400e12, "H100": 300e12, "A100": 120e12, "L40S": 150e12, "L40": 90e12, "RTX4090": 80e12,
    "RTX4080": 50e12, "A10": 50e12, "L4": 40e12, "V100": 40e12, "RTX3090": 35e12, "RTX3080": 30e12,
    "RTX3070": 20e12, "A6000": 40e12, "T4": 15e12,
}
UNKNOWN_GPU_FLOPS = 5e12  # a GPU the table does not know gets a slow (generous) figure


def _mix(x):  # type: ignore[no-untyped-def]
    """A 32-bit integer hash (lowbias32-style), on Python ints or int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _MIX1) & M32
    x = x ^ (x >> 15)
    x = (x * _MIX2) & M32
    return x ^ (x >> 16)


def _keys(seed: int, salt: str, start: int, stop: int, device: torch.device) -> torch.Tensor:
    """Per-index keys in [0, 2**31) for indices [start, stop): a hash of (seed, salt, index)."""
    first = _mix((seed & M32) ^ _SALTS[salt])
    second = _mix(((seed >> 32) & M32) ^ first)
    index = torch.arange(start, stop, dtype=torch.int64, device=device)
    return _mix(_mix(index ^ first) ^ second) & M31


def _entries(row_keys: torch.Tensor, col_keys: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Entry (i, j) = two bits of (row_key[i] ^ col_key[j]) * _ELEMENT, minus 2: a value in {-2, -1, 0, 1}."""
    h = row_keys.unsqueeze(1) ^ col_keys.unsqueeze(0)
    h.mul_(_ELEMENT).bitwise_right_shift_(40).bitwise_and_(3)  # bits 40-41 depend on every bit of the key
    return h.to(dtype).sub_(MAX_ENTRY)


@dataclass(frozen=True)
class _Challenge:
    seed: int
    rows: int
    inner: int
    cols: int
    device: torch.device

    @cached_property
    def row_keys(self) -> torch.Tensor:
        return _keys(self.seed, "a_rows", 0, self.rows, self.device)

    @cached_property
    def col_keys(self) -> torch.Tensor:
        return _keys(self.seed, "b_cols", 0, self.cols, self.device)

    def a_block(self, k0: int, k1: int, dtype: torch.dtype) -> torch.Tensor:  # A[:, k0:k1]
        return _entries(self.row_keys, _keys(self.seed, "a_inner", k0, k1, self.device), dtype)

    def b_block(self, k0: int, k1: int, dtype: torch.dtype) -> torch.Tensor:  # B[k0:k1, :]
        return _entries(_keys(self.seed, "b_inner", k0, k1, self.device), self.col_keys, dtype)

    def blocks(self, step: int) -> Iterator[tuple[int, int]]:
        for k0 in range(0, self.inner, step):
            yield k0, min(k0 + step, self.inner)


def _challenge(seed: int, rows: int, inner: int, cols: int, device: str | torch.device) -> _Challenge:
    if min(rows, inner, cols) < 1 or inner > EXACT_INNER or not 0 <= seed < 2**63:
        raise ValueError(f"no challenge of {rows} x {inner} x {cols} (inner at most {EXACT_INNER}) with seed {seed}")
    return _Challenge(seed, rows, inner, cols, torch.device(device))


def challenge_matrices(seed: int, rows: int, inner: int, cols: int, device: str | torch.device = "cpu",
                       dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """A (rows x inner) and B (inner x cols) of the challenge ``seed``: the same on every device."""
    c = _challenge(seed, rows, inner, cols, device)
    return c.a_block(0, inner, dtype), c.b_block(0, inner, dtype)


def compute_product(seed: int, rows: int, inner: int, cols: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """A @ B as int32 on the CPU, computed on ``device`` block by block (memory stays bounded).

    On CUDA the products are fp16 on the tensor cores, each over ``FP16_BLOCK`` of ``inner`` so that all of
    its sums are integers fp16 holds exactly; elsewhere float32. Either way the float32 total is exact."""
    c = _challenge(seed, rows, inner, cols, device)
    total = torch.zeros(rows, cols, dtype=torch.float32, device=c.device)
    if c.device.type == "cuda":
        _add_fp16_products(c, total)
    else:
        for k0, k1 in c.blocks(_step(rows, cols)):
            total.addmm_(c.a_block(k0, k1, torch.float32), c.b_block(k0, k1, torch.float32))
    return total.to(torch.int32).cpu()


def _add_fp16_products(c: _Challenge, total: torch.Tensor) -> None:
    """total += A @ B from fp16 products over ``FP16_BLOCK`` of ``inner`` each (A and B made a span at a time)."""
    span = max(1, GPU_CHUNK_ELEMENTS // max(c.rows, c.cols) // FP16_BLOCK) * FP16_BLOCK
    for k0, k1 in c.blocks(span):
        a, b = c.a_block(k0, k1, torch.float16), c.b_block(k0, k1, torch.float16)
        for s in range(0, k1 - k0, FP16_BLOCK):
            total += (a[:, s:s + FP16_BLOCK] @ b[s:s + FP16_BLOCK]).float()


def _step(rows: int, cols: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(rows, cols))


def product_ok(seed: int, rows: int, inner: int, cols: int, product: object, rounds: int = 2,
               rng: np.random.Generator | None = None) -> bool:
    """Freivalds: ``product`` is A @ B, checked as ``product @ R == A @ (B @ R)`` for a secret R (cols x rounds).

    R's entries are uniform in [0, 2**16) (``rng``, fresh OS entropy by default): a wrong product passes
    with probability at most 2**-16 per round. All arithmetic is float64 on integers below 2**53 (entries
    beyond the true bound are refused first), so it is exact. A and B are generated in chunks."""
    if not isinstance(product, torch.Tensor) or product.dtype not in (torch.int32, torch.int64) \
            or tuple(product.shape) != (rows, cols):
        return False
    c = _challenge(seed, rows, inner, cols, "cpu")
    bound = MAX_ENTRY * MAX_ENTRY * inner  # no true entry is larger; refusing the rest keeps the sums exact
    if int(product.min()) < -bound or int(product.max()) > bound:
        return False
    rng = rng if rng is not None else np.random.default_rng()
    r = torch.from_numpy(rng.integers(0, 1 << CHECK_BITS, size=(cols, rounds))).to(torch.float64)
    step = _step(rows, cols)
    br = torch.empty(inner, rounds, dtype=torch.float64)
    for k0, k1 in c.blocks(step):
        br[k0:k1] = c.b_block(k0, k1, torch.float64) @ r
    abr = torch.zeros(rows, rounds, dtype=torch.float64)
    for k0, k1 in c.blocks(step):
        abr += c.a_block(k0, k1, torch.float64) @ br[k0:k1]
    row_step = max(1, CHUNK_ELEMENTS // cols)
    return all(torch.equal(product[i:i + row_step].to(torch.float64) @ r, abr[i:i + row_step])
               for i in range(0, rows, row_step))


# -- the deadline ---------------------------------------------------------------------------------

def challenge_flops(rows: int, inner: int, cols: int) -> int:
    return 2 * rows * inner * cols


def gpu_flops(gpu_name: str, table: Mapping[str, float] = GPU_FLOPS) -> float:
    """The table's figure for ``gpu_name`` ('NVIDIA H100 80GB HBM3' -> H100's), or the slow default."""
    compact = re.sub(r"[^A-Z0-9]", "", gpu_name.upper())
    for key in sorted(table, key=len, reverse=True):  # L40S before L40, RTX4090 before A10 ...
        if key in compact:
            return table[key]
    return UNKNOWN_GPU_FLOPS


def expected_seconds(gpu_name: str, flops: float, table: Mapping[str, float] = GPU_FLOPS) -> float:
    """How long ``flops`` take at the claimed GPU's conservative speed."""
    return flops / gpu_flops(gpu_name, table)


def challenge_deadline(gpu_name: str, size: tuple[int, int, int], allowance_s: float,
                       table: Mapping[str, float] = GPU_FLOPS) -> float:
    """Seconds from the challenge to its answer: ``allowance_s`` (bus, store) plus the compute at claimed speed."""
    return allowance_s + expected_seconds(gpu_name, challenge_flops(*size), table)


# -- the verdict ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class HardwareVerdict:
    outcome: Literal["passed", "flagged"]
    reason: str | None = None

    @property
    def flagged(self) -> bool:
        return self.outcome == "flagged"


def hardware_verdict(deadline_s: float, answer_s: float | None, *, declined: str | None = None,
                     product_problem: str | None = None) -> HardwareVerdict:
    """Passed only for an answer in time whose product checked out.

    ``answer_s``: seconds from the challenge to the answer, None when none came; ``declined``: the
    provider's reason when it declined; ``product_problem``: what was wrong with the product it named."""
    if answer_s is None:
        return HardwareVerdict("flagged", "no answer to the hardware challenge")
    if declined is not None:
        return HardwareVerdict("flagged", f"declined the hardware challenge: {declined}"[:256])
    if answer_s > deadline_s:
        return HardwareVerdict("flagged", f"late: answered in {answer_s:.2f}s, deadline {deadline_s:.2f}s")
    if product_problem is not None:
        return HardwareVerdict("flagged", product_problem[:256])
    return HardwareVerdict("passed")
