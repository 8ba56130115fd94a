import pytest

from aitbc_agent_sdk.coordinator import check_transition, is_terminal
from aitbc_agent_sdk.errors import PhaseError
from aitbc_agent_sdk.records import TrainingPhase as P

HAPPY_PATH = [P.INITIALIZING, P.DISTRIBUTING, P.TRAINING, P.AGGREGATING, P.DISTRIBUTING, P.TRAINING,
              P.AGGREGATING, P.COMPLETE]


def test_the_multi_round_path_is_allowed():
    for current, target in zip(HAPPY_PATH, HAPPY_PATH[1:]):
        assert check_transition(current, target) == target


@pytest.mark.parametrize("current,target", [
    (P.INITIALIZING, P.TRAINING), (P.DISTRIBUTING, P.AGGREGATING), (P.TRAINING, P.COMPLETE),
    (P.COMPLETE, P.DISTRIBUTING), (P.FAILED, P.INITIALIZING), (P.AGGREGATING, P.INITIALIZING),
])
def test_skipping_or_leaving_a_terminal_phase_is_refused(current, target):
    with pytest.raises(PhaseError, match=f"from {current.value} to {target.value}"):
        check_transition(current, target)


@pytest.mark.parametrize("phase", [P.INITIALIZING, P.DISTRIBUTING, P.TRAINING, P.AGGREGATING])
def test_every_unfinished_phase_can_fail(phase):
    assert check_transition(phase, "failed") == P.FAILED


def test_terminal_phases_and_unknown_names():
    assert is_terminal(P.COMPLETE) and is_terminal("failed") and not is_terminal("training")
    with pytest.raises(PhaseError, match="unknown phase"):
        check_transition("training", "paused")
