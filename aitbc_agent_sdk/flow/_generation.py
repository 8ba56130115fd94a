"""Sample or export a home's training without starting an agent: the record from its database, the model from
its store.

Reading a model needs neither the chain nor the bus nor a wallet, so ``sample`` opens only the
content store the training was stored in: the embedded stack's ``$AITBC_HOME/store`` when it holds
the training's model (``run``), else the devnet profile's (a Kubo daemon or a local directory) when
the home has one (the step-by-step flow).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from ..profile import profile_path
from ._steps import db_path, load_training

if TYPE_CHECKING:
    from ..records import ExportResult, SampleResult, TrainingRecord
    from ..storage import ContentStore


async def home_store(home: Path, record: TrainingRecord, exits: AsyncExitStack) -> ContentStore:
    """The content store this home keeps ``record``'s model in (closed with ``exits``)."""
    from ..config import AgentConfig
    from ..profile import load_profile
    from .._stack import open_store
    from ..storage import LocalContentStore

    local = LocalContentStore(home / "store")
    embedded = record.model_cid is not None and await local.has(record.model_cid)
    if embedded or not profile_path(home).is_file():
        return local
    return await open_store(load_profile(home), AgentConfig(name="aitbc-cli", home=home), exits)


async def sample_training(home: Path, training_id: str, prompt: str, *, tokens: int = 200,
                          temperature: float = 0.8, top_k: int | None = 40, seed: int = 0) -> SampleResult:
    """Text from the training's current model (see :meth:`Agent.sample_text`); the request is checked first."""
    from ..coordinator.data._datasets import DatasetStore
    from ..coordinator.data._generation import SampleRequest, sample_text
    from ..coordinator.data._tasks import TaskCache

    request = SampleRequest(prompt, tokens, temperature, top_k, seed)
    request.check()  # a bad option costs no store connection
    record = await load_training(home, training_id)  # an unknown id: NotFoundError
    async with AsyncExitStack() as exits:
        store = await home_store(home, record, exits)
        # Where an agent of this home keeps its imported tasks and dataset parts.
        return await sample_text(store, DatasetStore(store, home / "datasets"), TaskCache(store, home / "tasks"),
                                 record, request)


async def export_training(home: Path, training_id: str, out: Path, *, round_: int | None = None,
                          format_: str = "safetensors") -> ExportResult:
    """The training's model after ``round_`` (None: the last) written into ``out`` (see :meth:`Agent.export_model`)."""
    from ..coordinator._training_db import TrainingDatabase
    from ..coordinator.data._datasets import DatasetStore
    from ..coordinator.data._export import export_model
    from ..coordinator.data._tasks import TaskCache

    record = await load_training(home, training_id)  # an unknown id: NotFoundError
    async with TrainingDatabase(db_path(home)) as db:
        rounds = await db.rounds(training_id)
    async with AsyncExitStack() as exits:
        store = await home_store(home, record, exits)
        return await export_model(store, DatasetStore(store, home / "datasets"), TaskCache(store, home / "tasks"),
                                  record, rounds, out, round_=round_, format_=format_)


__all__ = ["export_training", "home_store", "sample_training"]
