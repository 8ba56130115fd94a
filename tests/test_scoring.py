import numpy as np
import pytest

from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.market import WeightedScore, meets_min_gpu, rank_workers, reputation_from_history, weighted_scores
from aitbc_agent_sdk.market._scoring import gpu_key, gpu_performance
from aitbc_agent_sdk.records import GpuInfo, Hardware, Offer, Worker


def worker(i: int, gpu: str | None, price: int, reputation: float, free: int = 1, slots: int = 1) -> Worker:
    gpus = (GpuInfo(name=gpu, memory_total_bytes=24 << 30),) if gpu else ()
    address = "0x" + f"{i:040x}"
    offer = Offer(provider=address, price_wei=price, slots=slots, free_slots=free,
                  hardware=Hardware(cpu_model="test", cpu_cores=8, ram_bytes=1 << 34, gpus=gpus))
    return Worker(worker_id=address, offer=offer, reputation=reputation)


def test_default_weights_match_a_hand_computation():
    workers = [
        worker(1, "NVIDIA GeForce RTX 3090", price=100, reputation=4.0),
        worker(2, "NVIDIA GeForce RTX 4090", price=200, reputation=5.0, free=1, slots=2),
        worker(3, None, price=50, reputation=2.5),
    ]
    scores = WeightedScore().score(workers)
    # gpu*0.4 + (cheapest/price)*0.3 + rep/5*0.2 + availability*0.1
    expected = [
        0.85 * 0.4 + (50 / 100) * 0.3 + 0.8 * 0.2 + 1.0 * 0.1,
        1.00 * 0.4 + (50 / 200) * 0.3 + 1.0 * 0.2 + 0.5 * 0.1,
        0.10 * 0.4 + 1.0 * 0.3 + 0.5 * 0.2 + 1.0 * 0.1,
    ]
    assert scores == pytest.approx(expected)


def test_strategy_is_pluggable_through_weights():
    workers = [worker(1, "RTX3090", 100, 1.0), worker(2, "RTX3070", 10, 1.0)]
    price_only = WeightedScore(gpu=0, price=1, reputation=0, availability=0)
    gpu_only = WeightedScore(gpu=1, price=0, reputation=0, availability=0)
    assert rank_workers(workers, price_only.score(workers), 1)[0].worker_id == workers[1].worker_id
    assert rank_workers(workers, gpu_only.score(workers), 1)[0].worker_id == workers[0].worker_id


def test_vectorised_function_handles_zero_prices():
    scores = weighted_scores(np.array([1.0, 1.0]), np.array([0.0, 10.0]), np.array([5.0, 5.0]),
                             np.array([1.0, 1.0]), (0.0, 1.0, 0.0, 0.0))
    assert scores.tolist() == [1.0, 0.0]


def test_rank_breaks_ties_by_price_then_address():
    workers = [worker(3, "RTX3090", 100, 3.0), worker(1, "RTX3090", 100, 3.0), worker(2, "RTX3090", 90, 3.0)]
    tied = np.array([0.5, 0.5, 0.5])
    assert [w.worker_id[-1] for w in rank_workers(workers, tied, 3)] == ["2", "1", "3"]


def test_gpu_names_are_normalised():
    assert gpu_key("NVIDIA GeForce RTX 3090") == "RTX3090"
    assert gpu_key("NVIDIA H200") == "H200"
    assert gpu_performance("cpu") == pytest.approx(0.1)
    assert gpu_performance("Some Future GPU") == pytest.approx(0.5)


def test_min_gpu_filter():
    assert meets_min_gpu("NVIDIA GeForce RTX 4090", "RTX3090")
    assert not meets_min_gpu("NVIDIA GeForce RTX 3070", "RTX3090")
    assert not meets_min_gpu("cpu", "RTX3090")
    assert meets_min_gpu("cpu", None)
    with pytest.raises(ConfigError, match="unknown GPU"):
        meets_min_gpu("RTX3090", "GTX 9999 Ultra")


def test_reputation_prior_and_history():
    assert reputation_from_history(0, 0) == 2.5
    assert reputation_from_history(8, 0) == pytest.approx(5 * 9 / 10)
    assert reputation_from_history(0, 8) == pytest.approx(5 * 1 / 10)


def staked(w: Worker, stake: int) -> Worker:
    return w.model_copy(update={"stake_wei": stake})


def test_reputation_counts_in_full_only_behind_the_largest_bond():
    a = staked(worker(1, "RTX3090", 100, 5.0), 10**18)
    b = staked(worker(2, "RTX3090", 100, 5.0), 0)
    c = staked(worker(3, "RTX3090", 100, 5.0), 10**18 // 2)
    scores = WeightedScore(gpu=0, price=0, reputation=1, availability=0).score([a, b, c])
    assert scores.tolist() == pytest.approx([1.0, 0.5, 0.75])


def test_slashes_weigh_like_two_failures():
    assert reputation_from_history(3, 0, slashes=1) == pytest.approx(reputation_from_history(3, 2))
    assert reputation_from_history(3, 0, slashes=1) < reputation_from_history(3, 1)


def test_trainings_started_together_leave_each_other_the_slots_they_hold():
    from aitbc_agent_sdk.market._discovery import leave_out_held

    market = [worker(i, None, price=100 + i, reputation=1.0) for i in range(5)] + [worker(9, None, 90, 1.0, slots=2)]
    held = {market[0].worker_id: 1, market[1].worker_id: 1, market[5].worker_id: 1}
    # the one-slot providers held by another training go; the two-slot one has a slot left
    assert [w.worker_id for w in leave_out_held(market, held, 3)] == [w.worker_id for w in market[2:]]
    # too few left: everyone, so a job waits for a slot rather than the training failing to start
    assert leave_out_held(market, held, 5) == market
