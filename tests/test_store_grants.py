"""Store grants (issue 13, item 6: no long-lived keys in pods), against moto's S3 and STS on
127.0.0.1 over real HTTP.

moto accepts any presigned POST (it checks neither the policy's conditions, nor its signature,
nor its expiration) and any expired presigned URL. So the server-side refusals are shown through
:class:`EnforcingProxy`, a loopback proxy in front of moto that applies S3's documented rules
(SigV4 POST policy signature, expiration and conditions, every form field covered;
https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-HTTPPOSTConstructPolicy.html; a
presigned URL's ``X-Amz-Date`` + ``X-Amz-Expires``) and forwards what passes;
:func:`test_moto_itself_enforces_no_grant_condition` pins down that moto alone does not.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import re
import sys
import threading
import time
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

import httpx
import psutil
import pytest

from runbook_lib.errors import ParamsError, StorageError
from runbook_lib.phases import open_phase
from runbook_lib.phases.access import pod_secret_refs
from runbook_lib.providers.base import GRANT_SHOWN, PodSpec
from runbook_lib.providers.local import procs
from runbook_lib.storage import GRANT_ENV, GrantScope, build_grant, pod_store
from runbook_lib.storage.grants import GrantStore, SessionStore, grant_from_env, open_grant, session_policy
from runbook_lib.storage.s3 import S3Store
from runbook_lib.workload.records import JobRecords

from .conftest import ROOT

KEY_ID = "AKIALONGLIVED7EXAMPL"  # shaped like a long-lived AWS key id
SECRET = "long-lived/Secret+Value0123456789abcdefGH"
_n = iter(range(10_000))


# -- a loopback proxy that enforces what S3 enforces (moto does not) ----------------------------

def _signing_key(secret: str, date: str, region: str) -> bytes:
    k = hmac.new(f"AWS4{secret}".encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k


def post_policy_problem(fields: dict[str, str], size: int, bucket: str, secret: str, now: float) -> str:
    """Why S3 would refuse this POST form ("" when it would accept it): the SigV4 signature of
    the policy, its expiration, each condition, and every field covered by a condition."""
    policy_b64 = fields.get("policy", "")
    cred = fields.get("x-amz-credential", "").split("/")
    if len(cred) != 5:
        return "no x-amz-credential"
    want = hmac.new(_signing_key(secret, cred[1], cred[2]), policy_b64.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, fields.get("x-amz-signature", "")):
        return "SignatureDoesNotMatch"
    policy = json.loads(base64.b64decode(policy_b64))
    if now >= dt.datetime.fromisoformat(policy["expiration"].replace("Z", "+00:00")).timestamp():
        return "Invalid according to Policy: Policy expired."
    covered = {"policy", "x-amz-signature", "file"}
    form = {**{k.lower(): v for k, v in fields.items()}, "bucket": bucket}
    for cond in policy["conditions"]:
        if isinstance(cond, dict):
            [(name, value)] = cond.items()
            op, name = "eq", name.lower()
        elif cond[0] == "content-length-range":
            if not cond[1] <= size <= cond[2]:
                return f"Invalid according to Policy: content-length-range {cond[1]}..{cond[2]}, got {size}"
            continue
        else:
            op, name, value = cond[0], cond[1].lstrip("$").lower(), cond[2]
        covered.add(name)
        got = form.get(name)
        if got is None or (op == "eq" and got != value) or (op == "starts-with" and not got.startswith(value)):
            return f"Invalid according to Policy: Policy Condition failed: {cond}"
    extra = [k for k in form if k not in covered and not k.startswith("x-ignore-")]
    return f"Invalid according to Policy: Extra input fields: {extra}" if extra else ""


class EnforcingProxy:
    """Forwards to ``upstream`` (moto) what S3 would accept and answers 403 with S3's error XML
    for the rest. ``offset_s`` moves its clock (expiry tests)."""

    def __init__(self, upstream: str, secret: str) -> None:
        self.upstream, self.secret, self.offset_s = upstream, secret, 0.0
        self.no_sts = False  # answer STS calls as a store with no STS beside its S3 API (R2) does: not served
        self.refused: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # answers botocore's Expect: 100-continue at once

            def log_message(self, *a: Any) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                why = proxy.problem(self.command, self.path, dict(self.headers), body)
                if why:
                    proxy.refused.append(why)
                    xml = (f"<Error><Code>AccessDenied</Code><Message>{why}</Message></Error>").encode()
                    self.send_response(403)
                    self.send_header("Content-Length", str(len(xml) if self.command != "HEAD" else 0))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(xml)
                    return
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "content-length", "expect", "connection")}
                r = httpx.request(self.command, proxy.upstream + self.path, headers=headers, content=body or None)
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(k, v)
                size = r.headers.get("content-length", "0") if self.command == "HEAD" else str(len(r.content))
                self.send_header("Content-Length", size)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(r.content)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any  # noqa: N815 - http.server naming

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def problem(self, method: str, path: str, headers: dict[str, str], body: bytes) -> str:
        now = time.time() + self.offset_s
        q = parse_qs(urlsplit(path).query)
        if self.no_sts and method == "POST" and b"Action=GetFederationToken" in body:
            return "STS is not served at this endpoint"
        if "X-Amz-Expires" in q:  # a presigned URL
            signed = dt.datetime.strptime(q["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.timezone.utc)
            if now > signed.timestamp() + int(q["X-Amz-Expires"][0]):
                return "Request has expired"
        ctype = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
        if method == "POST" and ctype.startswith("multipart/form-data"):
            msg = BytesParser().parsebytes(f"Content-Type: {ctype}\r\n\r\n".encode() + body)
            fields: dict[str, str] = {}
            size = 0
            for part in msg.get_payload():
                name = part.get_param("name", header="content-disposition")
                if name == "file":
                    size = len(part.get_payload(decode=True))
                else:
                    fields[name] = part.get_payload(decode=True).decode()
            return post_policy_problem(fields, size, urlsplit(path).path.strip("/").split("/")[0], self.secret, now)
        return ""

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def long_lived_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)


@pytest.fixture
def stores() -> Iterator[Any]:
    """Registers pod stores to close after the test (their HTTP connections)."""
    opened: list[GrantStore] = []

    def keep(store: GrantStore) -> GrantStore:
        opened.append(store)
        return store

    yield keep
    for s in opened:
        s.close()


@pytest.fixture(scope="module")
def proxy(s3_endpoint: str) -> Iterator[EnforcingProxy]:
    p = EnforcingProxy(s3_endpoint, SECRET)
    yield p
    p.close()


@pytest.fixture
def host(proxy: EnforcingProxy) -> S3Store:
    """The runbook host's store: the long-lived keys, through the enforcing proxy."""
    proxy.offset_s = 0.0
    return S3Store(f"grants-{next(_n)}", "runs", endpoint_url=proxy.url, create_bucket=True,
                   access_key_id=KEY_ID, secret_access_key=SECRET)


def _frozen(host: S3Store, prefix: str = "src/frozen") -> dict[str, bytes]:
    files = {"weights.bin": bytes(range(256)) * 64, "config.json": b'{"dim": 4}'}
    objs = [host.put_bytes(data, f"{prefix}/{name}") for name, data in files.items()]
    host.commit_set(prefix, objs, run_id="r1")
    return files


def _urls(doc: dict[str, Any]) -> list[str]:
    return [u for o in doc["objects"].values() for u in o.values()] + [doc["list"]]


# -- the grant document ----------------------------------------------------------------------------

def test_a_grant_names_exactly_the_set_it_reads_and_holds_no_secret(host: S3Store) -> None:
    _frozen(host)
    host.put_bytes(b"not yours", "other/secret.bin")
    grant = build_grant(host, GrantScope("urls", ("src/frozen",), "tgt/canary", ttl_s=600))
    doc = grant.document
    assert sorted(doc["objects"]) == ["src/frozen/MANIFEST.json", "src/frozen/_SUCCESS", "src/frozen/config.json",
                                      "src/frozen/weights.bin"]
    for url in _urls(doc):  # SigV4, valid exactly the scope's ttl
        q = parse_qs(urlsplit(url).query)
        assert q["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"] and q["X-Amz-Expires"] == ["600"]
    assert doc["expires_at_epoch_s"] - doc["issued_at_epoch_s"] == 600
    policy = json.loads(base64.b64decode(doc["write"]["fields"]["policy"]))
    expiry = dt.datetime.fromisoformat(policy["expiration"].replace("Z", "+00:00")).timestamp()
    assert abs(expiry - doc["expires_at_epoch_s"]) < 2
    conds = policy["conditions"]
    assert ["starts-with", "$key", "runs/tgt/canary/"] in conds
    assert ["starts-with", "$x-amz-meta-sha256", ""] in conds
    assert ["content-length-range", 0, 5 * 1024**3] in conds
    assert {"bucket": host.bucket} in conds
    text = grant.to_env()
    assert SECRET not in text
    # the key id is an identifier, not a secret: SigV4 names it in every signed request's credential
    # scope; it appears nowhere else
    stripped = re.sub(r"(X-Amz-Credential=|\"x-amz-credential\":\")" + KEY_ID, r"\1", text)
    assert KEY_ID not in stripped
    ev = json.dumps(grant.evidence())
    assert "X-Amz-Signature" not in ev and "policy" not in ev and KEY_ID not in ev
    assert sorted(grant.evidence()["read_objects"]) == sorted(doc["objects"])


def test_a_grant_is_never_built_on_an_incomplete_set(host: S3Store) -> None:
    host.put_bytes(b"half", "src/frozen/weights.bin")  # no manifest, no marker
    with pytest.raises(StorageError, match="no completion marker"):
        build_grant(host, GrantScope("urls", ("src/frozen",), "tgt/canary", ttl_s=600))
    with pytest.raises(StorageError, match="must lie in 1..604800 s"):
        build_grant(host, GrantScope("urls", (), "tgt/canary", ttl_s=8 * 86400))


# -- the pod's store ---------------------------------------------------------------------------------

def test_a_pod_reads_the_granted_set_writes_under_its_prefix_and_nothing_else(host: S3Store, tmp_path: Path,
                                                                               proxy: EnforcingProxy, stores) -> None:
    files = _frozen(host)
    host.put_bytes(b"not yours", "other/secret.bin")
    pod = stores(GrantStore(build_grant(host, GrantScope("urls", ("src/frozen",), "tgt/canary", ttl_s=600)).document))
    got = pod.fetch_set("src/frozen", tmp_path / "in", run_id="r1")  # marker, manifest, heads, re-hashed GETs
    assert {k: p.read_bytes() for k, p in got.items()} == files
    for key in ("other/secret.bin", "src/other/_SUCCESS"):
        with pytest.raises(StorageError, match="not in this pod's store grant"):
            pod.get_bytes(key)
    # writes: objects, then manifest, then marker, each with its sha256 as object metadata
    (tmp_path / "out.npy").write_bytes(b"\x93NUMPY" + b"x" * 5000)
    objs = [pod.put_file(tmp_path / "out.npy", "tgt/canary/result/out.npy"),
            pod.put_bytes(b'{"ok": true}', "tgt/canary/result/result.json")]
    manifest = pod.commit_set("tgt/canary/result", objs, run_id="r1")
    assert host.verify_set("tgt/canary/result", run_id="r1")["out.npy"].sha256 == objs[0].sha256
    assert host.read_manifest("tgt/canary/result", run_id="r1")["producer_run_id"] == "r1"
    meta = host.client.head_object(Bucket=host.bucket, Key=host.object_key("tgt/canary/result/out.npy"))["Metadata"]
    assert meta == {"sha256": hashlib.sha256((tmp_path / "out.npy").read_bytes()).hexdigest()}
    assert manifest.sha256 == host.head("tgt/canary/result/MANIFEST.json").sha256
    # what it wrote it can read back (its own record); a listing shows it too
    assert pod.read_manifest("tgt/canary/result", run_id="r1")["producer_run_id"] == "r1"
    assert "tgt/canary/result/_SUCCESS" in pod.list("tgt/canary")
    # a write outside its prefix is refused before any request, and nothing lands
    refused = len(proxy.refused)
    for key in ("tgt/other/x.bin", "src/frozen/weights.bin", "tgt/canary/../evil"):
        with pytest.raises(StorageError, match="outside this pod's store grant"):
            pod.put_bytes(b"evil", key)
    assert host.list("tgt/other") == [] and host.head("src/frozen/weights.bin").size_bytes == len(files["weights.bin"])
    assert len(proxy.refused) == refused
    with pytest.raises(StorageError, match="no delete permission"):
        pod.delete("tgt/canary/result/out.npy")


def test_a_pod_refuses_bytes_that_differ_from_their_recorded_sha256(host: S3Store, tmp_path: Path, stores) -> None:
    _frozen(host)
    pod = stores(GrantStore(build_grant(host, GrantScope("urls", ("src/frozen",), "tgt/canary", ttl_s=600)).document))
    key = host.object_key("src/frozen/weights.bin")
    meta = host.client.head_object(Bucket=host.bucket, Key=key)["Metadata"]
    host.client.put_object(Bucket=host.bucket, Key=key, Body=b"\x00" * (256 * 64), Metadata=meta)  # same size
    with pytest.raises(StorageError, match="weights.bin: got 16384 bytes sha256"):
        pod.fetch_set("src/frozen", tmp_path / "in", run_id="r1")
    assert not (tmp_path / "in" / "weights.bin").exists()


def _form(doc: dict[str, Any], key: str, data: bytes, sha256: str = "") -> tuple[dict[str, str], dict[str, Any]]:
    fields = {**doc["write"]["fields"], "key": key, "x-amz-meta-sha256": sha256 or hashlib.sha256(data).hexdigest()}
    return fields, {"file": ("x.bin", data)}


def test_the_store_refuses_a_post_outside_the_prefix_too_large_tampered_or_expired(host: S3Store,
                                                                                   proxy: EnforcingProxy) -> None:
    doc = build_grant(host, GrantScope("urls", (), "tgt/canary", ttl_s=60, max_object_bytes=1000)).document
    url = doc["write"]["url"]
    fields, files = _form(doc, "runs/tgt/canary/ok.bin", b"fine")
    assert httpx.post(url, data=fields, files=files).status_code == 204  # what the pod itself sends passes
    cases = {
        "outside the prefix": _form(doc, "runs/tgt/other/x.bin", b"evil"),
        "another store root": _form(doc, "elsewhere/tgt/canary/x.bin", b"evil"),
        "too large": _form(doc, "runs/tgt/canary/big.bin", b"x" * 1001),
    }
    extra = _form(doc, "runs/tgt/canary/x.bin", b"evil")
    extra[0]["x-amz-meta-owner"] = "me"  # a field the policy does not list
    cases["an unlisted field"] = extra
    tampered = _form(doc, "runs/tgt/canary/x.bin", b"evil")
    policy = json.loads(base64.b64decode(tampered[0]["policy"]))
    policy["conditions"] = [c for c in policy["conditions"] if not (isinstance(c, list) and c[1] == "$key")]
    tampered[0]["policy"] = base64.b64encode(json.dumps(policy).encode()).decode()
    cases["a rewritten policy"] = tampered
    for what, (f, fl) in cases.items():
        r = httpx.post(url, data=f, files=fl)
        assert r.status_code == 403, what
    assert host.list("tgt/other") == [] and host.head("tgt/canary/big.bin") is None
    assert host.head("tgt/canary/x.bin") is None
    proxy.offset_s = 61  # the policy has expired
    fields, files = _form(doc, "runs/tgt/canary/late.bin", b"late")
    r = httpx.post(url, data=fields, files=files)
    assert r.status_code == 403 and "Policy expired" in r.text
    assert any("Extra input fields" in w for w in proxy.refused)


def test_moto_itself_enforces_no_grant_condition(s3_endpoint: str, host: S3Store) -> None:
    """Why the proxy exists: moto stores a POST outside the policy's prefix, and serves an
    expired presigned URL."""
    direct = S3Store(host.bucket, "runs", endpoint_url=s3_endpoint, access_key_id=KEY_ID, secret_access_key=SECRET)
    doc = build_grant(direct, GrantScope("urls", (), "tgt/canary", ttl_s=1)).document
    fields, files = _form(doc, "runs/tgt/other/x.bin", b"evil")
    assert httpx.post(doc["write"]["url"], data=fields, files=files).status_code == 204
    assert direct.get_bytes("tgt/other/x.bin") == b"evil"
    params = {"Bucket": host.bucket, "Key": "runs/tgt/other/x.bin"}
    url = direct.connection.presigner().generate_presigned_url("get_object", Params=params, ExpiresIn=1)
    time.sleep(1.5)
    assert httpx.get(url).status_code == 200


def test_an_expired_grant_is_refused_by_the_pod_and_by_the_store(host: S3Store, proxy: EnforcingProxy,
                                                                  stores) -> None:
    _frozen(host)
    doc = build_grant(host, GrantScope("urls", ("src/frozen",), "tgt/canary", ttl_s=30)).document
    late = stores(GrantStore(doc, clock=lambda: doc["expires_at_epoch_s"] + 1))
    for call in (lambda: late.get_bytes("src/frozen/_SUCCESS"), lambda: late.put_bytes(b"x", "tgt/canary/a"),
                 lambda: late.head("src/frozen/config.json")):
        with pytest.raises(StorageError, match="store grant expired at .*Relaunch the pod"):
            call()
    proxy.offset_s = 31  # the pod's clock is behind: the store refuses anyway
    behind = stores(GrantStore(doc))
    with pytest.raises(StorageError, match="HTTP 403 AccessDenied Request has expired"):
        behind.get_bytes("src/frozen/_SUCCESS")
    with pytest.raises(StorageError, match="Policy expired") as ei:
        behind.put_bytes(b"x", "tgt/canary/a")
    assert "X-Amz-Signature" not in str(ei.value) and KEY_ID not in str(ei.value)


# -- endpoint workers: a session grant on their records prefix ----------------------------------------

def test_a_session_grant_reads_and_writes_records_under_its_prefix_only(host: S3Store) -> None:
    scope = GrantScope("session", write_prefix="runs/r1/jobs/source", ttl_s=900)
    grant = build_grant(host, scope)
    doc = grant.document
    session = doc["session"]
    assert session["access_key_id"] != KEY_ID and session["secret_access_key"] != SECRET and session["session_token"]
    assert SECRET not in grant.to_env() and KEY_ID not in grant.to_env()
    assert 0 < doc["expires_at_epoch_s"] - time.time() <= 900
    shown = json.dumps(grant.evidence())
    assert grant.evidence()["expires_at"].endswith("Z") and grant.evidence()["write_prefix"] == "runs/r1/jobs/source"
    assert not any(v in shown for v in (session["access_key_id"], session["secret_access_key"],
                                        session["session_token"]))
    worker = open_grant(json.loads(grant.to_env()))
    assert isinstance(worker, SessionStore)
    records = JobRecords(worker, "runs/r1/jobs/source", worker="w-1")
    assert records.recorded("job-1") is None  # a missing record reads as None, through a listing
    records.executed("job-1")
    records.record("job-1", {"output": [1.0]})
    other = JobRecords(open_grant(doc), "runs/r1/jobs/source", worker="w-2")  # another worker reads it
    assert other.recorded("job-1")["output"] == [1.0] and other.executions("job-1") == 1
    assert host.head("runs/r1/jobs/source/job-1/_DONE") is not None  # written in the run's store
    for key in ("runs/r1/jobs/target/job-1/_DONE", "src/frozen/_SUCCESS", "runs/r1/jobs/sourcex/a"):
        with pytest.raises(StorageError, match="outside this worker's store grant"):
            worker.get_bytes(key)
        with pytest.raises(StorageError, match="outside this worker's store grant"):
            worker.put_bytes(b"x", key)
    late = SessionStore.from_grant(doc, clock=lambda: doc["expires_at_epoch_s"] + 1)
    with pytest.raises(StorageError, match="store grant expired"):
        late.head("runs/r1/jobs/source/job-1/_DONE")
    assert session_policy(host.bucket, "runs/runs/r1/jobs/source")["Statement"] == [
        {"Sid": "ObjectsUnderPrefix", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
         "Resource": f"arn:aws:s3:::{host.bucket}/runs/runs/r1/jobs/source/*"},
        {"Sid": "ListUnderPrefix", "Effect": "Allow", "Action": "s3:ListBucket",
         "Resource": f"arn:aws:s3:::{host.bucket}",
         "Condition": {"StringLike": {"s3:prefix": ["runs/runs/r1/jobs/source/*"]}}}]
    with pytest.raises(StorageError, match="must lie in 900..129600 s"):
        build_grant(host, GrantScope("session", write_prefix="runs/r1/jobs/source", ttl_s=60))


def test_a_pod_opens_its_store_through_the_grant_and_never_with_keys(host: S3Store, make_params: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from runbook_lib.params import load_params

    mig = load_params(make_params("demo-s3.yaml", storage={"endpoint_url": host.endpoint_url}))
    doc = build_grant(host, GrantScope("urls", (), "tgt/canary", ttl_s=60)).document
    env = {GRANT_ENV: json.dumps(doc)}
    assert isinstance(pod_store(mig.storage, host.url(), env=env), GrantStore)
    with pytest.raises(StorageError, match="grant is for"):
        pod_store(mig.storage, "s3://another/bucket", env=env)
    from runbook_lib.errors import AuthError

    with pytest.raises(AuthError, match="got no store grant"):
        pod_store(mig.storage, host.url(), env={})
    with pytest.raises(StorageError, match="not JSON"):
        grant_from_env({GRANT_ENV: "{"})


# -- plans, evidence and the environment a pod really gets ------------------------------------------

def _ctx(make_params: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, endpoint: str, **over: Any) -> Any:
    (tmp_path / "pyproject.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    storage = {"endpoint_url": endpoint, "url": f"s3://plans-{next(_n)}/ck", **over.pop("storage", {})}
    params = make_params("demo-s3.yaml", storage=storage, **over)
    return open_phase("01", str(params), run_mode="headless")


def _values_hold_no_key(env: dict[str, str]) -> None:
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(env), sorted(env)
    blob = json.dumps(env)
    assert SECRET not in blob
    assert KEY_ID not in re.sub(r"(X-Amz-Credential=|\\\\?\"x-amz-credential\\\\?\":\\\\?\")" + KEY_ID, "", blob)


def test_plans_name_the_grant_scope_not_the_keys_and_fingerprint_stably(make_params: Any, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        s3_endpoint: str) -> None:
    ctx = _ctx(make_params, monkeypatch, tmp_path, s3_endpoint)
    plan = ctx.agents.plan("target", "canary", "accept", prefix="runs/x/target", frozen_prefix="runs/x/source/frozen")
    spec = plan.spec
    assert isinstance(spec, PodSpec) and spec.store_grant is not None
    assert spec.store_grant.read_sets == ("runs/x/source/frozen",) and spec.store_grant.write_prefix == "runs/x/target"
    assert spec.store_grant.ttl_s == 900 + 300  # the agent's timeout plus the margin (a local pod: no launch budget)
    names = [n for n, _ in spec.secret_refs] + [n for n, _ in spec.env]
    assert not {n for n in names if n.startswith("AWS_")} and GRANT_ENV not in names, names
    again = ctx.agents.plan("target", "canary", "accept", prefix="runs/x/target", frozen_prefix="runs/x/source/frozen")
    assert again.fingerprint == plan.fingerprint
    # the grant goes in at apply time, without changing what the approval names or showing its value
    from dataclasses import replace

    applied = replace(plan, spec=replace(spec, env=spec.env + ((GRANT_ENV, '{"objects": "urls"}'),)))
    assert applied.fingerprint == plan.fingerprint
    assert [v for k, v in applied.to_dict()["spec"]["env"] if k == GRANT_ENV] == [GRANT_SHOWN]
    ep = ctx.endpoints.plan("source", "endpoint-source")
    assert ep.spec.store_grant == GrantScope("session", (), f"runs/{ctx.run_id}/jobs/source",
                                             ttl_s=12 * 3600 + ctx.mig.cutover.rollback_window_s)
    assert not {n for n, _ in ep.spec.secret_refs if n.startswith("AWS_")}
    file_ctx = _ctx(make_params, monkeypatch, tmp_path, s3_endpoint, storage={"url": "file://.runbook/store"})
    assert file_ctx.agents.plan("target", "c", "accept", prefix="p").spec.store_grant is None


def test_a_profile_secret_cannot_smuggle_the_storage_keys_into_a_pod(make_params: Any, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     s3_endpoint: str) -> None:
    ctx = _ctx(make_params, monkeypatch, tmp_path, s3_endpoint,
               target={"secrets": [{"name": "AWS_SECRET_ACCESS_KEY", "ref": "env:AWS_SECRET_ACCESS_KEY"}]})
    with pytest.raises(ParamsError, match="same reference as storage.secret_access_key_ref"):
        ctx.agents.plan("target", "canary", "bench", prefix="p")
    assert pod_secret_refs(ctx.mig, "source") == (("HF_TOKEN", "env:HF_TOKEN"),)


def test_the_source_providers_key_never_reaches_a_target_pod(make_params: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pyproject.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    params = make_params("runpod-to-vast.yaml", target={"secrets": [{"name": "RP", "ref": "env:RUNPOD_API_KEY"}]})
    ctx = open_phase("01", str(params), run_mode="headless")
    with pytest.raises(ParamsError, match=r"same reference as the source provider's API key \(runpod\)"):
        pod_secret_refs(ctx.mig, "target")
    assert pod_secret_refs(ctx.mig, "source") == (("HF_TOKEN", "env:HF_TOKEN"),)


def test_a_launched_agent_pod_gets_the_grant_and_no_storage_key(make_params: Any, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                s3_endpoint: str) -> None:
    """The real process environment of an agent pod the local provider launched from the
    runbook's own plan (its command swapped for one that dumps its environment)."""
    monkeypatch.setenv("HF_TOKEN", "hf_scoped_token_for_the_workload_only_0001")
    ctx = _ctx(make_params, monkeypatch, tmp_path, s3_endpoint)
    res = ctx.resources
    frozen = ctx.store_prefix("source", "frozen")
    objs = [ctx.store.put_bytes(b"weights", f"{frozen}/w.bin")]
    ctx.store.commit_set(frozen, objs, run_id=ctx.run_id)
    plan = ctx.agents.plan("target", "canary", "accept", prefix=ctx.store_prefix("target"), frozen_prefix=frozen)
    from dataclasses import replace

    dump = "import json, os; open('env.json', 'w').write(json.dumps(dict(os.environ)))"
    plan = replace(plan, spec=replace(plan.spec, command=(sys.executable, "-c", dump)))
    pod = ctx.agents.launched(res.apply_plan("target", plan, needs_store=True))  # demo-s3: local plans preapproved
    prov = res.provider("target")
    prov.wait_exit(pod.id, timeout_s=60)
    env = json.loads((Path(pod.container_dir) / "env.json").read_text())
    res.destroy("target", pod.id)
    _values_hold_no_key(env)
    assert env["HF_TOKEN"] == "hf_scoped_token_for_the_workload_only_0001"  # its own secret, by name
    doc = grant_from_env(env)
    assert doc is not None and sorted(doc["objects"]) == [f"{frozen}/{n}" for n in ("MANIFEST.json", "_SUCCESS",
                                                                                     "w.bin")]
    assert doc["write_prefix"] == ctx.store_prefix("target")
    row = next(r for r in ctx.evidence.plans if r.plan["fingerprint"] == plan.fingerprint)
    creds = {c.name: c.model_dump() for c in row.credentials or ()}
    assert set(creds) == {"HF_TOKEN", GRANT_ENV} and creds["HF_TOKEN"]["expires_at"] is None
    assert creds[GRANT_ENV]["expires_at"].endswith("Z") and creds[GRANT_ENV]["ttl_s"] == 1200
    shown = json.dumps([r.model_dump(mode="json") for r in ctx.evidence.plans])
    assert "X-Amz-Signature" not in shown and SECRET not in shown and KEY_ID not in shown
    assert "hf_scoped_token" not in shown


def test_a_local_queue_endpoint_keeps_records_in_s3_with_a_session_grant_and_no_key(
        make_params: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str) -> None:
    """Front door and worker processes of a real local endpoint: records land in the S3 store,
    and no process of the endpoint holds the long-lived key id or secret."""
    from runbook_lib.measure.timing import JobClient

    ctx = _ctx(make_params, monkeypatch, tmp_path, s3_endpoint,
               workload={"entry_point": "tests.fixture_workloads:SleepWorkload"},
               target={"batch_size": 1, "workers": 1})
    res = ctx.resources
    plan = ctx.endpoints.plan("target", "endpoint-target")
    ep = res.apply_plan("target", plan, needs_store=True)
    client = JobClient(ep.url)
    try:
        client.wait_ready(timeout_s=60)
        job = client.runsync({"request_id": "req-grant-1", "input": 0.01}, client_timeout_s=60)
        assert job["status"] == "COMPLETED" and job["output"] == [0.02], job
        again = client.runsync({"request_id": "req-grant-1", "input": 0.01}, client_timeout_s=60)
        assert again["replayed"] and again["output"] == [0.02]  # read back through the grant
        found = procs.find(ep.id, str(Path(res.provider("target").root) / "pods" / ep.id / "volume"))
        assert len(found) >= 2  # the front door and its worker
        for p in found:
            try:
                env = p.environ()
            except psutil.NoSuchProcess:
                continue
            _values_hold_no_key(env)
            assert GRANT_ENV in env
    finally:
        client.close()
        res.destroy("target", ep.id)
    records = JobRecords(ctx.store, f"runs/{ctx.run_id}/jobs/target")
    assert records.executions("req-grant-1") == 1 and records.recorded("req-grant-1")["output"] == [0.02]


def test_a_store_without_sts_stops_a_queue_endpoint_run_in_phase_02_before_anything_is_rented(
        make_params: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, proxy: EnforcingProxy) -> None:
    """Queue workers need an STS session grant; a store that cannot issue one (R2) is found by
    phase 02's dependency map, which asks for one and discards it, not by phase 04's endpoint."""
    from runbook_lib.phases.mapping import NONE, session_grant_row

    ctx = _ctx(make_params, monkeypatch, tmp_path, proxy.url)
    row = session_grant_row(ctx)
    assert row is not None and row.status != NONE and "issued and discarded" in row.reason
    proxy.no_sts = True
    try:
        refused = session_grant_row(ctx)
    finally:
        proxy.no_sts = False
    assert refused is not None and refused.status == NONE
    assert "STS GetFederationToken" in refused.reason and "load_balancing" in refused.reason
    assert SECRET not in refused.model_dump_json()
