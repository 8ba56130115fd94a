"""Field types, id rules and the Record base every message and record shares."""

from __future__ import annotations

import re
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from .. import limits
from ..errors import UnsafeNameError


@lru_cache(maxsize=4096)
def _checksum(value: str) -> str:
    # Cached: checksumming is a pure-Python keccak, and the same few addresses appear in
    # every message an agent receives. eth_utils is imported here: it costs the CLI's --help 0.1 s.
    from eth_utils import is_address, to_checksum_address

    if not is_address(value):
        raise ValueError(f"not an Ethereum address: {value!r}")
    return to_checksum_address(value)


def _cid(value: str) -> str:
    # CIDv0 is base58btc "Qm..." (46 chars); CIDv1 here is base32 lower-case "b...".
    if value.startswith("Qm") and len(value) == 46:
        return value
    if value.startswith("b") and 10 < len(value) <= limits.CID_MAX_LENGTH and value[1:].isalnum() and value == value.lower():
        return value
    raise ValueError(f"not a CID: {value!r}")


Address = Annotated[str, AfterValidator(_checksum)]
Cid = Annotated[str, AfterValidator(_cid)]
Wei = Annotated[int, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
Finite = Annotated[float, Field(allow_inf_nan=False)]  # NaN is stored as null and would not read back
Text = Annotated[str, Field(max_length=limits.TEXT_MAX_LENGTH)]


def clipped(text: str) -> str:
    """``text`` cut to fit a :data:`Text` field: for reasons we build from what another party said,
    which must never make our own record fail validation (and the loop that sends it)."""
    return text[: limits.TEXT_MAX_LENGTH]
Name = Annotated[str, Field(max_length=limits.NAME_MAX_LENGTH)]

# Every id that names a directory or a topic level: no '/', '.', wildcard, space or NUL can get in.
ID_PATTERN = rf"^[A-Za-z0-9_-]{{1,{limits.ID_MAX_LENGTH}}}$"
Id = Annotated[str, Field(pattern=ID_PATTERN)]
_ID = re.compile(ID_PATTERN)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def id_path(parent: Path, name: str) -> Path:
    """``parent / name`` for an id; UnsafeNameError unless it is an :data:`Id` that resolves inside ``parent``.

    Resolving catches a symlink planted under ``parent`` that points elsewhere.
    """
    if not isinstance(name, str) or not _ID.fullmatch(name):
        raise UnsafeNameError(f"{name!r} is not a safe id: 1-{limits.ID_MAX_LENGTH} letters, digits, '_' or '-'")
    path = parent / name
    resolved, root = path.resolve(), parent.resolve()
    if resolved == root or not resolved.is_relative_to(root):
        raise UnsafeNameError(f"{path} resolves to {resolved}, outside {root}")
    return path


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None


