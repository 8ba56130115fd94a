"""A round's fetch from the IPFS daemon against a plain ``curl`` of the same CIDs from the same daemon.

``python bench/bench_ipfs_fetch.py [--mib 256] [--repeat 3] [--quick]``.

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
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from aitbc_agent_sdk.coordinator.datasets import DatasetStore
from aitbc_agent_sdk.devnet.ipfs import start_ipfs_daemon
from aitbc_agent_sdk.devnet.service import free_port, stop
from aitbc_agent_sdk.models import TrainingRecord, TrainingSpec
from aitbc_agent_sdk.storage.kubo import KuboClient, KuboContentStore
from aitbc_agent_sdk.training.file_sharding import plan_split

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


async def main_async(mib: int, repeat: int) -> dict:
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
        finally:
            stop(service)
    return {"bench": "ipfs_fetch", "mib": mib, "shard_bytes": got, "import_s": round(import_s, 2),
            "fetch_s": [round(x, 3) for x in fetch_s], "curl_s": [round(x, 3) for x in curl_s],
            "fetch_over_curl_median": round(statistics.median(ratios), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4 MiB, one pair (as CI runs it)")
    args = parser.parse_args()
    mib, repeat = (4, 1) if args.quick else (args.mib, args.repeat)
    print(json.dumps(asyncio.run(main_async(mib, repeat))))


if __name__ == "__main__":
    main()
