"""Ctrl-C on `run` settles like `stop` (issue #26): the accepted rounds are paid, the rest refunded, one line
says so, and the exit code is the shell's 130. The run is a separate process started as `setsid make demo
< /dev/null` starts it: no terminal and no --yes, which the embedded network's play money does not need."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

ROUNDS = 200  # far more than run before the signal lands


def first_receipt(audit_dir: Path, proc: subprocess.Popen[str], timeout: float = 240) -> None:
    """Return once the run's audit log records a signed receipt: a round's work was accepted."""
    deadline = time.monotonic() + timeout
    offset: dict[Path, int] = {}
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for log in audit_dir.glob("*/audit.jsonl"):
            with log.open() as handle:
                handle.seek(offset.get(log, 0))
                text = handle.read()
            if '"receipt_sent"' in text:
                return
            offset[log] = offset.get(log, 0) + len(text.encode()) - len(text.rsplit("\n", 1)[-1].encode())
        try:  # a tenth of a second, or at once should the run end
            proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
    raise AssertionError("no round was accepted in time")


def test_ctrl_c_pays_the_accepted_rounds_and_refunds_the_rest(aitbc_cmd, cli_env, aitbc_home) -> None:
    run = subprocess.Popen([*aitbc_cmd, "distributed-training", "run", "--workers", "2", "--providers", "2",
                            "--rounds", str(ROUNDS), "--epochs", "1"], env=cli_env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        first_receipt(aitbc_home / "trainings", run)
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=180)
    finally:
        run.kill()
    assert run.returncode == 130, err
    line = next(ln for ln in err.splitlines() if ln.startswith("interrupted after round"))
    assert "paid 2 workers" in line and "cannot resume" in line and "Traceback" not in err

    listed = subprocess.run([*aitbc_cmd, "distributed-training", "payments", "--json"], env=cli_env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    paid = json.loads(listed.stdout)
    escrow = paid["escrow"]
    rounds = int(line.split("interrupted after round ")[1].split()[0])
    assert 1 <= rounds < ROUNDS and f"for {rounds} accepted round" in line
    # Each worker got its price (0.01 or 0.011 ETH) for each round of its accepted, and nothing more (the signal
    # may land between two workers' acceptances of the last round); the rest came back or is held.
    accepted = sorted(next(amount // price for price in (10**16, 11 * 10**15) if amount % price == 0)
                      for amount in (int(p["amount_wei"]) for p in paid["payments"]))
    assert len(accepted) == 2 and accepted[-1] == rounds and accepted[0] >= rounds - 1
    assert int(escrow["paid_wei"]) == sum(int(p["amount_wei"]) for p in paid["payments"])
    assert int(escrow["deposited_wei"]) == (int(escrow["paid_wei"]) + int(escrow["refunded_wei"])
                                            + int(escrow["held_wei"]))
