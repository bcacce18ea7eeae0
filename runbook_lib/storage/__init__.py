"""Checksummed object storage for checkpoints, golden outputs and canary results.

One interface, :class:`Store`, two implementations: ``file://`` directories
(:mod:`runbook_lib.storage.local`, the embedded default) and S3-compatible stores over boto3
(:mod:`runbook_lib.storage.s3`). Our own sha256 is computed while bytes stream, kept in object
metadata and in manifests, and checked again while downloads stream.

Layout of a *set* (a checkpoint with its shards, or a canary's results) under a prefix:
every object first, then ``MANIFEST.json`` (keys, sizes in bytes, sha256, producer run id),
then the completion marker ``_SUCCESS`` last. Readers refuse a prefix without a marker, with a
marker from another run, or with any mismatch, and name the object that failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runbook_lib import secrets
from runbook_lib.errors import StorageError
from runbook_lib.storage.base import (
    CHUNK_BYTES,
    MANIFEST_KEY,
    MARKER_KEY,
    HashingReader,
    HashingWriter,
    ObjectInfo,
    Store,
    check,
    progress_bar,
)

__all__ = ["CHUNK_BYTES", "MANIFEST_KEY", "MARKER_KEY", "HashingReader", "HashingWriter", "ObjectInfo", "Store",
           "check", "credential_env", "open_store", "progress_bar", "store_from_params"]


def open_store(url: str, *, base: str | Path = ".", **options: Any) -> Store:
    """Build the store for ``url``: ``file://dir`` (relative to ``base``) or ``s3://bucket/prefix``.

    Args:
        url: store URL.
        base: directory a relative ``file://`` path is resolved against.
        options: S3 options (``endpoint_url``, ``region``, ``checksum_mode``, ``create_bucket``,
            credentials) passed to :class:`runbook_lib.storage.s3.S3Store`.

    Raises:
        StorageError: unknown scheme.
    """
    if url.startswith("file://"):
        from runbook_lib.storage.local import FileStore

        return FileStore.from_url(url, base=base)
    if url.startswith("s3://"):
        from runbook_lib.storage.s3 import S3Store

        return S3Store.from_url(url, **options)
    raise StorageError(f"unsupported store URL {url!r}: use file://<dir> or s3://<bucket>[/<prefix>]")


def store_from_params(storage: Any, *, base: str | Path = ".") -> Store:
    """Build the store a migration's ``storage`` params section names, resolving credential
    references at run time (values are never stored or logged).

    Raises:
        StorageError: bad URL. AuthError: a credential reference is set but does not resolve.
    """
    opts: dict[str, Any] = {}
    if storage.url.startswith("s3://"):
        opts = {"endpoint_url": storage.endpoint_url, "region": storage.region,
                "checksum_mode": storage.checksum_mode, "create_bucket": storage.create_bucket}
        if storage.access_key_id_ref and storage.secret_access_key_ref:
            opts["access_key_id"] = secrets.resolve("access_key_id", storage.access_key_id_ref)
            opts["secret_access_key"] = secrets.resolve("secret_access_key", storage.secret_access_key_ref)
    return open_store(storage.url, base=base, **opts)


def credential_env(storage: Any) -> tuple[tuple[str, str], ...]:
    """``(NAME, ref)`` pairs a pod needs to reach the store: each ``env:VAR`` credential reference
    is injected under its own variable name, so the pod resolves the same reference."""
    out = []
    for ref in (storage.access_key_id_ref, storage.secret_access_key_ref):
        if ref.startswith("env:"):
            out.append((ref[4:], ref))
    return tuple(out)


def __getattr__(name: str) -> Any:  # FileStore / S3Store without importing boto3 eagerly
    if name == "FileStore":
        from runbook_lib.storage.local import FileStore

        return FileStore
    if name == "S3Store":
        from runbook_lib.storage.s3 import S3Store

        return S3Store
    raise AttributeError(name)
