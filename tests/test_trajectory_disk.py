"""Trajectory commitments at real size (issue #27, item 3): a job keeps three boundary states, not one per
segment, and recomputes the others when a spot check asks.

The commitment still binds every boundary; a recomputed state hashes as committed bit for bit (this CPU,
one thread) or is an error and never opened; the provider's kept results open what they did not keep
through the training process; the coordinator's opening deadline grows with the steps to recompute; and
on the embedded stack honest workers pass their spot checks through the recomputation.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from aitbc_agent_sdk.coordinator.checks._spot_check import measured_step_s, opening_deadline_s
from aitbc_agent_sdk.devnet._network import DEVNET_PROVIDER_ARGS
from aitbc_agent_sdk.errors import StoreUnreachableError, TrainingError
from aitbc_agent_sdk.flow._provider_daemon import build_parser
from aitbc_agent_sdk.records import JobAssignment, JobConfig, TaskRef, TrajectoryChallenge
from aitbc_agent_sdk.provider._jobs import TrainOutcome
from aitbc_agent_sdk.provider._kept import MAX_RECOMPUTES, KeptJob, KeptResults
from aitbc_agent_sdk.provider._owners import TrainingOwner
from aitbc_agent_sdk.provider._pins import TrainingPins
from aitbc_agent_sdk.provider._process import TRAJECTORY_DIR
from aitbc_agent_sdk.storage._local import LocalContentStore
from aitbc_agent_sdk.tasks._bound_task import bind_task
from aitbc_agent_sdk.wire._checkpoint import decode_state
from aitbc_agent_sdk.data._datasets import LabeledData
from aitbc_agent_sdk.proof._trajectory import (
    KEPT_STATES, TrajectoryRecorder, boundary_hashes, boundary_name, kept_boundaries, recompute_plan,
    recompute_segments,
)
from aitbc_agent_sdk.tasks._trajectory_replay import open_boundaries

WORKER = "0x" + "ab" * 20
pytestmark = pytest.mark.usefixtures("one_torch_thread")

WIDE = bind_task(TaskRef(name="mlp", params={"hidden": 256}))
LONG = JobConfig(epochs=2, batch_size=16, learning_rate=1e-3, segments=64)  # 128 steps: 64 segments of 2


def synthetic(samples: int = 1024, features: int = 64) -> LabeledData:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, features, generator=g)
    return LabeledData(x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long(), 3)


@pytest.fixture(scope="module")
def long_job(tmp_path_factory):
    directory = tmp_path_factory.mktemp("long") / TRAJECTORY_DIR
    data = synthetic()
    spec = WIDE.model_spec(data)
    model = WIDE.build(spec, samples=len(data), seed=1)
    recorder = TrajectoryRecorder(directory, LONG.segments)
    WIDE.train(model, data, LONG, seed=5, trajectory=recorder)
    return spec, data, model, recorder.commitment("job-1", WORKER, "cpu"), directory


def test_a_long_job_keeps_three_states_within_three_times_its_weights_and_optimizer(long_job):
    spec, data, model, commitment, directory = long_job
    assert commitment.segments == 64 and len(commitment.state_hashes) == 65  # every boundary still committed
    files = sorted(directory.iterdir())
    assert [p.name for p in files] == [boundary_name(i) for i in kept_boundaries(65)] == [
        boundary_name(i) for i in (0, 21, 43)]
    assert [boundary_hashes(p.read_bytes())[1] for p in files] == [commitment.state_hashes[i] for i in (0, 21, 43)]
    # The weights and Adam's two moments: what one state holds.
    weights = sum(t.nbytes for t in model.state_dict().values())
    state = weights + 2 * sum(p.nbytes for p in model.parameters())
    on_disk = sum(p.stat().st_size for p in files)
    assert weights > 50_000 and on_disk <= 3 * state + 3 * (16 << 10)  # a header of a few KB beside each state


def test_the_kept_boundaries_are_evenly_spaced_and_all_when_few():
    assert kept_boundaries(1) == (0,) and kept_boundaries(3) == (0, 1, 2) and kept_boundaries(4) == (0, 1, 2)
    assert kept_boundaries(65) == (0, 21, 43) and kept_boundaries(1025) == (0, 341, 683)
    for n in range(1, 300):
        kept = kept_boundaries(n)
        assert kept[0] == 0 and len(kept) == min(n, KEPT_STATES) and len(set(kept)) == len(kept)
        gap = max(b - max(k for k in kept if k <= b) for b in range(n))
        assert gap <= -(-(n - 1) // KEPT_STATES)  # any boundary at most a third of the job from a kept one
    assert recompute_plan(65, [0, 21, 22, 5, 6, 64]) == {0: 6, 21: 22, 43: 64}
    assert recompute_segments(65, [0, 21, 43]) == 0 and recompute_segments(65, range(65)) == 20 + 21 + 21
    with pytest.raises(ValueError):
        recompute_plan(65, [65])


def test_opening_boundaries_not_kept_recomputes_them_bit_for_bit(long_job):
    spec, data, model, commitment, directory = long_job
    wanted = [0, 1, 20, 21, 22, 42, 44, 63, 64]  # segments 0, 20, 21, 43 and 63 of a spot check, and more
    opened = open_boundaries(WIDE, spec, data, LONG, 5, commitment, directory, wanted)
    assert sorted(opened) == wanted
    for boundary, blob in opened.items():
        assert boundary_hashes(blob) == (commitment.model_hashes[boundary], commitment.state_hashes[boundary])
    final = {k.removeprefix("model/"): v for k, v in decode_state(opened[64]).items() if k.startswith("model/")}
    assert all(torch.equal(final[k], v) for k, v in model.state_dict().items())  # the job's own end state


def test_a_recomputation_that_does_not_hash_as_committed_is_an_error_not_a_file(long_job, tmp_path):
    spec, data, _, commitment, directory = long_job
    hashes = list(commitment.state_hashes)
    hashes[20] = "0" * 64  # the provider's own bug: it committed to something it cannot reproduce
    wrong = commitment.model_copy(update={"state_hashes": tuple(hashes)})
    with pytest.raises(TrainingError, match="recomputed boundary 20 does not hash as committed"):
        open_boundaries(WIDE, spec, data, LONG, 5, wrong, directory, [20])
    with pytest.raises(TrainingError, match="batch order"):  # another seed: not the committed batches
        open_boundaries(WIDE, spec, data, LONG, 6, commitment, directory, [20])
    moved = tmp_path / "moved"
    shutil.copytree(directory, moved)
    (moved / boundary_name(0)).write_bytes((directory / boundary_name(21)).read_bytes())
    with pytest.raises(TrainingError, match="kept boundary 0 does not match"):
        open_boundaries(WIDE, spec, data, LONG, 5, commitment, moved, [20])


def kept_job(directory: Path, root: Path) -> KeptJob:
    owner = TrainingOwner("0x" + "cd" * 20, "training-1")
    job = JobAssignment.model_construct(job_id="job-1", training_id="training-1")
    return KeptJob(owner, job, TrainOutcome(root / "checkpoint.safetensors", 1, 0.0, 0.0), directory.parent, 0)


async def test_kept_results_open_what_they_kept_and_recompute_the_rest(long_job, tmp_path):
    spec, data, _, commitment, directory = long_job
    store = LocalContentStore(tmp_path / "store")
    results = KeptResults(tmp_path / "kept", TrainingPins(store))
    kept = kept_job(directory, tmp_path)
    asked: list[tuple[int, ...]] = []

    async def recompute(job: KeptJob, boundaries: tuple[int, ...], into: Path) -> None:
        asked.append(boundaries)
        for boundary, blob in open_boundaries(WIDE, spec, data, LONG, 5, commitment, job.trajectory,
                                              boundaries).items():
            (into / boundary_name(boundary)).write_bytes(blob)

    challenge = TrajectoryChallenge(job_id="job-1", training_id="training-1", round=1, segments=(20, 42),
                                    deadline_s=30.0)
    states = await results.open(kept, challenge, recompute)
    assert asked == [(20, 42)]  # 21 and 43 are kept
    assert [s.boundary for s in states] == [20, 21, 42, 43]
    for state in states:
        assert boundary_hashes(await store.cat(state.cid))[1] == commitment.state_hashes[state.boundary]
    assert not [p for p in (tmp_path / "kept").iterdir() if p.name.startswith(".recompute-")]  # scratch gone

    async def broken(job: KeptJob, boundaries: tuple[int, ...], into: Path) -> None:
        raise TrainingError("recomputed boundary 20 does not hash as committed: not opened")

    for _ in range(MAX_RECOMPUTES - 1):
        assert [s.boundary for s in await results.open(kept, challenge, broken)] == [21, 43]  # what it has
    asked.clear()
    assert [s.boundary for s in await results.open(kept, challenge, recompute)] == [21, 43]  # no more recomputes
    assert asked == []


def test_the_opening_deadline_follows_the_steps_to_recompute():
    assert opening_deadline_s(30.0, 0.5, 0) == 30.0  # every boundary asked for is kept: the floor
    assert opening_deadline_s(30.0, 0.5, 100) == 30.0 + 2.0 * 0.5 * 100
    assert opening_deadline_s(30.0, 0.5, 200) > opening_deadline_s(30.0, 0.5, 100)
    assert measured_step_s(80.0, 80, limit_s=3600.0) == 1.0
    assert measured_step_s(1e9, 80, limit_s=160.0) == 2.0  # a worker claiming a slow job gets its deadline at most
    assert measured_step_s(-1.0, 80, limit_s=160.0) == 0.0
    # Five segments of 64 asked for: at most the whole job again, spread over the three kept stretches.
    wanted = {b for s in (3, 19, 30, 50, 63) for b in (s, s + 1)}
    assert recompute_segments(65, wanted) == (20 - 0) + (31 - 21) + (64 - 43)


async def test_honest_workers_pass_spot_checks_through_recomputation(aitbc_home, monkeypatch):
    from aitbc_agent_sdk import Agent, AgentConfig, TrainingPhase, TrainingSpec
    from aitbc_agent_sdk.provider import _node as node
    from tests.test_fault_tolerance import events

    recomputed: list[tuple[int, ...]] = []
    real = node.recompute_kept_job

    async def counted(process, inputs, kept, boundaries, into):
        await real(process, inputs, kept, boundaries, into)
        recomputed.append(tuple(sorted(p.name for p in into.iterdir() if p.is_file())))

    monkeypatch.setattr(node, "recompute_kept_job", counted)
    spec = TrainingSpec(model_type="mlp", target_workers=2, rounds=1, seed=3,
                        job=JobConfig(batch_size=8, learning_rate=1e-2, epochs=1, segments=64))
    async with Agent(AgentConfig(home=aitbc_home, providers=2)) as agent:
        report = await agent.run_distributed_training(spec)
        log = events(agent, report.training_id)
    assert report.status == TrainingPhase.COMPLETE
    checks = [e for e in log if e["event"] == "spot_check"]
    assert len(checks) == 2 and all(e["passed"] for e in checks), checks
    assert recomputed and all(recomputed)  # the openings went through recomputed states


async def test_the_devnet_providers_keep_4_gib_and_past_it_the_oldest_job_goes(tmp_path):
    """A devnet's providers share the user's one disk: each keeps 4 GiB of delivered results, not 32. A
    GPT-2-small job keeps about 3 GB (its checkpoint and three 1 GB boundary states), so a second round's
    job evicts the first round's (its spot check long over) rather than filling the disk."""
    args = build_parser().parse_args(["--wallet", "w", "--price-wei", "1", *DEVNET_PROVIDER_ARGS])
    assert args.kept_size == 4 << 30

    results = KeptResults(tmp_path / "kept", TrainingPins(LocalContentStore(tmp_path / "store")), max_bytes=5000)
    owner = TrainingOwner("0x" + "cd" * 20, "training-1")
    for n in (1, 2):
        job_dir = tmp_path / f"job-{n}"
        (job_dir / TRAJECTORY_DIR).mkdir(parents=True)
        (job_dir / "checkpoint.safetensors").write_bytes(b"c" * 1000)
        (job_dir / TRAJECTORY_DIR / boundary_name(0)).write_bytes(b"s" * 2000)
        job = JobAssignment.model_construct(job_id=f"job-{n}", training_id="training-1")
        await results.keep(owner, job, job_dir, TrainOutcome(job_dir / "checkpoint.safetensors", 1, 0.0, 0.0))
    assert results.get(owner, "job-1") is None and results.get(owner, "job-2") is not None
    assert results.bytes == 3000 and not (tmp_path / "kept" / owner.hex / "job-1").exists()


class _FailingStore(LocalContentStore):
    """Fault injection (a daemon that times out storing one file, which a real one does only under load):
    adding boundary 21 fails."""

    async def add(self, data, **kwargs):
        if isinstance(data, Path) and data.name == boundary_name(21):
            raise StoreUnreachableError("IPFS API http://127.0.0.1:5001: add timed out (ReadTimeout)")
        return await super().add(data, **kwargs)


async def test_a_boundary_that_cannot_be_uploaded_is_left_out_and_the_opening_still_goes_out(long_job, tmp_path):
    _, _, _, commitment, directory = long_job
    results = KeptResults(tmp_path / "kept", TrainingPins(_FailingStore(tmp_path / "store")))
    challenge = TrajectoryChallenge(job_id="job-1", training_id="training-1", round=1, segments=(42, 20),
                                    deadline_s=30.0)
    states = await results.open(kept_job(directory, tmp_path), challenge)
    assert [s.boundary for s in states] == [43]  # 20 and 42 are not kept, 21 failed: its coordinator says so at once


async def test_a_bit_for_bit_check_opens_each_segments_start_only(long_job, tmp_path):
    _, _, _, commitment, directory = long_job
    results = KeptResults(tmp_path / "kept", TrainingPins(LocalContentStore(tmp_path / "store")))
    both = TrajectoryChallenge(job_id="job-1", training_id="training-1", round=1, segments=(42, 20), deadline_s=30.0)
    starts = both.model_copy(update={"ends": False})
    assert (both.boundaries(), starts.boundaries()) == ([20, 21, 42, 43], [20, 42])
    kept = kept_job(directory, tmp_path)
    # 21 and 43 are the kept ones: asked for the starts 20 and 42, which it would recompute, it opens none of them
    assert [s.boundary for s in await results.open(kept, starts)] == []
    ends_kept = TrajectoryChallenge(job_id="job-1", training_id="training-1", round=1, segments=(21, 43),
                                    deadline_s=30.0, ends=False)
    assert [s.boundary for s in await results.open(kept, ends_kept)] == [21, 43]
