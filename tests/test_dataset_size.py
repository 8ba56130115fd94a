"""``--dataset-size`` takes units, and a dataset larger than declared is refused before it is stored or funded."""

import subprocess
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from aitbc_agent_sdk import Agent, AgentConfig, TrainingSpec
from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.records import format_size, parse_size


@pytest.mark.parametrize(("text", "size"), [
    ("100GB", 100 * 10**9), ("512MiB", 512 * 2**20), ("1.5TB", 15 * 10**11), ("4096", 4096), (" 2 kib ", 2048),
    (7, 7),
])
def test_sizes_read_as_people_write_them(text, size) -> None:
    assert parse_size(text) == size
    assert TrainingSpec(model_type="mlp", target_workers=1, dataset_size=text).dataset_size == size


@pytest.mark.parametrize("text", ["100 parsecs", "-5GB", "GB", "1e9", ""])
def test_a_size_that_is_not_one_says_what_is_accepted(text) -> None:
    with pytest.raises(ValidationError, match="is not a size|greater than or equal"):
        TrainingSpec(model_type="mlp", target_workers=1, dataset_size=text)


def test_sizes_print_in_decimal_units() -> None:
    assert format_size(100 * 10**9) == "100 GB" and format_size(512) == "512 B" and format_size(1536) == "1.54 kB"


def test_a_bad_size_on_the_cli_is_a_usage_error(aitbc_cmd, cli_env) -> None:
    done = subprocess.run([*aitbc_cmd, "distributed-training", "init", "--wallet", "dev", "--dataset-size", "9 furlongs"],
                          env=cli_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "is not a size" in done.stderr, done.stderr


async def test_a_dataset_larger_than_declared_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    path = tmp_path / "data.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.normal(size=(200, 8)).astype(np.float32), y=rng.integers(0, 2, 200))
    async with Agent(AgentConfig(home=tmp_path / "home", providers=2)) as agent:
        small = await agent.coordinator.initialize(TrainingSpec(model_type="mlp", target_workers=2, dataset_size="1kB"))
        with pytest.raises(ConfigError, match=r"more than the 1 kB \(1000 bytes\) the training declared"):
            await agent.coordinator.attach_dataset(small.training_id, path)
        assert (await agent.coordinator.db.training(small.training_id)).dataset_cid is None
        with pytest.raises(ConfigError, match="declared with --dataset-size"):  # the bundled digits: their stored size
            await agent.coordinator.attach_dataset(small.training_id, "digits")
        before = await agent.stack.sender.w3.eth.get_balance(agent.stack.account.address)
        with pytest.raises(ConfigError, match="declared with --dataset-size"):  # run: refused before funding
            await agent.run_distributed_training(
                TrainingSpec(model_type="mlp", target_workers=2, rounds=1, dataset_size=1000), dataset=path)
        assert await agent.stack.sender.w3.eth.get_balance(agent.stack.account.address) == before
        ok = await agent.coordinator.initialize(TrainingSpec(model_type="mlp", target_workers=2, dataset_size="1MB"))
        assert await agent.coordinator.attach_dataset(ok.training_id, path)  # within the declared size
