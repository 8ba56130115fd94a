"""A provider's pins per training: what it added stays pinned while the training is open, and goes with it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from aitbc_agent_sdk.errors import StoreUnreachableError
from aitbc_agent_sdk.provider._pins import TrainingPins
from aitbc_agent_sdk.provider._owners import TrainingOwner
from aitbc_agent_sdk.storage._local import LocalContentStore

COORDINATOR = "0x" + "ab" * 20


async def test_a_closed_trainings_pins_go_and_a_cid_another_open_training_pinned_stays(tmp_path: Path) -> None:
    store = LocalContentStore(tmp_path / "store")
    pins = TrainingPins(store)
    first, second = TrainingOwner(COORDINATOR, "training-1"), TrainingOwner(COORDINATOR, "training-2")
    own = await pins.add(first, b"a result of training 1 only")
    shared = await pins.add(first, b"the same bytes in both")
    assert await pins.add(second, b"the same bytes in both") == shared
    assert pins.owners() == {first, second} and pins.pinned(first) == {own, shared}

    await pins.forget_training(first)
    assert set(await store.pins()) == {shared}  # training 2 is open and still needs it
    assert pins.owners() == {second}
    await pins.forget_training(second)
    assert await store.pins() == []


async def test_the_same_training_id_under_another_coordinator_is_another_training(tmp_path: Path) -> None:
    store = LocalContentStore(tmp_path / "store")
    pins = TrainingPins(store)
    mine, borrowed = TrainingOwner(COORDINATOR, "training-1"), TrainingOwner("0x" + "cd" * 20, "training-1")
    kept = await pins.add(mine, b"mine")
    await pins.add(borrowed, b"a stranger's, under my id")
    await pins.forget_training(borrowed)  # the stranger's training closing unpins nothing of mine
    assert await store.pins() == [kept]


class _UnreachableStore(LocalContentStore):
    """Fault injection: a daemon that does not answer the unpin (a real one only does so when it is down)."""

    async def unpin(self, cid: str) -> None:
        raise StoreUnreachableError("IPFS API http://127.0.0.1:5001: pin/rm timed out")


async def test_an_unpin_that_fails_is_logged_and_the_sweep_goes_on(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    pins = TrainingPins(_UnreachableStore(tmp_path / "store"))
    owner = TrainingOwner(COORDINATOR, "training-1")
    await pins.add(owner, b"a result")
    with caplog.at_level(logging.WARNING):
        await pins.forget_training(owner)
    assert "could not unpin" in caplog.text and pins.owners() == set()
