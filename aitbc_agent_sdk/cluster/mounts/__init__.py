"""Shared datasets on every host: NFS, S3 (s3fs) or IPFS, each checked the same way.

Each host's agent runs :func:`perform_mount` for a :class:`MountCommand` from the coordinator
and answers a :class:`MountReport`; the coordinator compares the hosts' reports with
:func:`summarize_mounts`. On every host the checks (:mod:`._checks`) are:

* **client**: the mount tool is installed with apt-get when missing (``s3fs``; ``nfs-common``
  for a kernel NFS mount; ``libnfs-utils`` for the userspace NFS client); an offline or failed
  install is reported, not hidden (:mod:`._installer`);
* **access**: read (list, read a file) and write (create, write, read back, compare, remove a
  probe file named ``.aitbc-probe-*``, which manifests skip);
* **content**: a hash manifest (relative path, size, sha256 of every file) whose digest the
  coordinator compares across hosts, naming each host's missing, extra and changed files
  (:mod:`._manifest`, pure);
* **speed**: latency (median of small reads) and write/read throughput of a probe file.

Each source kind has its own backend, picked from :data:`MOUNT_BACKENDS`:

* **s3** (:mod:`._s3fs`): ``s3fs BUCKET MOUNTPOINT -f -o url=ENDPOINT -o use_path_request_style``,
  run as the agent's child (so the agent owns and unmounts it); credentials come from a file
  on the host (``MountSettings.s3_credentials_file`` or s3fs's own defaults), never over the bus.
* **nfs** (:mod:`._nfs`): a kernel mount (``mount -t nfs``) where the kernel has an NFS client.
  Where it has none, no mount can be made: the report says so (``mounted=False``) and the same
  access, manifest and speed checks run through the userspace libnfs tools (``nfs-ls``,
  ``nfs-cat``, ``nfs-cp``; :mod:`._libnfs`) against the server instead.
* **ipfs** (:mod:`._ipfs`): the CID is fetched through a Kubo RPC API with every block checked
  against its hash (:class:`~aitbc_agent_sdk.storage._kubo.KuboContentStore`) into ``MOUNTPOINT/CID``.
"""

from __future__ import annotations

from ._backends import MOUNT_BACKENDS, MountBackend, perform_mount
from ._checks import check_access, check_mounted, hash_manifest, measure_io
from ._installer import CLIENT_PACKAGES, ensure_client, find_binary
from ._ipfs import fetch_ipfs
from ._libnfs import LibnfsClient, libnfs_checks
from ._manifest import compare_manifests, make_manifest, manifest_digest, summarize_mounts
from ._mountpoint import MountHandle, Mounted
from ._nfs import kernel_has_nfs, mount_nfs
from ._records import (
    PROBE_PREFIX, AccessReport, ClusterMountReport, IoReport, Manifest, ManifestComparison, MountCommand, MountError,
    MountReport, MountSettings, MountSource,
)
from ._s3fs import mount_s3

__all__ = [
    "CLIENT_PACKAGES", "MOUNT_BACKENDS", "PROBE_PREFIX", "AccessReport", "ClusterMountReport", "IoReport",
    "LibnfsClient", "Manifest", "ManifestComparison", "MountBackend", "MountCommand", "MountError", "MountHandle",
    "MountReport", "MountSettings", "MountSource", "Mounted", "check_access", "check_mounted", "compare_manifests",
    "ensure_client", "fetch_ipfs", "find_binary", "hash_manifest", "kernel_has_nfs", "libnfs_checks",
    "make_manifest", "manifest_digest", "measure_io", "mount_nfs", "mount_s3", "perform_mount", "summarize_mounts",
]
