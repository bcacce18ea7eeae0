"""One exception tree for the whole runbook; each class says who has to act and how the CLI exits.

    RunbookError                     exit 4 (failed run) unless a subclass says otherwise
    ├── ParamsError (ValueError)     exit 2: the migration YAML is wrong; nothing ran
    ├── UsageError (ValueError)      exit 2: the command cannot apply (wrong run directory, layout)
    ├── ProviderError                a provider refused or failed an operation
    │   ├── AuthError
    │   ├── RateLimited
    │   ├── NoCapacity
    │   ├── ProviderTimeout
    │   ├── NotFound
    │   └── BadRequest
    ├── StorageError                 an object is missing, truncated or fails its checksum
    ├── WorkloadError                the acceptance job or an endpoint worker failed
    ├── EvidenceError                a phase record is missing or the hash chain is broken
    ├── ApprovalRequired             a plan needs an approval record that is not there (exit 3, HOLD)
    └── PhaseFailed                  a phase notebook failed, timed out or lost its kernel

Messages say what failed, the value seen, the limit, and what to do next. Credentials are
never put into a message: callers pass names of secrets, not values.

An ``OSError`` that reaches the CLI is one line (:func:`os_error_line`): a path the user named that
cannot be read, written or created exits 2, as a usage error; a full disk exits 4, named as such.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any, ClassVar

# CLI exit codes (documented in docs/reference/exit-codes.md and `runbook --help`).
EXIT_GO = 0
EXIT_NO_GO = 1
EXIT_USAGE = 2
EXIT_HOLD = 3
EXIT_FAILED = 4
EXIT_BY_DECISION = {"GO": EXIT_GO, "NO-GO": EXIT_NO_GO, "HOLD": EXIT_HOLD}
"""Exit code of a decided run (or a resolution) by its decision; the one map every caller uses."""


class RunbookError(Exception):
    """Root of every error the runbook raises on purpose."""

    exit_code: ClassVar[int] = EXIT_FAILED


class ParamsError(RunbookError, ValueError):
    """A params file is invalid; raised before anything runs.

    Attributes:
        field: dotted path of the offending field (``"target.price_usd_per_hour"``), or ``""``.
        value: the value seen (never a credential: secret fields hold references only).
    """

    exit_code: ClassVar[int] = EXIT_USAGE

    def __init__(self, message: str, *, field: str = "", value: Any = None) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


class UsageError(RunbookError, ValueError):
    """The command was asked for something it must not do (e.g. rewrite a sealed run); nothing ran."""

    exit_code: ClassVar[int] = EXIT_USAGE


class ProviderError(RunbookError):
    """A provider operation failed.

    Attributes:
        provider: registry name (``"local"``, ``"runpod"``, ``"vast"``).
        resource_id: pod / instance / endpoint id concerned, if any.
    """

    def __init__(self, message: str, *, provider: str = "", resource_id: str = "") -> None:
        super().__init__(message)
        self.provider = provider
        self.resource_id = resource_id


class AuthError(ProviderError):
    """Credentials are missing or were refused."""


class RateLimited(ProviderError):
    """The provider asked us to slow down."""


class NoCapacity(ProviderError):
    """No offer or worker could be had within the budget."""


class ProviderTimeout(ProviderError):
    """A resource did not reach the wanted state before its deadline."""


class NotFound(ProviderError):
    """The resource does not exist (or no longer exists)."""


class CreateOutcomeUnknown(ProviderError):
    """A request that creates something got no clear answer (a 5xx after it was sent, a timeout,
    a dropped connection): the resource may exist. It is never retried blindly; the adapter lists
    by the run's labels and adopts what it finds, or fails without creating a second one."""


class BadRequest(ProviderError):
    """The provider rejected the request as invalid (HTTP 400/422 that is not a capacity error)."""


class StorageError(RunbookError):
    """An object is missing, truncated, or its sha256 differs from its manifest."""


class WorkloadError(RunbookError):
    """The acceptance job, a training step or an endpoint worker failed."""


class EvidenceError(RunbookError):
    """A phase record is missing, altered, or does not chain to the one before it."""


class ApprovalRequired(RunbookError):
    """A plan that creates, changes, funds or destroys a resource has no matching approval."""

    exit_code: ClassVar[int] = EXIT_HOLD


class PhaseFailed(RunbookError):
    """A phase notebook failed: an error in a cell, a cell timeout, or a dead kernel.

    Attributes:
        phase: phase id (``"03"``).
        notebook: path of the executed notebook that was kept.
        cell_index: index of the failing cell, or -1 when unknown.
        ename: exception class name seen in the kernel (``"DeadKernelError"``...).
    """

    def __init__(
        self, message: str, *, phase: str, notebook: str, cell_index: int = -1, ename: str = ""
    ) -> None:
        super().__init__(message)
        self.phase = phase
        self.notebook = notebook
        self.cell_index = cell_index
        self.ename = ename


FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
"""errno values of a device with no space (or quota) left: the run failed for want of disk."""
PATH_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST,
               errno.ELOOP, errno.ENAMETOOLONG)
"""errno values of a path the user chose that cannot be used (permissions, a read-only file system,
a missing or non-directory parent, a symlink refused): a usage error, exit 2."""


def os_error_exit(exc: OSError) -> int:
    """The CLI's exit code for ``exc``: 2 for :data:`PATH_ERRNOS`, else 4 (a full disk included)."""
    return EXIT_USAGE if exc.errno in PATH_ERRNOS else EXIT_FAILED


def free_space(path: str | os.PathLike[str] | None) -> str:
    """What is left on the file system holding ``path`` (its nearest existing ancestor), as
    ``"4.1 MB free of 9.8 GB"`` (10**6 bytes a MB, from :func:`shutil.disk_usage`, which is
    ``statvfs(3)``: free means available to this user); "" when it cannot be read."""
    if not path:
        return ""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        usage = shutil.disk_usage(p)
    except OSError:
        return ""
    return f"{_size(usage.free)} free of {_size(usage.total)}"


def _size(n: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def os_error_line(exc: OSError) -> str:
    """``exc`` as one line saying what failed on which path and what to do next (errno names from
    ``errno(3)``); a full disk also says what is left on it (:func:`free_space`)."""
    where = f" {exc.filename}" if exc.filename else ""
    what = exc.strerror or str(exc)
    if exc.errno in FULL_DISK:
        left = free_space(exc.filename)
        return (f"no space left on the device holding{where} ({what}{'; ' + left if left else ''}): what was being "
                "written there is incomplete; free space (or pass --reports on another disk) and run again")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot use{where}: {what}; choose a path this user can write (--reports DIR, a directory you own)"
    if exc.errno in PATH_ERRNOS:
        return f"cannot use{where}: {what}; check the path (each parent must exist and be a directory)"
    return f"{type(exc).__name__}{where}: {what}"
