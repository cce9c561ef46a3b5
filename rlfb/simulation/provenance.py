"""What a run's figures rest on besides its settings and seeds (:func:`environment`): recorded in every JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["environment"]


#: the packages whose arithmetic a run's figures rest on
_PACKAGES = ("rlfb", "numpy", "scipy", "torch", "sentence-transformers", "transformers", "bm25s")


def environment() -> dict[str, Any]:
    """What a run's figures rest on besides its settings and seeds: Python, the machine's processor, the
    packages' versions, the git commit of a checkout's code and the arithmetic's thread settings. The learned
    figures follow a chain of close decisions, which the last bits of a number can turn, and a run with them:
    the same code and seeds gave scifact thompson's held-out nDCG@10 0.7520 in one session and 0.7471 in the
    next, on another machine or package build (neither recorded then), the fixed systems the same to the
    fourth digit (README, Results).

    >>> env = environment()
    >>> sorted(env) == ["commit", "machine", "packages", "processor", "python", "threads", "uncommitted"]
    True
    """
    import os
    import platform
    import sys
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    # the threads that sum a dot product (their count can change its last bits), as this process has them
    torch = sys.modules.get("torch")  # only if loaded: a run of BM25 alone does not import it for this
    threads = {var: os.environ.get(var) for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    threads["torch"] = torch.get_num_threads() if torch is not None else None
    commit = _commit()
    return {"python": platform.python_version(), "machine": platform.machine(), "processor": _processor(),
            "packages": versions, "commit": commit, "threads": threads,
            "uncommitted": None if commit is None else _uncommitted()}


def _git(*args: str) -> list[str] | None:
    """The lines git prints for ``args`` in the checkout the rlfb source runs from (``[]`` where it prints
    nothing); ``None`` for an installed wheel, without git, or where git fails."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else None


def _commit() -> str | None:
    """The git commit of the rlfb source running, where it runs from a checkout (the version alone, 0.1.0,
    does not tell two sessions' code apart)."""
    head = _git("rev-parse", "HEAD")
    return head[0] if head else None


def _uncommitted() -> list[str] | None:
    """The package's files that differ from the commit of the checkout (changed, added, removed): a run of
    changed code is not that commit's. ``[]`` for a clean checkout; ``None`` where git fails (a failure must not
    read as a clean tree)."""
    changed = _git("diff", "--name-only", "HEAD", "--", "rlfb")
    added = _git("ls-files", "--others", "--exclude-standard", "--", "rlfb")
    if changed is None or added is None:
        return None
    return sorted({*changed, *added})


def _processor() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux, where ``platform.processor()`` is often empty)."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
