"""Peak memory against dataset size, and import throughput against hashing the same bytes.

``python bench/bench_datasets.py [--sizes-mib 256,1024,4096] [--kinds tokens,images] [--plot FILE] [--quick]``.

For each kind and size a dataset is generated in a temporary directory: a text corpus
(``*.txt`` files of random words, 64 MiB each) or an image folder (two classes of JPEGs,
each a decodable noise image with a unique tail so no two share a block). Then, each in a
fresh process so its peak RSS (``ru_maxrss``) is its own:

* coordinator: ``DatasetStore.import_dataset`` (tokenize or index, stream into a
  LocalContentStore with kubo's CIDs) and ``publish_shards`` for 4 workers;
* provider: every slice of shard 0 through a ``ContentCache`` (range reads, verified blocks,
  files in the cache), as a provider fetches a job's inputs.

Import throughput: the coordinator's import against ``hashlib.sha256`` over the files it
imported (the staged token files, or the image folder), read from disk in the same run.
Prints a table and one JSON line; ``--plot`` draws peak RSS against size.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TEXT_FILE_BYTES = 64 << 20


def make_corpus(root: Path, size: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    words = np.array([w.encode() for w in "the of and to in is was for on that with as by at from his it an were "
                      "which are this be has had one other their there been also its new first after who".split()],
                     dtype=object)
    root.mkdir(parents=True)
    left, i = size, 0
    while left > 0:
        n = min(TEXT_FILE_BYTES, left)
        with open(root / f"doc{i:05d}.txt", "wb") as f:
            written = 0
            while written < n:
                chunk = b" ".join(rng.choice(words, 200_000))[: n - written]
                f.write(chunk)
                written += len(chunk)
        left, i = left - n, i + 1


def make_images(root: Path, size: int, seed: int = 0) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    import io
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, size=(224, 224, 3), dtype=np.uint8)).save(buf, "JPEG", quality=95)
    base = buf.getvalue()  # bytes after the JPEG's end marker are ignored by decoders: a unique tail is free
    count = max(4, size // len(base))
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
    for i in range(count):
        (root / ("a", "b")[i % 2] / f"{i:07d}.jpg").write_bytes(base + i.to_bytes(8, "little"))


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def coordinator_child(source: Path, work: Path) -> dict:
    from aitbc_agent_sdk.coordinator.data._datasets import DatasetStore
    from aitbc_agent_sdk.coordinator.data._sharding import publish_shards
    from aitbc_agent_sdk.records import TrainingRecord, TrainingSpec
    from aitbc_agent_sdk.storage import LocalContentStore

    data = DatasetStore(LocalContentStore(work / "store"), work / "data")
    start = time.perf_counter()
    cid, manifest = await data.import_dataset(source)
    imported = time.perf_counter() - start
    record = TrainingRecord(training_id="training_bench", spec=TrainingSpec(model_type="mlp", target_workers=4),
                            coordinator="0x" + "1" * 40, dataset_cid=cid)
    published = await publish_shards(data, record, manifest, 4)
    (work / "shard.json").write_text((await data.shard(published.shards[0].cid)).model_dump_json())
    return {"peak_mib": peak_mib(), "import_s": imported, "stored_bytes": manifest.total_bytes,
            "files": len(manifest.files)}


async def provider_child(work: Path) -> dict:
    from aitbc_agent_sdk.records._datasets import ShardData
    from aitbc_agent_sdk.provider._cache import ContentCache
    from aitbc_agent_sdk.storage import LocalContentStore

    shard = ShardData.model_validate_json((work / "shard.json").read_bytes())
    store = LocalContentStore(work / "store")
    start = time.perf_counter()
    async with ContentCache(work / "cache", 1 << 40) as cache:
        for piece in shard.data.slices:
            lease = await cache.acquire(store, piece.cid, size=piece.length, offset=piece.offset, length=piece.length)
            lease.release()
    return {"peak_mib": peak_mib(), "fetch_s": time.perf_counter() - start, "shard_bytes": shard.data.bytes}


def sha256_seconds(paths: list[Path]) -> float:
    start = time.perf_counter()
    buf = bytearray(1 << 20)
    for path in paths:
        h = hashlib.sha256()
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(memoryview(buf)[:n])
    return time.perf_counter() - start


def child(role: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", role, *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{role} child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(kind: str, size: int, tmp: Path) -> dict:
    source, work = tmp / f"{kind}-{size}", tmp / f"work-{kind}-{size}"
    (make_corpus if kind == "tokens" else make_images)(source, size)
    coord = child("coordinator", str(source), str(work))
    prov = child("provider", str(work))
    if kind == "tokens":  # what was imported: the token files (staged, gone now); hash the same byte count
        hashed = [p for p in source.glob("*.txt")] * 2  # uint16 byte tokens: twice the text
    else:
        hashed = sorted(p for p in source.rglob("*.jpg"))
    sha = sha256_seconds(hashed)
    row = {"kind": kind, "size_mib": size >> 20, "coordinator_peak_mib": round(coord["peak_mib"], 1),
           "provider_peak_mib": round(prov["peak_mib"], 1), "import_s": round(coord["import_s"], 2),
           "sha256_s": round(sha, 2), "import_vs_sha256": round(sha / coord["import_s"], 3),
           "shard_fetch_s": round(prov["fetch_s"], 2), "stored_bytes": coord["stored_bytes"]}
    subprocess.run(["rm", "-rf", str(source), str(work)], check=False)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes-mib", default="256,1024,4096")
    parser.add_argument("--kinds", default="tokens,images")
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--quick", action="store_true", help="8 and 32 MiB (as CI runs it)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        role, *rest = args.child
        result = (asyncio.run(coordinator_child(Path(rest[0]), Path(rest[1]))) if role == "coordinator"
                  else asyncio.run(provider_child(Path(rest[0]))))
        print(json.dumps(result))
        return
    sizes = [8, 32] if args.quick else [int(s) for s in args.sizes_mib.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-datasets-", dir=os.environ.get("BENCH_TMP")) as tmp:
        for kind in args.kinds.split(","):
            for size in sizes:
                rows.append(measure(kind, size << 20, Path(tmp)))
                r = rows[-1]
                print(f"{r['kind']:7s} {r['size_mib']:6d} MiB  coordinator {r['coordinator_peak_mib']:7.1f} MiB  "
                      f"provider {r['provider_peak_mib']:7.1f} MiB  import {r['import_s']:7.2f} s  "
                      f"({r['import_vs_sha256']:.2f}x sha256)  shard fetch {r['shard_fetch_s']:.2f} s", flush=True)
    growth = {}
    for kind in args.kinds.split(","):
        mine = [r for r in rows if r["kind"] == kind]
        growth[kind] = {
            "coordinator_peak_ratio_largest_over_smallest": round(mine[-1]["coordinator_peak_mib"]
                                                                  / mine[0]["coordinator_peak_mib"], 3),
            "provider_peak_ratio_largest_over_smallest": round(mine[-1]["provider_peak_mib"]
                                                               / mine[0]["provider_peak_mib"], 3)}
    if args.plot:
        plot(rows, args.plot)
    print(json.dumps({"bench": "datasets", "rows": rows, "growth": growth}))


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for kind in sorted({r["kind"] for r in rows}):
        mine = [r for r in rows if r["kind"] == kind]
        sizes = [r["size_mib"] / 1024 for r in mine]
        ax.plot(sizes, [r["coordinator_peak_mib"] for r in mine], "o-", label=f"coordinator ({kind})")
        ax.plot(sizes, [r["provider_peak_mib"] for r in mine], "s--", label=f"provider ({kind})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("dataset size (GiB)")
    ax.set_ylabel("peak RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
