"""``file://`` store: a directory. Writes go to a temporary name, are fsynced, then renamed.

:meth:`FileStore.head` hashes the bytes on disk (local reads are cheap), so verifying a set here
is always a full re-hash.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from runbook_lib._fs import atomic_write
from runbook_lib.errors import StorageError
from runbook_lib.storage.base import CHUNK_BYTES, ObjectInfo, Store, accept_download, progress_bar


class FileStore(Store):
    """A store rooted at a directory (created if missing).

    Args:
        root: directory that holds the objects.
    """

    scheme = "file"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_url(cls, url: str, *, base: str | Path = ".") -> "FileStore":
        """``file://relative/dir`` (relative to ``base``) or ``file:///abs/dir``."""
        path = Path(url[len("file://"):])
        return cls(path if path.is_absolute() else Path(base) / path)

    def url(self, key: str = "") -> str:
        return f"file://{self._path(key) if key else self.root}"

    def _path(self, key: str) -> Path:
        p = (self.root / key).resolve()
        if self.root not in p.parents and p != self.root:
            raise StorageError(f"key {key!r} escapes the store root {self.root}")
        return p

    def _stream_copy(self, fin: Any, dest: Path, progress: Any) -> ObjectInfo:
        size, digest = atomic_write(dest, iter(lambda: fin.read(CHUNK_BYTES), b""),
                                    on_chunk=progress.update if progress is not None else None)
        return ObjectInfo(str(dest.relative_to(self.root)), size, digest)

    def put_file(self, src: str | Path, key: str, *, sha256: str | None = None, progress: bool = False) -> ObjectInfo:
        bar = progress_bar(Path(src).stat().st_size if progress else None, f"put {key}", progress)
        try:
            with open(src, "rb") as fin:
                info = self._stream_copy(fin, self._path(key), bar)
        except OSError as exc:
            raise StorageError(f"put {src} -> {self.url(key)} failed: {exc.strerror}") from exc
        finally:
            if bar is not None:
                bar.close()
        if sha256 and info.sha256 != sha256:
            self.delete(key)
            raise StorageError(f"put {self.url(key)}: the bytes read hash to {str(info.sha256)[:16]}..., the writer "
                               f"recorded {sha256[:16]}...; the file changed after it was written (object removed)")
        return ObjectInfo(key, info.size_bytes, info.sha256)

    def put_bytes(self, data: bytes, key: str) -> ObjectInfo:
        import io

        info = self._stream_copy(io.BytesIO(data), self._path(key), None)
        return ObjectInfo(key, info.size_bytes, info.sha256)

    def head(self, key: str) -> ObjectInfo | None:
        """Opens first and reads size and hash from the one open file: an object removed or
        replaced between a check and the read can never mix two versions."""
        try:
            f = open(self._path(key), "rb")  # noqa: SIM115 - closed below
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        h = hashlib.sha256()
        size = 0
        with f:
            while chunk := f.read(CHUNK_BYTES):
                h.update(chunk)
                size += len(chunk)
        return ObjectInfo(key, size, h.hexdigest())

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise StorageError(f"object {self.url(key)} does not exist") from None

    def get_file(self, key: str, dest: str | Path, *, expect: ObjectInfo | None = None,
                 progress: bool = False) -> ObjectInfo:
        try:
            fin = open(self._path(key), "rb")  # noqa: SIM115 - closed below
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise StorageError(f"object {self.url(key)} does not exist") from None
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        bar = progress_bar(os.fstat(fin.fileno()).st_size, f"get {key}", progress)
        h = hashlib.sha256()
        size = 0
        try:
            with fin, open(dest, "wb") as fout:
                while chunk := fin.read(CHUNK_BYTES):
                    h.update(chunk)
                    size += len(chunk)
                    fout.write(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
        finally:
            if bar is not None:
                bar.close()
        return accept_download(key, self.url(key), dest, ObjectInfo(key, size, h.hexdigest()), expect)

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.exists():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith("."))

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> None:
        shutil.rmtree(self._path(prefix), ignore_errors=True)
