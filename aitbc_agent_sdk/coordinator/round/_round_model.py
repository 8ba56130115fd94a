"""A round's new global model: the verified results aggregated, then the outer optimizer's step.

Results arrive as the job asked (the trained weights, or their change from the round's model in
float32, bf16 or int8); :func:`decoded` rebuilds the worker's weights from the round's model, so
verification and every robust aggregation strategy see the same thing whatever the encoding (a
coordinate-wise rule on weights equals the rule on their changes, shifted by the round's model).

Under DiLoCo the aggregate's change is a pseudo-gradient for Nesterov SGD, whose momentum is stored
in the content store after each round and named in the training record, so a resumed coordinator
carries on with it. When workers upload changes, the new model goes out as a change too, in the
same encoding: the new model is *defined* as the old one plus that decoded change (what encoding
lost is carried to the next round, as on the workers), so a provider that holds the old model
rebuilds exactly the new model's bytes and checks them against its CID.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from ...records import TrainingRecord, UpdateEncoding
from ...storage import ContentStore
from ...aggregate._aggregation import AggregationStrategy
from ...wire._checkpoint import decode_state, encode_state
from ...aggregate._outer import outer_for
from ...wire._update_codec import decode_residual, decode_update, encode_residual, encode_update

State = dict[str, torch.Tensor]
MAX_STATE_SLACK = 1 << 20  # a float32 copy of the model (momentum, residual) plus its header


def decoded(encoding: UpdateEncoding, reference: Mapping[str, torch.Tensor]) -> Callable[[bytes], State]:
    """The decoder of one round's results: bytes from a stranger to the weights they stand for. Whole
    weights decode as they always did (the verification names what does not fit the model)."""
    if encoding == "weights":
        return decode_state
    return lambda blob: decode_update(blob, reference, encoding)


@dataclass(frozen=True)
class NewModel:
    model_cid: str
    outer_state_cid: str | None  # the outer optimizer's state after this round (None: it keeps none)
    delta_cid: str | None = None  # the new model as an encoded change from the round's model
    residual_cid: str | None = None  # what that encoding lost, for the next round's change

    def record_update(self, base_cid: str | None) -> dict[str, str | None]:
        """The training record's fields that move with the model."""
        return {"model_cid": self.model_cid, "outer_state_cid": self.outer_state_cid,
                "model_base_cid": base_cid if self.delta_cid else None, "model_delta_cid": self.delta_cid,
                "broadcast_residual_cid": self.residual_cid}


async def outer_step(store: ContentStore, record: TrainingRecord, reference: Mapping[str, torch.Tensor],
                     strategy: AggregationStrategy) -> NewModel:
    """Apply the training's outer optimizer to the aggregate; store the new model, its change and the state."""
    spec = record.spec
    limit = 4 * sum(t.numel() for t in reference.values()) + MAX_STATE_SLACK
    outer = outer_for(spec.outer, spec.outer_lr, spec.outer_momentum)
    if record.outer_state_cid is not None:
        outer.load_state(await store.cat(record.outer_state_cid, max_bytes=limit), reference)
    encoding = spec.upload_encoding
    kept = None
    if encoding != "weights" and record.broadcast_residual_cid is not None:
        kept = decode_residual(await store.cat(record.broadcast_residual_cid, max_bytes=limit), reference)

    def step() -> tuple[bytes, bytes | None, bytes | None, bytes | None]:
        model = outer.step(dict(reference), strategy.result())
        if encoding == "weights":
            return encode_state(model), outer.state_bytes(), None, None
        delta, left = encode_update(model, reference, encoding, residual=kept)
        model = decode_update(delta, reference, encoding)  # exactly what a worker rebuilds from the delta
        return encode_state(model), outer.state_bytes(), delta, None if left is None else encode_residual(left)

    model_bytes, state_bytes, delta_bytes, residual_bytes = await asyncio.to_thread(step)
    return NewModel(await store.add(model_bytes), await _stored(store, state_bytes),
                    await _stored(store, delta_bytes), await _stored(store, residual_bytes))


async def _stored(store: ContentStore, blob: bytes | None) -> str | None:
    return await store.add(blob) if blob is not None else None
