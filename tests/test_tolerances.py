"""Re-execution tolerances per device class (issue #29, item 3): the shipped table, the rule that picks a
comparison, and the device class a worker is hired as."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from aitbc_agent_sdk.proof._tolerances import UNMEASURED, comparison_for, precision_of, shipped_tolerances
from aitbc_agent_sdk.records import (
    CPU_CLASS, UNCONFIRMED_CLASS, GpuInfo, Hardware, Offer, ToleranceRow, ToleranceTable, Worker, WorkerContract,
)

REPO = Path(__file__).resolve().parents[1]
ADDRESS = "0x" + "ab" * 20
H200 = "NVIDIA H200"


def row(device_class: str = H200, precision: str = "bf16", reference: str = "cpu", bound: float = 0.02,
        honest: float = 0.004, skipped: float = 0.6) -> ToleranceRow:
    return ToleranceRow(device_class=device_class, precision=precision, reference=reference, bound=bound,
                        honest_max=honest, skipped_min=skipped, segments=32, measured="test")


def worker(gpus: tuple[str, ...], check: str = "passed") -> Worker:
    hardware = Hardware(cpu_model="c", cpu_cores=2, ram_bytes=1 << 30,
                        gpus=tuple(GpuInfo(name=g, memory_total_bytes=1 << 30) for g in gpus))
    return Worker(worker_id=ADDRESS, offer=Offer(provider=ADDRESS, price_wei=1, hardware=hardware), reputation=1.0,
                  hardware_check=check)


def test_the_shipped_table_loads_and_every_row_lies_between_what_it_measured():
    table = shipped_tolerances()
    on_disk = json.loads((REPO / "aitbc_agent_sdk" / "proof" / "tolerances.json").read_text())
    assert len(table.rows) == len(on_disk["rows"])
    assert all(r.honest_max <= r.bound < r.skipped_min for r in table.rows)


def test_a_bound_outside_its_measurement_is_refused():
    with pytest.raises(ValidationError, match="not between"):
        row(bound=0.7)  # above what a skipped segment measured: it would pass the cheat
    with pytest.raises(ValidationError, match="not between"):
        row(bound=0.001)  # below what honest work measured: it would slash honest noise
    with pytest.raises(ValidationError):
        row(device_class="NVIDIA\nH200")  # a class name is one printable line


def test_a_cpu_is_compared_bit_for_bit_whatever_its_result_claims():
    table = ToleranceTable(rows=(row(),))
    hired_as_cpu = comparison_for(table, device_class=CPU_CLASS, committed_device="cuda", precision="bf16",
                                  reference="cpu", default=0.05)
    assert hired_as_cpu.exact and hired_as_cpu.tolerance == 0.0
    says_cpu = comparison_for(table, device_class=H200, committed_device="cpu", precision="fp32",
                              reference="cpu", default=0.05)
    assert says_cpu.exact


def test_a_gpu_gets_its_class_measured_bound_and_an_unmeasured_one_the_trainings_default():
    table = ToleranceTable(rows=(row(), row(precision="fp32", bound=0.01, honest=0.001)))
    measured = comparison_for(table, device_class=H200, committed_device="cuda", precision="bf16",
                              reference="cpu", default=0.05)
    assert (measured.exact, measured.tolerance) == (False, 0.02) and measured.source.startswith("measured")
    fp32 = comparison_for(table, device_class=H200, committed_device="cuda", precision="fp32", reference="cpu",
                          default=0.05)
    assert fp32.tolerance == 0.01
    other = comparison_for(table, device_class="NVIDIA A100-SXM4-80GB", committed_device="cuda", precision="bf16",
                           reference="cpu", default=0.05)
    assert (other.tolerance, other.source) == (0.05, UNMEASURED)
    # a bound measured against the class itself is not one against the coordinator's CPU
    same_class = ToleranceTable(rows=(row(reference=H200, bound=0.001, honest=0.0),))
    assert comparison_for(same_class, device_class=H200, committed_device="cuda", precision="bf16",
                          reference="cpu", default=0.05).source == UNMEASURED


def test_precision_follows_the_task_loop_rule():
    assert precision_of("cuda", True) == "bf16"
    assert precision_of("cuda", False) == "fp32"
    assert precision_of("cpu", True) == "fp32"


def test_the_device_class_is_what_hiring_confirmed_never_a_claim():
    assert worker(()).device_class == CPU_CLASS
    assert worker((H200,)).device_class == H200
    assert worker((H200,), check="flagged").device_class == UNCONFIRMED_CLASS  # the challenge did not confirm it
    assert worker((H200,), check="unchecked").device_class == UNCONFIRMED_CLASS
    assert worker(("NVIDIA\x00H200",)).device_class == UNCONFIRMED_CLASS  # not a name a class can carry
    contract = WorkerContract(contract_id="c-1", training_id="t-1", worker_id=ADDRESS, coordinator=ADDRESS,
                              price_wei=1, rounds=1, accepted_at=0.0)
    assert contract.device_class == UNCONFIRMED_CLASS  # a contract stored before #29 claims nothing


def test_the_measuring_script_writes_rows_the_table_accepts(tmp_path):
    out = tmp_path / "tolerances.json"
    done = subprocess.run([sys.executable, "scripts/spot_check_tolerance.py", "--table", str(out), "--quick"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    table = ToleranceTable.model_validate_json(out.read_text())
    # on a CPU the table gains nothing (a CPU is bit for bit), and the script says it measured exactly that
    assert table.rows == ()
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["device"] == "cpu"
    assert all(d["honest"]["cpu"] == 0.0 and d["skipped"]["cpu"] > 0.05
               for d in summary["worst_relative_distance"].values())


def test_the_bound_sits_between_honest_and_skipped_and_a_merge_replaces_rows_of_its_key(tmp_path):
    from scripts.spot_check_tolerance import merge_table, middle_bound

    assert middle_bound(0.004, 0.64) == pytest.approx(0.0506, rel=1e-3)  # sqrt(0.004 * 0.64)
    assert 0.0 < middle_bound(0.0, 0.6) < 0.6  # a deterministic kernel still gets a bound above 0
    assert middle_bound(0.7, 0.6) is None  # honest noise as large as skipped work: nothing separates them
    path = tmp_path / "tolerances.json"
    merge_table(path, [row(), row(reference=H200, bound=0.001, honest=0.0)])
    merge_table(path, [row(bound=0.03)])
    table = ToleranceTable.model_validate_json(path.read_text())
    assert [(r.reference, r.bound) for r in table.rows] == [(H200, 0.001), ("cpu", 0.03)]
    assert not list(tmp_path.glob("*.partial"))


def test_a_table_that_is_not_one_is_refused_with_exit_2_and_left_as_it_was(tmp_path):
    bad = tmp_path / "tolerances.json"
    bad.write_text('{"version": 1, "rows": [{"device_class": "x"}]}')
    done = subprocess.run([sys.executable, "scripts/spot_check_tolerance.py", "--table", str(bad), "--quick"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "is not a tolerance table" in done.stderr, done.stderr[-2000:]
    assert bad.read_text() == '{"version": 1, "rows": [{"device_class": "x"}]}'
    assert not list(tmp_path.glob("*.partial"))
