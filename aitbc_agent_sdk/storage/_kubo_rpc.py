"""The Kubo RPC API (``/api/v0``) transport, as served by kubo and by js-ipfs.

``KuboClient`` has one method per RPC endpoint and maps errors onto the SDK's. It trusts the
daemon; :class:`~aitbc_agent_sdk.storage._kubo.KuboContentStore` on top does not.

Two daemon-side limits exist besides the HTTP timeout: ``find_timeout`` bounds how long
the daemon looks for content it does not hold (an offline daemon asked for an unknown
CID would otherwise wait forever), and is sent as the RPC's ``timeout`` argument.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from ..errors import ContentNotFoundError, FetchLimitError, StorageError, StoreUnreachableError
from ._address import parse_api_address
from ._bounds import MAX_BLOCK_BYTES
from ._cid import DAG_PB, RAW, cid_from_str, cid_to_str

__all__ = ["DEFAULT_API", "KuboClient", "UnsupportedEndpointError", "same_cid"]

DEFAULT_API = "http://127.0.0.1:5001"
_UPLOAD_PIECE = 1024 * 1024  # bytes read from disk per event-loop hop while uploading
# The slowest rate at which a daemon may chunk, hash and store an upload before it answers: it answers once the
# whole file is stored, and a 1 GB state took js-ipfs over a minute beside another upload (the GPT-2 test).
_ADD_FLOOR_BYTES_PER_S = 4 * 1024 * 1024
# Substrings of daemon messages that mean "this content is not here / was not found in time".
# What kubo (Go's http.NotFound) and js-ipfs (hapi) answer for a path they do not route.
_NO_ROUTE = ("404 page not found", "not found", "method not allowed", "not implemented")
_MISSING = ("not found", "could not find", "timed out", "deadline exceeded", "timeout")


class UnsupportedEndpointError(StorageError):
    """The daemon does not serve this RPC endpoint (HTTP 404/405/501 for the endpoint itself)."""


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"  # kubo and js-ipfs both parse Go-style durations


def same_cid(a: str, b: str) -> bool:
    # The daemon may print a CIDv1 in another multibase (js-ipfs defaults to base58btc).
    return cid_from_str(a) == cid_from_str(b)


class KuboClient:
    """Async client for one daemon's RPC API. ``async with KuboClient(url) as client: ...``

    ``api_url`` is a URL or kubo's multiaddr form (``/ip4/127.0.0.1/tcp/5001``).
    """

    def __init__(self, api_url: str = DEFAULT_API, *, timeout: float = 60.0, find_timeout: float = 60.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.api_url = parse_api_address(api_url)
        self.timeout = timeout
        self.find_timeout = find_timeout
        self._http = httpx.AsyncClient(base_url=f"{self.api_url}/api/v0", transport=transport,
                                       timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)))
        self._closed = False

    async def __aenter__(self) -> KuboClient:
        if self._closed:  # httpx refuses reopening too; say so in our own words
            raise StorageError("KuboClient is closed and cannot be reopened")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        await self._http.aclose()

    # --- health

    async def id(self) -> dict[str, Any]:
        return dict(await self._json("id"))

    async def version(self) -> dict[str, Any]:
        return dict(await self._json("version"))

    # --- files

    async def add(self, data: bytes | Path, *, cid_version: int = 0, raw_leaves: bool | None = None,
                  chunker: str = "size-262144", pin: bool = True, only_hash: bool = False) -> str:
        """``ipfs add`` one file; a Path is streamed from disk, never read whole."""
        params = {"cid-version": str(cid_version), "chunker": chunker, "pin": str(pin).lower(),
                  "only-hash": str(only_hash).lower(), "progress": "false"}
        if raw_leaves is not None:  # unset follows the daemon's default: raw leaves for CIDv1
            params["raw-leaves"] = str(raw_leaves).lower()
        if isinstance(data, Path) and not data.is_file():
            raise StorageError(f"cannot add {data}: not a file")
        name = data.name if isinstance(data, Path) else "data"
        size = data.stat().st_size if isinstance(data, Path) else len(data)
        async with self._request("add", params, upload=(data, name), answer_s=size / _ADD_FLOOR_BYTES_PER_S) as reply:
            return _added_cid(await _read(reply, self.api_url), self.api_url)

    async def cat(self, cid: str) -> AsyncIterator[bytes]:
        """Stream a file's bytes as the daemon sends them. Not verified: see KuboContentStore."""
        params = {"arg": cid, "timeout": _ms(self.find_timeout)}
        async with self._request("cat", params, fetches=True) as reply:
            try:
                async for chunk in reply.aiter_bytes():
                    yield chunk
            except httpx.HTTPError as exc:
                raise StorageError(f"IPFS API {self.api_url}: cat {cid} broke off: {exc!r}") from exc

    async def dag_export(self, cid: str) -> AsyncIterator[bytes]:
        """Stream the DAG under ``cid`` as a CAR v1, as the daemon sends it. Not verified: see
        :class:`~aitbc_agent_sdk.storage._car.CarFileReader`. UnsupportedEndpointError if the
        daemon has no ``dag/export``."""
        params = {"arg": cid, "timeout": _ms(self.find_timeout)}
        async with self._request("dag/export", params, fetches=True) as reply:
            try:
                async for chunk in reply.aiter_bytes():
                    yield chunk
            except httpx.HTTPError as exc:
                raise StorageError(f"IPFS API {self.api_url}: dag/export {cid} broke off: {exc!r}") from exc
            # js-ipfs and kubo report a failure after the first byte in this trailer, which httpx
            # drops: the reader's own completeness check catches the truncated stream instead.

    # --- blocks

    async def block_get(self, cid: str, *, max_bytes: int = MAX_BLOCK_BYTES) -> bytes:
        """One block's bytes; a reply longer than ``max_bytes`` is refused, not buffered."""
        params = {"arg": cid, "timeout": _ms(self.find_timeout)}
        async with self._request("block/get", params, fetches=True) as reply:
            body = bytearray()
            try:
                async for piece in reply.aiter_bytes():
                    body += piece
                    if len(body) > max_bytes:
                        raise FetchLimitError(f"IPFS API {self.api_url}: block {cid} is over the"
                                              f" {max_bytes}-byte block limit")
            except httpx.HTTPError as exc:
                raise StorageError(f"IPFS API {self.api_url}: reply broke off: {exc!r}") from exc
            return bytes(body)

    async def block_put(self, block: bytes, *, codec: int = DAG_PB, cid_version: int = 0) -> str:
        """Store one block; returns the daemon's CID for it."""
        if codec == DAG_PB and cid_version == 0:
            params = {"format": "v0"}  # understood by kubo (deprecated form) and js-ipfs alike
        elif codec in (DAG_PB, RAW):
            params = {"format": "dag-pb" if codec == DAG_PB else "raw", "version": "1"}
        else:
            raise StorageError(f"unsupported codec 0x{codec:x}")
        async with self._request("block/put", params, upload=(block, "block")) as reply:
            key = _json_body(await _read(reply, self.api_url), self.api_url).get("Key")
        if not isinstance(key, str):
            raise StorageError(f"IPFS API {self.api_url}: block/put returned no Key")
        return key

    # --- pins

    async def pin_add(self, cid: str) -> None:
        await self._json("pin/add", {"arg": cid, "timeout": _ms(self.find_timeout)}, fetches=True)

    async def pin_rm(self, cid: str) -> None:
        await self._json("pin/rm", {"arg": cid})

    async def pin_ls(self) -> list[str]:
        """Recursive pins, as canonical CID strings (v0 base58, v1 base32)."""
        reply = await self._json("pin/ls", {"type": "recursive"})
        keys = reply.get("Keys") or {}
        return sorted(cid_to_str(cid_from_str(k)) for k in keys)

    # --- plumbing

    def _request(self, endpoint: str, params: dict[str, str] | None = None, *, fetches: bool = False,
                 upload: tuple[bytes | Path, str] | None = None, answer_s: float = 0.0) -> _Call:
        """``answer_s``: seconds the daemon may take beyond ``timeout`` to answer (a big upload's storing)."""
        if self._closed:
            raise StorageError("KuboClient is closed")
        content, headers = None, None
        if upload is not None:  # one file as multipart/form-data, streamed
            boundary = uuid.uuid4().hex
            content = _multipart(*upload, boundary)
            headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        # Content lookups may legitimately wait up to find_timeout before the first byte.
        timeout = httpx.Timeout(self.timeout + (self.find_timeout if fetches else 0.0) + answer_s,
                                connect=min(self.timeout, 5.0))
        request = self._http.build_request("POST", endpoint, params=params, content=content,
                                           headers=headers, timeout=timeout)
        return _Call(self, request, fetches)

    async def _json(self, endpoint: str, params: dict[str, str] | None = None, *,
                    fetches: bool = False) -> dict[str, Any]:
        async with self._request(endpoint, params, fetches=fetches) as reply:
            return _json_body(await _read(reply, self.api_url), self.api_url)


class _Call:
    """One streamed RPC call: maps transport failures and error replies on entry."""

    def __init__(self, client: KuboClient, request: httpx.Request, fetches: bool) -> None:
        self._client = client
        self._request = request
        self._fetches = fetches
        self._reply: httpx.Response | None = None

    async def __aenter__(self) -> httpx.Response:
        url = self._client.api_url
        what = self._request.url.path.removeprefix("/api/v0/")
        try:
            reply = await self._client._http.send(self._request, stream=True)
        except httpx.ConnectError as exc:
            raise StoreUnreachableError(f"IPFS API {url} is not reachable (is the daemon running?): {exc}") from exc
        except httpx.TimeoutException as exc:
            raise StoreUnreachableError(f"IPFS API {url}: {what} timed out ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise StorageError(f"IPFS API {url}: {what} failed: {exc!r}") from exc
        if reply.status_code != 200:
            try:
                body = await reply.aread()
            except httpx.HTTPError:
                body = b""
            finally:
                await reply.aclose()
            raise _error_for(reply.status_code, body, url, what, self._request, self._fetches)
        self._reply = reply
        return reply

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._reply is not None:
            await self._reply.aclose()


def _error_for(status: int, body: bytes, url: str, what: str, request: httpx.Request,
               fetches: bool) -> StorageError:
    try:
        message = str(json.loads(body).get("Message", ""))
    except (ValueError, AttributeError):
        message = body[:200].decode(errors="replace")
    arg = request.url.params.get("arg")
    subject = f"{what} {arg}" if arg else what
    if status in (404, 405, 501) and (not message or message.lower() in _NO_ROUTE or "unknown endpoint" in message):
        return UnsupportedEndpointError(f"IPFS API {url} does not serve {what} (HTTP {status}: {message})")
    if fetches and any(m in message.lower() for m in _MISSING):
        return ContentNotFoundError(f"IPFS API {url}: {subject}: content not found in time"
                                    f" (HTTP {status}: {message})")
    return StorageError(f"IPFS API {url}: {subject} failed (HTTP {status}): {message or 'no message'}")


async def _read(reply: httpx.Response, url: str) -> bytes:
    try:
        return await reply.aread()
    except httpx.HTTPError as exc:
        raise StorageError(f"IPFS API {url}: reply broke off: {exc!r}") from exc


def _json_body(body: bytes, url: str) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise StorageError(f"IPFS API {url} sent a reply that is not JSON: {body[:200]!r}") from exc
    if not isinstance(value, dict):
        raise StorageError(f"IPFS API {url} sent unexpected JSON: {body[:200]!r}")
    return value


def _added_cid(body: bytes, url: str) -> str:
    """The ``Hash`` of the (single) file in add's NDJSON reply."""
    cid: str | None = None
    for line in body.splitlines():
        if not line.strip():
            continue
        entry = _json_body(line, url)
        if entry.get("Type") == "error" or ("Message" in entry and "Hash" not in entry):
            raise StorageError(f"IPFS API {url}: add failed: {entry.get('Message')}")
        if "Hash" in entry:
            cid = str(entry["Hash"])
    if cid is None:  # kubo reports late failures in a trailer that httpx does not expose
        raise StorageError(f"IPFS API {url}: add returned no CID")
    return cid


async def _multipart(data: bytes | Path, name: str, boundary: str) -> AsyncIterator[bytes]:
    """A one-file multipart/form-data body; files are read a piece at a time off the loop."""
    safe = name.replace('"', "_").replace("\r", "_").replace("\n", "_")
    yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{safe}\"\r\n"
           "Content-Type: application/octet-stream\r\n\r\n").encode()
    if isinstance(data, Path):
        try:
            f = await asyncio.to_thread(open, data, "rb")
        except OSError as exc:
            raise StorageError(f"cannot read {data}: {exc}") from exc
        try:
            while piece := await asyncio.to_thread(f.read, _UPLOAD_PIECE):
                yield piece
        finally:
            f.close()
    else:
        view = memoryview(data)
        for start in range(0, len(view), _UPLOAD_PIECE):
            yield bytes(view[start:start + _UPLOAD_PIECE])
    yield f"\r\n--{boundary}--\r\n".encode()
