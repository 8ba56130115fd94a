"""The assistant's audit trail: every request, confirmation and tool call, hash-chained.

Entries go to ``$AITBC_HOME/assistant/audit.jsonl`` (an :class:`~aitbc_agent_sdk.audit.AuditLog`),
and a tool call that acts on a training is also written to that training's own log, the
one ``aitbc distributed-training audit`` verifies, while no coordinator daemon is appending
to it (two writers would fork the chain).

Nothing secret is written: :class:`Secrets` drops secret-looking field names (the AuditLog
would refuse them anyway), blanks the secrets this process handed out (wallet passwords,
the LLM key) and values that look like API keys, bearer tokens or ``password=...`` pairs,
and, in what the person typed (request, arguments), anything shaped like a private key.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from ..audit import AuditLog, is_secret_name

REDACTED = "<redacted>"
PRIVATE_KEY = re.compile(r"\b(?:0x)?[0-9a-fA-F]{64}\b")  # 32 bytes of hex: a key (or a tx hash)
_ALWAYS = (
    re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}\b"),                        # an OpenAI-style API key
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._\-~+/]{8,}=*"),           # an Authorization header value
)
# A secret's name, then "is", "=" or ":" (or a quote), then its value: a quoted string, or every
# word up to the end of the line or sentence, a comma or "&", or the next "name=" / "name:".
# A secret phrase is many words ("correct horse battery staple"); blanking only the first
# word would keep the rest of it.
_KEYWORD = (r"(?:password|passphrase|passwd|secret|private[ _-]?key|api[ _-]?key|token|mnemonic"
            r"|seed(?:[ _-]?phrase)?|recovery[ _-]?phrase)")
_NAMED = re.compile(
    rf"(?im)(?P<key>(?<![A-Za-z0-9]){_KEYWORD}[\w-]*[\"']?)"
    r"(?P<sep>\s*(?:\b(?:is|was)\b|[=:])[ \t]*|[ \t]*(?=[\"']))"
    r"(?P<value>\"[^\"\n]*\"?|'[^'\n]*'?|[^\n]+?)"
    r"(?=$|[.;!?](?:\s|$)|,|&|\s+[\"']?[\w.-]+[\"']?\s*[=:])")
_WORD = re.compile(r"[A-Za-z]+")
BIP39_RUN = 12  # the shortest BIP-39 mnemonic; prose rarely strings 12 of its 2048 words in a row


@functools.cache  # a constant table, read once
def _bip39_words() -> frozenset[str]:
    from importlib import resources

    text = resources.files("eth_account.hdaccount").joinpath("wordlist/english.txt").read_text()
    return frozenset(text.split())


def _blank_value(match: re.Match[str]) -> str:
    value = match.group("value")
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{match.group('key')}{match.group('sep')}{quote}{REDACTED}{quote if value.endswith(quote) else ''}"


def blank_mnemonics(text: str, words: frozenset[str]) -> str:
    """Blank every run of ``BIP39_RUN`` or more BIP-39 words separated only by spaces."""
    runs: list[tuple[int, int]] = []
    start = end = count = 0
    for match in _WORD.finditer(text):
        joined = count and not text[end:match.start()].strip()
        if match.group().lower() in words:
            if joined:
                end, count = match.end(), count + 1
                continue
            if count >= BIP39_RUN:
                runs.append((start, end))
            start, end, count = match.start(), match.end(), 1
        else:
            if count >= BIP39_RUN:
                runs.append((start, end))
            count = 0
    if count >= BIP39_RUN:
        runs.append((start, end))
    for a, b in reversed(runs):
        text = text[:a] + REDACTED + text[b:]
    return text
INPUT_FIELDS = frozenset({"request", "arguments", "plan", "steps"})


class Secrets:
    """The secrets this process has seen (passwords it handed out, an API key, keys a user pasted),
    blanked wherever they would be shown or logged, plus whatever merely looks like a secret."""

    def __init__(self, *known: str | None) -> None:
        self.known: set[str] = {k for k in known if k and len(k) >= 4}
        self._mnemonic_words = _bip39_words()

    def add(self, value: str | None) -> None:
        if value and len(value) >= 4:
            self.known.add(value)

    def add_keys_in(self, text: str) -> None:
        """Remember 64-hex values a person typed: in their words they can only be keys."""
        self.known.update(PRIVATE_KEY.findall(text))

    def text(self, text: str, *, keys: bool = False) -> str:
        """``keys``: also blank every 64-hex value (for input; results carry tx hashes, which are public)."""
        for secret in sorted(self.known, key=len, reverse=True):
            text = text.replace(secret, REDACTED)
        for pattern in _ALWAYS:
            text = pattern.sub(REDACTED, text)
        text = _NAMED.sub(_blank_value, text)
        text = blank_mnemonics(text, self._mnemonic_words)
        return PRIVATE_KEY.sub(REDACTED, text) if keys else text

    def value(self, value: Any, *, keys: bool = False) -> Any:
        """A JSON-safe copy of ``value``: secret-looking keys dropped, secret-looking strings blanked."""
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            dropped = 0
            for key, item in value.items():
                if is_secret_name(str(key)):
                    dropped += 1
                    continue
                out[str(key)] = self.value(item, keys=keys)
            if dropped:
                out["redacted_fields"] = dropped
            return out
        if isinstance(value, (list, tuple, set)):
            return [self.value(v, keys=keys) for v in value]
        if isinstance(value, str):
            return self.text(value, keys=keys)
        if isinstance(value, bool) or value is None or isinstance(value, int):
            return value
        if isinstance(value, float):
            return value if value == value and abs(value) != float("inf") else str(value)
        if isinstance(value, (Decimal, Path)):
            return str(value)
        return self.text(str(value), keys=keys)


def scrub_text(text: str, *, keys: bool = False) -> str:
    return Secrets().text(text, keys=keys)


def scrub(value: Any, *, keys: bool = False) -> Any:
    return Secrets().value(value, keys=keys)


def assistant_log_path(home: Path) -> Path:
    return home / "assistant" / "audit.jsonl"


class AssistantAudit:
    """Appends scrubbed entries to the assistant log, and to a training's log when it is safe."""

    def __init__(self, home: Path, *, source: str, secrets: Secrets | None = None) -> None:
        self.home = home
        self.source = source
        self.secrets = secrets or Secrets()
        self.log = AuditLog(assistant_log_path(home))

    def clean(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """What the person asked for is scrubbed for keys too; results keep their (public) tx hashes."""
        kept = {k: v for k, v in fields.items() if not is_secret_name(k)}
        for key in INPUT_FIELDS & kept.keys():  # a key the person typed is blanked in the replies too
            self.secrets.add_keys_in(json.dumps(kept[key], default=str))
        return {k: self.secrets.value(v, keys=k in INPUT_FIELDS) for k, v in kept.items()}

    async def record(self, event: str, **fields: Any) -> None:
        await self.log.append(event, source=self.source, **self.clean(fields))

    async def on_training(self, training_id: str, event: str, **fields: Any) -> str:
        """Append to the training's own log unless a daemon drives it; returns what happened."""
        from ..coordinator import training_lock
        from ..coordinator import audit_path
        from ..errors import ConfigError

        if not re.fullmatch(r"training_[A-Za-z0-9]+", training_id):
            return "skipped: not a training id"
        try:
            with training_lock(self.home, training_id):
                # A fresh AuditLog reads the tail now: earlier writers in this process are done.
                await AuditLog(audit_path(self.home / "trainings", training_id)).append(
                    event, source=self.source, **self.clean(fields))
        except ConfigError:
            return "skipped: a coordinator daemon is appending to it"
        return "written"
