"""The measured re-execution tolerances shipped with the SDK, and the rule that picks one for a result.

``tolerances.json`` beside this module holds rows that ``scripts/spot_check_tolerance.py --table`` wrote
from measurements (``docs/usage/verification.md`` gives the method). A result is compared bit for bit when
either side says CPU: a worker hired as a CPU is held to that whatever its commitment claims. A GPU
result gets its device class's measured bound when the table has one, else the training's
``reexec_tolerance``, and the audit log says which.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from ..records import CPU_CLASS, ToleranceTable

TABLE_FILE = "tolerances.json"
UNMEASURED = "unmeasured: the training's reexec_tolerance"


def shipped_tolerances() -> ToleranceTable:
    """The table in the installed package (validated like anything read from outside)."""
    text = resources.files(__package__).joinpath(TABLE_FILE).read_text(encoding="utf-8")
    return ToleranceTable.model_validate_json(text)


@dataclass(frozen=True)
class Comparison:
    """How one re-executed segment is compared: ``exact`` (bit for bit), else within ``tolerance``."""

    exact: bool
    tolerance: float
    source: str


def precision_of(committed_device: str, task_bf16: bool) -> str:
    """The precision a job trained at: bf16 autocast on a GPU where the task allows it (the task loop's rule)."""
    return "bf16" if committed_device == "cuda" and task_bf16 else "fp32"


def comparison_for(table: ToleranceTable, *, device_class: str, committed_device: str, precision: str,
                   reference: str, default: float) -> Comparison:
    """The comparison for a result of a worker hired as ``device_class`` whose commitment says it trained on
    ``committed_device``, re-executed on ``reference``."""
    if device_class == CPU_CLASS or committed_device == "cpu":
        return Comparison(exact=True, tolerance=0.0, source="bit for bit: a CPU")
    row = table.bound_for(device_class, precision, reference)
    if row is None:
        return Comparison(exact=False, tolerance=default, source=UNMEASURED)
    return Comparison(exact=False, tolerance=row.bound,
                      source=f"measured: {device_class} {precision} against {reference}")
