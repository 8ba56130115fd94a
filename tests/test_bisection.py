"""A dispute narrowed to one step (proof/_bisection.py): the pure rules, against traces made up here."""

import hashlib

import pytest

from aitbc_agent_sdk.proof._bisection import Disputed, Wrong, narrow, step_verdict, trace_points


def h(label: object) -> str:
    return hashlib.sha256(str(label).encode()).hexdigest()


def honest(step: int) -> str:
    return h(("honest", step))


def settle(steps: int, worker, verifier, limit: int) -> tuple[Disputed, int]:
    """Run the rounds as the coordinator does; ``worker``/``verifier`` map a step to the hash each traces."""
    dispute = Disputed(0, honest(0), steps, worker(steps), verifier(steps))
    rounds = 0
    while not dispute.narrowed:
        points = trace_points(dispute, limit)
        assert len(points) <= limit and points[-1] == dispute.disputed and list(points) == sorted(set(points))
        dispute = narrow(dispute, points, [worker(p) for p in points], [verifier(p) for p in points])
        rounds += 1
    return dispute, rounds


@pytest.mark.parametrize("steps,limit,rounds", [(2, 256, 1), (157, 256, 1), (1000, 256, 2), (10**6, 256, 3),
                                                (10**6, 2, 20)])
def test_a_skipped_step_anywhere_is_found_in_log_limit_rounds_and_the_worker_shown_wrong(steps, limit, rounds):
    for skipped in (1, max(1, steps // 3), steps):  # the worker's hashes leave the true ones from this step on
        def worker(step: int, skipped: int = skipped) -> str:
            return honest(step) if step < skipped else h(("lazy", step))
        dispute, taken = settle(steps, worker, honest, limit)
        assert (dispute.agreed, dispute.disputed) == (skipped - 1, skipped)
        assert dispute.agreed_hash == honest(skipped - 1) and taken <= rounds
        # the referee's one step from the agreed (true) state reaches the true hash: the verifier's
        assert step_verdict(dispute, honest(skipped)) == Wrong.WORKER


def test_a_verifier_that_rejects_honest_work_loses_and_one_that_makes_up_a_step_too():
    def hostile(step: int) -> str:  # traced honestly, then moved its end
        return h("moved") if step == 40 else honest(step)
    dispute, _ = settle(40, honest, hostile, 8)
    assert (dispute.agreed, dispute.disputed) == (39, 40) and step_verdict(dispute, honest(40)) == Wrong.VERIFIER
    # both sides off the true path at the same step: the one step reaches neither
    dispute, _ = settle(40, lambda s: h(("a", s)) if s >= 7 else honest(s), lambda s: h(("b", s)) if s >= 7
                        else honest(s), 8)
    assert dispute.disputed == 7 and step_verdict(dispute, honest(7)) == Wrong.BOTH


def test_a_side_that_changes_its_story_at_the_disputed_step_is_held_to_its_word():
    dispute = Disputed(0, honest(0), 4, h("committed"), honest(4))
    # the worker now traces the true end, as if it had never committed to another: still disputed there
    narrowed = narrow(dispute, (1, 2, 3, 4), [honest(s) for s in (1, 2, 3, 4)], [honest(s) for s in (1, 2, 3, 4)])
    assert (narrowed.agreed, narrowed.disputed, narrowed.worker_hash) == (3, 4, h("committed"))


def test_bad_rounds_are_refused():
    with pytest.raises(ValueError, match="not a dispute"):
        Disputed(0, honest(0), 3, honest(3), honest(3))
    with pytest.raises(ValueError, match="not a dispute"):
        Disputed(3, honest(3), 3, h(1), h(2))
    dispute = Disputed(0, honest(0), 4, h(1), h(2))
    with pytest.raises(ValueError, match="not at step 4"):
        narrow(dispute, (1, 2), [h(1), h(2)], [h(1), h(2)])
    with pytest.raises(ValueError, match="hashes over"):
        narrow(dispute, (2, 4), [h(1)], [h(1), h(2)])
    with pytest.raises(ValueError, match="not yet one step"):
        step_verdict(dispute, h(1))
    with pytest.raises(ValueError, match="limit"):
        trace_points(dispute, 0)
