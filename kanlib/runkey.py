"""What a run key hashes besides the config: the version of the code that runs it and of torch, a data file's
content, and the host allocator asked for (``kanlib.config.Config.run_key``, ``RunConfig.key_inputs``).

A change of any of these makes a new key, so changed code, another torch, rewritten data or another allocator
reruns instead of reusing or silently pooling old records. Torch-free: a runner computes keys without importing it.
"""

from __future__ import annotations

import functools
import hashlib
import os


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """A hash of the source of every kanlib module a run executes (12 hex digits).

    Hashes the files themselves, so a committed change and an uncommitted edit both give a new
    version (``git_sha`` in the record says which commit, ``-dirty`` when edited). Analysis-only
    modules and packages (:data:`ANALYSIS_MODULES`: tables, figures, report) are left out: changing how
    results are drawn does not make the measurements stale. ``KANLIB_CODE_VERSION`` overrides it (tests).
    """
    forced = os.environ.get("KANLIB_CODE_VERSION")
    if forced:
        return forced
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in runtime_sources(here):
        with open(os.path.join(here, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()[:12]


def host_malloc_asked() -> str:
    """The host allocator setting a run launched from this environment asks for: ``KANLIB_HOST_MALLOC``
    lower-cased (``steady`` when unset or empty; kanlib.metrics.steady_host_allocator applies it and refuses other
    values). It moved the one-process baseline from 200 to 129 ms (docs/measurement.md), so it is part of the
    run key."""
    return os.environ.get("KANLIB_HOST_MALLOC", "steady").strip().lower() or "steady"


def runtime_sources(package_dir: str) -> list[str]:
    """The ``.py`` files under ``package_dir`` that a run executes (relative paths, sorted): every module and
    subpackage except those named in :data:`ANALYSIS_MODULES`."""
    out = []
    for root, dirs, files in os.walk(package_dir):
        rel = os.path.relpath(root, package_dir)
        if rel == ".":
            dirs[:] = [d for d in dirs if d not in ANALYSIS_MODULES]
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in files:
            path = name if rel == "." else os.path.join(rel, name)
            if name.endswith(".py") and not (rel == "." and name[:-3] in ANALYSIS_MODULES):
                out.append(path)
    return sorted(out)


@functools.lru_cache(maxsize=1)
def torch_version() -> str:
    """The installed torch's version as its package metadata says (``2.13.0+cpu``; what ``torch.__version__``
    reports), read without importing torch, so a runner and its workers agree; ``none`` without torch."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"


def data_fingerprint(path: str) -> str:
    """SHA-256 of the content of the data file ``path`` (16 hex digits; hashed again only when its size or
    modification time changed); empty when the file cannot be read (the task check names the problem)."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return _file_sha256(os.path.abspath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return ""
    return h.hexdigest()[:16]


# Modules and packages of kanlib that only read records (no effect on what a run measures); see code_version().
ANALYSIS_MODULES = ("analysis", "studies", "report", "guidelines")
