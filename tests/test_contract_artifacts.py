"""The committed contract artifacts are exactly what the pinned solc builds from the sources."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from aitbc_agent_sdk.chain import ContractArtifact, load_artifact

ROOT = Path(__file__).resolve().parents[1]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_artifacts_match_sources() -> None:
    assert load_artifact("TrainingEscrow").source_sha256 == _sha256(ROOT / "contracts/TrainingEscrow.sol")
    assert load_artifact("ProviderRegistry").source_sha256 == _sha256(ROOT / "contracts/ProviderRegistry.sol")
    receiver = ContractArtifact.from_file(ROOT / "tests/artifacts/RevertingReceiver.json")
    assert receiver.source_sha256 == _sha256(ROOT / "contracts/test/RevertingReceiver.sol")


def test_production_artifact_excludes_test_contracts() -> None:
    shipped = sorted(p.name for p in (ROOT / "aitbc_agent_sdk/chain/artifacts").glob("*.json"))
    assert shipped == ["ProviderRegistry.json", "TrainingEscrow.json"]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not on PATH; the solc build needs Node.js")
def test_build_check_reproduces_committed_artifacts() -> None:
    proc = subprocess.run(
        [str(ROOT / "scripts/build_contracts.sh"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
