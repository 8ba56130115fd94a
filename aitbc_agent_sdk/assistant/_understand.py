"""Deterministic request understanding: concepts and entities in, a scored intent out (pure).

Each intent is a small rule: groups of features it *needs* (every group must have one
feature present), and weights for the features that speak for it or against it. A
feature is a concept from :mod:`._concepts` ("NODE", "CRASH", ...) or an extracted entity
("training_id", "price", ...). Features are a set, so word order does not matter, and a
paraphrase only has to use some synonym of each idea. The best-scoring intent wins if
it reaches :data:`THRESHOLD`; below that the request is reported as not understood.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ._concepts import concepts_in
from ._extract import Entities, extract
from ._text import tokens

THRESHOLD = 2.5


@dataclass(frozen=True)
class IntentRule:
    name: str
    needs: tuple[tuple[str, ...], ...]
    weights: dict[str, float]


RULES: tuple[IntentRule, ...] = (
    IntentRule("cluster_inventory", (("GPU", "HARDWARE"),), {
        "DETECT": 1.5, "GPU": 1.5, "HARDWARE": 1.5, "NODE": 1.0, "CLUSTER": 0.5,
        "MOUNT": -3, "BALANCE": -2.5, "RECOVER": -2, "CRASH": -2, "PAY_ACT": -3, "MARKET": -1.5, "price": -3,
        "training_id": -2, "TRAIN": -1.0, "host_count": -1.0, "WALLET": -1.5}),
    IntentRule("cluster_train", (("TRAIN", "DISTRIBUTE"), ("NODE", "CLUSTER", "host_count", "ACROSS")), {
        "TRAIN": 1.5, "DISTRIBUTE": 2, "NODE": 1, "host_count": 2, "ACROSS": 1, "CLUSTER": 0.5, "ALL": 0.5,
        "price": -3, "MARKET": -1.5, "training_id": -2, "MOUNT": -2, "BALANCE": -1.5, "RECOVER": -2,
        "CRASH": -2, "PAY_ACT": -3, "DETECT": -0.5, "GPU": -0.5, "source": -3, "STATUS": -1.5}),
    IntentRule("cluster_mount", (("MOUNT", "source", "SHARE"), ("MOUNT", "source", "DATA")), {
        "MOUNT": 3, "source": 2, "DATA": 1, "NODE": 0.5, "SHARE": 1, "ACROSS": 0.5, "ALL": 0.5,
        "PAY_ACT": -3, "price": -3, "BALANCE": -1, "CRASH": -1.5, "STATUS": -1, "training_id": -1}),
    IntentRule("cluster_balance", (("BALANCE",), ("MEMORY", "GPU", "BATCH")), {
        "BALANCE": 3, "MEMORY": 1.5, "GPU": 0.5, "BATCH": 1, "batch": 1,
        "WALLET": -3, "PAY_ACT": -3, "price": -2, "MOUNT": -2, "CRASH": -1.5}),
    IntentRule("cluster_recover", (("RECOVER", "CRASH"),), {
        "RECOVER": 2, "CRASH": 2, "NODE": 1, "host_name": 1, "CLUSTER": 0.5,
        "training_id": -1.5, "COORD": -2, "PAY_ACT": -3, "MOUNT": -2, "RESUME": -0.5, "STATUS": -0.5}),
    IntentRule("resume", (("RESUME", "RECOVER", "CRASH"), ("training_id", "COORD")), {
        "RESUME": 2.5, "COORD": 2, "training_id": 2, "TRAIN": 0.5, "RECOVER": 1,
        "NODE": -1.5, "host_name": -2, "PAY_ACT": -3}),
    IntentRule("market_train", (("TRAIN", "language_model"),
                                ("MARKET", "price", "gpu_model", "worker_count", "language_model")), {
        "TRAIN": 2, "MARKET": 1.5, "price": 1.5, "gpu_model": 1, "worker_count": 1, "HIRE": 1, "model_type": 1,
        "language_model": 1.5,
        "path": 0.5, "NODE": -1.5, "host_count": -2, "training_id": -3, "STATUS": -1.5, "PAY_ACT": -2,
        "PAYMENT_REC": -1, "MOUNT": -2, "CRASH": -2, "INIT": -2, "WALLET": -0.5, "COST": -2}),
    IntentRule("market_offers", (("MARKET", "price", "gpu_model"), ("DETECT", "HIRE", "price", "SHOWISH")), {
        "MARKET": 2, "DETECT": 1, "price": 1.5, "gpu_model": 1, "worker_count": 0.5,
        "TRAIN": -2.5, "training_id": -2, "PAY_ACT": -3, "PAYMENT_REC": -1.5, "NODE": -1, "CLUSTER": -1.5,
        "STATUS": -1, "WALLET": -1}),
    IntentRule("discover_workers", (("training_id",), ("HIRE", "MARKET")), {
        "training_id": 2, "HIRE": 2, "MARKET": 1.5, "price": 1, "gpu_model": 1, "worker_count": 1,
        "PAY_ACT": -3, "STATUS": -1.5, "PAYMENT_REC": -1.5, "FUND": -1}),
    IntentRule("distribute", (("training_id",), ("FUND",)), {
        "training_id": 2, "FUND": 2, "DISTRIBUTE": 1,
        "NODE": -1.5, "host_count": -2, "STATUS": -1, "PAY_ACT": -2, "HIRE": -0.5, "UPLOAD": -1}),
    IntentRule("training_init", (("INIT",), ("TRAIN", "model_type", "language_model")), {
        "INIT": 2, "TRAIN": 1, "model_type": 1, "language_model": 1, "worker_count": 0.5, "rounds": 0.5,
        "price": -1, "training_id": -2, "NODE": -1.5, "host_count": -2, "MOUNT": -2, "BALANCE": -2,
        "PAY_ACT": -2, "STATUS": -1}),
    IntentRule("upload_data", (("UPLOAD",), ("DATA", "path", "dataset")), {
        "UPLOAD": 2.5, "DATA": 1, "path": 1, "training_id": 1,
        "MOUNT": -2, "NODE": -1, "PAY_ACT": -2, "source": -3}),
    IntentRule("training_status", (("STATUS",), ("TRAIN", "training_id", "language_model")), {
        "STATUS": 2, "training_id": 2, "TRAIN": 1, "language_model": 1,
        "PAY_ACT": -2, "WALLET": -2, "price": -2, "CRASH": -1, "NODE": -1, "GPU": -1, "MOUNT": -2,
        "PAYMENT_REC": -1}),
    IntentRule("pay_workers", (("PAY_ACT",),), {
        "PAY_ACT": 3, "LEAD_PAY_ACT": 2, "MARKET": 1, "training_id": 1, "SHOWISH": -2, "PAST": -2, "WALLET": -1}),
    IntentRule("payments", (("PAYMENT_REC", "PAY_ACT"), ("SHOWISH", "PAST")), {
        "PAYMENT_REC": 2, "SHOWISH": 1.5, "PAST": 1.5, "training_id": 1, "MARKET": 0.5,
        "WALLET": -1, "COST": -1.5}),
    # "How much would 8 RTX 4090s for 20 rounds cost?": a figure, never a plan that hires or pays.
    IntentRule("cost_estimate", (("COST",), ("worker_count", "gpu_model", "rounds", "MARKET", "TRAIN")), {
        "COST": 3, "worker_count": 1, "gpu_model": 1, "rounds": 1, "MARKET": 0.5, "TRAIN": 0.5,
        "training_id": -3, "PAST": -3, "WALLET": -1, "NODE": -1, "host_count": -2}),
    IntentRule("wallet_balance", (("WALLET",),), {
        "WALLET": 2.5, "BALWORD": 1, "SHOWISH": 0.5, "wallet": 1,
        "MEMORY": -3, "GPU": -2, "PAY_ACT": -2, "BATCH": -2, "training_id": -1, "TRAIN": -1}),
)

_CLAUSE_SPLIT = re.compile(r"\s*(?:;|\bthen\b|\bafter that\b|\bafterwards\b|\band also\b|\bnext\b)\s*",
                           re.IGNORECASE)


@dataclass
class Understanding:
    """One clause understood (or not): the winning intent, every score, and the entities."""

    text: str
    intent: str | None
    score: float
    scores: dict[str, float]
    entities: Entities
    features: set[str] = field(default_factory=set)

    @property
    def understood(self) -> bool:
        return self.intent is not None


_POLITE = {"please", "pleas", "now", "can", "could", "would", "will", "you", "just", "go", "ahead", "and", "ok",
           "okay", "kindly", "hey", "so"}


def features_of(ent: Entities, toks: list[str]) -> set[str]:
    """Concepts anywhere, the concepts of the leading verb (an imperative: LEAD_*), and entities."""
    found = concepts_in(toks)
    lead = next((t for t in toks if t not in _POLITE), None)
    if lead is not None:
        found |= {f"LEAD_{c}" for c in concepts_in([lead])}
    for name in ("training_id", "price", "gpu_model", "model_type", "host_count", "worker_count", "host_name",
                 "batch", "rounds", "wallet", "dataset", "source"):
        if getattr(ent, name):
            found.add(name)
    if ent.paths:
        found.add("path")
    if ent.lm.task:
        found.add("language_model")
    if ent.gpu_model:
        found.add("GPU")
    return found


def score(rule: IntentRule, features: set[str]) -> float | None:
    """The rule's score, or None when one of its needed groups has no feature present."""
    if not all(any(f in features for f in group) for group in rule.needs):
        return None
    return sum(w for f, w in rule.weights.items() if f in features)


def understand_clause(text: str) -> Understanding:
    ent = extract(text)
    feats = features_of(ent, tokens(ent.masked))
    scores = {r.name: s for r in RULES if (s := score(r, feats)) is not None}
    best = max(scores, key=lambda n: scores[n], default=None)
    if best is None or scores[best] < THRESHOLD:
        return Understanding(text, None, scores.get(best, 0.0) if best else 0.0, scores, ent, feats)
    return Understanding(text, best, scores[best], scores, ent, feats)


def understand(text: str) -> list[Understanding]:
    """One understanding per clause ("X, then Y"), or the whole text as one clause.

    Clauses are used only when every one of them is understood; otherwise the whole
    request is read as one (its best intent, or not understood).
    """
    clauses = [c for c in _CLAUSE_SPLIT.split(text) if c and c.strip(" ,.")]
    if len(clauses) > 1:
        parts = [understand_clause(c) for c in clauses]
        if all(p.understood for p in parts):
            return parts
    return [understand_clause(text)]
