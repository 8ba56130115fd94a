"""One error root for the SDK; adapters map library errors onto these with ``raise ... from``."""

from __future__ import annotations


class AitbcError(Exception):
    """Root of every error the SDK raises on purpose."""


class ConfigError(AitbcError):
    """A configuration or argument the user supplied is invalid."""


class DatasetError(ConfigError):
    """A dataset file is missing, unreadable or lacks the expected columns."""


class UnsafeNameError(AitbcError, ValueError):
    """An id or topic level that could reach outside its directory or topic (``..``, ``/``, ``#``...)."""


class UnknownModelError(ConfigError):
    """The requested model type is not in the registry."""


class NotEnoughWorkersError(AitbcError):
    """Fewer suitable providers were discovered than the training needs."""


class InsufficientFundsError(AitbcError):
    """The wallet cannot cover the escrow budget plus gas."""


class PhaseError(AitbcError):
    """A training phase transition that the phase machine does not allow."""


class NotFoundError(AitbcError):
    """A training, job, worker or contract id that is not known."""


class UnreachableError(AitbcError):
    """A service (chain RPC node, MQTT broker, IPFS API) could not be reached or did not answer in time."""


class StorageError(AitbcError):
    """The content store failed to store or return content."""


class StoreUnreachableError(StorageError, UnreachableError):
    """The IPFS API (or another store backend) is down or did not answer in time."""


class ContentNotFoundError(StorageError):
    """No content is stored under the requested CID."""


class IntegrityError(StorageError):
    """Content read back does not hash to the CID it was requested by."""


class FetchLimitError(IntegrityError):
    """Content read by CID breaks a limit of the read: size, links, depth, blocks or time."""


class DecryptionError(IntegrityError):
    """Sealed content or a wrapped key does not authenticate: wrong key or context, tampered or truncated."""


class MessagingError(AitbcError):
    """The message bus failed, or a request got no reply in time."""


class BrokerUnreachableError(MessagingError, UnreachableError):
    """The MQTT broker could not be reached (refused credentials are a plain MessagingError)."""


class SignatureError(MessagingError):
    """An envelope is unsigned, forged, replayed or stale."""


class ChainError(AitbcError):
    """A chain call failed: dead RPC, revert, or a transaction that did not land."""


class ChainUnreachableError(ChainError, UnreachableError):
    """The JSON-RPC node is down or did not answer in time."""


class ContractRevertError(ChainError):
    """A contract call reverted; ``reason`` carries the revert string when there is one."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class TrainingError(AitbcError):
    """Local training in a worker process failed."""
