import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Fixtures that start real servers on 127.0.0.1 (mosquitto, js-ipfs, anvil) and stop them after.
pytest_plugins = ["plugins.mqtt", "plugins.ipfs", "plugins.chain"]


@pytest.fixture
def aitbc_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "aitbc-home"
    monkeypatch.setenv("AITBC_HOME", str(home))
    return home


@pytest.fixture
def cli_env(aitbc_home) -> dict[str, str]:
    env = dict(os.environ)
    env["AITBC_HOME"] = str(aitbc_home)
    return env


@pytest.fixture
def aitbc_cmd() -> list[str]:
    return [sys.executable, "-m", "aitbc_cli.app"]


# The suite runs in pytest-xdist workers one file at a time (--dist loadfile). xdist hands out the files
# with the most tests first; among files of as many tests, collection order decides, and the longest go
# first (seconds of a fresh-clone run, largest first). Taking this order whole (--no-loadscope-reorder)
# ran the heavy devnet files against each other and was slower: 55 min of pytest against 52 (the CPUs
# are busy about 90 % of the run either way).
LONGEST_FIRST = (
    "test_gpt2_small.py", "test_benchmarks.py", "test_fault_tolerance.py", "test_cluster_train.py",
    "test_chaos.py", "test_cli_run.py", "test_assistant_chat.py", "test_market_verification.py",
    "test_multinode.py", "test_devnet_flow.py", "test_language_model.py", "test_scenario_elastic_devnet.py",
    "test_cli_training_admin.py", "test_market_sim.py", "test_auto_resume.py", "test_elastic.py",
    "test_user_tasks.py", "test_dashboard_browser.py", "test_embedded_run.py", "test_cli_wallet.py",
    "test_hostile_tasks.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture
def one_torch_thread():
    """Tiny models on a shared machine: one thread is faster than contending for the cores (and a CPU's
    sums, so a committed trajectory's bits, depend on the thread count)."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
