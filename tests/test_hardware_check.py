"""The timed hardware challenge: the matrices, the product and its check, deadlines, verdicts, scoring,
and the challenge at discovery over the in-memory bus (an honest CPU offer, a fake GPU, wrong answers)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from eth_account import Account

from aitbc_agent_sdk.coordinator._service import Coordinator
from aitbc_agent_sdk.coordinator._settings import CoordinatorSettings
from aitbc_agent_sdk.coordinator.money._settlement import EscrowAccount
from aitbc_agent_sdk.coordinator._training_db import TrainingDatabase
from aitbc_agent_sdk.market import WeightedScore, rank_workers
from aitbc_agent_sdk.market import _hardware_check as hc
from aitbc_agent_sdk.market._hardware_check import (
    challenge_deadline, challenge_matrices, compute_product, expected_seconds, gpu_flops, hardware_verdict,
    product_ok,
)
from aitbc_agent_sdk.messaging import InMemoryBus, SignedChannel, Verified, topics
from aitbc_agent_sdk.records import GpuInfo, Hardware, HardwareAnswer, HardwareChallenge, Offer, Worker
from aitbc_agent_sdk.provider._hardware_answer import HardwareAnswers, challenge_refusal
from aitbc_agent_sdk.provider._node import ProviderAgent, ProviderConfig
from aitbc_agent_sdk.storage import LocalContentStore
from aitbc_agent_sdk.wire._checkpoint import encode_state

H100 = GpuInfo(name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 << 30)
CPU_HOST = Hardware(cpu_model="test cpu", cpu_cores=2, ram_bytes=1 << 30)
H100_HOST = CPU_HOST.model_copy(update={"gpus": (H100,)})


# -- the matrices and the product ---------------------------------------------------------------

def _reference_entry(seed: int, row_salt: str, col_salt: str, i: int, j: int) -> int:
    """One entry as the module's docstring defines it, computed on Python ints, one at a time."""
    def key(salt: str, index: int) -> int:
        first = hc._mix((seed & hc.M32) ^ hc._SALTS[salt])
        second = hc._mix(((seed >> 32) & hc.M32) ^ first)
        return hc._mix(hc._mix(index ^ first) ^ second) & hc.M31
    return (((key(row_salt, i) ^ key(col_salt, j)) * hc._ELEMENT >> 40) & 3) - 2


@pytest.mark.parametrize("seed", [0, 12345, 2**63 - 1])
def test_matrices_match_an_element_by_element_reference(seed):
    a, b = challenge_matrices(seed, 5, 7, 3, dtype=torch.int64)
    assert a.shape == (5, 7) and b.shape == (7, 3)
    assert a.tolist() == [[_reference_entry(seed, "a_rows", "a_inner", i, k) for k in range(7)] for i in range(5)]
    assert b.tolist() == [[_reference_entry(seed, "b_inner", "b_cols", k, j) for j in range(3)] for k in range(7)]
    af, _ = challenge_matrices(seed, 5, 7, 3, dtype=torch.float64)
    assert torch.equal(af, a.double())


def test_matrices_are_small_integers_that_differ_by_seed():
    a, b = challenge_matrices(1, 64, 512, 64)
    assert set(a.unique().tolist()) == {-2.0, -1.0, 0.0, 1.0} and set(b.unique().tolist()) <= {-2.0, -1.0, 0.0, 1.0}
    assert not torch.equal(a, challenge_matrices(2, 64, 512, 64)[0])
    assert not torch.equal(a[:, :64], b[:64].T)  # A and B come from different keys


def test_product_is_exact_across_blocks():
    rows, inner, cols = 40, 3 * hc._step(40, 24) + 17, 24  # several blocks and a short last one
    a, b = challenge_matrices(9, rows, inner, cols, dtype=torch.float64)
    assert torch.equal(compute_product(9, rows, inner, cols), (a @ b).to(torch.int32))


def test_the_gpu_path_adds_exact_fp16_products(monkeypatch):
    """The CUDA path's blocking, run on the CPU's fp16: spans of A and B, products over FP16_BLOCK each."""
    rows, inner, cols = 40, 5 * hc.FP16_BLOCK + 7, 24
    monkeypatch.setattr(hc, "GPU_CHUNK_ELEMENTS", 2 * hc.FP16_BLOCK * rows)  # spans of two blocks
    total = torch.zeros(rows, cols)
    hc._add_fp16_products(hc._challenge(3, rows, inner, cols, "cpu"), total)
    a, b = challenge_matrices(3, rows, inner, cols, dtype=torch.float64)
    assert torch.equal(total.to(torch.int32), (a @ b).to(torch.int32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_gpu_gives_the_cpu_answer():
    assert torch.equal(compute_product(3, 256, 4 * hc.FP16_BLOCK + 5, 128, "cuda"),
                       compute_product(3, 256, 4 * hc.FP16_BLOCK + 5, 128, "cpu"))


def test_product_ok_accepts_the_exact_product_and_rejects_one_wrong_entry():
    rows, inner, cols = 48, 700, 32
    product = compute_product(4, rows, inner, cols)
    assert product_ok(4, rows, inner, cols, product, rng=np.random.default_rng(0))
    assert product_ok(4, rows, inner, cols, product.long())
    for seed in range(5):  # a wrong entry anywhere passes a round with probability 2**-16 at most
        wrong = product.clone()
        wrong[seed * 7 % rows, seed * 5 % cols] += 1
        assert not product_ok(4, rows, inner, cols, wrong, rng=np.random.default_rng(seed))
    assert not product_ok(5, rows, inner, cols, product)  # another challenge's product


def test_product_ok_rejects_wrong_shapes_types_and_impossible_entries():
    rows, inner, cols = 16, 64, 8
    product = compute_product(1, rows, inner, cols)
    assert not product_ok(1, rows, inner, cols, product[:, :-1])
    assert not product_ok(1, rows, inner, cols, product.T.contiguous())
    assert not product_ok(1, rows, inner, cols, product.float())
    assert not product_ok(1, rows, inner, cols, product.tolist())
    huge = product.clone()
    huge[0, 0] = -2**31  # beyond any true entry: refused before it could upset float64 sums
    assert not product_ok(1, rows, inner, cols, huge)


# -- deadlines and verdicts ---------------------------------------------------------------------

def test_deadlines_grow_with_size_and_shrink_with_the_claimed_speed():
    small, large = (256, 4096, 256), (1024, 65536, 1024)
    assert challenge_deadline("NVIDIA H100 80GB HBM3", large, 1.0) > challenge_deadline("NVIDIA H100", small, 1.0)
    speeds = [challenge_deadline(gpu, large, 1.0) for gpu in ("NVIDIA H200", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4",
                                                              "NVIDIA L4", "Tesla T4", "Some Future GPU")]
    assert speeds == sorted(speeds) and speeds[0] < speeds[-1]
    assert challenge_deadline("NVIDIA H100", small, 2.5) == pytest.approx(2.5 + expected_seconds("H100", 2 * 256**2 * 4096))
    assert gpu_flops("NVIDIA L40S") != gpu_flops("NVIDIA L40") and gpu_flops("GeForce RTX 4090") == hc.GPU_FLOPS["RTX4090"]
    # the default challenge: milliseconds of compute at H100 speed, so the allowance is what a CPU must beat
    settings = CoordinatorSettings()
    assert expected_seconds("H100", hc.challenge_flops(*settings.hardware_challenge)) < 0.01
    assert challenge_deadline("NVIDIA H100", settings.hardware_challenge, settings.hardware_allowance_s) < 2.1


def test_verdicts():
    assert hardware_verdict(1.0, 0.5).outcome == "passed"
    assert hardware_verdict(1.0, None).reason == "no answer to the hardware challenge"
    assert hardware_verdict(1.0, 0.2, declined="no GPU 0").reason.startswith("declined")
    assert hardware_verdict(1.0, 1.5).reason.startswith("late: answered in 1.50s")
    assert hardware_verdict(1.0, 0.5, product_problem="wrong product").flagged


def test_providers_decline_what_they_cannot_or_will_not_compute():
    challenge = HardwareChallenge(nonce="n", seed=1, rows=8, inner=8, cols=8, gpu_index=1, deadline_s=1.0)
    assert challenge_refusal(challenge, H100_HOST) == "no GPU 1 on this host"
    assert challenge_refusal(challenge.model_copy(update={"gpu_index": 0}), CPU_HOST) == "no GPU 0 on this host"
    big = challenge.model_copy(update={"gpu_index": 0, "rows": 8192, "cols": 8192})
    assert "beyond" in challenge_refusal(big, H100_HOST)
    assert challenge_refusal(challenge.model_copy(update={"gpu_index": 0}), H100_HOST) is None


# -- scoring ------------------------------------------------------------------------------------

def _worker(i: int, hardware: Hardware, price: int, check: str = "unchecked") -> Worker:
    address = "0x" + f"{i:040x}"
    return Worker(worker_id=address, offer=Offer(provider=address, price_wei=price, hardware=hardware),
                  reputation=5.0, hardware_check=check)


def test_a_flagged_offer_ranks_below_every_unflagged_one():
    fake = _worker(1, H100_HOST, 1, "flagged")  # the cheapest, the best GPU, a perfect reputation
    honest = _worker(2, CPU_HOST, 10**6)
    scores = WeightedScore().score([fake, honest])
    assert scores[0] < scores[1]
    assert rank_workers([fake, honest], scores, 2) == [honest, fake]
    price_only = WeightedScore(gpu=0, price=1, reputation=0, availability=0)  # scores the fake above
    assert rank_workers([fake, honest], price_only.score([fake, honest]), 1) == [honest]
    assert rank_workers([fake], WeightedScore().score([fake]), 1) == [fake]  # kept when nothing else exists


# -- at discovery, over the in-memory bus -------------------------------------------------------

Handler = Callable[[Verified[HardwareChallenge]], Awaitable[None]]


@contextlib.asynccontextmanager
async def market(tmp_path: Path, **settings: object) -> AsyncIterator[SimpleNamespace]:
    bus, store = InMemoryBus(), LocalContentStore(tmp_path / "store")
    tasks: list[asyncio.Task[None]] = []

    async def provider(hardware: Hardware, price: int, handler: Callable[[SignedChannel], Handler] | None) -> str:
        channel = SignedChannel(bus, Account.create())
        if handler is not None:
            ready = asyncio.Event()
            tasks.append(asyncio.create_task(_serve(channel, handler(channel), ready)))
            await ready.wait()
        await channel.publish(topics.offer(channel.address),
                              Offer(provider=channel.address, price_wei=price, hardware=hardware), retain=True)
        return channel.address

    try:
        async with TrainingDatabase(tmp_path / "db.sqlite") as db:
            account = Account.create()
            escrow = EscrowAccount(SimpleNamespace(address=account.address), None, None)  # type: ignore[arg-type]
            coordinator = Coordinator(channel=SignedChannel(bus, account), store=store, db=db, escrow=escrow,
                                      scoring=WeightedScore(),
                                      # no registry here: no bonds to require (test_min_stake.py does)
                                      settings=CoordinatorSettings(discovery_timeout_s=1.0, min_stake_wei=0,
                                                                   **settings))
            yield SimpleNamespace(coordinator=coordinator, store=store, provider=provider)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await bus.close()


async def _serve(channel: SignedChannel, handle: Handler, ready: asyncio.Event) -> None:
    async with channel.subscribe(topics.hardware_check(channel.address), HardwareChallenge) as challenges:
        ready.set()
        async for verified in challenges:
            await handle(verified)


def honest_on_cpu(store: LocalContentStore, hardware: Hardware) -> Callable[[SignedChannel], Handler]:
    return lambda channel: HardwareAnswers(channel, store, lambda: hardware, device="cpu")


def wrong_product(store: LocalContentStore) -> Callable[[SignedChannel], Handler]:
    """Answers at once with a product one entry off."""
    def build(channel: SignedChannel) -> Handler:
        async def handle(verified: Verified[HardwareChallenge]) -> None:
            c = verified.message
            product = compute_product(c.seed, c.rows, c.inner, c.cols)
            product[0, 0] += 1
            cid = await store.add(encode_state({"product": product}))
            await channel.publish(topics.hardware_answer(verified.sender, c.nonce),
                                  HardwareAnswer(nonce=c.nonce, provider=channel.address, cid=cid))
        return handle
    return build


async def test_a_fake_gpu_answering_late_is_flagged_and_ranked_below_an_honest_cpu_offer(tmp_path):
    # A tight deadline at the claimed H100's speed: a CPU computing 128 x 8192 x 128 cannot meet it.
    async with market(tmp_path, hardware_challenge=(128, 8192, 128), hardware_allowance_s=1e-4,
                      hardware_grace_s=60.0) as m:
        honest = await m.provider(CPU_HOST, 10**6, None)  # claims no GPU: never challenged
        fake = await m.provider(H100_HOST, 1, honest_on_cpu(m.store, H100_HOST))
        workers = {w.worker_id: w for w in await m.coordinator.discover()}
        assert workers[honest].hardware_check == "unchecked"
        assert workers[fake].hardware_check == "flagged" and workers[fake].hardware_reason.startswith("late")
        assert m.coordinator.hardware_flags == {fake: workers[fake].hardware_reason}
        assert [w.worker_id for w in m.coordinator.select(list(workers.values()), 2)] == [honest, fake]
        assert [w.worker_id for w in m.coordinator.select(list(workers.values()), 1)] == [honest]


async def test_answers_in_time_pass_and_wrong_or_declined_ones_are_flagged(tmp_path):
    async with market(tmp_path, hardware_challenge=(64, 2048, 32), hardware_allowance_s=60.0) as m:
        passing = await m.provider(H100_HOST, 5, honest_on_cpu(m.store, H100_HOST))
        wrong = await m.provider(H100_HOST, 5, wrong_product(m.store))
        declining = await m.provider(H100_HOST, 5, honest_on_cpu(m.store, CPU_HOST))  # it has no GPU after all
        workers = {w.worker_id: w for w in await m.coordinator.discover()}
    assert workers[passing].hardware_check == "passed" and workers[passing].hardware_reason is None
    assert workers[wrong].hardware_check == "flagged" and workers[wrong].hardware_reason.startswith("wrong product")
    assert workers[declining].hardware_reason == "declined the hardware challenge: no GPU 0 on this host"


async def test_silence_is_flagged_and_the_check_can_be_turned_off(tmp_path):
    async with market(tmp_path, hardware_allowance_s=0.05, hardware_grace_s=0.05) as m:
        silent = await m.provider(H100_HOST, 5, None)
        (worker,) = await m.coordinator.discover()
        assert worker.worker_id == silent and worker.hardware_reason == "no answer to the hardware challenge"
    async with market(tmp_path / "off", hardware_check=False) as m:
        await m.provider(H100_HOST, 5, None)
        (worker,) = await m.coordinator.discover()
        assert worker.hardware_check == "unchecked"


async def test_a_provider_agent_answers_on_the_gpu_its_offer_claims(tmp_path):
    async with market(tmp_path, hardware_challenge=(64, 1024, 64), hardware_allowance_s=60.0) as m:
        bus = m.coordinator.channel._bus
        agent = ProviderAgent(Account.create(), bus, m.store, ProviderConfig(price_wei=5, work_dir=tmp_path / "p",
                                                                             sandbox=None), hardware=H100_HOST)
        async with agent:
            (worker,) = await m.coordinator.discover()
        assert worker.worker_id == agent.address and worker.hardware_check == "passed"
        assert agent.hardware_answers.answered == 1


def test_strangers_cannot_keep_a_providers_gpu_busy_with_challenges():
    from aitbc_agent_sdk.provider._hardware_answer import ChallengeBudget
    budget = ChallengeBudget(per_sender=2, total=3)
    assert budget.allow("a", 0.0) and budget.allow("a", 1.0)
    assert not budget.allow("a", 2.0)  # its own share is spent
    assert budget.allow("b", 3.0)
    assert not budget.allow("c", 4.0)  # everyone's is spent
    assert budget.allow("a", 61.0)  # a minute later the first ones no longer count
