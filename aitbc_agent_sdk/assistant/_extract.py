"""Parameter extraction from a request's raw text (pure, no I/O).

Entities that punctuation would break (paths, ``server:/export``, ``s3://bucket``,
training ids, prices, GPU models) are found on the raw text first and replaced by
placeholder words (``zpath``, ``znfs``, ...), so the word-level pass still sees *that*
a path was given. Counts are then read from the words: a number followed, within a
few words, by a host noun or a worker noun.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal

from ._lm_request import LmRequest, read_language_model
from ._text import raw_words

TRAINING_ID = re.compile(r"\btraining_[A-Za-z0-9]+\b")
S3_URL = re.compile(r"\bs3://[A-Za-z0-9][A-Za-z0-9.\-_]*(?:/[\w.\-/]*)?")
NFS_SOURCE = re.compile(r"(?<![\w/:])(?!s3:)(?!https?:)([A-Za-z0-9][A-Za-z0-9.\-]*):(/[\w.\-/]*)")
LOCAL_PATH = re.compile(r"(?<![\w:/.~])((?:~|\.{1,2})?/[\w.\-/]*|\.\.?(?=[\s,;]|$))")
DATA_FILE = re.compile(r"(?<![\w/.])[\w\-]+\.(?:npz|pt|csv|py)\b")
GPU_MODEL = re.compile(
    r"\b(?:nvidia\s+)?(?:geforce\s+)?(?:(?P<family>rtx|gtx)\s*-?\s*(?P<num>\d{4})(?:\s*ti)?"
    r"|(?P<dc>a100|h100|h200|v100|a10|a40|a6000|l40s|l40|l4|t4)"
    r"|(?P<bare>(?:30|40)[5-9]0))s?\b", re.IGNORECASE)
_NUM = r"(\d+(?:\.\d+)?|\.\d+)"
_CURRENCY = r"\s*(?:eth|ether)?"
PRICE_PATTERNS = (
    re.compile(r"(?:under|below|less than|cheaper than|at most|no more than|not more than|up to|capped at|"
               r"max(?:imum)?(?: price)?(?: of| is|:|=)?|price cap(?: of| is|:)?|cap(?: of| at)?|<=?)\s*"
               r"(?:eth\s*)?" + _NUM + _CURRENCY, re.IGNORECASE),
    re.compile(_NUM + _CURRENCY + r"\s*(?:each|apiece|a piece|per (?:round|worker|gpu|provider|node)|/\s*round|"
               r"a round|max|or less|tops|at most)\b", re.IGNORECASE),
)
MODEL_WORDS = {"transformer": "transformer", "transformers": "transformer", "cnn": "cnn", "convnet": "cnn",
               "convolutional": "cnn", "conv": "cnn", "mlp": "mlp", "perceptron": "mlp"}
HOST_NOUNS = {"host", "hosts", "node", "nodes", "machine", "machines", "server", "servers", "box", "boxes",
              "computer", "computers", "instance", "instances", "vm", "vms"}
WORKER_NOUNS = {"worker", "workers", "provider", "providers", "gpu", "gpus", "card", "cards", "peer", "peers",
                "seller", "sellers", "offer", "offers", "rtx", "zgpumodel"}
_HOST_NAME = re.compile(r"\b(?:node|host|machine|server|box)\s+([A-Za-z][\w.\-]*\d[\w.\-]*)\b", re.IGNORECASE)
_HOST_NAME_SUBJECT = re.compile(
    r"\b([A-Za-z][\w.\-]*\d[\w.\-]*)\s+(?:crashed|died|failed|hung|stopped responding|"
    r"(?:is|went|has gone|seems)\s+(?:down|offline|dead|unresponsive|unreachable|missing))",
    re.IGNORECASE)
_CLUSTER = (re.compile(r"\bcluster\s+(?:named\s+|called\s+)?([A-Za-z0-9_][\w.\-]*)", re.IGNORECASE),
            re.compile(r"\b([A-Za-z0-9_][\w.\-]*)\s+cluster\b", re.IGNORECASE))
_WALLET = (re.compile(r"\bwallet\s+(?:named\s+|called\s+)?([A-Za-z0-9_][\w.\-]*)", re.IGNORECASE),
           re.compile(r"\b([A-Za-z0-9_][\w.\-]*)\s+wallet\b", re.IGNORECASE))
_NOT_NAMES = {"the", "my", "our", "a", "this", "that", "whole", "entire", "each", "every", "all", "its",
              "of", "in", "on", "for", "across", "is", "and", "trusted", "local", "your", "gpu", "what",
              "whats", "how", "much", "balance", "to", "named", "called", "which", "current", "s", "gpu", "gpus",
              "node", "nodes", "host", "hosts", "machines", "hardware", "memory", "inventory", "members", "now",
              "please", "with", "have", "has", "are", "using", "status", "state", "usage", "be", "so", "at",
              "do", "does", "was", "were", "it", "them", "they", "here", "there", "by", "from", "an"}
_CHECKPOINTS = re.compile(r"\bcheckpoint(?:s|ing)?\s+(?:(?:go\s+)?(?:in|to|into|at|under)|dir(?:ectory)?)\s+"
                          r"((?:~|\.{1,2})?/[\w.\-/]*)", re.IGNORECASE)
IPFS_CID = re.compile(r"\b(?:ipfs://)?((?:Qm[1-9A-HJ-NP-Za-km-z]{44})|(?:bafy[a-z2-7]{50,}))\b")
_ROUNDS = re.compile(r"\b(\d+)\s+(?:federated\s+)?rounds?\b", re.IGNORECASE)
_EPOCHS = re.compile(r"\b(\d+)\s+(?:local\s+)?epochs?\b", re.IGNORECASE)
_BATCH = re.compile(r"\b(?:global\s+)?batch(?:\s+size)?\s*(?:of|=|:|is)?\s*(\d+)\b|\b(\d+)\s+samples?\s+per\s+step",
                    re.IGNORECASE)


@dataclass
class Entities:
    """Everything extracted from one request; ``masked`` is the text with placeholders."""

    masked: str
    training_id: str | None = None
    script_args: list[str] = field(default_factory=list)
    checkpoint_dir: str | None = None
    ipfs: str | None = None
    s3: str | None = None
    nfs: str | None = None
    paths: list[str] = field(default_factory=list)
    price: Decimal | None = None
    gpu_model: str | None = None
    model_type: str | None = None
    host_count: int | None = None
    worker_count: int | None = None
    counts: list[int] = field(default_factory=list)
    rounds: int | None = None
    epochs: int | None = None
    batch: int | None = None
    host_name: str | None = None
    cluster: str | None = None
    wallet: str | None = None
    dataset: str | None = None
    lm: LmRequest = field(default_factory=LmRequest)  # lm.task is set when a language model is asked for

    @property
    def source(self) -> str | None:
        """What to mount: an NFS ``server:/export``, an ``s3://bucket`` or ``ipfs://CID``."""
        return self.nfs or self.s3 or (f"ipfs://{self.ipfs}" if self.ipfs else None)


def _sub(pattern: re.Pattern[str], placeholder: str, text: str, found: list[str], group: int = 0) -> str:
    def keep(match: re.Match[str]) -> str:
        found.append(match.group(group).rstrip(".,;:"))
        return f" {placeholder} "
    return pattern.sub(keep, text)


def gpu_name(match: re.Match[str]) -> str:
    if match.group("family"):
        return f"{match.group('family').upper()}{match.group('num')}"
    if match.group("dc"):
        return match.group("dc").upper()
    return f"RTX{match.group('bare')}"


def _name(pattern: re.Pattern[str], text: str) -> str | None:
    """The first capture of ``pattern`` in ``text`` that is a name, not a filler word."""
    for match in pattern.finditer(text):
        name = next((g for g in match.groups() if g), None)
        if name is not None and name.lower() not in _NOT_NAMES:
            return name
    return None


def extract(text: str) -> Entities:
    text, _, rest = text.partition(" -- ")  # what follows " -- " is the script's own arguments
    script_args = rest.split()
    checkpoint = _CHECKPOINTS.search(text)
    if checkpoint is not None:
        text = text[: checkpoint.start()] + " checkpoints " + text[checkpoint.end():]
    cids: list[str] = []
    text = _sub(IPFS_CID, "zcid", text, cids, 1)
    ids: list[str] = []
    s3: list[str] = []
    nfs: list[str] = []
    paths: list[str] = []
    masked = _sub(TRAINING_ID, "ztid", text, ids)
    masked = _sub(S3_URL, "zsurl", masked, s3)
    masked = _sub(NFS_SOURCE, "znfs", masked, nfs)
    masked = _sub(LOCAL_PATH, "zpath", masked, paths, 1)
    masked = _sub(DATA_FILE, "zpath", masked, paths)
    lm, masked = read_language_model(masked)
    ent = Entities(masked="", training_id=ids[0] if ids else None, s3=s3[0] if s3 else None,
                   script_args=script_args, ipfs=cids[0] if cids else None,
                   checkpoint_dir=checkpoint.group(1).rstrip(".,;:") if checkpoint else None,
                   nfs=nfs[0] if nfs else None, paths=[p for p in paths if p not in ("", "/")], lm=lm)
    gpu = GPU_MODEL.search(masked)
    if gpu:
        ent.gpu_model = gpu_name(gpu)
        masked = GPU_MODEL.sub(" zgpumodel ", masked)
    for pattern in PRICE_PATTERNS:
        if (price := pattern.search(masked)) is not None:
            ent.price = Decimal(price.group(1))
            masked = masked[: price.start()] + " zprice " + masked[price.end():]
            break
    ent.host_name = _name(_HOST_NAME, masked) or _name(_HOST_NAME_SUBJECT, masked)
    if ent.host_name:
        masked = re.sub(rf"\b{re.escape(ent.host_name)}\b", " zhost ", masked)
    ent.cluster = _name(_CLUSTER[0], masked) or _name(_CLUSTER[1], masked)
    ent.wallet = _name(_WALLET[0], masked) or _name(_WALLET[1], masked)
    for pattern, attr in ((_ROUNDS, "rounds"), (_EPOCHS, "epochs")):
        if (m := pattern.search(masked)) is not None:
            setattr(ent, attr, int(m.group(1)))
            masked = masked[: m.start()] + " " + masked[m.end():]
    if (m := _BATCH.search(masked)) is not None:
        ent.batch = int(m.group(1) or m.group(2))
    ent.masked = masked
    _counts(ent, raw_words(masked))
    return ent


def _counts(ent: Entities, words: list[str]) -> None:
    """Numbers tied to a host or worker noun within three words; model names; the bundled dataset."""
    for i, word in enumerate(words):
        if word in MODEL_WORDS and ent.model_type is None:
            ent.model_type = MODEL_WORDS[word]
        if word == "digits":
            ent.dataset = "digits"
        if not word.isdigit():
            continue
        value = int(word)
        ent.counts.append(value)
        ahead = words[i + 1:i + 4]
        host = next((n for n, w in enumerate(ahead) if w in HOST_NOUNS), None)
        worker = next((n for n, w in enumerate(ahead) if w in WORKER_NOUNS), None)
        if host is not None and (worker is None or host <= worker) and ent.host_count is None:
            ent.host_count = value
        elif worker is not None and ent.worker_count is None:
            ent.worker_count = value
        elif i > 0 and words[i - 1] in ("across", "over", "onto", "between") and ent.host_count is None:
            ent.host_count = value
