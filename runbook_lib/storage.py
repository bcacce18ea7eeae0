"""Checksummed object storage for checkpoints, golden outputs and canary results.

Layout of a *set* (a checkpoint with its shards, or a canary's results) under a prefix:
every object first, then ``MANIFEST.json`` (keys, sizes in bytes, sha256, producer run id),
then the completion marker ``_SUCCESS`` last. Readers refuse a prefix without a marker or with
any mismatch and name the object that failed. The embedded default is a directory (``file://``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from runbook_lib.errors import StorageError

MANIFEST_KEY = "MANIFEST.json"
MARKER_KEY = "_SUCCESS"
_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object: ``key`` relative to the store root, ``size_bytes``, ``sha256`` hex."""

    key: str
    size_bytes: int
    sha256: str


class FileStore:
    """A ``file://`` store rooted at a directory; writes are temp-name, fsync, atomic rename.

    Args:
        root: directory that holds the objects (created if missing).
    """

    scheme = "file"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_url(cls, url: str, *, base: str | Path = ".") -> "FileStore":
        """``file://relative/dir`` (relative to ``base``) or ``file:///abs/dir``."""
        if not url.startswith("file://"):
            raise StorageError(f"unsupported store URL {url!r}: only file:// is available in this build")
        path = Path(url[len("file://"):])
        return cls(path if path.is_absolute() else Path(base) / path)

    def url(self, key: str = "") -> str:
        return f"file://{self._path(key) if key else self.root}"

    def _path(self, key: str) -> Path:
        p = (self.root / key).resolve()
        if self.root not in p.parents and p != self.root:
            raise StorageError(f"key {key!r} escapes the store root {self.root}")
        return p

    def put_file(self, src: str | Path, key: str) -> ObjectInfo:
        """Copy ``src`` to ``key``, hashing while the bytes stream (one read of ``src``).

        Raises:
            StorageError: ``src`` cannot be read.
        """
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        size = 0
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
        try:
            with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
                while chunk := fin.read(_CHUNK_BYTES):
                    h.update(chunk)
                    size += len(chunk)
                    fout.write(chunk)
                fout.flush()
                os.fsync(fout.fileno())
            os.replace(tmp, dest)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise StorageError(f"put {src} -> {self.url(key)} failed: {exc.strerror}") from exc
        return ObjectInfo(key, size, h.hexdigest())

    def put_bytes(self, data: bytes, key: str) -> ObjectInfo:
        """Store ``data`` at ``key`` atomically."""
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
        return ObjectInfo(key, len(data), hashlib.sha256(data).hexdigest())

    def stat(self, key: str) -> ObjectInfo:
        """Size and sha256 of a stored object (hashes it).

        Raises:
            StorageError: the object does not exist.
        """
        p = self._path(key)
        if not p.is_file():
            raise StorageError(f"object {self.url(key)} does not exist")
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while chunk := f.read(_CHUNK_BYTES):
                h.update(chunk)
        return ObjectInfo(key, p.stat().st_size, h.hexdigest())

    def get_file(self, key: str, dest: str | Path, *, expect: ObjectInfo | None = None) -> ObjectInfo:
        """Copy ``key`` to ``dest``, re-hashing while streaming; check size and sha256 if given.

        Raises:
            StorageError: missing object, or size / sha256 differ from ``expect`` (``dest`` is
                then removed, so no partial file is left behind).
        """
        src = self._path(key)
        if not src.is_file():
            raise StorageError(f"object {self.url(key)} does not exist")
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        size = 0
        with open(src, "rb") as fin, open(dest, "wb") as fout:
            while chunk := fin.read(_CHUNK_BYTES):
                h.update(chunk)
                size += len(chunk)
                fout.write(chunk)
        got = ObjectInfo(key, size, h.hexdigest())
        if expect is not None and (got.size_bytes, got.sha256) != (expect.size_bytes, expect.sha256):
            dest.unlink(missing_ok=True)
            raise StorageError(
                f"{self.url(key)}: got {got.size_bytes} bytes sha256 {got.sha256[:16]}..., manifest says "
                f"{expect.size_bytes} bytes sha256 {expect.sha256[:16]}...; refusing the object. "
                "Re-upload it from a verified copy."
            )
        return got

    def list(self, prefix: str = "") -> list[str]:
        """Keys under ``prefix`` (sorted), excluding temporary files."""
        base = self._path(prefix) if prefix else self.root
        if not base.exists():
            return []
        return sorted(
            str(p.relative_to(self.root))
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    def delete_prefix(self, prefix: str) -> None:
        """Remove every object under ``prefix``; idempotent."""
        shutil.rmtree(self._path(prefix), ignore_errors=True)

    # -- sets: objects, then manifest, then marker ------------------------------------------

    def commit_set(self, prefix: str, objects: list[ObjectInfo], *, run_id: str) -> ObjectInfo:
        """Write the manifest for ``objects`` under ``prefix`` and then the completion marker.

        Returns:
            The manifest object (its sha256 goes into evidence).
        """
        manifest = {
            "producer_run_id": run_id,
            "objects": [
                {"key": o.key[len(prefix) + 1:] if o.key.startswith(prefix + "/") else o.key,
                 "size_bytes": o.size_bytes, "sha256": o.sha256}
                for o in objects
            ],
        }
        info = self.put_bytes(json.dumps(manifest, indent=2, sort_keys=True).encode(), f"{prefix}/{MANIFEST_KEY}")
        self.put_bytes(json.dumps({"manifest_sha256": info.sha256}).encode(), f"{prefix}/{MARKER_KEY}")
        return info

    def verify_set(self, prefix: str) -> dict[str, ObjectInfo]:
        """Verify a committed set: marker present, manifest matches marker, every object matches.

        Returns:
            Objects by key relative to ``prefix``.

        Raises:
            StorageError: no marker (incomplete upload), manifest altered, or an object missing,
                truncated or with a different sha256; the message names the object.
        """
        try:
            marker = json.loads(self._path(f"{prefix}/{MARKER_KEY}").read_text())
        except FileNotFoundError:
            raise StorageError(
                f"{self.url(prefix)} has no completion marker {MARKER_KEY}: the set is incomplete "
                "(an upload that did not finish). Do not use it; re-run the producer."
            ) from None
        man = self.stat(f"{prefix}/{MANIFEST_KEY}")
        if man.sha256 != marker.get("manifest_sha256"):
            raise StorageError(f"{self.url(prefix)}: manifest sha256 differs from the marker's; the set was altered")
        manifest = json.loads(self._path(f"{prefix}/{MANIFEST_KEY}").read_text())
        out: dict[str, ObjectInfo] = {}
        for entry in manifest["objects"]:
            key = f"{prefix}/{entry['key']}"
            got = self.stat(key)
            if got.size_bytes != entry["size_bytes"] or got.sha256 != entry["sha256"]:
                raise StorageError(
                    f"{self.url(key)}: {got.size_bytes} bytes sha256 {got.sha256[:16]}..., manifest says "
                    f"{entry['size_bytes']} bytes sha256 {entry['sha256'][:16]}...; the object is corrupt"
                )
            out[entry["key"]] = got
        return out
