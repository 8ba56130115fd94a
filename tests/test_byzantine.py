"""The chaos tests' Byzantine providers each cheat the way they claim to (scripts/chaos/byzantine.py)."""

from __future__ import annotations

import shutil

import pytest
import torch

from aitbc_agent_sdk.errors import ContentNotFoundError
from aitbc_agent_sdk.flow._provider_daemon import serve_provider
from aitbc_agent_sdk.provider._process import CHECKPOINT_FILE, WEIGHTS_FILE
from aitbc_agent_sdk.provider._worker_process import run_job
from aitbc_agent_sdk.storage import compute_cid
from aitbc_agent_sdk.wire._checkpoint import decode_state, encode_state
from aitbc_agent_sdk.data._shard_files import write_shard
from aitbc_agent_sdk.wire._update_codec import decode_update
from aitbc_agent_sdk.coordinator.checks._verification import checkpoint_problem
from aitbc_agent_sdk.records._datasets import ShardData
from scripts.chaos.byzantine import (
    BEHAVIOURS, SCALE, CidMismatchProvider, ForgedProvider, NanProvider, RandomProvider, ScaledProvider,
    StaleProvider, byzantine_factory,
)
from test_provider_agent import Market, open_market, signer_of


async def run_one_job(market: Market, agent_class, **assign):
    """Hire a provider of ``agent_class``, give it one job; returns (provider, job, result)."""
    async with market.provider(agent_class) as provider:
        job = await market.assign(provider, await market.hire(provider), **assign)
        result = await market.result(job)
        await market.status(job, "complete")
    return provider, job, result


async def announced_state(market: Market, result) -> dict[str, torch.Tensor]:
    return decode_state(await market.store.cat(result.checkpoint_cid))


async def market_shard(market: Market, job) -> ShardData:
    return ShardData.model_validate_json(await market.store.cat(job.shard_cid))


def update_norm(state, start) -> float:
    return torch.sqrt(sum(((state[k] - start[k]) ** 2).sum() for k in start)).item()


def honest_checkpoint(market: Market, job, tmp_path) -> dict[str, torch.Tensor]:
    """What an honest provider computes for ``job``: the training process's own function, run here."""
    job_dir = tmp_path / "honest"
    job_dir.mkdir()
    write_shard(job_dir, market.data)
    (job_dir / WEIGHTS_FILE).write_bytes(encode_state(market.initial_weights()))
    run_job({"job_dir": str(job_dir), "job_id": job.job_id, "seed": job.seed,
             "model": job.model.model_dump(mode="json"), "config": job.config.model_dump(mode="json")},
            {}, lambda event: None)
    state = decode_state((job_dir / CHECKPOINT_FILE).read_bytes())
    shutil.rmtree(job_dir)
    return state


async def test_nan_provider_announces_a_checkpoint_full_of_nan(tmp_path):
    async with open_market(tmp_path) as market:
        provider, _, result = await run_one_job(market, NanProvider)
        state = await announced_state(market, result)
    assert set(state) == set(market.initial_weights())
    assert all(t.isnan().all() for t in state.values() if t.is_floating_point())
    assert signer_of(market, result) == provider.address  # a signed bad result: slashable


@pytest.mark.parametrize("encoding", ["int8", "float32"])
async def test_nan_provider_poisons_an_encoded_update_into_weights_the_verification_slashes(tmp_path, encoding):
    async with open_market(tmp_path) as market:
        provider, job, result = await run_one_job(market, NanProvider, update_encoding=encoding)
        blob = await market.store.cat(result.checkpoint_cid)
    start = market.initial_weights()
    state = decode_update(blob, start, encoding)  # well-formed in its encoding: not a format error
    assert "non-finite values" in (checkpoint_problem(state, start) or "")  # the slashable rule of inspect_result
    assert signer_of(market, result) == provider.address  # signed and provably bad: slashable


async def test_scaled_provider_boosts_its_update_a_hundredfold(tmp_path):
    async with open_market(tmp_path) as market:
        _, job, result = await run_one_job(market, ScaledProvider)
        scaled = await announced_state(market, result)
    start = market.initial_weights()
    honest = honest_checkpoint(market, job, tmp_path)
    assert update_norm(honest, start) > 0
    assert update_norm(scaled, start) / update_norm(honest, start) == pytest.approx(SCALE, rel=1e-2)
    for name, w0 in start.items():  # same direction as the honest update, per tensor
        assert torch.allclose((scaled[name] - w0) / SCALE, honest[name] - w0, atol=1e-4)


async def test_random_provider_sends_noise_of_the_right_shapes_without_training(tmp_path):
    async with open_market(tmp_path) as market:
        _, job, result = await run_one_job(market, RandomProvider)
        state = await announced_state(market, result)
    start = market.initial_weights()
    assert {k: t.shape for k, t in state.items()} == {k: t.shape for k, t in start.items()}
    weights = state["net.1.weight"]  # 8192 draws: a standard normal's spread, far from an init's
    assert 0.9 < weights.std().item() < 1.1 and start["net.1.weight"].std().item() < 0.5
    assert result.samples == len(market.data) and result.loss > 0
    assert [epoch for _, epoch in market.statuses(job)] == [0, job.config.epochs]  # no epoch was trained


async def test_stale_provider_replays_its_first_checkpoint_in_later_rounds(tmp_path):
    async with open_market(tmp_path) as market, market.provider(StaleProvider) as provider:
        contract = await market.hire(provider)
        first = await market.assign(provider, contract, round=1)
        first_result = await market.result(first)
        second = await market.assign(provider, contract, round=2, weights=market.initial_weights(seed=1))
        second_result = await market.result(second)
        await market.status(second, "complete")
    assert second_result.round == 2 and second_result.checkpoint_cid == first_result.checkpoint_cid
    assert any(p == ("running", 1) for p in market.statuses(first))  # trained honestly the first time
    assert all(epoch == 0 for status, epoch in market.statuses(second) if status == "running")


async def test_forged_provider_signs_with_a_key_that_is_not_its_own(tmp_path):
    async with open_market(tmp_path) as market:
        provider, _, result = await run_one_job(market, ForgedProvider)
        state = await announced_state(market, result)  # the checkpoint itself is honest and stored
    assert all(t.isfinite().all() for t in state.values())
    assert signer_of(market, result) != provider.address


async def test_cid_mismatch_provider_announces_a_cid_it_never_stored(tmp_path):
    async with open_market(tmp_path) as market:
        _, job, result = await run_one_job(market, CidMismatchProvider)
        assert not await market.store.has(result.checkpoint_cid)
        with pytest.raises(ContentNotFoundError):
            await market.store.cat(result.checkpoint_cid)
        # what it did upload is its real checkpoint, and the announced CID is of one extra byte
        inputs = {job.shard_cid, job.weights_cid, *(s.cid for s in (await market_shard(market, job)).data.slices)}
        (uploaded,) = set(await market.store.pins()) - inputs
        blob = await market.store.cat(uploaded)
    assert decode_state(blob).keys() == market.initial_weights().keys()
    assert compute_cid(blob + b"\0") == result.checkpoint_cid


def test_behaviours_are_found_by_name_and_unknown_names_are_refused():
    assert set(BEHAVIOURS) == {"nan", "scaled", "random", "stale", "forged", "cid-mismatch", "free-rider", "lazy",
                               "lazy-honest", "copycat", "device-liar"}
    assert byzantine_factory("cid-mismatch") is CidMismatchProvider
    with pytest.raises(ValueError, match="unknown behaviour"):
        byzantine_factory("honest-ish")
    assert "agent_factory" in serve_provider.__code__.co_varnames
