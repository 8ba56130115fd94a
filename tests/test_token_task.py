"""A language model trained on a real text corpus by a user task that reads token shards, on real providers."""

from __future__ import annotations

import math
import sysconfig
from pathlib import Path

import numpy as np

from aitbc_agent_sdk import Agent, AgentConfig, JobConfig, TrainingPhase, TrainingSpec

TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "byte_lm.py"


def stdlib_corpus(target: Path, limit: int = 400_000) -> bytes:
    """Real text that ships with every Python: some of the standard library's own sources, as .txt files."""
    target.mkdir()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    taken = b""
    for source in sorted(stdlib.glob("*.py")):
        text = source.read_bytes()
        (target / f"{source.stem}.txt").write_bytes(text)
        taken += text
        if len(taken) >= limit:
            return taken
    return taken


def unigram_bits(data: bytes) -> float:
    counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())


async def test_a_byte_language_model_learns_below_the_unigram_entropy(aitbc_home, tmp_path):
    text = stdlib_corpus(tmp_path / "corpus")
    async with Agent(AgentConfig(home=aitbc_home, providers=2)) as agent:
        ref = await agent.coordinator.tasks.add(TASK, {"windows_per_epoch": 512, "context": 32})
        spec = TrainingSpec(model_type="mlp", task=ref, target_workers=2, rounds=3,
                            job=JobConfig(batch_size=32, learning_rate=3e-3, epochs=2))
        report = await agent.run_distributed_training(spec, dataset=tmp_path / "corpus")
    assert report.status == TrainingPhase.COMPLETE
    bits = [r.metrics["bits_per_byte"] for r in report.rounds]
    assert all(math.isfinite(b) for b in bits)
    assert bits[-1] < unigram_bits(text) - 0.3, (bits, unigram_bits(text))  # it learned context, not counts
    assert bits[-1] < bits[0]
