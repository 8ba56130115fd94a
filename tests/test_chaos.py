"""The chaos suite's CI subset: real provider daemons, mosquitto, anvil and js-ipfs, 4 workers + 1 spare.

Each scenario starts its own devnet, injects one fault into a 3-round training, and checks the
outcome against the chain (escrow conservation, who was paid) and the hash-chained audit log.
The full suite is ``make chaos`` (``scripts/chaos/run_chaos.py``). Four of its rows left this file for
the suite's time (about three minutes each), each checked in process elsewhere: a NaN worker caught and
slashed (test_byzantine.py), a coordinator killed with SIGKILL on a devnet (test_auto_resume.py), a fake
GPU flagged at hiring (test_hardware_check.py) and a lazy verifier caught by a canary and slashed
(test_market_verification.py). Their verdict rules are checked below, without a devnet.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.chaos import harness  # noqa: E402
from scripts.chaos.harness import ChaosConfig, ScenarioResult  # noqa: E402

CONFIG = ChaosConfig(keep_failed=False, python=sys.executable)


def _explain(result: ScenarioResult) -> str:
    return "\n".join([f"{result.scenario} failed:", *result.failures, *result.notes, result.diagnostics])


def run(name: str, root: Path, reference: float | None) -> ScenarioResult:
    return asyncio.run(harness.run_scenario(name, CONFIG, reference=reference, root=root))


@pytest.fixture(scope="module")
def chaos_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("chaos")


@pytest.fixture(scope="module")
def clean(chaos_root) -> ScenarioResult:
    return run("clean", chaos_root, None)


def _reference(clean: ScenarioResult) -> float:
    if not clean.complete or clean.accuracy is None:
        pytest.fail(f"the clean run gave no reference accuracy:\n{_explain(clean)}")
    return clean.accuracy


def _common(result: ScenarioResult, reference: float) -> None:
    assert result.passed, _explain(result)
    assert result.complete and result.phase == "complete"
    assert result.delta is not None and abs(result.delta) <= CONFIG.accuracy_tolerance
    assert abs(result.accuracy - reference) <= CONFIG.accuracy_tolerance
    assert result.conservation_ok
    assert result.deposited_wei == result.paid_wei + result.refunded_wei + result.held_wei
    assert result.audit_ok and result.event_seen


@pytest.mark.slow
def test_clean(clean):
    assert clean.passed, _explain(clean)
    assert clean.accuracy is not None and clean.accuracy >= 0.9
    assert clean.all_paid and clean.conservation_ok and clean.audit_ok
    assert clean.refunded_wei == 0 and clean.paid_wei == clean.deposited_wei  # everyone earned every round
    assert clean.events.get("payment") == CONFIG.workers
    assert not {"worker_failed", "result_rejected", "worker_replaced", "training_failed"} & set(clean.events)


@pytest.mark.slow
def test_kill_provider(clean, chaos_root):
    reference = _reference(clean)
    result = run("kill-provider", chaos_root, reference)
    _common(result, reference)
    assert result.faulty_paid_wei == 0
    assert result.events.get("worker_replaced", 0) >= 1
    # caught by the heartbeat/ping rule or, first, by the straggler rule; either way within seconds
    assert result.detection_s is not None and 0 < result.detection_s < 30
    if result.silent_s is not None:
        assert result.silent_s >= CONFIG.heartbeat_timeout_s


# -- the checks themselves, without a devnet: each must be able to fail -------------------------

class _State:
    def __init__(self, deposited: int, paid: int, refunded: int) -> None:
        self.deposited, self.paid, self.refunded, self.closed, self.exists = deposited, paid, refunded, True, True


def _judged(tmp_path: Path, *, released: dict[str, int], refunded: int, deposited: int,
            replaced: list[tuple[str, str]], events: list[dict], accuracy: float, held: int = 0) -> ScenarioResult:
    run_ = harness.ScenarioRun("kill-provider", CONFIG, tmp_path)
    run_.tid = "training_x"
    run_.target = "0xB"
    run_.hired = [{"worker_id": w, "role": "worker", "price_wei": 10} for w in ("0xA", "0xB", "0xC", "0xD")]
    run_.hired.append({"worker_id": "0xE", "role": "spare", "price_wei": 20})
    result = ScenarioResult(scenario="kill-provider")
    entries = [{"event": "escrow_funded", "fields": {"deposit_wei": deposited}, "ts": 1.0}, *events]
    harness.judge(run_, result,
                  {"phase": "complete", "round_metrics": [{"round": r, "accuracy": accuracy} for r in (1, 2, 3)]},
                  {"ok": True, "entries": entries},
                  {"payments": [{"worker_id": w, "amount_wei": a} for w, a in released.items()]},
                  {"state": _State(deposited, sum(released.values()), refunded), "released": released,
                   "replaced": replaced, "refunded": refunded, "held": held, "redeemed": 0, "fees": 0,
                   "verification_funded": 0},
                  0.95)
    return result


def test_checks_pass_a_good_outcome(tmp_path):
    events = [{"event": "worker_replaced", "fields": {"worker": "0xB", "replacement": "0xE", "reason": "silent"},
               "ts": 2.0}]
    result = _judged(tmp_path, released={"0xA": 30, "0xC": 30, "0xD": 30, "0xE": 30}, refunded=0, deposited=120,
                     replaced=[("0xB", "0xE")], events=events, accuracy=0.95)
    assert not result.failures, result.failures


def test_checks_catch_a_paid_faulty_worker_lost_wei_and_bad_accuracy(tmp_path):
    events = [{"event": "worker_replaced", "fields": {"worker": "0xB", "replacement": "0xE", "reason": "silent"},
               "ts": 2.0}]
    result = _judged(tmp_path, released={"0xA": 30, "0xB": 30, "0xC": 30, "0xD": 30}, refunded=0, deposited=130,
                     replaced=[("0xB", "0xE")], events=events, accuracy=0.90)
    text = "\n".join(result.failures)
    assert "faulty worker 0xB was paid" in text
    assert "not conserved" in text
    assert "from clean's" in text
    assert "paid nothing" in text  # the spare took the slot over and earned nothing


def test_checks_count_what_the_refund_holds_for_receipts(tmp_path):
    events = [{"event": "worker_replaced", "fields": {"worker": "0xB", "replacement": "0xE", "reason": "silent"},
               "ts": 2.0}]
    paid = {"0xA": 30, "0xC": 30, "0xD": 30, "0xE": 30}
    held = _judged(tmp_path / "held", released=paid, refunded=0, deposited=130, held=10, replaced=[("0xB", "0xE")],
                   events=events, accuracy=0.95)
    assert not held.failures, held.failures
    short = _judged(tmp_path / "short", released=paid, refunded=0, deposited=130, held=5, replaced=[("0xB", "0xE")],
                    events=events, accuracy=0.95)
    assert any("not conserved" in f for f in short.failures)


def test_checks_catch_a_missing_audit_event(tmp_path):
    result = _judged(tmp_path, released={"0xA": 30, "0xC": 30, "0xD": 30, "0xE": 30}, refunded=0, deposited=120,
                     replaced=[("0xB", "0xE")], events=[], accuracy=0.95)
    assert any("no 'worker_replaced' event" in f for f in result.failures)
    assert not result.event_seen


def _judged_impostor(tmp_path: Path, *, hired_impostor: bool, flagged_event: bool) -> ScenarioResult:
    run_ = harness.ScenarioRun("fake-gpu", CONFIG, tmp_path)
    run_.tid, run_.flagged = "training_x", "0xF"
    run_.hired = [{"worker_id": w, "role": "worker", "price_wei": 10} for w in ("0xA", "0xB", "0xC", "0xD")]
    run_.hired.append({"worker_id": "0xF" if hired_impostor else "0xE", "role": "spare", "price_wei": 20})
    released = {w: 30 for w in ("0xA", "0xB", "0xC", "0xD")}
    events = [{"event": "escrow_funded", "fields": {"deposit_wei": 120}, "ts": 1.0}]
    if flagged_event:
        events.append({"event": "hardware_flagged", "fields": {"worker": "0xF", "reason": "late"}, "ts": 0.5})
    return _judged_complete_run(run_, events, released)


def _judged_complete_run(run_: harness.ScenarioRun, entries: list[dict], released: dict[str, int],
                         fees: int = 0, funded: int | None = None) -> ScenarioResult:
    """Judge a three-round run that completed at 0.95 with a 120-wei escrow fully released, and ``fees`` wei
    of verification paid from ``funded`` (as much, unless given) funded on chain."""
    funded = fees if funded is None else funded
    result = ScenarioResult(scenario=run_.name)
    harness.judge(run_, result,
                  {"phase": "complete", "round_metrics": [{"round": r, "accuracy": 0.95} for r in (1, 2, 3)]},
                  {"ok": True, "entries": entries},
                  {"payments": [{"worker_id": w, "amount_wei": a} for w, a in released.items()]},
                  {"state": _State(120 + funded, 120 + fees, funded - fees), "released": released, "replaced": [],
                   "refunded": funded - fees, "held": 0, "redeemed": 0, "fees": fees,
                   "verification_funded": funded}, 0.95)
    return result


def test_checks_pass_a_flagged_impostor_and_catch_a_hired_or_unflagged_one(tmp_path):
    good = _judged_impostor(tmp_path / "good", hired_impostor=False, flagged_event=True)
    assert not good.failures and good.event_seen and good.all_paid, good.failures
    hired = _judged_impostor(tmp_path / "hired", hired_impostor=True, flagged_event=True)
    assert any("impostor 0xF was hired" in f for f in hired.failures)
    unflagged = _judged_impostor(tmp_path / "unflagged", hired_impostor=False, flagged_event=False)
    assert any("no 'hardware_flagged' event for 0xF" in f for f in unflagged.failures)


def _judged_verifier(tmp_path: Path, scenario: str, events: list[dict], fees: int = 0,
                     funded: int | None = None) -> ScenarioResult:
    run_ = harness.ScenarioRun(scenario, CONFIG, tmp_path)
    run_.tid, run_.verifier = "training_x", "0xD"
    run_.hired = [{"worker_id": w, "role": "worker", "price_wei": 10} for w in ("0xA", "0xB", "0xC", "0xD")]
    released = {w: 30 for w in ("0xA", "0xB", "0xC", "0xD")}
    entries = [{"event": "escrow_funded", "fields": {"deposit_wei": 120}, "ts": 1.0},
               {"event": "verification", "fields": {"worker": "0xA", "verifier": "0xB", "outcome": "agreed"}, "ts": 2},
               *events]
    return _judged_complete_run(run_, entries, released, fees, funded)


def test_checks_want_a_lazy_verifier_caught_by_a_canary_and_slashed_and_nobody_else(tmp_path):
    caught = [{"event": "canary", "fields": {"worker": "0xD", "passed": False}, "ts": 3},
              {"event": "verifier_wrong", "fields": {"worker": "0xD", "reason": "canary"}, "ts": 3},
              {"event": "slashed", "fields": {"worker": "0xD"}, "ts": 4}]
    good = _judged_verifier(tmp_path / "good", "lazy-verifier", caught)
    assert not good.failures and good.event_seen, good.failures
    unslashed = _judged_verifier(tmp_path / "unslashed", "lazy-verifier", caught[:2])
    assert any("was not slashed" in f for f in unslashed.failures)
    innocent = _judged_verifier(tmp_path / "innocent", "lazy-verifier",
                                [*caught, {"event": "slashed", "fields": {"worker": "0xA"}, "ts": 5}])
    assert any("slashed ['0xA']" in f for f in innocent.failures)
    colluder = _judged_verifier(tmp_path / "colluder", "colluding-verifier", caught[2:])
    assert any("only a canary proves it" in f for f in colluder.failures)


def test_checks_want_a_hostile_verifier_shown_wrong_at_one_step_of_a_dispute(tmp_path):
    def shown(reason: str) -> list[dict]:
        return [{"event": "dispute", "fields": {"worker": "0xA", "verifier": "0xD", "outcome": "verifier",
                                                "steps_trained_here": 1}, "ts": 3},
                {"event": "verifier_wrong", "fields": {"worker": "0xD", "reason": reason}, "ts": 3},
                {"event": "slashed", "fields": {"worker": "0xD"}, "ts": 4}]
    good = _judged_verifier(tmp_path / "good", "hostile-verifier", shown("bisected to step 7: its trace ..."))
    assert not good.failures and good.event_seen, good.failures
    refereed = _judged_verifier(tmp_path / "refereed", "hostile-verifier", shown("disagrees with the referee's"))
    assert any("dispute's one step" in f for f in refereed.failures)


def test_checks_want_verification_fees_funded_and_paid_as_the_audit_log_says(tmp_path):
    caught = [{"event": "canary", "fields": {"worker": "0xD", "passed": False}, "ts": 3},
              {"event": "verifier_wrong", "fields": {"worker": "0xD", "reason": "canary"}, "ts": 3},
              {"event": "slashed", "fields": {"worker": "0xD"}, "ts": 4}]
    paid = {"event": "verifiers_paid", "fields": {"amount_wei": 5, "verifiers": {"0xB": 5}}, "ts": 5}
    good = _judged_verifier(tmp_path / "good", "lazy-verifier", [*caught, paid], fees=5)
    assert not good.failures and good.conservation_ok, good.failures
    unlogged = _judged_verifier(tmp_path / "unlogged", "lazy-verifier", caught, fees=5)
    assert any("verification fees: audit 0, paid on chain 5" in f for f in unlogged.failures)
    overfunded = _judged_verifier(tmp_path / "overfunded", "lazy-verifier", [*caught, paid], fees=5, funded=7)
    assert any("funded 7" in f for f in overfunded.failures)
