"""``--quick``: every benchmark's CI-sized form (seconds, not minutes), run by tests/test_benchmarks.py.

A benchmark passes its quick settings here; with ``--quick`` on the command line they become the
defaults, so an explicit flag still wins. The figures a quick run prints only show that the
benchmark still works; quote the full forms (bench/run_all.py without ``--quick``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def parse_args(parser: argparse.ArgumentParser, **quick: Any) -> argparse.Namespace:
    """Parse the command line, with ``quick``'s values as the defaults when ``--quick`` is given."""
    shown = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in quick.items())
    parser.add_argument("--quick", action="store_true", help=f"CI-sized run, in seconds ({shown})")
    if "--quick" in sys.argv[1:]:
        parser.set_defaults(**quick)
    return parser.parse_args()
