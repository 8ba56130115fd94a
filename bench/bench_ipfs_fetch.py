"""A round's fetch from the IPFS daemon against a plain ``curl`` of the same CIDs from the same daemon.

``python bench/bench_ipfs_fetch.py [--mib 256] [--model-mib 64 512] [--repeat 3] [--quick]``.

"model" rows: a random blob of each ``--model-mib`` size (a model a round moves) is added, then
``KuboContentStore.cat`` fetches it whole as one ``dag/export`` CAR, every block checked as it
streams; against ``curl`` of ``dag/export`` (the same bytes, unchecked) and of ``cat`` (the file
alone), alternating, the ratio being the median of per-pair curl/fetch speed ratios. "import"
rows: ``LocalContentStore.add`` of the same file (one pack) against ``hashlib.sha256`` over the
same bytes in memory (speed ratio: sha256 time / import time).

A token dataset (``--mib`` of generated text, tokenized) goes into a fresh local js-ipfs
daemon (the Kubo RPC) through ``KuboContentStore.add_directory``; the 4-worker split is planned
on its manifest. "fetch" is what a provider does for shard 0: every slice streamed through
``KuboContentStore.stream(cid, offset=, length=)``, each block fetched by ``block/get`` and
checked against its CID before use. "curl" asks the same daemon for the same slices with
``/api/v0/cat?arg=CID&offset=&length=``, which trusts the daemon and checks nothing. Runs
alternate (fetch, curl) so both see the same load; the ratio is the median of the pairs'
fetch/curl time ratios. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from aitbc_agent_sdk.coordinator.data._datasets import DatasetStore
from aitbc_agent_sdk.devnet._ipfs import start_ipfs_daemon
from aitbc_agent_sdk.devnet._service import free_port, stop
from aitbc_agent_sdk.records import TrainingRecord, TrainingSpec
from aitbc_agent_sdk.storage._kubo import KuboClient, KuboContentStore
from aitbc_agent_sdk.storage._local import LocalContentStore
from aitbc_agent_sdk.data._file_sharding import plan_split

from bench_datasets import make_corpus


async def fetch_slices(store: KuboContentStore, slices) -> int:
    total = 0
    for s in slices:
        async for chunk in store.stream(s.cid, offset=s.offset, length=s.length, max_bytes=s.length):
            total += len(chunk)
    return total


def curl_slices(api: str, slices) -> int:
    total = 0
    for s in slices:
        url = f"{api}/api/v0/cat?arg={s.cid}&offset={s.offset}&length={s.length}"
        done = subprocess.run(["curl", "-s", "-X", "POST", "-o", "/dev/null", "-w", "%{size_download}", url],
                              capture_output=True, text=True, check=True)
        total += int(done.stdout)
    return total


def curl(api: str, endpoint: str, cid: str) -> int:
    done = subprocess.run(["curl", "-s", "-X", "POST", "-o", "/dev/null", "-w", "%{size_download}",
                           f"{api}/api/v0/{endpoint}?arg={cid}"], capture_output=True, text=True, check=True)
    return int(done.stdout)


async def model_rows(store: KuboContentStore, api: str, root: Path, mib: int, repeat: int) -> dict:
    """Whole-blob verified CAR fetch vs curl (dag/export and cat), and local import vs sha256."""
    blob = root / f"model-{mib}.bin"
    data = os.urandom(mib << 20)
    blob.write_bytes(data)
    cid = await store.add(blob, pin=False)
    fetch_s, export_s, cat_s = [], [], []
    for _ in range(repeat):
        t = time.perf_counter()
        got = await store.cat(cid, max_bytes=len(data))
        fetch_s.append(time.perf_counter() - t)
        if got != data:
            raise SystemExit("the verified fetch returned other bytes")
        del got
        t = time.perf_counter()
        assert await asyncio.to_thread(curl, api, "dag/export", cid) >= len(data)
        export_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        assert await asyncio.to_thread(curl, api, "cat", cid) == len(data)
        cat_s.append(time.perf_counter() - t)
    import_s, sha_s = [], []
    for n in range(repeat):
        local = LocalContentStore(root / f"local-{mib}-{n}")
        t = time.perf_counter()
        assert await local.add(blob, pin=False) == cid
        import_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        hashlib.sha256(data).digest()
        sha_s.append(time.perf_counter() - t)
        shutil.rmtree(local.root)
    blob.unlink()
    med = statistics.median
    return {"mib": mib, "fetch_s": _r(fetch_s), "curl_export_s": _r(export_s), "curl_cat_s": _r(cat_s),
            "fetch_vs_curl_export": round(med(e / f for e, f in zip(export_s, fetch_s)), 3),
            "fetch_vs_curl_cat": round(med(c / f for c, f in zip(cat_s, fetch_s)), 3),
            "import_s": _r(import_s), "sha256_s": _r(sha_s),
            "import_vs_sha256": round(med(h / i for h, i in zip(sha_s, import_s)), 3)}


def _r(xs: list[float]) -> list[float]:
    return [round(x, 3) for x in xs]


async def main_async(mib: int, repeat: int, model_mibs: list[int]) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-ipfs-") as tmp:
        root = Path(tmp)
        service, api = await start_ipfs_daemon(root / "repo", api_port=free_port(), swarm_port=free_port(),
                                               tied_to=os.getpid())
        try:
            async with KuboClient(api, timeout=120) as client:
                store = KuboContentStore(client)
                make_corpus(root / "corpus", mib << 20)
                data = DatasetStore(store, root / "data")
                started = time.perf_counter()
                _, manifest = await data.import_dataset(root / "corpus")
                import_s = time.perf_counter() - started
                spec = TrainingSpec(model_type="mlp", target_workers=4)
                slices = plan_split(manifest, num_shards=4, test_fraction=spec.test_fraction, partition="iid",
                                    alpha=1.0, seed=0).shards[0].slices
                ratios, fetch_s, curl_s = [], [], []
                for _ in range(repeat):
                    t = time.perf_counter()
                    got = await fetch_slices(store, slices)
                    fetch_s.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    curled = await asyncio.to_thread(curl_slices, api, slices)
                    curl_s.append(time.perf_counter() - t)
                    if got != curled:
                        raise SystemExit(f"fetched {got} bytes but curl got {curled}")
                    ratios.append(fetch_s[-1] / curl_s[-1])
                models = [await model_rows(store, api, root, m, repeat) for m in model_mibs]
        finally:
            stop(service)
    return {"bench": "ipfs_fetch", "mib": mib, "shard_bytes": got, "import_s": round(import_s, 2),
            "fetch_s": [round(x, 3) for x in fetch_s], "curl_s": [round(x, 3) for x in curl_s],
            "fetch_over_curl_median": round(statistics.median(ratios), 3), "models": models}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--model-mib", type=int, nargs="*", default=[64, 512])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4 MiB, one pair, an 8 MiB model (as CI runs it)")
    args = parser.parse_args()
    mib, repeat, models = (4, 1, [8]) if args.quick else (args.mib, args.repeat, args.model_mib)
    print(json.dumps(asyncio.run(main_async(mib, repeat, models))))


if __name__ == "__main__":
    main()
