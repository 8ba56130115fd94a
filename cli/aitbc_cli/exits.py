"""Exit codes and error output: one table from the SDK's error classes to the code a script can test.

Exit 2 is for usage errors only (a bad option, a bad value, a bad config); each kind of runtime
failure has its own code. With ``--json`` an error is one JSON object on stdout,
``{"error": message, "code": exit code, "type": error class}``, as ``flwr --format json`` does.
"""

from __future__ import annotations

import json
from enum import IntEnum

from pydantic import ValidationError

from aitbc_agent_sdk.errors import (
    AitbcError, ChainError, ConfigError, ContentNotFoundError, InsufficientFundsError, IntegrityError,
    NotEnoughWorkersError, NotFoundError, SignatureError, TrainingError, UnreachableError, UnsafeNameError,
)


MAX_MESSAGE_CHARS = 1024  # an unexpected error's text may quote anything: one line, bounded


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # a runtime failure with no code of its own
    USAGE = 2  # bad option, value, configuration or input file: fix the command line
    UNREACHABLE = 3  # chain RPC node, MQTT broker or IPFS API down or not answering
    NOT_ENOUGH_PROVIDERS = 4  # fewer suitable providers on the market than the training needs
    PAYMENT = 5  # the chain refused or lost a transaction, or the wallet cannot pay
    NOT_FOUND = 6  # no such training, job, wallet, contract or CID
    INTEGRITY = 7  # content or a signature did not verify
    TRAINING = 8  # local training failed
    INTERRUPTED = 130  # Ctrl-C


# Most specific first: the first class an error is an instance of gives its code.
EXIT_CODES: tuple[tuple[type[BaseException], ExitCode], ...] = (
    (ValidationError, ExitCode.USAGE),
    (ConfigError, ExitCode.USAGE),
    (UnsafeNameError, ExitCode.USAGE),
    (UnreachableError, ExitCode.UNREACHABLE),
    (NotEnoughWorkersError, ExitCode.NOT_ENOUGH_PROVIDERS),
    (InsufficientFundsError, ExitCode.PAYMENT),
    (ChainError, ExitCode.PAYMENT),
    (NotFoundError, ExitCode.NOT_FOUND),
    (ContentNotFoundError, ExitCode.NOT_FOUND),
    (IntegrityError, ExitCode.INTEGRITY),
    (SignatureError, ExitCode.INTEGRITY),
    (TrainingError, ExitCode.TRAINING),
    (AitbcError, ExitCode.FAILED),
)

EXIT_HELP = {
    ExitCode.OK: "success",
    ExitCode.FAILED: "runtime failure",
    ExitCode.USAGE: "usage error (bad option, value, config or input file)",
    ExitCode.UNREACHABLE: "a service is unreachable (RPC node, broker, IPFS API)",
    ExitCode.NOT_ENOUGH_PROVIDERS: "not enough suitable providers",
    ExitCode.PAYMENT: "payment or chain failure (revert, funds, lost tx)",
    ExitCode.NOT_FOUND: "not found (training, wallet, CID ...)",
    ExitCode.INTEGRITY: "content or signature failed verification",
    ExitCode.TRAINING: "local training failed",
    ExitCode.INTERRUPTED: "interrupted",
}


def exit_code_for(exc: BaseException) -> ExitCode:
    # A malformed CID on the command line (it is also a StorageError); the storage package is imported
    # here, not for --version.
    from aitbc_agent_sdk.storage import InvalidCidError

    for kind, code in ((InvalidCidError, ExitCode.USAGE), *EXIT_CODES):
        if isinstance(exc, kind):
            return code
    return ExitCode.FAILED


def describe(exc: BaseException) -> str:
    """One line for the user: a pydantic error names the field, anything else is its message."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or exc.title
        return f"invalid {where}: {first['msg']}"
    return str(exc) or type(exc).__name__


def unexpected_message(exc: BaseException) -> str:
    """An error no command expected, in one line: its type, its message, and how to see more."""
    text = " ".join(str(exc).split())[:MAX_MESSAGE_CHARS] or "(no message)"
    return f"{type(exc).__name__}: {text} (run with --debug for the traceback)"


def error_object(message: str, code: int, kind: str) -> dict[str, object]:
    return {"error": message, "code": int(code), "type": kind}


def error_json(message: str, code: int, kind: str) -> str:
    return json.dumps(error_object(message, code, kind), sort_keys=True)


def exit_codes_epilog() -> str:
    """The table for ``aitbc --help``: one line per code."""
    return "Exit codes: " + "; ".join(f"{int(code)} {text}" for code, text in EXIT_HELP.items()) + "."
