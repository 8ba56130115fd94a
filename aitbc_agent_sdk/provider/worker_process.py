"""The training process a provider runs jobs in (``python -m aitbc_agent_sdk.provider.worker_process``).

It speaks JSON lines: one request per line on stdin, events on stdout. It only
ever reads safetensors files from the job directory, so nothing a stranger sent
is unpickled, and it holds no keys: its environment is scrubbed by the parent, and
on a provider it runs in the bwrap sandbox of :mod:`.sandbox`.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from ..models import JobConfig, ModelSpec
from ..training import EpochStats, LabeledData, build_model, decode_data, decode_state, encode_state, train_local

from .process import CHECKPOINT_FILE, SHARD_FILE, WEIGHTS_FILE


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def run_job(request: dict[str, Any]) -> dict[str, Any]:
    job_dir = Path(request["job_dir"])
    spec = ModelSpec.model_validate(request["model"])
    config = JobConfig.model_validate(request["config"])
    data = decode_data((job_dir / SHARD_FILE).read_bytes())
    model = build_model(spec)
    model.load_state_dict(decode_state((job_dir / WEIGHTS_FILE).read_bytes()), strict=True)

    def on_epoch(stats: EpochStats) -> None:
        emit({"event": "epoch", "epoch": stats.epoch, "epochs": stats.epochs, "loss": stats.loss,
              "samples_per_s": stats.samples_per_s})

    result = train_local(model, data, config, seed=int(request["seed"]), on_epoch=on_epoch)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    out_dir = Path(request.get("out_dir") or job_dir)  # sandboxed: inputs are read-only, output goes here
    (out_dir / CHECKPOINT_FILE).write_bytes(encode_state(state, {"job_id": str(request.get("job_id", ""))}))
    return {"event": "done", "samples": result.samples, "loss": result.loss, "seconds": result.seconds}


def warm_up() -> None:
    """One tiny step before announcing ready: torch loads much of itself on the first optimizer
    step, and a fresh sandboxed process serves every new training, so no job should wait for that."""
    spec = ModelSpec(name="mlp", input_shape=(4,), num_classes=2, hidden=4)
    data = LabeledData(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), 2)
    model = build_model(spec)
    train_local(model, data, JobConfig(epochs=1, batch_size=2), seed=0)
    decode_state(encode_state({k: v.detach() for k, v in model.state_dict().items()}))


def main() -> None:
    torch.set_num_threads(int(os.environ.get("AITBC_WORKER_THREADS", "1")))
    warm_up()
    emit({"event": "ready", "pid": os.getpid()})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            emit(run_job(json.loads(line)))
        except Exception as exc:  # report any failure to the parent instead of dying
            emit({"event": "error", "message": f"{type(exc).__name__}: {exc}",
                  "trace": traceback.format_exc(limit=5)})
    # stdin closed: the parent is done with us. Skip interpreter teardown (about a second
    # with torch loaded); there is nothing left to flush.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
