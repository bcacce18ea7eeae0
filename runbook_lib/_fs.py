"""Atomic local writes: a temporary name in the same directory, fsync, then rename."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable


def atomic_write(dest: Path, chunks: Iterable[bytes], *, on_chunk: Callable[[int], None] | None = None) -> tuple[int, str]:
    """Write ``chunks`` to ``dest`` atomically, hashing them as they pass.

    Returns:
        ``(size_bytes, sha256 hex)`` of what was written. On any error the temporary file is
        removed and ``dest`` is left as it was.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                h.update(chunk)
                size += len(chunk)
                f.write(chunk)
                if on_chunk is not None:
                    on_chunk(len(chunk))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return size, h.hexdigest()
