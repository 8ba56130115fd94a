"""Deadlines sized by a job's work and its provider's measured speed, and every timeout a CLI flag."""

import pytest
import typer
from pydantic import ValidationError

from aitbc_agent_sdk.coordinator.round._deadlines import first_job_deadline, job_deadline, job_work, round_timeout
from aitbc_agent_sdk.coordinator.round._health import quantile
from aitbc_agent_sdk.records import FaultPolicy
from aitbc_cli.distributed_training import app

POLICY = FaultPolicy()
DIGITS_WORST = job_work(1438, 2)  # the whole digits training split on one worker, default epochs
BIG = job_work(200_000, 5)  # a million sample passes


def test_a_small_job_keeps_todays_first_round_deadline_and_a_big_one_gets_its_work():
    assert job_deadline(DIGITS_WORST, [], POLICY) == POLICY.first_round_deadline_s == 120.0
    assert job_deadline(job_work(360, 1), [], POLICY) == 120.0
    expected_s = BIG / POLICY.assumed_samples_per_s
    assert job_deadline(BIG, [], POLICY) == pytest.approx(POLICY.deadline_factor * expected_s) == 40_000.0
    faster = POLICY.model_copy(update={"assumed_samples_per_s": 5_000.0})
    assert first_job_deadline(BIG, faster) == 400.0  # an operator who knows the hardware tightens it


def test_history_replaces_the_assumed_speed_and_shortens_a_big_jobs_deadline():
    history = [90.0, 100.0, 110.0]
    measured = job_deadline(BIG, history, POLICY)
    assert measured == pytest.approx(POLICY.deadline_factor * quantile(history, POLICY.deadline_quantile))
    assert measured < job_deadline(BIG, [], POLICY) / 100
    assert job_deadline(DIGITS_WORST, [0.4, 0.5], POLICY) == POLICY.min_deadline_s  # the floor of a fast provider


def test_the_round_timeout_scales_with_the_work_and_allows_a_spares_copy():
    small = [(job_work(360, 2), [0.5]), (job_work(360, 2), [])]
    assert round_timeout(small, POLICY) == POLICY.min_round_timeout_s == 600.0  # today's 600 s for toy rounds
    assert round_timeout([], POLICY) == 600.0
    # The holder is fast, but a copy on a spare with no history may need the whole first deadline.
    assert round_timeout([(BIG, [100.0])], POLICY) == pytest.approx(POLICY.round_timeout_factor * 40_000.0)
    slow = [(BIG, [30_000.0])]  # a provider slower than assumed: its own history sets the limit
    assert round_timeout(slow, POLICY) == pytest.approx(3.0 * 2.0 * 30_000.0)
    fixed = POLICY.model_copy(update={"round_timeout_s": 45.0})
    assert round_timeout([(BIG, [])], fixed) == 45.0  # a fixed limit is kept as given


def test_timeouts_are_validated_settings():
    with pytest.raises(ValidationError):
        FaultPolicy(round_timeout_s=0.0)
    with pytest.raises(ValidationError):
        FaultPolicy(assumed_samples_per_s=0.0)
    stored = FaultPolicy(round_timeout_s=900.0).model_dump_json()
    assert FaultPolicy.model_validate_json(stored).round_timeout_s == 900.0
    assert FaultPolicy.model_validate_json("{}").round_timeout_s is None  # a training stored before: derived


@pytest.mark.parametrize("command", ["run", "init"])
def test_every_faultpolicy_timeout_is_a_documented_flag_with_the_sdks_default(command):
    params = {p.name: p for p in typer.main.get_command(app).commands[command].params}  # type: ignore[attr-defined]
    speed = "assumed_samples_per_s"  # not a timeout, but what sizes the first deadlines
    for field in [name for name in FaultPolicy.model_fields if name.endswith("_s")]:
        param = params[field if field == speed else field.removesuffix("_s")]
        assert param.param_type_name == "option" and param.help, field
        assert field == speed or "seconds" in param.help, field
        assert param.default == FaultPolicy.model_fields[field].default, field
