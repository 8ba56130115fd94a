"""The seed's Example 3 (fault-tolerant training), run for real as a script."""

import json
import subprocess
import sys

from conftest import REPO

SCRIPT = REPO / "scenarios" / "37_distributed_ai_training" / "fault_tolerant.py"


def test_the_seed_fault_tolerant_loop_watches_a_stalled_worker_get_replaced(cli_env, aitbc_home):
    done = subprocess.run([sys.executable, str(SCRIPT), "--stall", "--rounds", "2", "--home", str(aitbc_home)],
                          env=cli_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    summary = json.loads(out.split("SUMMARY ", 1)[1])
    faulty = summary["faulty"]
    assert summary["phase"] == "complete" and summary["accuracy"] >= 0.9
    assert summary["faulty_paid_wei"] == 0
    escrow = summary["escrow"]
    assert escrow["deposited_wei"] == escrow["paid_wei"] + escrow["refunded_wei"] + escrow["held_wei"]
    # the seed's own straggler rule saw it, and the round loop duplicated and replaced it
    assert f"Straggler detected: {faulty}" in out
    # In this order, though not always adjacent: on a loaded machine another worker can be
    # flagged as a straggler too before the stalled one's replacement is recorded.
    events = summary["events"]
    first = events.index("straggler_detected")
    assert events.index("speculative_job", first) < events.index("worker_replaced", first)
    assert f'"worker": "{faulty}"' in out.split("audit: worker_replaced", 1)[1].splitlines()[0]
