"""The concept lexicon: which words (after stemming) carry which meaning. Pure data + one matcher.

A concept is present in a request when any of its entries is: a single word, or a phrase
whose words appear in that order within a window of :data:`WINDOW` tokens ("how is
training T doing" holds the phrase "how ... do"). Entries are stemmed when this module
loads, with the same stemmer as the request, so "crash" also matches "crashed"/"crashes".
"""

from __future__ import annotations

from collections.abc import Sequence

from ._text import stem_phrase

WINDOW = 5

LEXICON: dict[str, tuple[str, ...]] = {
    "NODE": ("host", "node", "machine", "server", "box", "computer", "instance", "vm", "member", "rank",
             "worker node", "peer machine"),
    "CLUSTER": ("cluster", "fleet", "multi node", "multinode", "multi host", "multihost", "farm", "rack"),
    "ALL": ("all", "every", "each", "everywhere", "whole", "entire"),
    "GPU": ("gpu", "graphics card", "graphic card", "video card", "accelerator", "cuda", "nvidia", "zgpumodel"),
    "HARDWARE": ("hardware", "inventory", "spec", "specs", "resources", "vram", "driver", "equip", "equipped",
                 "capable", "capability", "cpu only", "cpu"),
    "DETECT": ("detect", "find", "list", "which", "show", "what", "discover", "scan", "check", "identify", "tell",
               "enumerate", "report", "survey", "probe", "see", "inspect", "look for", "figure out", "are there",
               "do any", "any", "display", "query", "count", "how many", "give", "get"),
    "MOUNT": ("mount", "nfs", "s3fs", "zsurl", "znfs", "zcid", "ipfs", "attach", "make available", "make accessible",
              "export", "network storage", "shared storage", "share storage", "remount", "hook up", "share",
              "mount point", "bucket", "network drive", "network share", "filesystem"),
    "SHARE": ("share", "common", "same", "shared"),
    "DATA": ("dataset", "data", "corpus", "file", "folder", "directory", "bucket", "volume", "storage", "zpath",
             "digits", "image", "sample"),
    "BALANCE": ("balance", "rebalance", "even out", "evenly", "equalize", "equalise", "optimize", "optimise",
                "spread evenly", "allocat", "allocate", "allocation", "adjust", "fit in memory", "oom",
                "out of memory", "overflow", "run out", "utilization", "utilisation", "load balance", "tune",
                "level", "redistribute", "uniform", "fair"),
    "MEMORY": ("memory", "vram", "mem", "oom", "out of memory", "usage", "load", "utilization", "utilisation"),
    "BATCH": ("batch", "batch size", "per gpu batch"),
    "RECOVER": ("recover", "recovery", "heal", "self heal", "failover", "fail over", "rescue", "restart",
                "reschedule", "reallocate", "reassign", "bring back", "survive", "handle", "fix", "repair",
                "replace", "move work", "move the work", "migrate", "relaunch", "deal with", "cope with",
                "get back", "redistribute"),
    "CRASH": ("crash", "die", "down", "fail", "failure", "unresponsive", "lose", "hang", "offline", "break",
              "outage", "went away", "stop respond", "not respond", "kill", "dead", "fault", "faulty",
              "disappear", "unreachable", "oom kill"),
    "DISTRIBUTE": ("distribute", "spread", "split", "shard", "parallel", "parallelize", "parallelise", "ddp",
                   "torch distributed", "multi node", "multinode", "multi host", "launch", "scale", "scale out",
                   "run across", "across", "spread out", "use", "span", "fan out", "multi gpu"),
    "ACROSS": ("across", "over", "onto", "between", "among", "on all", "on every", "on each"),
    "TRAIN": ("train", "training", "fit", "finetune", "fine tune", "learn", "job", "model", "run",
              "experiment", "transformer", "cnn", "mlp", "workload"),
    "MARKET": ("worker", "provider", "rent", "rental", "hire", "market", "marketplace", "offer", "seller",
               "contractor", "zprice", "escrow", "contract", "cheap", "cheapest", "price", "cost", "eth", "budget"),
    "HIRE": ("hire", "recruit", "engage", "book", "sign", "enlist", "sign up", "bring on", "find", "discover",
             "select", "pick", "get", "rent", "contract", "look for", "source"),
    "STATUS": ("status", "progress", "how be", "how do", "how go", "how far", "far along", "how look",
               "how it go", "how thing", "update on", "accuracy", "loss", "monitor", "watch", "track", "finish",
               "complet", "eta", "still run", "what happen", "what up", "check on", "state of", "doing",
               "come along"),
    "PAY_ACT": ("pay", "payout", "settle", "compensate", "reward", "remunerate", "send money", "release payment",
                "release fund", "pay out", "pay up", "settle up", "release the money", "wire", "transfer"),
    "PAYMENT_REC": ("payment", "paid", "payout", "transaction", "tx", "receipt", "earn", "earning", "how much",
                    "who get", "spent", "spend"),
    "SHOWISH": ("show", "list", "display", "view", "see", "what", "who", "how much", "history", "report", "check",
                "tell", "look at", "give", "summary", "breakdown"),
    "PAST": ("paid", "did", "be paid", "have been", "already", "so far", "get paid", "receive", "record"),
    "WALLET": ("wallet", "fund", "money", "eth", "ether", "account", "how much eth", "how rich", "my balance",
               "our balance", "balance of", "coin", "afford"),
    "BALWORD": ("balance", "left", "remain", "have"),
    "UPLOAD": ("upload", "put", "push", "store", "ingest", "send", "load", "add", "copy", "pin"),
    "INIT": ("create", "init", "initialize", "initialise", "set up", "setup", "new", "prepare", "register",
             "define", "open", "make"),
    "FUND": ("distribute", "fund", "start", "launch", "kick off", "begin", "deploy", "dispatch", "go ahead",
             "proceed", "shard", "hand out", "send out"),
    "RESUME": ("resume", "continue", "carry on", "pick up", "restart", "relaunch", "revive", "restore",
               "take over", "keep go"),
    "COORD": ("coordinator", "daemon", "driver", "orchestrator", "coordinat"),
    "COST": ("cost", "estimate", "quote", "price of", "expense", "expensive", "budget"),
}


def _compile() -> dict[str, tuple[tuple[str, ...], ...]]:
    return {name: tuple(dict.fromkeys(stem_phrase(e) for e in entries)) for name, entries in LEXICON.items()}


COMPILED = _compile()


def phrase_in(phrase: tuple[str, ...], toks: Sequence[str]) -> bool:
    """Whether the phrase's words appear in order within ``WINDOW`` tokens (one word: anywhere)."""
    if not phrase:
        return False
    if len(phrase) == 1:
        return phrase[0] in toks
    for start, tok in enumerate(toks):
        if tok != phrase[0]:
            continue
        pos, ok = start, True
        for word in phrase[1:]:
            try:
                pos = toks.index(word, pos + 1, start + WINDOW + len(phrase))
            except ValueError:
                ok = False
                break
        if ok:
            return True
    return False


def concepts_in(toks: Sequence[str]) -> set[str]:
    return {name for name, phrases in COMPILED.items() if any(phrase_in(p, toks) for p in phrases)}
