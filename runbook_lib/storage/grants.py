"""Store grants: what a pod gets instead of the run's long-lived storage keys.

The runbook host keeps the S3 keys (:class:`~runbook_lib.storage.s3.S3Store`). At launch it
turns the scope a plan names (:class:`GrantScope`, part of the approved spec) into a grant
(:func:`build_grant`): a JSON document passed to the pod in one environment variable,
:data:`GRANT_ENV`, whose values are short-lived URLs or short-lived scoped credentials, never the
keys. The pod opens the store through it (:func:`open_grant`). Two kinds:

``urls`` (agent pods: freeze, accept, bench, slice)
    * reads: a presigned ``GET`` and ``HEAD`` URL for exactly the objects of the committed sets
      it reads (the frozen artifact, or the checkpoint set a slice resumes from): their marker
      ``_SUCCESS``, ``MANIFEST.json`` and every object the manifest lists. The host verifies
      each set (:meth:`~runbook_lib.storage.Store.verify_set`) when it builds the grant, so
      the object names are known at launch and a pod is never paid for on an incomplete set.
    * writes: one presigned ``POST`` policy for its own result prefix
      (``["starts-with", "$key", "<prefix>/"]``), with ``content-length-range`` 0 to
      :data:`POST_MAX_BYTES` and ``["starts-with", "$x-amz-meta-sha256", ""]``, so every
      upload carries the sha256 readers check. Names under the prefix need not be known at
      launch. S3 accepts a form only when every field is covered by a policy condition
      (https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-HTTPPOSTConstructPolicy.html);
      one POST carries at most 5 GB
      (https://docs.aws.amazon.com/AmazonS3/latest/API/RESTObjectPOST.html), and there is no
      presigned multipart upload for names unknown at launch, so larger objects cannot be
      written through a grant.
    * reading what it wrote: a presigned URL names one key, and S3 has no wildcard presigned
      ``GET`` (https://docs.aws.amazon.com/AmazonS3/latest/userguide/ShareObjectPreSignedURL.html),
      so a pod cannot read objects whose names were unknown at launch. It does not need to:
      the agent's checkpoints live on its own volume, its result set is write-only, and the
      store (:class:`GrantStore`) answers ``head``/``get``/``list`` for the objects this pod
      wrote from its own record of them (size, sha256, bytes or source file, re-hashed on
      read). A presigned ``ListObjectsV2`` URL of the prefix shows names written by an earlier
      pod (an interrupted one), at most 1000 of them: its query is signed, so it can neither
      page (``continuation-token``) nor narrow its prefix.

``session`` (queue endpoint workers)
    Idempotency records (:mod:`runbook_lib.workload.records`) are written by one worker and
    read by another (a redelivered job, a wiped disk), under names that are job ids: neither
    presigned URLs nor a 1000-key presigned listing can serve that. A worker gets temporary
    credentials instead, from STS ``GetFederationToken``
    (https://docs.aws.amazon.com/STS/latest/APIReference/API_GetFederationToken.html) with an
    inline session policy that allows ``s3:GetObject`` and ``s3:PutObject`` on
    ``<bucket>/<records prefix>/*`` and ``s3:ListBucket`` only for ``s3:prefix`` under it. The
    effective permissions are the intersection of that policy and the host identity's own. The
    credentials last ``ttl_s`` (STS allows 900 to 129600 seconds) and need a store with STS
    beside its S3 API (AWS, moto); :func:`build_grant` says what to do where there is none.

Expiry: a ``urls`` grant's URLs and POST policy expire after the scope's ``ttl_s`` (at most
:data:`PRESIGN_MAX_S`, SigV4's 7 days); a URL signed with temporary credentials dies with them
too. The pod checks the grant's ``expires_at_epoch_s`` before every request and says so, since
some S3-compatible servers (moto) do not enforce expiry. Evidence names the variable, the kind,
the objects and prefix, and the expiry (:meth:`Grant.evidence`), never a URL or credential.
"""

from __future__ import annotations

import builtins
import datetime as _dt
import hashlib
import itertools
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping
from urllib.parse import quote

from runbook_lib._time import iso
from runbook_lib.errors import AuthError, StorageError
from runbook_lib.storage.base import (
    CHUNK_BYTES,
    MANIFEST_KEY,
    MARKER_KEY,
    HashingWriter,
    ObjectInfo,
    Store,
    accept_download,
    progress_bar,
)
from runbook_lib.storage.s3 import S3Store
from runbook_lib.storage.s3_bucket import META_SHA256, BucketPath

GRANT_ENV = "RUNBOOK_STORE_GRANT"
"""The environment variable that carries a pod's grant (JSON). Its name holds no credential
word, so inventories list it as configuration; its value is never shown in plans or evidence."""
GRANT_VERSION = 1
PRESIGN_MAX_S = 604_800
"""Longest validity of a SigV4 presigned URL or POST policy, seconds (7 days)."""
POST_MAX_BYTES = 5 * 1024**3
"""Largest object one presigned POST may upload, bytes (S3's 5 GB limit for POST)."""
FEDERATION_MIN_S, FEDERATION_MAX_S = 900, 129_600
"""Validity bounds of ``GetFederationToken`` credentials, seconds (15 minutes to 36 hours)."""
LIST_MAX_KEYS = 1000
"""Keys one presigned ``ListObjectsV2`` answers (S3's page size; a presigned listing cannot page)."""
MAX_GRANT_BYTES = 96 * 1024
"""Largest grant document, bytes: one environment variable (Linux caps one at 128 KiB,
``MAX_ARG_STRLEN``)."""
HTTP_TIMEOUT_S = 60.0
"""Connect and read timeout of one request a pod makes with its grant, seconds."""

GrantKind = Literal["urls", "session"]


def utc_iso(epoch_s: float) -> str:
    """``epoch_s`` (seconds) as a run timestamp (UTC, ISO 8601, ``Z``)."""
    return iso(_dt.datetime.fromtimestamp(epoch_s, tz=_dt.timezone.utc))


@dataclass(frozen=True)
class GrantScope:
    """What a pod may reach in the run's store, named in its launch spec (so an approval covers
    it) and turned into a :class:`Grant` at launch.

    Attributes:
        kind: ``urls`` (presigned URLs and a POST policy) or ``session`` (temporary credentials
            scoped to ``write_prefix``); see the module docstring.
        read_sets: store prefixes of committed sets the pod reads (``urls``): their marker,
            manifest and objects.
        write_prefix: the store prefix the pod writes under (``urls``: POST policy; ``session``:
            read, write and list).
        ttl_s: how long the grant is valid from the moment it is built, seconds.
        max_object_bytes: the largest object one write may carry, bytes (``urls``).
    """

    kind: GrantKind
    read_sets: tuple[str, ...] = ()
    write_prefix: str = ""
    ttl_s: float = 3600.0
    max_object_bytes: int = POST_MAX_BYTES


@dataclass(frozen=True)
class Grant:
    """A grant built for one launch.

    Attributes:
        scope: what it was built from. document: the JSON the pod gets in :data:`GRANT_ENV`
            (URLs or temporary credentials: never log or record it). issued_at_epoch_s,
            expires_at_epoch_s: its validity, epoch seconds. reads: the store keys it can read.
    """

    scope: GrantScope
    document: dict[str, Any]
    issued_at_epoch_s: float
    expires_at_epoch_s: float
    reads: tuple[str, ...]

    def to_env(self) -> str:
        """The document as the value of :data:`GRANT_ENV`."""
        return json.dumps(self.document, separators=(",", ":"), sort_keys=True)

    def evidence(self) -> dict[str, Any]:
        """What a plan's record shows of the grant: names and expiry, never a URL or a credential."""
        out: dict[str, Any] = {"name": GRANT_ENV, "kind": f"store grant ({self.scope.kind})",
                               "issued_at": utc_iso(self.issued_at_epoch_s),
                               "expires_at": utc_iso(self.expires_at_epoch_s), "ttl_s": self.scope.ttl_s,
                               "write_prefix": self.scope.write_prefix}
        if self.scope.kind == "urls":
            out.update(read_objects=list(self.reads), max_object_bytes=self.scope.max_object_bytes)
        else:
            out["actions"] = ["s3:GetObject", "s3:PutObject", "s3:ListBucket (s3:prefix under write_prefix)"]
        return out


def _clip_ttl(scope: GrantScope) -> int:
    lo, hi = (FEDERATION_MIN_S, FEDERATION_MAX_S) if scope.kind == "session" else (1, PRESIGN_MAX_S)
    ttl = int(scope.ttl_s)
    if not lo <= ttl <= hi:
        raise StorageError(f"store grant ({scope.kind}) ttl_s is {scope.ttl_s:g} s; it must lie in {lo}..{hi} s "
                           f"({'STS GetFederationToken' if scope.kind == 'session' else 'SigV4 presigned URLs'}). "
                           "Shorten the job's timeout, or split the work.")
    return ttl


def build_grant(store: Store, scope: GrantScope, *, clock: Callable[[], float] = time.time) -> Grant:
    """Build the grant of ``scope`` with the host's store (which holds the keys).

    ``urls``: verifies every read set (marker, manifest, each object's size and sha256), then
    presigns a ``GET`` and a ``HEAD`` per object, one ``POST`` policy and one ``ListObjectsV2``
    for ``write_prefix``, each valid ``ttl_s`` seconds (boto3 ``generate_presigned_url`` and
    ``generate_presigned_post``,
    https://boto3.amazonaws.com/v1/documentation/api/latest/guide/s3-presigned-urls.html).
    ``session``: asks STS for federation credentials valid ``ttl_s`` seconds under the session
    policy of :func:`session_policy`.

    Raises:
        StorageError: ``store`` is not an S3 store, a read set does not verify, ``ttl_s`` is out
            of bounds, or the document is larger than :data:`MAX_GRANT_BYTES`.
        AuthError: STS refused the federation token (no STS at the endpoint, or the host's
            credentials are temporary or not allowed ``sts:GetFederationToken``).
    """
    if not isinstance(store, S3Store):
        raise StorageError(f"a store grant is built for an S3 store, not {store.url()!r}: a file:// store is shared "
                           "with local pods directly and needs none")
    ttl = _clip_ttl(scope)
    now = clock()
    doc: dict[str, Any] = {"version": GRANT_VERSION, "kind": scope.kind, "store_url": store.url(),
                           "bucket": store.bucket, "root": store.prefix, "write_prefix": scope.write_prefix.strip("/"),
                           "issued_at_epoch_s": now, "expires_at_epoch_s": now + ttl}
    reads: list[str] = []
    if scope.kind == "session":
        doc["session"] = _federation(store, scope, ttl)
        doc["expires_at_epoch_s"] = min(doc["expires_at_epoch_s"], doc["session"].pop("expires_at_epoch_s"))
    else:
        signer = store.connection.presigner()
        objects: dict[str, dict[str, Any]] = {}
        for pfx in scope.read_sets:
            listed = store.verify_set(pfx)
            keys = [f"{pfx}/{MARKER_KEY}", f"{pfx}/{MANIFEST_KEY}"] + [f"{pfx}/{rel}" for rel in sorted(listed)]
            for key in keys:
                params = {"Bucket": store.bucket, "Key": store.object_key(key)}
                objects[key] = {"get": signer.generate_presigned_url("get_object", Params=params, ExpiresIn=ttl),
                                "head": signer.generate_presigned_url("head_object", Params=params, ExpiresIn=ttl)}
                reads.append(key)
        doc["objects"] = objects
        if scope.write_prefix:
            bucket_prefix = store.object_key(scope.write_prefix.strip("/")) + "/"
            post = signer.generate_presigned_post(
                store.bucket, bucket_prefix + "${filename}", ExpiresIn=ttl,
                Conditions=[["starts-with", "$key", bucket_prefix], ["starts-with", f"$x-amz-meta-{META_SHA256}", ""],
                            ["content-length-range", 0, int(scope.max_object_bytes)]])
            fields = {k: v for k, v in post["fields"].items() if k != "key"}
            doc["write"] = {"url": post["url"], "fields": fields, "max_bytes": int(scope.max_object_bytes)}
            doc["list"] = signer.generate_presigned_url(
                "list_objects_v2", Params={"Bucket": store.bucket, "Prefix": bucket_prefix, "MaxKeys": LIST_MAX_KEYS},
                ExpiresIn=ttl)
    grant = Grant(scope, doc, now, doc["expires_at_epoch_s"], tuple(reads))
    size = len(grant.to_env().encode())
    if size > MAX_GRANT_BYTES:
        raise StorageError(f"the store grant for {len(reads)} objects is {size} bytes, more than the {MAX_GRANT_BYTES} "
                           "bytes one environment variable may carry; pack the artifact into fewer files (a sharded "
                           "checkpoint with fewer, larger shards)")
    return grant


def session_policy(bucket: str, bucket_prefix: str) -> dict[str, Any]:
    """The inline session policy of a ``session`` grant: objects under ``bucket_prefix/`` may be
    read and written, and only names under it listed (IAM JSON policy reference,
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/security_iam_service-with-iam.html)."""
    pfx = bucket_prefix.strip("/")
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ObjectsUnderPrefix", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
         "Resource": f"arn:aws:s3:::{bucket}/{pfx}/*"},
        {"Sid": "ListUnderPrefix", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{bucket}",
         "Condition": {"StringLike": {"s3:prefix": [f"{pfx}/*"]}}}]}


def _federation(store: S3Store, scope: GrantScope, ttl: int) -> dict[str, Any]:
    from botocore.exceptions import BotoCoreError, ClientError

    if not scope.write_prefix.strip("/"):
        raise StorageError("a session store grant needs a write_prefix: it is scoped to one prefix")
    policy = session_policy(store.bucket, store.object_key(scope.write_prefix.strip("/")))
    name = "runbook-" + hashlib.sha256(scope.write_prefix.encode()).hexdigest()[:16]
    try:
        creds = store.connection.sts().get_federation_token(Name=name, Policy=json.dumps(policy, separators=(",", ":")),
                                                 DurationSeconds=ttl)["Credentials"]
    except ClientError as exc:
        err = exc.response.get("Error") or {}
        raise AuthError(
            f"STS GetFederationToken for the store grant of {store.url(scope.write_prefix)} failed "
            f"({err.get('Code') or '?'}: {str(err.get('Message') or '')[:200]}). Endpoint workers need read and write "
            "under their records prefix, which presigned URLs cannot give. Use long-term IAM user keys allowed "
            "sts:GetFederationToken for the store's references (role or session credentials cannot call it), or a "
            "store with STS beside its S3 API.", provider="s3", resource_id=store.url(scope.write_prefix)) from None
    except BotoCoreError as exc:
        raise AuthError(f"STS GetFederationToken at {store.endpoint_url or 'AWS'} failed: {type(exc).__name__}; "
                        "the store needs STS beside its S3 API for endpoint workers' session grants",
                        provider="s3") from None
    expiration = creds["Expiration"]
    exp = expiration.timestamp() if hasattr(expiration, "timestamp") else time.time() + ttl
    return {"access_key_id": creds["AccessKeyId"], "secret_access_key": creds["SecretAccessKey"],
            "session_token": creds["SessionToken"], "endpoint_url": store.endpoint_url, "region": store.region,
            "checksum_mode": store.checksum_mode, "expires_at_epoch_s": exp}


# -- the pod's side -------------------------------------------------------------------------------

def grant_from_env(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The grant document in :data:`GRANT_ENV`, or None when the variable is unset.

    Raises:
        StorageError: the variable holds no valid grant document.
    """
    raw = (os.environ if env is None else env).get(GRANT_ENV, "")
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        raise StorageError(f"{GRANT_ENV} is set but is not JSON ({len(raw)} characters); the pod was launched with "
                           "a damaged store grant: relaunch it through the runbook") from None
    if not isinstance(doc, dict) or doc.get("version") != GRANT_VERSION or doc.get("kind") not in ("urls", "session"):
        raise StorageError(f"{GRANT_ENV} holds no store grant of version {GRANT_VERSION} (kind urls or session); "
                           "the runbook that launched this pod differs from the one inside its image: use one release")
    return doc


def open_grant(doc: dict[str, Any], *, clock: Callable[[], float] = time.time, transport: Any = None) -> Store:
    """The store a pod uses with grant ``doc``: :class:`GrantStore` (``urls``) or
    :class:`SessionStore` (``session``). ``transport``: an ``httpx`` transport (tests)."""
    if doc["kind"] == "session":
        return SessionStore.from_grant(doc, clock=clock)
    return GrantStore(doc, clock=clock, transport=transport)


def _expired(doc: dict[str, Any], clock: Callable[[], float], what: str) -> None:
    exp = float(doc.get("expires_at_epoch_s") or 0)
    if clock() >= exp:
        raise StorageError(f"{what}: this pod's store grant expired at {utc_iso(exp)} (now {utc_iso(clock())}); a "
                           "grant lasts as long as the job it was made for. Relaunch the pod (a new launch gets a "
                           "new grant), or raise the job's timeout if it needs longer.")


def _under(key: str, prefix: str) -> bool:
    return bool(prefix) and key.startswith(prefix.rstrip("/") + "/") and ".." not in key.split("/")


@dataclass
class _Written:
    """An object this pod wrote through its grant: its size and sha256, and its bytes (``data``)
    or the file they were read from (``source``)."""

    info: ObjectInfo
    data: bytes | None = None
    source: Path | None = None

    def read_back(self, where: str) -> bytes:
        """The bytes written, from this pod's own record (``where``: the object's URL, for messages).

        Raises:
            StorageError: the source file is gone or changed since the upload (a grant cannot read
                the stored copy back).
        """
        if self.data is not None:
            return self.data
        assert self.source is not None
        try:
            data = self.source.read_bytes()
        except OSError as exc:
            raise StorageError(f"get {where}: this pod wrote it from {self.source}, which is gone "
                               f"({exc.strerror}); a grant cannot read it back from the store") from None
        if hashlib.sha256(data).hexdigest() != self.info.sha256:
            raise StorageError(f"get {where}: {self.source} changed since this pod uploaded it; a grant cannot "
                               "read the stored copy back")
        return data


def _refusal(op: str, where: str, r: Any) -> StorageError:
    """The error of a refused request ``r`` (an httpx response) of ``op`` on the object at URL
    ``where``: its HTTP status, S3's error ``Code`` and ``Message`` when the body holds them, and
    what the code means for a grant; never the request URL's signed query."""
    code, msg = "", ""
    try:
        import xml.etree.ElementTree as ET

        body = r.read() if hasattr(r, "read") else r.content
        root = ET.fromstring(body) if body else None
        if root is not None:
            code = root.findtext("Code") or ""
            msg = root.findtext("Message") or ""
    except Exception:  # noqa: BLE001 - an unreadable error body still leaves the status
        pass
    hint = {"AccessDenied": "the grant does not cover this request (a key outside its prefix, a form field the "
                            "policy does not list, or an object larger than its content-length-range)",
            "RequestExpired": "the grant expired; relaunch the pod",
            "SignatureDoesNotMatch": "the request differs from what was signed (a changed URL or form field)",
            "EntityTooLarge": "the object is larger than the grant's content-length-range"}.get(code, "")
    if r.status_code == 403 and not hint:
        hint = "the grant does not allow it, or it expired; relaunch the pod through the runbook"
    return StorageError(f"{op} {where} refused: HTTP {r.status_code} {code or ''} {msg[:200]}".rstrip()
                        + (f"; {hint}" if hint else ""))


class GrantWire:
    """The HTTP requests a pod makes with a ``urls`` grant, over httpx: ``HEAD`` and ``GET`` of a
    granted object through its presigned URLs, the presigned ``ListObjectsV2`` of the write
    prefix, and a ``POST`` under that prefix through the presigned policy. Each checks the
    grant's expiry and scope before it is sent (some S3-compatible servers enforce neither), and a
    refusal names the object, never the URL's signed query.

    Args:
        doc: the grant document (:func:`grant_from_env`). location: the store root in the bucket.
        clock: epoch seconds (tests). transport: an ``httpx`` transport (tests); None uses httpx's own.
    """

    def __init__(self, doc: dict[str, Any], location: BucketPath, *, clock: Callable[[], float] = time.time,
                 transport: Any = None) -> None:
        self.doc = doc
        self.location = location
        self.write_prefix = str(doc.get("write_prefix") or "").strip("/")
        self._clock = clock
        self._transport = transport
        self._http: Any = None

    @property
    def http(self) -> Any:
        """The ``httpx.Client`` (timeout :data:`HTTP_TIMEOUT_S`), opened on first use."""
        if self._http is None:
            import httpx

            self._http = httpx.Client(timeout=HTTP_TIMEOUT_S, transport=self._transport)
        return self._http

    def close(self) -> None:
        """Close the HTTP connections (a later request opens new ones)."""
        if self._http is not None:
            self._http.close()
            self._http = None

    def _urls(self, key: str, op: str) -> dict[str, str]:
        _expired(self.doc, self._clock, f"{op} {self.location.url(key)}")
        entry = (self.doc.get("objects") or {}).get(key)
        if entry is None:
            raise StorageError(f"{op} {self.location.url(key)}: not in this pod's store grant, which reads "
                               f"{len(self.doc.get('objects') or {})} objects of the sets named at launch and writes "
                               f"under {self.write_prefix or '(nothing)'}/. Add the set to the launch plan's "
                               "store_grant.read_sets, or read what this pod wrote itself.")
        return dict(entry)

    def head(self, key: str) -> ObjectInfo | None:
        """Size and ``x-amz-meta-sha256`` of granted object ``key`` (presigned ``HEAD``), or None
        when it does not exist.

        Raises:
            StorageError: the grant expired, does not hold ``key``, or the store refused the request.
        """
        r = self.http.head(self._urls(key, "head")["head"])
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise _refusal("head", self.location.url(key), r)
        return ObjectInfo(key, int(r.headers.get("content-length", 0)), r.headers.get(f"x-amz-meta-{META_SHA256}"))

    def get(self, key: str) -> bytes:
        """The bytes of granted object ``key`` (presigned ``GET``).

        Raises:
            StorageError: as :meth:`head`, or the object does not exist.
        """
        r = self.http.get(self._urls(key, "get")["get"])
        if r.status_code == 404:
            raise StorageError(f"object {self.location.url(key)} does not exist")
        if r.status_code != 200:
            raise _refusal("get", self.location.url(key), r)
        return bytes(r.content)

    def fetch(self, key: str, dest: Path, *, progress: bool = False) -> tuple[ObjectInfo, ObjectInfo]:
        """Stream granted object ``key`` into file ``dest``, hashing as it streams.

        Returns:
            ``(got, recorded)``: the size and sha256 of the bytes written, and the size and
            ``x-amz-meta-sha256`` the response headers state (for
            :func:`~runbook_lib.storage.base.accept_download`).

        Raises:
            StorageError: as :meth:`get`.
        """
        with self.http.stream("GET", self._urls(key, "get")["get"]) as r:
            if r.status_code == 404:
                raise StorageError(f"object {self.location.url(key)} does not exist")
            if r.status_code != 200:
                raise _refusal("get", self.location.url(key), r)
            size = int(r.headers.get("content-length", 0))
            recorded = ObjectInfo(key, size, r.headers.get(f"x-amz-meta-{META_SHA256}"))
            bar = progress_bar(size, f"get {key}", progress)
            try:
                with open(dest, "wb") as f:
                    writer = HashingWriter(f, bar)
                    for chunk in r.iter_bytes(CHUNK_BYTES):
                        writer.write(chunk)
            finally:
                if bar is not None:
                    bar.close()
        return ObjectInfo(key, writer.size, writer.sha256.hexdigest()), recorded

    def listed(self) -> list[tuple[str, int]]:
        """``(store key, size in bytes)`` under the write prefix, from the presigned listing
        (empty when the grant has none).

        Raises:
            StorageError: the grant expired, the store refused the listing, or the listing is
                truncated (more than :data:`LIST_MAX_KEYS` names).
        """
        import xml.etree.ElementTree as ET

        if not self.doc.get("list"):
            return []
        _expired(self.doc, self._clock, f"list {self.location.url(self.write_prefix)}")
        r = self.http.get(self.doc["list"])
        if r.status_code != 200:
            raise _refusal("list", self.location.url(self.write_prefix), r)
        root = ET.fromstring(r.content)
        ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
        if (root.findtext(f"{ns}IsTruncated") or "false").lower() == "true":
            raise StorageError(f"list {self.location.url(self.write_prefix)}: more than {LIST_MAX_KEYS} objects, and "
                               "a presigned listing cannot page; write fewer objects under one pod's prefix")
        strip = len(self.location.prefix) + 1 if self.location.prefix else 0
        return [((c.findtext(f"{ns}Key") or "")[strip:], int(c.findtext(f"{ns}Size") or 0))
                for c in root.findall(f"{ns}Contents")]

    def _write_form(self, key: str, size: int) -> dict[str, Any]:
        url = self.location.url(key)
        _expired(self.doc, self._clock, f"put {url}")
        write = self.doc.get("write")
        if not write or not _under(key, self.write_prefix):
            raise StorageError(f"put {url}: outside this pod's store grant, which writes only under "
                               f"{self.location.url(self.write_prefix) if self.write_prefix else '(nothing)'}/ (the "
                               "POST policy's starts-with $key condition); write under that prefix")
        if size > int(write["max_bytes"]):
            raise StorageError(f"put {url}: {size} bytes, more than the {write['max_bytes']} bytes the "
                               "grant's content-length-range allows (one presigned POST carries at most 5 GB); split "
                               "the object")
        return dict(write)

    def post(self, key: str, size: int, sha256: str, chunks: Iterable[bytes]) -> None:
        """One presigned POST of ``size`` bytes streamed from ``chunks`` to store key ``key``: the
        policy's fields, the object's ``key`` and ``x-amz-meta-sha256`` (``sha256``, hex), then the
        file (S3 reads fields after ``file`` as content, so it comes last), with an exact
        ``Content-Length`` (no chunked encoding).

        Raises:
            StorageError: the grant expired, ``key`` is outside the write prefix, ``size`` is over
                the grant's ``max_bytes``, or the store refused the form.
        """
        write = self._write_form(key, size)
        fields = {**write["fields"], "key": self.location.object_key(key), f"x-amz-meta-{META_SHA256}": sha256}
        boundary = "runbook-" + secrets.token_hex(16)
        head = b"".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
                        for k, v in fields.items())
        name = quote(key.rsplit("/", 1)[-1] or "object")
        head += (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
                 "Content-Type: application/octet-stream\r\n\r\n").encode()
        tail = f"\r\n--{boundary}--\r\n".encode()
        r = self.http.post(write["url"], content=itertools.chain([head], chunks, [tail]),
                           headers={"Content-Type": f"multipart/form-data; boundary={boundary}",
                                    "Content-Length": str(len(head) + size + len(tail))})
        if r.status_code not in (200, 201, 204):
            raise _refusal("put", self.location.url(key), r)


class GrantStore(Store):
    """The store a pod opens with a ``urls`` grant: reads the granted objects and writes under its
    prefix through :class:`GrantWire` (presigned ``GET``/``HEAD`` URLs and ``POST`` policy,
    ``x-amz-meta-sha256`` set on every object), and answers for what it wrote from its own
    record (see the module docstring). It cannot delete.

    Args:
        doc: the grant document (:func:`grant_from_env`).
        clock: epoch seconds (tests).
        transport: an ``httpx`` transport (tests); None uses httpx's own.

    Attributes:
        location: the store root in the bucket. wire: the requests. write_prefix: the store
            prefix it writes under.
    """

    scheme = "s3"

    def __init__(self, doc: dict[str, Any], *, clock: Callable[[], float] = time.time, transport: Any = None) -> None:
        if doc.get("kind") != "urls":
            raise StorageError(f"GrantStore needs a urls grant, got kind {doc.get('kind')!r}")
        self.doc = doc
        self.location = BucketPath(str(doc["bucket"]), str(doc.get("root") or "").strip("/"))
        self.bucket, self.root = self.location.bucket, self.location.prefix
        self.wire = GrantWire(doc, self.location, clock=clock, transport=transport)
        self.write_prefix = self.wire.write_prefix
        self._written: dict[str, _Written] = {}

    @property
    def expires_at_epoch_s(self) -> float:
        """When the grant stops working, epoch seconds."""
        return float(self.doc["expires_at_epoch_s"])

    def settings(self) -> dict[str, Any]:
        return {"scheme": "s3", "url": self.url(), "access": "store grant (presigned URLs and POST policy)",
                "expires_at": utc_iso(self.expires_at_epoch_s), "write_prefix": self.write_prefix}

    def url(self, key: str = "") -> str:
        return self.location.url(key)

    def close(self) -> None:
        """Close the HTTP connections."""
        self.wire.close()

    def __enter__(self) -> "GrantStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reads ---------------------------------------------------------------------------------

    def head(self, key: str) -> ObjectInfo | None:
        if key in self._written:
            return self._written[key].info
        if key not in (self.doc.get("objects") or {}) and _under(key, self.write_prefix):
            return next((ObjectInfo(key, size, None) for k, size in self.wire.listed() if k == key), None)
        return self.wire.head(key)  # raises for a key the grant does not hold

    def get_bytes(self, key: str) -> bytes:
        if key in self._written:
            return self._written[key].read_back(self.url(key))
        return self.wire.get(key)

    def get_file(self, key: str, dest: str | Path, *, expect: ObjectInfo | None = None,
                 progress: bool = False) -> ObjectInfo:
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if key in self._written:
            dest.write_bytes(self._written[key].read_back(self.url(key)))
            got = ObjectInfo(key, dest.stat().st_size, hashlib.sha256(dest.read_bytes()).hexdigest())
            return accept_download(key, self.url(key), dest, got, expect)
        got, recorded = self.wire.fetch(key, dest, progress=progress)
        return accept_download(key, self.url(key), dest, got, expect, recorded)

    def list(self, prefix: str = "") -> builtins.list[str]:
        base = prefix.rstrip("/") + "/" if prefix else ""
        keys = set(self.doc.get("objects") or {}) | set(self._written)
        mine = self.write_prefix + "/"
        if self.write_prefix and (mine.startswith(base) or base.startswith(mine)):  # the listing can hold some
            keys |= {k for k, _ in self.wire.listed()}
        return sorted(k for k in keys if k.startswith(base))

    # -- writes --------------------------------------------------------------------------------

    def put_bytes(self, data: bytes, key: str) -> ObjectInfo:
        digest = hashlib.sha256(data).hexdigest()
        self.wire.post(key, len(data), digest, [data])
        info = ObjectInfo(key, len(data), digest)
        self._written[key] = _Written(info, data=data)
        return info

    def put_file(self, src: str | Path, key: str, *, sha256: str | None = None, progress: bool = False) -> ObjectInfo:
        src = Path(src)
        try:
            size = src.stat().st_size
            digest = sha256 or _sha256_file(src)  # the POST names it before the bytes, so it is known first
        except OSError as exc:
            raise StorageError(f"put {src} -> {self.url(key)} failed: {exc.strerror}") from exc
        streamed = hashlib.sha256()
        count = [0]
        bar = progress_bar(size, f"put {key}", progress)

        def chunks() -> Iterator[bytes]:
            with open(src, "rb") as f:
                while chunk := f.read(CHUNK_BYTES):
                    streamed.update(chunk)
                    count[0] += len(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
                    yield chunk

        try:
            self.wire.post(key, size, digest, chunks())
        except OSError as exc:
            raise StorageError(f"put {src} -> {self.url(key)} failed while reading: {exc.strerror}") from exc
        finally:
            if bar is not None:
                bar.close()
        if count[0] != size or streamed.hexdigest() != digest:
            raise StorageError(f"put {self.url(key)}: sent {count[0]} bytes hashing to {streamed.hexdigest()[:16]}..., "
                               f"declared {size} bytes and {digest[:16]}...; {src} changed during the upload. The "
                               "stored object is wrong and a grant cannot delete it: it is never committed (no "
                               "manifest names it), so re-create the file and upload it again")
        info = ObjectInfo(key, size, digest)
        self._written[key] = _Written(info, source=src)
        return info

    def delete(self, key: str) -> None:
        raise StorageError(f"delete {self.url(key)}: a pod's store grant holds no delete permission; the runbook "
                           "host removes objects")

    def delete_prefix(self, prefix: str) -> None:
        self.delete(prefix + "/")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


class SessionStore(S3Store):
    """The store an endpoint worker opens with a ``session`` grant: an :class:`S3Store` with the
    grant's temporary credentials, which refuses any key outside its prefix before a request is
    made (the session policy refuses it at the store too, on a store that enforces IAM) and
    answers ``head`` through a listing of the exact key (the policy allows ``s3:ListBucket``
    only with an ``s3:prefix``, and a missing object's ``HEAD`` answers 404 only to an identity
    allowed to list, https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadObject.html).

    Args:
        bucket, prefix: the store root (as :class:`S3Store`).
        scope_prefix: the store prefix every key must be under.
        expires_at_epoch_s: when the credentials expire, epoch seconds.
        clock: epoch seconds (tests).
        options: :class:`S3Store` keyword options (endpoint, region, credentials).
    """

    def __init__(self, bucket: str, prefix: str = "", *, scope_prefix: str, expires_at_epoch_s: float,
                 clock: Callable[[], float] = time.time, **options: Any) -> None:
        super().__init__(bucket, prefix, **options)
        self.scope_prefix = scope_prefix.strip("/")
        self.expires_at_epoch_s = expires_at_epoch_s
        self._clock = clock

    @classmethod
    def from_grant(cls, doc: dict[str, Any], *, clock: Callable[[], float] = time.time) -> "SessionStore":
        """The store of a ``session`` grant document."""
        s = doc["session"]
        return cls(str(doc["bucket"]), str(doc.get("root") or ""), scope_prefix=str(doc["write_prefix"]),
                   expires_at_epoch_s=float(doc["expires_at_epoch_s"]), clock=clock, endpoint_url=s["endpoint_url"],
                   region=s["region"], checksum_mode=s["checksum_mode"], access_key_id=s["access_key_id"],
                   secret_access_key=s["secret_access_key"], session_token=s["session_token"])

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "access": "store grant (temporary credentials scoped to a prefix)",
                "scope_prefix": self.scope_prefix, "expires_at": utc_iso(self.expires_at_epoch_s)}

    def _guard(self, op: str, key: str) -> None:
        _expired({"expires_at_epoch_s": self.expires_at_epoch_s}, self._clock, f"{op} {self.url(key)}")
        if not (_under(key, self.scope_prefix) or key.rstrip("/") == self.scope_prefix):
            raise StorageError(f"{op} {self.url(key)}: outside this worker's store grant, which covers only "
                               f"{self.url(self.scope_prefix)}/; keep the worker's records under that prefix")

    def put_file(self, src: str | Path, key: str, *, sha256: str | None = None, progress: bool = False) -> ObjectInfo:
        self._guard("put", key)
        return super().put_file(src, key, sha256=sha256, progress=progress)

    def put_bytes(self, data: bytes, key: str) -> ObjectInfo:
        self._guard("put", key)
        return super().put_bytes(data, key)

    def get_bytes(self, key: str) -> bytes:
        self._guard("get", key)
        return super().get_bytes(key)

    def get_file(self, key: str, dest: str | Path, *, expect: ObjectInfo | None = None,
                 progress: bool = False) -> ObjectInfo:
        self._guard("get", key)
        return super().get_file(key, dest, expect=expect, progress=progress)

    def head(self, key: str) -> ObjectInfo | None:
        self._guard("head", key)
        with self.errors.translating("list", key):
            page = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.object_key(key), MaxKeys=1)
        if not any(o["Key"] == self.object_key(key) for o in page.get("Contents", [])):
            return None
        return super().head(key)

    def list(self, prefix: str = "") -> builtins.list[str]:
        self._guard("list", prefix)
        return super().list(prefix)

    def delete(self, key: str) -> None:
        raise StorageError(f"delete {self.url(key)}: a worker's store grant holds no delete permission; the runbook "
                           "host removes objects")

    def delete_prefix(self, prefix: str) -> None:
        self.delete(prefix + "/")
