"""A small GPT on the Python standard library's sources: central, synchronous DP, FedAvg and DiLoCo.

``python bench/bench_lm.py [--steps 400] [--inner-steps 50] [--plot docs/lm_curves.png] [--quick]``.

Corpus: every ``*.py`` file of ``sysconfig.get_paths()["stdlib"]`` (site-packages left out),
byte-level tokens (vocabulary 257, 256 ends a file). Whole files are held out for validation
(every ``--val-every``-th file of a seeded shuffle); the training files are dealt to 4 workers, a
quarter each. Every row trains the SDK's ``GPT`` from the same initial weights on the same number
of tokens (``steps x workers x batch x context``) with the ``gpt`` task's AdamW (betas 0.9/0.95,
weight decay on matrices, clipping at 1) and warm-up + cosine learning rate:

* central: one process, batches of ``workers x batch`` windows from all training files;
* sync DP: every step each worker's gradient on its own shard, averaged, one AdamW step;
* FedAvg: rounds of ``--inner-steps`` AdamW steps per worker from the global weights, the
  optimizer re-created every round, the weights averaged (``outer_for("fedavg")``);
* DiLoCo: each worker keeps its AdamW across rounds; its pseudo-gradient travels through
  ``encode_update``/``decode_update`` (float32, or int8 with error feedback), the averaged
  weights go to ``NesterovOuter`` (lr 0.7, momentum 0.9);
* DiLoCo + int8 both ways: also the download is the global weights' change, int8 with the
  coordinator's own error feedback (the global is what the workers rebuild, so all hold the same).

Bytes per worker count both directions with real encoded lengths: sync DP sends its gradient and
receives the averaged one every step; the rounds send the update blob and receive the weights
(``encode_state``) each round. Prints a markdown table and one JSON line; ``--plot`` draws
validation loss against tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from aitbc_agent_sdk.records import JobConfig
from aitbc_agent_sdk.wire._checkpoint import encode_state
from aitbc_agent_sdk.data._corpus import BYTE_EOT, BYTE_VOCAB
from aitbc_agent_sdk.tasks._gpt import GPT, GptConfig
from aitbc_agent_sdk.tasks._gpt_task import GptParams, GptTask, warmup_cosine
from aitbc_agent_sdk.aggregate._outer import outer_for
from aitbc_agent_sdk.wire._update_codec import decode_update, encode_update

from quick import parse_args  # bench/ is on sys.path when a benchmark runs

WORKERS = 4
MIN_LR_RATIO = 0.1


@dataclass
class Corpus:
    shards: list[np.ndarray]  # one token array per worker
    everything: np.ndarray  # all training tokens (the central row's data)
    val: np.ndarray
    files: dict[str, int] = field(default_factory=dict)


def load_corpus(max_mib: float, val_every: int, seed: int) -> Corpus:
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file())
    order = np.random.default_rng(seed).permutation(len(paths))
    budget, chosen = int(max_mib * (1 << 20)), []
    for i in order:
        if budget <= 0:
            break
        chosen.append(paths[i])
        budget -= paths[i].stat().st_size
    tokens = [np.append(np.frombuffer(p.read_bytes(), dtype=np.uint8).astype(np.uint16), BYTE_EOT) for p in chosen]
    val = [t for i, t in enumerate(tokens) if i % val_every == 0]
    train = [t for i, t in enumerate(tokens) if i % val_every != 0]
    shards = [np.concatenate(train[w::WORKERS]) for w in range(WORKERS)]
    return Corpus(shards, np.concatenate(shards), np.concatenate(val),
                  {"files": len(chosen), "val_files": len(val), "train_tokens": sum(map(len, train)),
                   "val_tokens": sum(map(len, val))})


def unigram_entropy(tokens: np.ndarray) -> float:
    """Nats per token of the best model that ignores context: the byte frequencies themselves."""
    p = np.bincount(tokens, minlength=BYTE_VOCAB) / len(tokens)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


class Windows:
    """Random training windows of ``context + 1`` tokens from one token array, seeded."""

    def __init__(self, tokens: np.ndarray, context: int, seed: int) -> None:
        self.tokens, self.context = tokens.astype(np.int64), context
        self.rng = np.random.default_rng(seed)

    def batch(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self.rng.integers(0, len(self.tokens) - self.context - 1, size)
        chunk = torch.from_numpy(np.stack([self.tokens[s:s + self.context + 1] for s in starts]))
        return chunk[:, :-1], chunk[:, 1:]


@dataclass
class Setup:
    args: argparse.Namespace
    corpus: Corpus
    val_windows: torch.Tensor
    initial: dict[str, torch.Tensor]

    def model(self, state: dict[str, torch.Tensor] | None = None) -> GPT:
        model = GPT(GptConfig(vocab_size=BYTE_VOCAB, layers=self.args.layers, heads=self.args.heads,
                              width=self.args.width, context=self.args.context))
        model.load_state_dict(state or self.initial)
        return model

    def optimizer(self, model: GPT) -> torch.optim.Optimizer:
        params = GptParams(layers=self.args.layers, heads=self.args.heads, width=self.args.width,
                           context=self.args.context)
        optimizer, _ = GptTask().configure_optimizer(model, params, JobConfig(learning_rate=self.args.lr), 1)
        return optimizer  # its scheduler is replaced by set_lr: the same schedule whether or not Adam is kept

    def set_lr(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        factor = warmup_cosine(self.args.warmup, self.args.steps, MIN_LR_RATIO)(step)
        for group in optimizer.param_groups:
            group["lr"] = self.args.lr * factor

    def tokens_per_step(self) -> int:
        return WORKERS * self.args.batch * self.args.context

    @torch.no_grad()
    def val_loss(self, model: GPT) -> float:
        model.eval()
        total = 0.0
        for chunk in self.val_windows.split(64):
            logits = model(chunk[:, :-1])
            total += F.cross_entropy(logits.reshape(-1, BYTE_VOCAB), chunk[:, 1:].reshape(-1), reduction="sum").item()
        model.train()
        return total / (self.val_windows.shape[0] * self.args.context)


def make_setup(args: argparse.Namespace) -> Setup:
    corpus = load_corpus(args.max_mib, args.val_every, args.seed)
    span = args.context + 1
    count = min(args.eval_windows, len(corpus.val) // span)
    stride = len(corpus.val) // count  # evenly through the validation files, the same windows for every row
    val = torch.from_numpy(np.stack([corpus.val[i * stride:i * stride + span] for i in range(count)]).astype(np.int64))
    torch.manual_seed(args.seed)
    model = GPT(GptConfig(vocab_size=BYTE_VOCAB, layers=args.layers, heads=args.heads, width=args.width,
                          context=args.context))
    return Setup(args, corpus, val, {k: v.clone() for k, v in model.state_dict().items()})


def loss_of(model: GPT, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return F.cross_entropy(model(inputs).reshape(-1, BYTE_VOCAB), targets.reshape(-1))


@dataclass
class Run:
    curve: list[tuple[int, float]] = field(default_factory=list)
    upload: int = 0  # bytes per worker
    download: int = 0
    train_s: float = 0.0
    final: GPT | None = None


def central(setup: Setup) -> Run:
    model, run = setup.model(), Run()
    optimizer, windows = setup.optimizer(model), Windows(setup.corpus.everything, setup.args.context, setup.args.seed)
    return _single_model(setup, model, optimizer, run, lambda: loss_of(model, windows.batch(WORKERS * setup.args.batch)))


def sync_dp(setup: Setup) -> Run:
    model, run = setup.model(), Run()
    optimizer = setup.optimizer(model)
    shards = [Windows(s, setup.args.context, setup.args.seed + w) for w, s in enumerate(setup.corpus.shards)]

    def averaged_loss() -> torch.Tensor:
        total = sum(loss_of(model, w.batch(setup.args.batch)) / WORKERS for w in shards)
        if not run.upload:  # a gradient is one tensor per parameter, as a worker would send it
            run.upload = run.download = len(encode_state({k: torch.zeros_like(v) for k, v in model.state_dict().items()}))
        return total

    done = _single_model(setup, model, optimizer, run, averaged_loss)
    run.upload, run.download = run.upload * setup.args.steps, run.download * setup.args.steps
    return done


def _single_model(setup: Setup, model: GPT, optimizer: torch.optim.Optimizer, run: Run,
                  loss: Callable[[], torch.Tensor]) -> Run:
    """One model, one AdamW, ``steps`` steps; the loss closure says where each step's batch comes from."""
    started = time.perf_counter()
    for step in range(setup.args.steps):
        setup.set_lr(optimizer, step)
        loss().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % setup.args.inner_steps == 0 or step + 1 == setup.args.steps:
            run.train_s += time.perf_counter() - started
            run.curve.append(((step + 1) * setup.tokens_per_step(), setup.val_loss(model)))
            started = time.perf_counter()
    run.final = model
    return run


@dataclass(frozen=True)
class Rounds:
    """A row that syncs every ``inner_steps``: what its outer step is, how it uploads and downloads."""

    outer: str
    upload: str
    keep_optimizer: bool
    download: str = "weights"

    def __call__(self, setup: Setup) -> Run:
        # Long because: one round reads top to bottom: workers train, upload, aggregate, outer step, download.
        args, run = setup.args, Run()
        outer = outer_for(self.outer, args.outer_lr, args.outer_momentum)
        workers = [setup.model() for _ in range(WORKERS)]
        optimizers = [setup.optimizer(m) for m in workers]
        shards = [Windows(s, args.context, args.seed + w) for w, s in enumerate(setup.corpus.shards)]
        residuals: list = [None] * WORKERS
        down_residual, global_state, step = None, dict(setup.initial), 0
        while step < args.steps:
            started, inner = time.perf_counter(), min(args.inner_steps, args.steps - step)
            decoded = []
            for w, model in enumerate(workers):
                model.load_state_dict(global_state)  # in place: a kept AdamW still holds these parameters
                if not self.keep_optimizer:
                    optimizers[w] = setup.optimizer(model)
                for s in range(inner):
                    setup.set_lr(optimizers[w], step + s)
                    loss_of(model, shards[w].batch(args.batch)).backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizers[w].step()
                    optimizers[w].zero_grad(set_to_none=True)
                blob, residuals[w] = encode_update(model.state_dict(), global_state, self.upload, residual=residuals[w])
                run.upload += len(blob) // WORKERS  # every worker's blob has the same length: per worker
                decoded.append(decode_update(blob, global_state, self.upload))
            aggregate = {k: torch.stack([d[k] for d in decoded]).mean(0) for k in global_state}
            new_state = outer.step(global_state, aggregate)
            if self.download == "weights":
                run.download += len(encode_state(new_state))
            else:  # the change of the global weights, with the coordinator's error feedback
                blob, down_residual = encode_update(new_state, global_state, self.download, residual=down_residual)
                run.download += len(blob)
                new_state = decode_update(blob, global_state, self.download)
            global_state, step = new_state, step + inner
            run.train_s += time.perf_counter() - started
            run.curve.append((step * setup.tokens_per_step(), setup.val_loss(setup.model(global_state))))
        run.final = setup.model(global_state)
        return run


ROWS: dict[str, Callable[[Setup], Run]] = {
    "central": central,
    "sync DP": sync_dp,
    "FedAvg": Rounds("fedavg", "weights", keep_optimizer=False),
    "DiLoCo": Rounds("diloco", "float32", keep_optimizer=True),
    "DiLoCo + int8": Rounds("diloco", "int8", keep_optimizer=True),
    "DiLoCo + int8 both ways": Rounds("diloco", "int8", keep_optimizer=True, download="int8"),
}


def row_of(name: str, run: Run, setup: Setup) -> dict:
    loss = run.curve[-1][1]
    return {"row": name, "val_loss": round(loss, 4), "perplexity": round(math.exp(loss), 3),
            "bytes_per_worker": run.upload + run.download, "upload_bytes_per_worker": run.upload,
            "download_bytes_per_worker": run.download, "train_s": round(run.train_s, 1),
            "tokens": run.curve[-1][0], "curve": [[t, round(v, 4)] for t, v in run.curve]}


def ratios(rows: dict[str, dict]) -> dict:
    def r(a: float, b: float) -> float:
        return round(a / b, 4) if b else float("nan")

    dp, diloco, fedavg, int8 = rows["sync DP"], rows["DiLoCo"], rows["FedAvg"], rows["DiLoCo + int8"]
    both = rows["DiLoCo + int8 both ways"]
    return {
        "diloco_loss_over_sync_dp": r(diloco["val_loss"], dp["val_loss"]),
        "sync_dp_bytes_over_diloco": r(dp["bytes_per_worker"], diloco["bytes_per_worker"]),
        "diloco_loss_over_fedavg": r(diloco["val_loss"], fedavg["val_loss"]),
        "central_loss_over_sync_dp": r(rows["central"]["val_loss"], dp["val_loss"]),
        "int8_bytes_over_float32_diloco": r(int8["bytes_per_worker"], diloco["bytes_per_worker"]),
        "int8_upload_bytes_over_float32_diloco": r(int8["upload_bytes_per_worker"], diloco["upload_bytes_per_worker"]),
        "int8_loss_over_float32_diloco": r(int8["val_loss"], diloco["val_loss"]),
        "int8_both_ways_bytes_over_float32_diloco": r(both["bytes_per_worker"], diloco["bytes_per_worker"]),
        "int8_both_ways_loss_over_float32_diloco": r(both["val_loss"], diloco["val_loss"]),
    }


def goals(ratio: dict) -> dict[str, bool]:
    return {
        "diloco_within_5pct_of_sync_dp": ratio["diloco_loss_over_sync_dp"] <= 1.05,
        "diloco_50x_fewer_bytes": ratio["sync_dp_bytes_over_diloco"] >= 50,
        "diloco_better_than_fedavg": ratio["diloco_loss_over_fedavg"] < 1,
        "int8_at_most_0.27x_bytes": ratio["int8_bytes_over_float32_diloco"] <= 0.27,
        "int8_both_ways_at_most_0.27x_bytes": ratio["int8_both_ways_bytes_over_float32_diloco"] <= 0.27,
        "int8_loss_within_1pct": abs(ratio["int8_loss_over_float32_diloco"] - 1) <= 0.01,
        "int8_both_ways_loss_within_1pct": abs(ratio["int8_both_ways_loss_over_float32_diloco"] - 1) <= 0.01,
    }


def table(rows: dict[str, dict], entropy: float) -> str:
    lines = ["| row | val loss (nats) | perplexity | MB per worker (up + down) | train s |", "|---|---|---|---|---|"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['val_loss']:.4f} | {row['perplexity']:.3f} | "
                     f"{row['bytes_per_worker'] / 1e6:.2f} ({row['upload_bytes_per_worker'] / 1e6:.2f} + "
                     f"{row['download_bytes_per_worker'] / 1e6:.2f}) | {row['train_s']:.1f} |")
    lines.append(f"| unigram entropy of the validation split | {entropy:.4f} | {math.exp(entropy):.3f} | | |")
    return "\n".join(lines)


def plot(rows: dict[str, dict], entropy: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, row in rows.items():
        tokens, losses = zip(*row["curve"])
        ax.plot([t / 1e6 for t in tokens], losses, "o-" if "DiLoCo" in name or name == "FedAvg" else "-",
                markersize=3, label=name)
    ax.axhline(entropy, color="grey", linestyle=":", label="unigram entropy")
    ax.set_xlabel("training tokens (millions, all workers)")
    ax.set_ylabel("validation loss (nats per byte)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps per worker, the same for every row")
    parser.add_argument("--inner-steps", type=int, default=50, help="H: inner steps per round (FedAvg, DiLoCo)")
    parser.add_argument("--batch", type=int, default=8, help="windows per worker per step")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3, help="peak inner learning rate (AdamW)")
    parser.add_argument("--warmup", type=int, default=30, help="warm-up steps of the inner learning rate")
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--outer-momentum", type=float, default=0.9)
    parser.add_argument("--max-mib", type=float, default=32.0, help="corpus bytes to read (whole files)")
    parser.add_argument("--val-every", type=int, default=20, help="every n-th file is held out for validation")
    parser.add_argument("--eval-windows", type=int, default=200, help="validation windows of context+1 tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--plot", type=Path, help="draw validation loss against tokens here")
    args = parse_args(parser, steps=8, inner_steps=4, batch=2, layers=1, width=32, context=32, warmup=2,
                      max_mib=1.0, val_every=5, eval_windows=16)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    setup = make_setup(args)
    entropy = unigram_entropy(setup.corpus.val)
    rows = {}
    for name, train in ROWS.items():
        rows[name] = row_of(name, train(setup), setup)
        print(f"{name:24s} val loss {rows[name]['val_loss']:.4f}  {rows[name]['bytes_per_worker'] / 1e6:9.2f} MB "
              f"per worker  {rows[name]['train_s']:7.1f} s", flush=True)
    ratio = ratios(rows)
    print(table(rows, entropy))
    if args.plot:
        plot(rows, entropy, args.plot)
    config = {k: v for k, v in vars(args).items() if k not in ("plot", "quick")}
    print(json.dumps({"bench": "lm", "config": config, "corpus": setup.corpus.files, "tokens_per_row": rows["central"]["tokens"],
                      "unigram_entropy_nats": round(entropy, 4), "rows": list(rows.values()), "ratios": ratio,
                      "goals": goals(ratio), "wall_s": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
