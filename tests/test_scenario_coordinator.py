"""The seed's Example 2 coordinator loop, run for real as a script."""

import json
import subprocess
import sys

from conftest import REPO

SCRIPT = REPO / "scenarios" / "37_distributed_ai_training" / "coordinator.py"


def test_the_seed_coordinator_runs_to_completion_and_pays(cli_env, aitbc_home):
    done = subprocess.run([sys.executable, str(SCRIPT), "--workers", "3", "--rounds", "3"],
                          env=cli_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    # the seed's own prints, in the seed's order
    for line in ("Training initialized: ", "Dataset CID: Qm", "Discovered 3 workers", "Selected 3 workers",
                 "Aggregated model: Qm", "Training complete and payments processed"):
        assert line in out
    assert out.index("Selected 3 workers") < out.index("Sent job to worker") < out.index("Aggregated model")
    assert out.count("Aggregated model:") == 3
    summary = json.loads(out.split("SUMMARY ", 1)[1])
    assert summary["phase"] == "complete"
    assert summary["accuracy"] >= 0.93
    payments = summary["payments"]
    assert len(payments) == 3
    escrow = summary["escrow"]
    assert escrow["paid_wei"] == sum(p["amount_wei"] for p in payments)
    assert escrow["deposited_wei"] == escrow["paid_wei"] + escrow["refunded_wei"]
    # each worker was paid its full contract (price x 3 rounds), as the seed's finalize asks
    assert escrow["refunded_wei"] == 0
