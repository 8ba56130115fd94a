"""What a request says about a language model (pure, no I/O): that it wants one, the model's size,
the corpus, the outer optimizer and how updates are encoded.

"Train a GPT on my text corpus ./wiki" is a language model; so is a transformer on text, a
next-token model, an LLM. Size phrases ("6 layers", "8 heads", "width 256", "context 512") are
read only for a language model and masked, so their numbers are not taken for worker counts.
Asking for compression or a low-bandwidth link picks DiLoCo with int8 updates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LANGUAGE_MODEL_TASK = "gpt"

_I = re.IGNORECASE
LM_WORDS = re.compile(r"\b(?:(?:nano)?gpt(?:-?\d)?s?|llms?|lms?|language[\s-]+models?|next[\s-]+(?:token|word|"
                      r"character|char|byte)s?|causal[\s-]+(?:lm|language)|decoder[\s-]+only|text[\s-]+generat\w*|"
                      r"generat\w*\s+text|autoregressive)\b", _I)
TEXT_CORPUS = re.compile(r"\b(?:text\s+corp\w*|corp\w*\s+of\s+text|\.?txt\s+files?|text\s+files?|plain\s+text)\b", _I)
TEXT_WORDS = re.compile(r"\b(?:text|texts|corpus|corpora|prose|books?|articles?|wikipedia|tokens?)\b", _I)
TRANSFORMER = re.compile(r"\btransformers?\b", _I)
CLASSIFIER = re.compile(r"\b(?:cnn|convnet|convolutional|mlp|perceptron|classifier)\b", _I)
_OF = r"\s*(?:of|=|:|is)?\s*"
SIZES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("layers", re.compile(r"\b(\d+)[\s-]*(?:transformer\s+)?(?:layers?|blocks?)\b|\b(?:layers?|depth)" + _OF
                          + r"(\d+)\b", _I)),
    ("heads", re.compile(r"\b(\d+)[\s-]*(?:attention\s+)?heads?\b|\bheads?" + _OF + r"(\d+)\b", _I)),
    ("width", re.compile(r"\b(?:width|d_?model|embedding(?:\s+(?:size|dim\w*|width))?|model\s+dim\w*)" + _OF
                         + r"(\d+)\b|\b(\d+)[\s-]*(?:wide|dim(?:ensional)?s?|d_?model)\b", _I)),
    ("context", re.compile(r"\b(?:context(?:\s+(?:length|window|size))?|block\s+size|seq(?:uence)?\s+len(?:gth)?)"
                           + _OF + r"(\d+)\b|\b(\d+)[\s-]*(?:tokens?\s+(?:of\s+)?)?context\b", _I)),
)
_UPDATES = r"(?:\s+(?:updates?|uploads?|deltas?|pseudo[\s-]?gradients?|changes?|weights?))?"  # masked with it
DILOCO = re.compile(r"\bdi[\s-]?loco\b", _I)
FEDAVG = re.compile(r"\bfed[\s-]?avg\b|\bfederated\s+averaging\b", _I)
COMPRESS = re.compile(r"\bcompress\w*" + _UPDATES + r"|\b(?:low|limited|little|slow|poor|narrow|scarce)[\s-]+"
                      r"(?:bandwidth|network|connections?|links?|uplinks?)\b|\bless\s+(?:communication|traffic|"
                      r"bandwidth)\b|\bbandwidth[\s-]+(?:efficient|saving|friendly)\b|\bsave\s+bandwidth\b", _I)
INTERNET = re.compile(r"\b(?:over|across|through|via)\s+the\s+(?:open\s+)?internet\b|\bwan\b", _I)
ENCODINGS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("int8", re.compile(r"\b(?:int[\s-]?8|8[\s-]*bits?|quanti[sz]\w*)\b" + _UPDATES, _I)),
    ("bf16", re.compile(r"\bb(?:float|f)[\s-]?16\b" + _UPDATES, _I)),
    ("float32", re.compile(r"\b(?:(?:float|fp)[\s-]?32|full[\s-]+precision)\b" + _UPDATES, _I)),
)
_NUMBER = r"(\d+(?:\.\d+)?|\.\d+)"
OUTER_LR = re.compile(r"\bouter\s+(?:lr|learning\s+rate|step\s+size)" + _OF + _NUMBER, _I)
OUTER_MOMENTUM = re.compile(r"\b(?:outer\s+)?(?:nesterov\s+)?momentum" + _OF + _NUMBER, _I)
# "my text corpus wiki", "the corpus at data/wiki": a corpus named by a word, not a ./path
CORPUS_NAME = re.compile(r"\b(?:corpus|corpora|folder|directory|dir)\s+(?:(?:at|in|from|under|called|named)\s+)?"
                         r"([A-Za-z0-9_~][\w.\-~]*(?:/[\w.\-]*)*)", _I)
_NOT_CORPUS = {"with", "and", "using", "on", "for", "of", "to", "at", "in", "from", "the", "my", "our", "a", "an",
               "that", "this", "which", "please", "then", "so", "by", "over", "across", "under", "as", "is"}
_PLACEHOLDER = re.compile(r"^z(?:path|lm|nfs|surl|cid|tid|price|gpumodel|host)$")


@dataclass
class LmRequest:
    """The language-model part of a request; ``task`` is None when it asks for none."""

    task: str | None = None
    params: dict[str, int] = field(default_factory=dict)
    corpus: str | None = None
    outer: str | None = None
    outer_lr: float | None = None
    outer_momentum: float | None = None
    update_encoding: str | None = None


def _mask(match: re.Match[str], text: str) -> str:
    return text[: match.start()] + " zlm " + text[match.end():]


def wants_language_model(text: str) -> bool:
    if LM_WORDS.search(text):
        return True
    if CLASSIFIER.search(text):
        return False  # "a cnn on my text files" is a classifier the user chose; the loader says why not
    return bool(TEXT_CORPUS.search(text) or (TRANSFORMER.search(text) and TEXT_WORDS.search(text)))


def read_language_model(text: str) -> tuple[LmRequest, str]:
    """The language-model request in ``text`` and the text with what was read masked out."""
    if not wants_language_model(text):
        return LmRequest(), text
    lm = LmRequest(task=LANGUAGE_MODEL_TASK)
    for name, pattern in SIZES:
        if (m := pattern.search(text)) is not None:
            lm.params[name] = int(next(g for g in m.groups() if g))
            text = _mask(m, text)
    for attr, pattern in (("outer_lr", OUTER_LR), ("outer_momentum", OUTER_MOMENTUM)):
        if (m := pattern.search(text)) is not None:
            setattr(lm, attr, float(m.group(1)))
            text = _mask(m, text)
    for encoding, pattern in ENCODINGS:
        if (m := pattern.search(text)) is not None:
            lm.update_encoding = encoding
            text = _mask(m, text)
            break
    compress = (m := COMPRESS.search(text)) is not None
    if m is not None:
        text = _mask(m, text)
    if compress and lm.update_encoding is None:
        lm.update_encoding = "int8"
    internet = (m := INTERNET.search(text)) is not None  # masked: its "across" is no host count
    if m is not None:
        text = _mask(m, text)
    if FEDAVG.search(text):
        lm.outer = "fedavg"
    elif DILOCO.search(text) or compress or internet or lm.outer_lr is not None:
        lm.outer = "diloco"
    named = next((m.group(1).rstrip(".,;:") for m in CORPUS_NAME.finditer(text)
                  if m.group(1).lower() not in _NOT_CORPUS and not _PLACEHOLDER.match(m.group(1))), None)
    lm.corpus = named or None
    return lm, text
