"""Byte sizes as people write them: ``100GB``, ``512MiB``, ``1.5TB`` or a plain number of bytes."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Annotated

from pydantic import BeforeValidator, Field

# Decimal units as disks are sold (kB = 1000 B), binary ones as the kernel counts (KiB = 1024 B).
SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}
MAX_SIZE_BYTES = 2**60  # an exabyte: more than any dataset, small enough for SQLite's integers
_SIZE = re.compile(r"\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[a-z]*)\s*", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes of ``text``; ValueError says what is accepted. An int is bytes already."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = _SIZE.fullmatch(str(text))
    unit = match.group("unit").lower() if match else ""
    if match is None or unit not in SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size: a number of bytes, or a number and a unit "
                         f"(100GB, 512MiB, 1.5TB; kB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024)")
    try:
        size = Decimal(match.group("number")) * SIZE_UNITS[unit]
    except InvalidOperation as exc:  # pragma: no cover - the pattern admits only decimal digits
        raise ValueError(f"{text!r} is not a number") from exc
    return int(size)


def format_size(size: int) -> str:
    """``100000000000`` -> ``100 GB`` (decimal units, three significant digits)."""
    for unit, factor in (("PB", 10**15), ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= factor:
            return f"{size / factor:.3g} {unit}"
    return f"{size} B"


ByteSize = Annotated[int, BeforeValidator(parse_size), Field(ge=0, le=MAX_SIZE_BYTES)]
