"""Pure: manifest digests and the comparison of every host's view of one dataset."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping

from ._records import ClusterMountReport, Manifest, ManifestComparison, MountCommand, MountReport


def manifest_digest(files: Mapping[str, tuple[int, str]]) -> str:
    lines = "".join(f"{path}\0{size}\0{sha}\n" for path, (size, sha) in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def make_manifest(files: Mapping[str, tuple[int, str]]) -> Manifest:
    return Manifest(files=dict(files), digest=manifest_digest(files), bytes_total=sum(s for s, _ in files.values()),
                    count=len(files))


def compare_manifests(manifests: Mapping[str, Manifest]) -> ManifestComparison:
    """Which hosts see the same dataset: the digest most hosts have is the reference
    (ties: the first host by name); each other host's missing, extra and changed files."""
    if not manifests:
        return ManifestComparison(ok=False, digest=None, agreeing=())
    counts = Counter(m.digest for m in manifests.values())
    top = max(counts.values())
    reference_host = min(h for h, m in manifests.items() if counts[m.digest] == top)
    reference = manifests[reference_host]
    agreeing = tuple(sorted(h for h, m in manifests.items() if m.digest == reference.digest))
    differences: dict[str, dict[str, list[str]]] = {}
    for host, manifest in sorted(manifests.items()):
        if manifest.digest == reference.digest:
            continue
        ref, mine = reference.files, manifest.files
        differences[host] = {"missing": sorted(set(ref) - set(mine)), "extra": sorted(set(mine) - set(ref)),
                             "changed": sorted(p for p in set(ref) & set(mine) if ref[p] != mine[p])}
    return ManifestComparison(ok=not differences, digest=reference.digest, agreeing=agreeing, differences=differences)


def summarize_mounts(command: MountCommand, reports: Mapping[str, MountReport],
                     errors: Mapping[str, str] | None = None) -> ClusterMountReport:
    errors = dict(errors or {})
    manifests = {h: r.manifest for h, r in reports.items() if r.manifest is not None}
    comparison = compare_manifests(manifests)
    not_exercised = sorted({n for r in reports.values() for n in r.notes if n.startswith("not exercised")})
    ok = (not errors and bool(reports) and all(r.ok for r in reports.values()) and comparison.ok
          and len(manifests) == len(reports))
    return ClusterMountReport(source=command.source, target=command.target, mountpoint=command.mountpoint,
                              hosts=dict(reports), errors=errors, comparison=comparison, ok=ok,
                              not_exercised=tuple(not_exercised))
