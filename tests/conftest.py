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
