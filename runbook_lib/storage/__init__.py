"""Checksummed object storage for checkpoints, golden outputs and canary results.

One interface, :class:`Store`, two implementations: ``file://`` directories
(:mod:`runbook_lib.storage.local`, the embedded default) and S3-compatible stores over boto3
(:mod:`runbook_lib.storage.s3`). Our own sha256 is computed while bytes stream, kept in object
metadata and in manifests, and checked again while downloads stream.

Layout of a *set* (a checkpoint with its shards, or a canary's results) under a prefix:
every object first, then ``MANIFEST.json`` (keys, sizes in bytes, sha256, producer run id),
then the completion marker ``_SUCCESS`` last. Readers refuse a prefix without a marker, with a
marker from another run, or with any mismatch, and name the object that failed.

Pods never get the run's S3 keys: the runbook host builds a short-lived grant per launch
(:mod:`runbook_lib.storage.grants`) and a pod opens the store through it (:func:`pod_store`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from runbook_lib import secret_refs
from runbook_lib.errors import AuthError, StorageError
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
from runbook_lib.storage.grants import GRANT_ENV, Grant, GrantScope, build_grant, grant_from_env, open_grant

__all__ = ["CHUNK_BYTES", "GRANT_ENV", "MANIFEST_KEY", "MARKER_KEY", "Grant", "GrantScope", "HashingReader",
           "HashingWriter", "ObjectInfo", "Store", "build_grant", "check", "credential_env", "open_store", "pod_store",
           "progress_bar", "store_from_params"]


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
            opts["access_key_id"] = secret_refs.resolve("access_key_id", storage.access_key_id_ref)
            opts["secret_access_key"] = secret_refs.resolve("secret_access_key", storage.secret_access_key_ref)
    return open_store(storage.url, base=base, **opts)


def pod_store(storage: Any, url: str, *, env: Mapping[str, str] | None = None) -> Store:
    """The store as a pod or endpoint worker opens it: through the store grant in
    :data:`~runbook_lib.storage.grants.GRANT_ENV` when the runbook passed one (an S3 store:
    presigned URLs, or temporary credentials scoped to a prefix), else ``url`` with the params'
    storage section (a ``file://`` store, shared with a local pod; or an S3 store with no key
    references, reached through boto3's own chain, such as an instance role).

    Args:
        storage: the params' ``storage`` section. url: the store URL the pod was given.
        env: the environment to read (default ``os.environ``).

    Raises:
        StorageError: the grant is damaged, or is for another store than ``url``.
        AuthError: an S3 store whose params name key references, and no grant: the pod would need
            the long-lived keys, which pods never get.
    """
    doc = grant_from_env(env)
    if doc is not None:
        if doc.get("store_url") != url.rstrip("/"):
            raise StorageError(f"this pod's store grant is for {doc.get('store_url')!r}, but it was told to use "
                               f"{url!r}; relaunch it through the runbook")
        return open_grant(doc)
    if url.startswith("s3://") and (storage.access_key_id_ref or storage.secret_access_key_ref):
        raise AuthError(f"the store {url} is S3 with key references in params, and this pod got no store grant "
                        f"({GRANT_ENV}): pods never receive the run's long-lived keys. Launch the pod through the "
                        "runbook's plan (it passes a short-lived grant), not by hand.", provider="s3", resource_id=url)
    return store_from_params(storage.model_copy(update={"url": url, "create_bucket": False}))


def credential_env(storage: Any) -> tuple[tuple[str, str], ...]:
    """``(NAME, ref)`` pairs of the params' ``env:VAR`` storage key references: the variable names
    the run's long-lived storage keys live under on the runbook host. Pods are never given them
    (they get a store grant, :func:`pod_store`); phase 01 uses the names to tell declared
    credentials from undeclared ones."""
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
