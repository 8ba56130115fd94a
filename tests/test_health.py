"""The pure liveness and straggler rules."""

import pytest

from aitbc_agent_sdk.coordinator.round._health import (
    adaptive_deadline, confirmed_stragglers, past_deadline, progress_stragglers, quantile, silent_workers,
)
from aitbc_agent_sdk.records import FaultPolicy


def test_silent_workers_are_those_quiet_for_longer_than_the_timeout():
    assert silent_workers({"a": 100.0, "b": 95.0, "c": 89.9}, now=100.0, timeout_s=10.0) == ["c"]
    assert silent_workers({"a": 90.0}, now=100.0, timeout_s=10.0) == []  # exactly at the limit is alive


def test_the_seeds_rule_flags_progress_more_than_20_points_below_the_average():
    # average 62.5: 40 is 22.5 below, 50 only 12.5
    assert progress_stragglers({"a": 80.0, "b": 80.0, "c": 50.0, "d": 40.0}, 20.0) == ["d"]
    assert progress_stragglers({"a": 10.0}, 20.0) == []  # nobody to compare with
    assert progress_stragglers({"a": 50.0, "b": 50.0}, 20.0) == []


def test_coarse_progress_does_not_flag_jobs_that_are_merely_not_done_yet():
    policy = FaultPolicy(straggler_grace=1.5, straggler_min_s=0.0)
    progress = {0: 100.0, 1: 100.0, 2: 0.0, 3: 0.0}
    # two finished in about 1s; the others have run 1.2s: behind the average, but not for long
    assert confirmed_stragglers(progress, {2: 1.2, 3: 1.2}, [1.0, 1.0], policy) == []
    # one of them has now run twice the median: a straggler
    assert confirmed_stragglers(progress, {2: 1.2, 3: 2.0}, [1.0, 1.0], policy) == [3]
    # before half the jobs finished there is no yardstick
    assert confirmed_stragglers({0: 100.0, 1: 0.0, 2: 0.0}, {1: 9.0, 2: 9.0}, [1.0], policy) == []


def test_a_short_job_is_no_straggler_for_lagging_a_fraction_of_a_second():
    progress = {0: 100.0, 1: 100.0, 2: 0.0}
    policy = FaultPolicy(straggler_grace=1.5, straggler_min_s=5.0)
    # the others took 0.3s; three times that is still under the floor (a verifier's job waits behind its checks)
    assert confirmed_stragglers(progress, {2: 0.9}, [0.3, 0.3], policy) == []
    assert confirmed_stragglers(progress, {2: 5.5}, [0.3, 0.3], policy) == [2]
    # a long job's patience is its grace, far above the floor
    assert confirmed_stragglers(progress, {2: 80.0}, [60.0, 60.0], policy) == []
    assert confirmed_stragglers(progress, {2: 95.0}, [60.0, 60.0], policy) == [2]


def test_quantile_interpolates_between_ranks():
    assert quantile([4.0, 1.0, 3.0, 2.0], 1.0) == 4.0
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert quantile([0.0, 10.0], 0.9) == pytest.approx(9.0)
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_the_adaptive_deadline_follows_the_providers_own_history():
    policy = FaultPolicy(deadline_quantile=0.9, deadline_factor=2.0, min_deadline_s=5.0, first_round_deadline_s=60.0)
    assert adaptive_deadline([], policy) == 60.0  # no history yet
    fast = adaptive_deadline([1.0, 1.0, 1.2], policy)
    slow = adaptive_deadline([10.0, 12.0, 11.0, 30.0], policy)
    assert fast == 5.0  # the floor: 2 x 1.16 is shorter
    assert slow == pytest.approx(2.0 * quantile([10.0, 12.0, 11.0, 30.0], 0.9))
    assert past_deadline({"j1": 0.0, "j2": 90.0}, {"j1": fast, "j2": fast}, now=96.0) == ["j1", "j2"]
    assert past_deadline({"j1": 0.0}, {"j1": slow}, now=20.0) == []
