"""What funding a training costs, before anything is paid (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..market._discovery import eth_amount, stake_skip_text
from ..records import CPU_CLASS, FaultPolicy, ModelFootprint

WEI_PER_ETH = 10**18


def eth_text(wei: int, decimals: int = 4) -> str:
    """Wei as ETH with a fixed number of decimals, exact (no float rounding of large amounts)."""
    scale = 10 ** (18 - decimals)
    rounded = (int(wei) + scale // 2) // scale
    whole, frac = divmod(rounded, 10**decimals)
    return f"{whole}.{frac:0{decimals}d}"


@dataclass(frozen=True)
class CostPreview:
    """The escrow deposit (every worker's price x rounds) and the most the spares can add; the bond every
    hired provider holds, and how many offers were skipped for holding less."""

    workers: int
    rounds: int
    prices_wei: tuple[int, ...]  # per worker, per round
    spares: int
    spare_prices_wei: tuple[int, ...]
    min_stake_wei: int = 0
    stake_skipped: int = 0
    spot_checks: int | None = None  # segments re-executed per result; None: not part of this preview
    segments: int = 64  # a job's committed segments (JobConfig.segments)
    verify_on: str = "coordinator"  # who re-executes them (FaultPolicy.verify_on, or what auto resolved to)
    canary_rate: float = 0.2  # canaries a verifier also re-executes, per check (FaultPolicy.canary_rate)

    @property
    def deposit_wei(self) -> int:
        return sum(self.prices_wei) * self.rounds

    @property
    def verification_wei(self) -> int:
        """What verifiers would be paid if every check went to them: each re-executes a segment (and, at the
        canary rate, a canary) for its own price's share of a job, so the deposit's share is the checked
        segments' (rounded up). Paid through the escrow as it falls due, apart from the deposit."""
        if not self.spot_checks or self.verify_on == "coordinator":
            return 0
        checked = min(self.spot_checks, self.segments) * (1 + self.canary_rate)
        return math.ceil(self.deposit_wei * checked / max(self.segments, 1))

    @property
    def spares_wei(self) -> int:
        """A spare's slot is funded only when it steps in; at most its price for every round."""
        return sum(self.spare_prices_wei) * self.rounds

    @property
    def most_wei(self) -> int:
        return self.deposit_wei + self.spares_wei

    def items(self) -> list[tuple[str, int]]:
        """(what, wei) lines of the preview: the deposit, then what the spares could add."""
        low, high = min(self.prices_wei, default=0), max(self.prices_wei, default=0)
        price = eth_text(low) if low == high else f"{eth_text(low)}-{eth_text(high)}"
        lines = [(f"escrow deposit: {self.workers} workers x {price} ETH x {self.rounds} rounds", self.deposit_wei)]
        if self.spares:
            lines.append((f"at most, if the {self.spares} spare(s) step in", self.spares_wei))
        if self.verify_on == "market" and self.verification_wei:
            lines.append(("verifiers, paid per check through the escrow as it falls due (about)",
                          self.verification_wei))
        return lines

    def notes(self) -> list[str]:
        """Lines that cost nothing but decide who is paid: the minimum bond, and the offers it left out."""
        lines = [f"hired providers hold at least {eth_amount(self.min_stake_wei)} ETH of bond (--min-stake)"]
        if self.stake_skipped:
            lines.append(stake_skip_text(self.stake_skipped, self.min_stake_wei))
        if self.spot_checks is not None:
            lines.append(verification_note(self.spot_checks, self.segments, self.verify_on))
            if self.verify_on == "auto" and self.verification_wei:
                lines.append(f"verifiers are paid per check through the escrow: up to about "
                             f"{eth_text(self.verification_wei)} ETH if every check goes to them")
        return lines

    def as_json(self) -> dict[str, object]:
        return {"workers": self.workers, "rounds": self.rounds, "spares": self.spares,
                "deposit_wei": str(self.deposit_wei), "spares_wei": str(self.spares_wei),
                "most_wei": str(self.most_wei), "min_stake_wei": str(self.min_stake_wei),
                "stake_skipped": self.stake_skipped,
                **({"spot_checks": self.spot_checks, "segments": self.segments, "verify_on": self.verify_on,
                    "verification_wei": str(self.verification_wei)}
                   if self.spot_checks is not None else {})}


def verification_note(spot_checks: int, segments: int, verify_on: str = "coordinator") -> str:
    """What checking every result will cost this machine: the share of a job it re-executes (CPU, not ETH),
    all of it, only disputes (``market``), or by the worker's device class (``auto``)."""
    if spot_checks == 0:
        return "spot checks off (--spot-checks 0): no result is re-executed, so skipped work goes unnoticed"
    checked = min(spot_checks, segments)
    share = f"about {100 * checked / max(segments, 1):.0f} % of each job's training compute"
    if verify_on == "market":
        return (f"every result is spot-checked by verifiers hired among the other workers: {checked} of its "
                f"{segments} segments re-executed there ({share}), each paid its price's share; this machine "
                f"trains one step of a disputed segment, or replays one nobody answered for")
    if verify_on == "auto":
        return (f"every result is spot-checked: {checked} of its {segments} segments re-executed ({share}), on "
                f"this machine's CPU for a worker hired as a CPU (no ETH), by paid verifiers among the other "
                f"workers for a GPU (--verify-on auto)")
    return (f"every result is spot-checked on this machine's CPU: {checked} of its {segments} segments "
            f"re-executed, {share} (no ETH)")


def preview(prices_wei: Sequence[int], spare_prices_wei: Sequence[int], rounds: int, *, min_stake_wei: int = 0,
            stake_skipped: int = 0, spot_checks: int | None = None, segments: int = 64,
            verify_on: str = "coordinator", canary_rate: float = 0.2) -> CostPreview:
    return CostPreview(workers=len(prices_wei), rounds=rounds, prices_wei=tuple(prices_wei),
                       spares=len(spare_prices_wei), spare_prices_wei=tuple(spare_prices_wei),
                       min_stake_wei=min_stake_wei, stake_skipped=stake_skipped, spot_checks=spot_checks,
                       segments=segments, verify_on=verify_on, canary_rate=canary_rate)


def checks_where(faults: FaultPolicy, footprint: ModelFootprint | None) -> str:
    """Who will re-execute a training's spot checks, as far as is known before hiring: ``auto`` becomes
    ``market`` once the measured model is at or above the size that sends every check to verifiers."""
    large = footprint is not None and faults.verified_on_market(CPU_CLASS, footprint.parameters)
    return "market" if faults.verify_on == "auto" and large else faults.verify_on


def estimate_text(cost: CostPreview, *, asked: int, hardware: str | None) -> str:
    """A cost question answered in a sentence: COST is the preview ``run --dry-run`` shows, over the best
    offers the market has now (fewer than ASKED when it has fewer)."""
    what = f"{hardware} or faster" if hardware else "any hardware"
    if cost.workers == 0:
        return f"No offers for {what} on the market now, so {asked} workers cannot be priced; nothing was spent."
    (line, wei), *_ = cost.items()
    short = "" if cost.workers >= asked else (f" The market has only {cost.workers} offers for {what} now, "
                                              f"so {asked} cannot be hired; this prices {cost.workers}.")
    return (f"{cost.workers} workers ({what}) for {cost.rounds} rounds would put {eth_text(wei)} ETH into the "
            f"escrow ({line}), paid out only for accepted rounds; the same estimate as `run --dry-run`. "
            f"Nothing was spent.{short}")
