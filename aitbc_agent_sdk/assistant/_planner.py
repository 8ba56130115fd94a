"""From understood intents to a plan: tool steps with the arguments the request gave (pure).

Only what the request said goes into the arguments; everything else is the tool's
default, shown by the tool itself (one exception: a language model gets DiLoCo unless the
request asks for FedAvg, and the reply says so). A step that works on "the" training and names none
works on the training an earlier step of the same plan created (or, alone, the newest).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._extract import Entities
from ._understand import Understanding, understand


@dataclass
class Step:
    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": self.arguments}


@dataclass
class Plan:
    request: str
    steps: list[Step]
    intents: list[str] = field(default_factory=list)

    @property
    def understood(self) -> bool:
        return bool(self.steps)

    def as_json(self) -> dict[str, Any]:
        return {"understood": self.understood, "steps": [s.as_json() for s in self.steps]}


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _price(e: Entities) -> float | None:
    return float(e.price) if e.price is not None else None


def _data(e: Entities) -> str | None:
    return next((p for p in e.paths), None) or e.dataset


def _mount_point(e: Entities) -> str | None:
    return next((p for p in e.paths if p.startswith("/")), None)


def _script(e: Entities) -> str | None:
    return next((p for p in e.paths if p.endswith(".py")), None)


def _datasets(e: Entities) -> list[str] | None:
    found = [p for p in e.paths if not p.endswith(".py")]
    return found or None


def _init(e: Entities) -> dict[str, Any]:
    """training_init's arguments: the classifier named, or the language model asked for and its settings
    (DiLoCo unless FedAvg was asked for: a language model over rented links is what it is for)."""
    common = _given(target_workers=e.worker_count, rounds=e.rounds, epochs=e.epochs, wallet=e.wallet)
    lm = e.lm
    if lm.task is None:
        return {**_given(model_type=e.model_type), **common}
    return {**_given(task=lm.task, task_params=lm.params or None, outer=lm.outer or "diloco", outer_lr=lm.outer_lr,
                     outer_momentum=lm.outer_momentum, update_encoding=lm.update_encoding), **common}


def _upload(e: Entities, default: str | None) -> dict[str, Any]:
    """upload_data's arguments; a language model's data must be a text corpus, and none named is no default."""
    if e.lm.task is None:
        return _given(data_path=_data(e) or default)
    return _given(data_path=next(iter(e.paths), None) or e.lm.corpus, text_corpus=True)


def cluster_train(e: Entities) -> list[Step]:
    return [Step("cluster_train", _given(hosts=e.host_count, cluster=e.cluster, script=_script(e),
                                         script_args=e.script_args or None, datasets=_datasets(e),
                                         checkpoint_dir=e.checkpoint_dir, wallet=e.wallet))]


def market_train(e: Entities) -> list[Step]:
    count = e.worker_count
    return [Step("training_init", _init(e)),
            Step("upload_data", _upload(e, "digits")),
            Step("discover_workers", _given(required_workers=count, min_gpu=e.gpu_model, max_price=_price(e))),
            Step("distribute", {})]


PLANNERS: dict[str, Callable[[Entities], list[Step]]] = {
    "cluster_inventory": lambda e: [Step("cluster_inventory", _given(cluster=e.cluster))],
    "cluster_train": cluster_train,
    "cluster_mount": lambda e: [Step("cluster_mount", _given(source=e.source, mount_point=_mount_point(e),
                                                             cluster=e.cluster, wallet=e.wallet))],
    "cluster_balance": lambda e: [Step("cluster_balance", _given(cluster=e.cluster, global_batch=e.batch))],
    "cluster_recover": lambda e: [Step("cluster_recover", _given(cluster=e.cluster, host=e.host_name,
                                                                 wallet=e.wallet))],
    "market_train": market_train,
    "market_offers": lambda e: [Step("market_offers", _given(min_gpu=e.gpu_model, max_price=_price(e),
                                                             limit=e.worker_count))],
    "discover_workers": lambda e: [Step("discover_workers", _given(
        training_id=e.training_id, required_workers=e.worker_count, min_gpu=e.gpu_model, max_price=_price(e)))],
    "distribute": lambda e: [Step("distribute", _given(training_id=e.training_id))],
    "resume": lambda e: [Step("resume", _given(training_id=e.training_id))],
    "training_init": lambda e: [Step("training_init", _init(e))],
    "upload_data": lambda e: [Step("upload_data", {**_given(training_id=e.training_id), **_upload(e, None)})],
    "training_status": lambda e: [Step("monitor", _given(training_id=e.training_id))],
    "pay_workers": lambda e: [Step("pay_workers", _given(training_id=e.training_id))],
    "payments": lambda e: [Step("payments", _given(training_id=e.training_id))],
    "wallet_balance": lambda e: [Step("wallet_balance", _given(wallet=e.wallet))],
    "cost_estimate": lambda e: [Step("cost_estimate", _given(workers=e.worker_count, rounds=e.rounds,
                                                             min_gpu=e.gpu_model, max_price=_price(e)))],
}


def plan_from(parts: list[Understanding], request: str) -> Plan:
    steps: list[Step] = []
    intents: list[str] = []
    for part in parts:
        if part.intent is None:
            return Plan(request, [], [])
        intents.append(part.intent)
        steps += PLANNERS[part.intent](part.entities)
    return Plan(request, steps, intents)


def plan_request(text: str) -> Plan:
    """Understand ``text`` and plan it; an empty plan means it was not understood."""
    return plan_from(understand(text), text)
