"""Mount clients: found on the host, or installed with apt-get when missing (and allowed)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

# binary -> Debian package that provides it
CLIENT_PACKAGES = {"s3fs": "s3fs", "mount.nfs": "nfs-common", "nfs-cp": "libnfs-utils"}


def find_binary(name: str) -> str | None:
    return shutil.which(name) or next((str(p) for d in ("/usr/sbin", "/sbin", "/usr/bin")
                                       if (p := Path(d) / name).is_file()), None)


def ensure_client(binary: str, *, install: bool, apt_get: Sequence[str] = ("apt-get",),
                  package: str | None = None, timeout: float = 600) -> tuple[str | None, str | None, str | None]:
    """``(path, installed_package, error)``: the binary, installing its Debian package when missing."""
    found = find_binary(binary)
    if found:
        return found, None, None
    package = package or CLIENT_PACKAGES.get(binary, binary)
    if not install:
        return None, None, f"{binary} is not installed (Debian package {package}) and installing is off"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        done = subprocess.run([*apt_get, "install", "-y", "--no-install-recommends", package], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, None, f"{binary} is missing and 'apt-get install {package}' could not run: {exc}"
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return None, None, (f"{binary} is missing and 'apt-get install {package}' failed (exit {done.returncode}; "
                            f"offline?): {' | '.join(tail)}")
    found = find_binary(binary)
    if not found:
        return None, None, f"'apt-get install {package}' succeeded but {binary} is still not found"
    return found, package, None
