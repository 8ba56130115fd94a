"""The examples users start from run as their docstrings say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.slow
def test_the_ddp_example_trains_two_gloo_ranks_under_torchrun(tmp_path):
    """``torchrun --standalone --nproc-per-node=2 examples/train_ddp.py data.pt 30`` on this host's CPUs."""
    import torch

    x = torch.randn(96, 4, generator=torch.Generator().manual_seed(7))
    torch.save({"x": x, "y": x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1}, tmp_path / "data.pt")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITBC_")}
    env.update(OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(EXAMPLES / "train_ddp.py"), str(tmp_path / "data.pt"), "30"],
                          capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    finals = [json.loads(line[len("FINAL "):]) for line in lines if line.startswith("FINAL ")]
    assert sorted(f["rank"] for f in finals) == [0, 1] and {f["world"] for f in finals} == {2}
    assert len({f["digest"] for f in finals}) == 1, finals  # DDP kept both ranks' weights identical
    losses = [json.loads(line) for line in lines if line.startswith('{"rank": 0, "step"')]
    assert [m["step"] for m in losses] == list(range(1, 31)) and losses[-1]["loss"] < 0.5 * losses[0]["loss"]
