"""Plain PyTorch DDP: a linear model fitted to your data, one shard per rank. Nothing from the SDK.

Run it on one machine with two processes:

    torchrun --standalone --nproc-per-node=2 examples/train_ddp.py data.pt 30

or on every host of a cluster (the script and the data on a path all hosts can read):

    aitbc cluster train --cluster lab --wallet coord --hosts 3 --script examples/train_ddp.py \
        --dataset /shared/data.pt -- /shared/data.pt 30

``data.pt`` holds ``{"x": float tensor [N, F], "y": float tensor [N, 1]}``, for example:

    python -c "import torch; x = torch.randn(96, 4); torch.save({'x': x, 'y': x.sum(1, keepdim=True)}, 'data.pt')"

Each rank prints one JSON line per step (``{"rank", "step", "loss"}``) and, at the end,
``FINAL {"rank", "world", "digest"}``: the sha256 of its weights, the same on every rank when
DDP kept them in step. It runs on CPUs over gloo, so it works on any host.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

# Defaults, overridable on the command line.
STEPS = 30
LEARNING_RATE = 0.05
SEED = 0  # the same on every rank, so every rank starts from the same weights


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help='a torch.save()d dict {"x": [N, F], "y": [N, 1]}')
    parser.add_argument("steps", nargs="?", type=int, default=STEPS, help=f"optimizer steps (default {STEPS})")
    parser.add_argument("--lr", type=float, default=LEARNING_RATE, help=f"learning rate (default {LEARNING_RATE})")
    return parser.parse_args()


def weights_digest(model: torch.nn.Module) -> str:
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()


def main() -> None:
    args = parse_args()

    # Setup: torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every process.
    dist.init_process_group("gloo")
    final = train(args, dist.get_rank(), dist.get_world_size())
    emit("FINAL " + json.dumps(final))
    # Teardown. The DDP model died with train(): a reducer that outlives the group holds gloo work whose
    # tensors are freed during interpreter shutdown, which aborts the process (exit -6). Then every rank
    # passes its last all-reduce before any closes its gloo pairs under another rank's pending work.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def train(args: argparse.Namespace, rank: int, world: int) -> dict:
    # Data: every rank takes every world-th sample, so the shards are disjoint and cover the set.
    data = torch.load(args.data)
    x, y = data["x"][rank::world], data["y"][rank::world]

    # Model and optimizer: DDP averages the gradients across ranks in backward().
    torch.manual_seed(SEED)
    model = DDP(torch.nn.Linear(x.shape[1], 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    # Loop: one full-shard step each time.
    for step in range(1, args.steps + 1):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        emit(json.dumps({"rank": rank, "step": step, "loss": loss.item()}))

    return {"rank": rank, "world": world, "digest": weights_digest(model.module)}


def emit(line: str) -> None:
    # One write per line: the ranks share one stdout pipe, and print()'s separate write of the
    # newline lets another rank's line land in between.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
