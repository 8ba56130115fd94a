"""The coordinator's settings: a frozen, bounded pydantic model nested in AgentConfig (issue #14)."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from aitbc_agent_sdk import AgentConfig
from aitbc_agent_sdk.coordinator import CoordinatorSettings, TrainingDatabase


def test_the_agent_config_carries_the_coordinator_settings_it_is_given(tmp_path: Path) -> None:
    config = AgentConfig(home=tmp_path, coordinator={"discovery_timeout_s": 0.5, "reply_timeout_s": 3})
    assert config.coordinator == CoordinatorSettings(discovery_timeout_s=0.5, reply_timeout_s=3.0)
    assert AgentConfig(home=tmp_path).coordinator == CoordinatorSettings()


@pytest.mark.parametrize("bad", [{"reply_timeout_s": 0}, {"discovery_timeout_s": -1}, {"gas_reserve_wei": -1},
                                 {"discovery_timout_s": 1}])
def test_out_of_range_or_misspelt_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ValidationError):
        CoordinatorSettings(**bad)


def test_the_settings_are_frozen() -> None:
    settings = CoordinatorSettings()
    with pytest.raises(ValidationError):
        settings.reply_timeout_s = 1.0  # type: ignore[misc]


async def test_round_times_outlive_the_connection_that_wrote_them_and_stay_with_their_training(
        tmp_path: Path) -> None:
    async with TrainingDatabase(tmp_path / "aitbc.db") as db:
        for seconds in (1.0, 2.0, 3.0):
            await db.save_round_time("t1", "0xA", seconds)
        await db.save_round_time("t1", "0xB", 9.0)
        await db.save_round_time("t2", "0xA", 40.0)  # another training: another model, another deadline
    async with TrainingDatabase(tmp_path / "aitbc.db") as db:
        assert await db.round_times("t1") == {"0xA": [1.0, 2.0, 3.0], "0xB": [9.0]}
        assert await db.round_times("t1", last=2) == {"0xA": [2.0, 3.0], "0xB": [9.0]}
        assert await db.round_times("t2") == {"0xA": [40.0]}
        assert await db.round_times("t3") == {}
