"""Storage: the ContentStore port, kubo-compatible UnixFS CIDs and the local blockstore."""

from .local import LocalContentStore, compute_file_cid, read_chunks
from .port import DEFAULT_CHUNK_SIZE, AddOptions, ContentStore
from .unixfs import (
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
    walk_file,
)

__all__ = [
    "DAG_PB", "DEFAULT_CHUNK_SIZE", "MAX_LINKS", "RAW", "AddOptions", "Block", "ContentStore",
    "FileDagBuilder", "InvalidCidError", "LocalContentStore", "PBLink", "PBNode", "UnixFSData",
    "cid_for_block", "cid_from_str", "cid_to_str", "compute_cid", "compute_file_cid",
    "decode_dagpb", "decode_unixfs", "iter_blocks", "parse_cid", "read_chunks", "walk_file",
]
