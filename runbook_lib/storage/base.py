"""The store interface: :class:`Store` (objects with a recorded sha256, and sets committed as
objects, then ``MANIFEST.json``, then the ``_SUCCESS`` marker), :class:`ObjectInfo`, and the
hashing stream wrappers both backends use. See :mod:`runbook_lib.storage` for the layout."""

from __future__ import annotations

import builtins
import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runbook_lib.errors import StorageError

MANIFEST_KEY = "MANIFEST.json"
MARKER_KEY = "_SUCCESS"
CHUNK_BYTES = 1 << 20  # streaming chunk, bytes


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object: ``key`` relative to the store root, ``size_bytes``, ``sha256`` hex
    (``None`` when the store holds no recorded hash for it)."""

    key: str
    size_bytes: int
    sha256: str | None


class HashingReader:
    """A read-only, non-seekable file wrapper that hashes (sha256) and counts what is read.

    Non-seekable on purpose: boto3's transfer manager then reads it once, in order, so the
    digest covers the bytes exactly as sent.
    """

    def __init__(self, f: Any, progress: Any = None) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()
        self.size = 0
        self._progress = progress

    def read(self, n: int = -1) -> bytes:
        b = self._f.read(n)
        self.sha256.update(b)
        self.size += len(b)
        if self._progress is not None and b:
            self._progress.update(len(b))
        return bytes(b)

    def readable(self) -> bool:
        return True


class HashingWriter:
    """A write-only, non-seekable sink that hashes what it writes into ``f``, in order."""

    def __init__(self, f: Any, progress: Any = None) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()
        self.size = 0
        self._progress = progress

    def write(self, b: bytes) -> int:
        self.sha256.update(b)
        self.size += len(b)
        if self._progress is not None and b:
            self._progress.update(len(b))
        return int(self._f.write(b))

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self._f.flush()


def progress_bar(total: int | None, desc: str, enabled: bool) -> Any:
    """A tqdm bar in bytes with rate, or None when disabled."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=False)


def check(key: str, url: str, got: ObjectInfo, expect: ObjectInfo | None) -> None:
    """Raise StorageError naming ``url`` when size or sha256 differ from ``expect``."""
    if expect is None:
        return
    if got.size_bytes != expect.size_bytes or (expect.sha256 and got.sha256 != expect.sha256):
        raise StorageError(
            f"{url}: got {got.size_bytes} bytes sha256 {str(got.sha256)[:16]}..., expected {expect.size_bytes} bytes "
            f"sha256 {str(expect.sha256)[:16]}...; refusing the object (truncated or corrupt). Re-upload it from a "
            "verified copy."
        )


def accept_download(key: str, url: str, dest: Path, got: ObjectInfo, expect: ObjectInfo | None,
                    recorded: ObjectInfo | None = None) -> ObjectInfo:
    """Keep the download at ``dest`` only when what streamed (``got``) matches ``expect`` (else the
    object's own ``recorded`` size and sha256 metadata, when given) and, when the object records a
    sha256, that too; otherwise delete ``dest`` and raise.

    Raises:
        StorageError: the bytes differ from what was expected or recorded (``dest`` is removed).
    """
    try:
        check(key, url, got, expect or recorded)
        if recorded is not None and recorded.sha256 and got.sha256 != recorded.sha256:
            raise StorageError(f"{url}: bytes hash to {(got.sha256 or '')[:16]}..., object metadata says "
                               f"{recorded.sha256[:16]}...; the object is corrupt")
    except StorageError:
        dest.unlink(missing_ok=True)
        raise
    return got


class Store(ABC):
    """Object store with streamed sha256 and verified sets.

    Implementations provide the primitives (``put_file``, ``put_bytes``, ``get_file``,
    ``get_bytes``, ``head``, ``list``, ``delete``, ``delete_prefix``, ``url``); the set protocol
    is shared.
    """

    scheme: str = ""

    def settings(self) -> dict[str, Any]:
        """Store settings recorded in evidence (no credentials)."""
        return {"scheme": self.scheme, "url": self.url()}

    @abstractmethod
    def url(self, key: str = "") -> str:
        """URL of ``key`` (or of the store root)."""

    @abstractmethod
    def put_file(self, src: str | Path, key: str, *, sha256: str | None = None, progress: bool = False) -> ObjectInfo:
        """Upload ``src`` to ``key``, hashing while the bytes stream (one read of ``src``); the
        sha256 is stored with the object. ``sha256``, when the writer of ``src`` already knows it,
        is checked against the streamed digest.

        Raises:
            StorageError: ``src`` unreadable, it differs from ``sha256`` (nothing is kept), or
                the store refused the write.
        """

    @abstractmethod
    def put_bytes(self, data: bytes, key: str) -> ObjectInfo:
        """Store ``data`` at ``key`` with its sha256."""

    @abstractmethod
    def get_file(self, key: str, dest: str | Path, *, expect: ObjectInfo | None = None,
                 progress: bool = False) -> ObjectInfo:
        """Download ``key`` to ``dest``, re-hashing while streaming; check size and sha256
        against ``expect`` (``dest`` is removed on a mismatch, so no partial file remains).

        Raises:
            StorageError: missing object, or a mismatch.
        """

    @abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """The bytes of a small object (manifests, markers, results).

        Raises:
            StorageError: missing object.
        """

    @abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """Size and recorded sha256 of ``key``, or None when it does not exist."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Keys under ``prefix``, sorted (temporary files excluded)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove one object; idempotent (no error when it is already gone)."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Remove every object under ``prefix``; idempotent."""

    # -- sets: objects, then manifest, then marker ------------------------------------------

    def commit_set(self, prefix: str, objects: builtins.list[ObjectInfo], *, run_id: str,
                   about: dict[str, Any] | None = None) -> ObjectInfo:
        """Write ``MANIFEST.json`` for ``objects`` under ``prefix``, then the completion marker.

        Args:
            about: what moves with the output (JSON): the model and dataset identifiers, the
                runtime versions, the configuration, the run and the validation results
                (:func:`runbook_lib.workload.job.provenance`), kept in the manifest as ``about``
                beside ``producer_run_id``, so a set read elsewhere says what it is.

        Returns:
            The manifest object (its sha256 goes into evidence).
        """
        rel = [{"key": o.key[len(prefix) + 1:] if o.key.startswith(prefix + "/") else o.key,
                "size_bytes": o.size_bytes, "sha256": o.sha256} for o in objects]
        if any(r["sha256"] is None for r in rel):
            raise StorageError(f"commit_set {prefix}: every object needs a sha256 before the manifest is written")
        manifest: dict[str, Any] = {"producer_run_id": run_id, "objects": rel}
        if about:
            manifest["about"] = about
        info = self.put_bytes(json.dumps(manifest, indent=2, sort_keys=True).encode(), f"{prefix}/{MANIFEST_KEY}")
        self.put_bytes(json.dumps({"manifest_sha256": info.sha256, "producer_run_id": run_id}).encode(),
                       f"{prefix}/{MARKER_KEY}")
        return info

    def read_manifest(self, prefix: str, *, run_id: str | None = None) -> dict[str, Any]:
        """The manifest of a committed set, checked against its marker.

        Raises:
            StorageError: no marker (incomplete upload), a marker from another run than
                ``run_id`` (stale), or a manifest that differs from what the marker names.
        """
        try:  # one read, no existence check before it: the marker may vanish in between
            marker = json.loads(self.get_bytes(f"{prefix}/{MARKER_KEY}"))
        except StorageError:
            if self.head(f"{prefix}/{MARKER_KEY}") is not None:
                raise  # it exists, so the read failed for another reason: say that one
            raise StorageError(
                f"{self.url(prefix)} has no completion marker {MARKER_KEY}: the set is incomplete (an upload that "
                "did not finish). Do not use it; re-run the producer."
            ) from None
        if run_id is not None and marker.get("producer_run_id") != run_id:
            raise StorageError(
                f"{self.url(prefix)}: completion marker is from run {marker.get('producer_run_id')!r}, not {run_id!r}; "
                "a stale marker from an earlier run. Re-run the producer for this run."
            )
        raw = self.get_bytes(f"{prefix}/{MANIFEST_KEY}")
        if hashlib.sha256(raw).hexdigest() != marker.get("manifest_sha256"):
            raise StorageError(f"{self.url(prefix)}: manifest sha256 differs from the marker's; the set was altered")
        return dict(json.loads(raw))

    def verify_set(self, prefix: str, *, run_id: str | None = None) -> dict[str, ObjectInfo]:
        """Verify a committed set without downloading it: marker, manifest, and each object's size
        and recorded sha256 (full re-hash happens in :meth:`fetch_set`).

        Returns:
            Objects by key relative to ``prefix``, with the manifest's size and sha256.

        Raises:
            StorageError: as :meth:`read_manifest`, or an object missing or differing from the
                manifest; the message names the object.
        """
        manifest = self.read_manifest(prefix, run_id=run_id)
        out: dict[str, ObjectInfo] = {}
        for entry in manifest["objects"]:
            key = f"{prefix}/{entry['key']}"
            want = ObjectInfo(key, entry["size_bytes"], entry["sha256"])
            got = self.head(key)
            if got is None:
                raise StorageError(f"{self.url(key)} is listed in the manifest but missing (a missing shard)")
            check(key, self.url(key), got, want)
            out[entry["key"]] = want
        return out

    def fetch_set(self, prefix: str, dest: str | Path, *, run_id: str | None = None,
                  progress: bool = False) -> dict[str, Path]:
        """Download a verified set into ``dest``, re-hashing every object while it streams.

        Returns:
            Local paths by key relative to ``prefix``.
        """
        objects = self.verify_set(prefix, run_id=run_id)
        out = {}
        for rel, info in objects.items():
            out[rel] = Path(dest) / rel
            self.get_file(info.key, out[rel], expect=info, progress=progress)
        return out

    def newest_verified_set(self, parent: str) -> tuple[str | None, builtins.list[dict[str, str]]]:
        """Among the sets directly under ``parent`` (e.g. ``ckpt/step-000010``), the newest by name
        that verifies, and the rejected newer ones with the reason.

        Returns:
            ``(prefix or None, [{"prefix", "reason"}, ...])``.
        """
        names = sorted({k[len(parent) + 1:].split("/", 1)[0] for k in self.list(parent) if "/" in k[len(parent) + 1:]},
                       reverse=True)
        rejected: builtins.list[dict[str, str]] = []
        for name in names:
            pfx = f"{parent}/{name}"
            try:
                self.verify_set(pfx)
                return pfx, rejected
            except StorageError as exc:
                rejected.append({"prefix": pfx, "reason": str(exc)})
        return None, rejected
