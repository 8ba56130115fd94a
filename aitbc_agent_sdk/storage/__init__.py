"""Storage: the ContentStore port, kubo-compatible UnixFS CIDs (files, directories, HAMTs) and the local blockstore.

The Kubo RPC client is imported on first use (PEP 562): httpx is not needed to compute a CID."""

from .._lazy import lazy_exports

from ._bounds import (
    MAX_BLOCK_BYTES,
    MAX_DAG_DEPTH,
    MAX_NODE_LINKS,
    FileNode,
    fetch_timeout_s,
    read_file_node,
    walk_file,
)
from ._directory_import import scan_directory
from ._local import LocalContentStore, compute_directory_cid, compute_file_cid, read_chunks
from ._paths import parse_content_path
from ._port import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_ENTRIES,
    DEFAULT_TIMEOUT_S,
    HAMT_SHARDING_SIZE,
    AddOptions,
    ContentStore,
    DirectoryStore,
    DirEntry,
)
from ._unixfs import (
    DAG_PB,
    MAX_LINKS,
    RAW,
    Block,
    FileDagBuilder,
    InvalidCidError,
    PBLink,
    PBNode,
    UnixFSData,
    cid_for_block,
    cid_from_str,
    cid_to_str,
    compute_cid,
    decode_dagpb,
    decode_unixfs,
    iter_blocks,
    parse_cid,
)

__getattr__, __dir__, _lazy_names = lazy_exports(__name__, {
    "_address": ("parse_api_address",),
    "_kubo": ("KuboClient", "KuboContentStore"),
}, globals())

__all__ = [*_lazy_names,
    "DAG_PB", "DEFAULT_CHUNK_SIZE", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_ENTRIES", "DEFAULT_TIMEOUT_S",
    "HAMT_SHARDING_SIZE", "MAX_BLOCK_BYTES", "MAX_DAG_DEPTH", "MAX_LINKS", "MAX_NODE_LINKS", "RAW", "AddOptions",
    "Block", "ContentStore", "DirEntry", "DirectoryStore", "FileDagBuilder", "FileNode", "InvalidCidError",
    "LocalContentStore", "PBLink", "PBNode", "UnixFSData", "cid_for_block", "cid_from_str", "cid_to_str",
    "compute_cid", "compute_directory_cid", "compute_file_cid", "decode_dagpb", "decode_unixfs", "fetch_timeout_s",
    "iter_blocks", "parse_cid", "parse_content_path", "read_chunks", "read_file_node", "scan_directory", "walk_file",
]
