"""What an S3 error response means: :func:`diagnose` names the cause of a refusal from its error
code first and its HTTP status second, and :class:`ErrorTranslator` turns one store's botocore
errors into the runbook's error tree with it.

Codes and their meanings follow Amazon S3's error reference
(https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html). Messages never hold a
credential: the store's own values are replaced, and anything shaped like an AWS access key id
is masked.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from runbook_lib.errors import AuthError, RunbookError, StorageError

# Error fields that carry no credential and help to name the cause (S3 puts AWSAccessKeyId,
# StringToSign and CanonicalRequest into some error bodies too: those are never read).
_SAFE_FIELDS = ("RequestTime", "ServerTime", "MaxAllowedSkewMilliseconds", "Region", "Endpoint", "Bucket")
_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA)[A-Z0-9]{12,}\b")
_EXPECTED_REGION = re.compile(r"expecting '([A-Za-z0-9-]+)'")
_SSE_C_WORDS = ("customer", "server side encryption", "server-side encryption", "sse-c", "encryption parameters")
_ACTION = {"get": "s3:GetObject", "head": "s3:GetObject", "put": "s3:PutObject (and s3:GetObject for the copy)",
           "list": "s3:ListBucket", "delete": "s3:DeleteObject", "create bucket": "s3:CreateBucket"}
_TOKEN = {"ExpiredToken": "the session token has expired",
          "TokenRefreshRequired": "the session token must be refreshed",
          "InvalidToken": "the session token is malformed or invalid"}
_THROTTLE = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
             "TooManyRequestsException", "ServiceUnavailable", "503", "429"}
_KMS = {"KMS.DisabledException": ("the KMS key that encrypts this bucket or object is disabled",
                                  "enable it (aws kms enable-key --key-id <key>) or point the bucket's default "
                                  "encryption at an enabled key"),
        "KMS.NotFoundException": ("the KMS key named by the bucket's default encryption or the request does not exist "
                                  "(or is in another region or account)",
                                  "fix the key id in the bucket's default encryption (aws s3api "
                                  "get-bucket-encryption shows it), or use SSE-S3"),
        "KMS.KMSInvalidStateException": ("the KMS key is in a state that cannot be used (pending deletion, "
                                         "pending import or unavailable)",
                                         "cancel a scheduled deletion (aws kms cancel-key-deletion) and enable the "
                                         "key, or re-encrypt with another key")}


def _redact(text: str, secrets: Iterable[str]) -> str:
    for s in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(s, "[credential]")
    return _KEY_ID.sub("[access key id]", text)


@dataclass(frozen=True)
class _Seen:
    """An S3 error response as :func:`diagnose` reads it: the operation and URL (``at``), what
    the store said (``seen``: code, status and message), the code and status, the message
    (``text``, ``low`` lower-cased), the error's safe fields, the region the store expects and the
    one this store signs for, and whether the error had a body."""

    at: str
    seen: str
    code: str
    status: int
    low: str
    text: str
    info: dict[str, str]
    expected: str
    region: str
    bare: bool
    where: str
    op: str

    def fields(self) -> tuple[str, str, str, int, str, str, dict[str, str], str, str, bool, str, str]:
        return (self.at, self.seen, self.code, self.status, self.low, self.text, self.info, self.expected,
                self.region, self.bare, self.where, self.op)


def diagnose(op: str, where: str, code: str, status: int, message: str, region_hint: str = "", *,
             region: str = "", details: Mapping[str, Any] | None = None, redact: Iterable[str] = ()) -> RunbookError:
    """The error to raise for an S3 error response, diagnosed by its error code first and its HTTP
    status second, with a message that says what failed, the code and value seen, and what to do.

    Codes and their meanings follow Amazon S3's error reference
    (https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html). A HEAD response has no
    body, so botocore gives the status as the code (``"403"``) and the cause cannot be told from it
    (https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadObject.html): the message then lists
    the possible causes and the checks that tell them apart.

    Args:
        op: the operation (``"get"``, ``"put"``, ``"head"``, ``"list"``, ``"delete"``, ``"create bucket"``).
        where: the object or bucket URL (``s3://bucket/key``).
        code: the ``Error.Code`` botocore parsed (``"AccessDenied"``), or the status as text for a HEAD.
        status: the HTTP status code (0 when unknown).
        message: the ``Error.Message`` the store sent.
        region_hint: the bucket's region as the store named it (``x-amz-bucket-region`` header or the
            error's ``Region``), or ``""``.
        region: the region this store signs for.
        details: the rest of the parsed ``Error``; only non-secret fields are read (request and
            server time, region, endpoint, bucket).
        redact: credential values to keep out of the message (key ids shaped like AWS's are
            always masked).

    Returns:
        :class:`~runbook_lib.errors.AuthError` for credential, signature, clock, permission, region and
        KMS-permission causes; :class:`~runbook_lib.errors.StorageError` otherwise. Never raises.
    """
    code = (code or "").strip()
    status = int(status or 0)
    info = {k: str((details or {}).get(k) or "") for k in _SAFE_FIELDS}
    text = " ".join((message or "").split())[:300]
    c = _Seen(at=f"{op} {where}", seen=f"{code or 'no code'}, HTTP {status or '?'}" + (f": {text}" if text else ""),
              code=code, status=status, low=text.lower(), text=text, info=info,
              expected=region_hint or info["Region"] or next(iter(_EXPECTED_REGION.findall(text)), ""),
              region=region, bare=not code or code == str(status), where=where, op=op)  # bare: no error body
    found = _credential_cause(c) or _region_cause(c) or _policy_cause(c) or _bare_cause(c)
    assert found is not None  # _bare_cause ends with a catch-all
    cls, out = found
    msg = _redact(out, redact)
    return AuthError(msg, provider="s3", resource_id=where) if cls is AuthError else cls(msg)


def _credential_cause(c: _Seen) -> tuple[type[RunbookError], str] | None:
    """KMS, SSE-C, clock, session token, signature and key-id causes. None when the error is none of
    them."""
    at, seen, code, status, low, text, info, expected, region, bare, where, op = c.fields()
    cls: type[RunbookError]
    cls, out = AuthError, ""
    if code.startswith("KMS.") or ("kms" in low and code in ("AccessDenied", "InvalidArgument", "InvalidRequest")):
        if code in ("KMS.AccessDeniedException", "AccessDenied"):
            out = (f"{at}: the identity may use the bucket but not the KMS key that encrypts it ({seen}). Grant "
                   "kms:Decrypt (reads) and kms:GenerateDataKey (writes) on that key to the identity the params' "
                   "storage credentials resolve to, in the key policy or IAM.")
        else:
            what, fix = _KMS.get(code, ("the KMS key that encrypts this bucket or object refused the request",
                                        "check the bucket's default encryption key and its state "
                                        "(aws kms describe-key)"))
            cls, out = StorageError, f"{at}: {what} ({seen}). {fix[0].upper()}{fix[1:]}."
    elif code in ("InvalidRequest", "InvalidArgument") and any(w in low for w in _SSE_C_WORDS):
        cls, out = StorageError, (
            f"{at}: the object is encrypted with a customer-provided key (SSE-C) and the request did not carry "
            f"it, or carried another ({seen}). The runbook sends no SSE-C keys: copy the object with its key "
            "into a bucket that uses SSE-S3 or SSE-KMS, and write checkpoints there.")
    elif code == "RequestTimeTooSkewed":
        times = ", ".join(f"{k} {info[k]}" for k in ("RequestTime", "ServerTime") if info[k])
        out = (f"{at}: the store rejected the request time: this machine's clock differs from the store's by more "
               f"than the allowed skew (15 minutes on AWS) ({seen}{'; ' + times if times else ''}). Sync the "
               "clock (timedatectl set-ntp true, or chronyc makestep) and retry.")
    elif code in _TOKEN:
        out = (f"{at}: {_TOKEN[code]} ({seen}). Get fresh temporary credentials (aws sso login, or assume the role "
               "again) and update the session token the params' storage credentials refer to.")
    elif code == "RequestExpired":
        out = (f"{at}: the signed request reached the store after its validity window ({seen}): a presigned URL "
               "expired, or this machine's clock is behind. Sync the clock and sign a new request.")
    elif code == "SignatureDoesNotMatch":
        out = (f"{at}: the store computed a different signature ({seen}): the secret access key does not belong "
               "to the access key id, or something rewrote the request. Copy the secret key for this key id into "
               "the secret the params refer to again (no trailing newline or space), and check endpoint_url and "
               "that no proxy alters the request.")
    elif code in ("InvalidAccessKeyId", "InvalidClientTokenId"):
        out = (f"{at}: the store does not know the access key id ({seen}): it was deleted or deactivated, belongs "
               "to another account or provider (an R2 or MinIO key sent to AWS, or the reverse), or the "
               "environment holds a stale value. Check the key id the params' credentials for this store refer to "
               "(storage, or workload.checkpoint_store for a checkpoint's bucket) and that endpoint_url names the "
               "provider that issued it.")
    else:
        return None
    return cls, out


def _region_cause(c: _Seen) -> tuple[type[RunbookError], str] | None:
    """A bucket in another region than the store signs for, or a malformed authorization header. None
    when the error is none of them."""
    at, seen, code, status, low, text, info, expected, region, bare, where, op = c.fields()
    cls: type[RunbookError]
    cls, out = AuthError, ""
    if (code in ("AuthorizationHeaderMalformed", "PermanentRedirect", "IllegalLocationConstraintException")
          or status == 301 or (bare and status in (400, 403) and expected and region and expected != region)):
        endpoint = info["Endpoint"]
        if expected and expected != region:
            out = (f"{at}: the bucket is in region {expected!r}, the store is configured for {region or '?'!r} "
                   f"({seen}). Set the storage region to {expected} in params"
                   + (f" (endpoint {endpoint})" if endpoint else "") + ".")
        elif code == "AuthorizationHeaderMalformed":
            out = (f"{at}: the store could not read the request's authorization header ({seen}). Usually the "
                   f"signing region is wrong (configured {region or '?'!r}) or the access key id is empty: set the "
                   "storage region to the bucket's region and check the key id reference resolves to a value.")
        elif code == "IllegalLocationConstraintException":
            out = (f"{at}: the bucket's location constraint does not match the endpoint's region (configured "
                   f"{region or '?'!r}) ({seen}). Create the bucket with the endpoint of its region, or set the "
                   "storage region to the region the bucket must live in.")
        else:
            out = (f"{at}: the bucket is in another region than {region or '?'!r} and the store did not say which "
                   f"({seen}" + (f"; endpoint {endpoint}" if endpoint else "") + "). Find it with aws s3api "
                   "get-bucket-location and set the storage region in params.")
    else:
        return None
    return cls, out


def _policy_cause(c: _Seen) -> tuple[type[RunbookError], str] | None:
    """Policy denials, a disabled bucket or account, a missing bucket or key, a changed object,
    throttling, internal errors. None when the error is none of them."""
    at, seen, code, status, low, text, info, expected, region, bare, where, op = c.fields()
    cls: type[RunbookError]
    cls, out = AuthError, ""
    if code == "AccessDenied":
        action = _ACTION.get(op, "this operation")
        out = (f"{at}: access denied by a policy: the credentials were accepted but a bucket policy, IAM policy, "
               f"SCP, block-public-access rule or object ACL denies {action} ({seen}). Grant {action} on "
               f"{where} to the identity the params' storage credentials resolve to (aws sts "
               "get-caller-identity shows it), or fix the bucket policy.")
    elif code == "AllAccessDisabled":
        out = (f"{at}: the provider has disabled all access to this bucket ({seen}). No params change fixes it: "
               "contact the provider's support, or use another bucket.")
    elif code == "AccountProblem":
        out = (f"{at}: a problem with the storage account (billing, suspension) blocks the request ({seen}). Check "
               "the account's status and billing with the provider, then retry.")
    elif code == "NoSuchBucket":
        cls, out = StorageError, (
            f"{at}: object or bucket does not exist ({code}): the bucket is not there at this endpoint "
            f"({seen}). Check the bucket name in the store URL, endpoint_url and region, or create the bucket.")
    elif code in ("NoSuchKey", "404", "NotFound") or status == 404:
        cls, out = StorageError, (
            f"{at}: object or bucket does not exist ({code or status}): nothing at this key ({seen}). Check the "
            "key and prefix; a set that was never completed has no marker and no manifest.")
    elif code == "PreconditionFailed" or status == 412:
        cls, out = StorageError, (
            f"{at}: the object changed while it was read ({code or status}: its ETag no longer matches the one "
            f"read first, {seen}): someone wrote it meanwhile. Copy it again once writers have stopped; a "
            "versioned bucket lets a copy pin the version instead.")
    elif code in _THROTTLE or status in (429, 503):
        cls, out = StorageError, (
            f"{at}: the store is throttling requests ({seen}), still after botocore's retries. Retry later, and "
            "lower max_concurrency or spread keys over more prefixes if it keeps happening.")
    elif code in ("InternalError", "InternalFailure") or status >= 500:
        cls, out = StorageError, (
            f"{at}: the store failed internally ({seen}), still after botocore's retries. Retry later; if it "
            "persists, check the provider's status page.")
    else:
        return None
    return cls, out


def _bare_cause(c: _Seen) -> tuple[type[RunbookError], str] | None:
    """An error without a body (a HEAD), refused credentials, and anything else. None when the error is
    none of them."""
    at, seen, code, status, low, text, info, expected, region, bare, where, op = c.fields()
    cls: type[RunbookError]
    cls, out = AuthError, ""
    if bare and status == 403:
        out = (f"{at}: HTTP 403 with no error body ({seen}), as S3 answers every failed HEAD, so the cause cannot be told "
               "from it. It is one of: the object is missing and the identity lacks s3:ListBucket; a policy "
               "denies s3:GetObject; the KMS key denies kms:Decrypt; an SSE-C object read without its key; "
               "refused or expired credentials; clock skew. Check: aws sts get-caller-identity with the same "
               "credentials, the machine's clock, and a GET of the object (aws s3api get-object), which returns "
               "the error code.")
    elif bare and status == 400:
        cls, out = StorageError, (
            f"{at}: HTTP 400 with no error body ({seen}), as S3 answers every failed HEAD, so the cause cannot be told "
            f"from it. It is one of: the bucket is in another region than {region or '?'!r}; an SSE-C object "
            "read without its key; an expired session token. Check: aws s3api get-bucket-location, and a GET of "
            "the object (aws s3api get-object), which returns the error code.")
    elif status in (401, 403):
        out = (f"{at}: the store refused the credentials ({code or status}, HTTP {status}"
               + (f": {text}" if text else "") + "); check the storage credential references in params and the "
               "bucket policy.")
    else:
        cls, out = StorageError, f"{at} failed: {code or status}: {text}"
    return cls, out



@dataclass(frozen=True)
class ErrorTranslator:
    """Translates one store's botocore errors into the runbook's, once per operation, naming the
    operation and the object (:func:`diagnose` reads the error code, not only the HTTP status).

    Attributes:
        url: the URL of a store key (``S3Store.url``), for messages.
        region: the region the store signs for.
        redact: credential values the store resolved (key id, secret, session token), kept out of
            messages. An injected client's own credentials are not read (botocore exposes them only
            through private attributes); :func:`diagnose` reads no field that echoes them and masks
            anything shaped like an AWS key id.
    """

    url: Callable[[str], str]
    region: str
    redact: tuple[str, ...] = field(default=(), repr=False)

    @contextlib.contextmanager
    def translating(self, op: str, key: str) -> Iterator[None]:
        """Run the block, raising what :meth:`diagnose` makes of a botocore ``ClientError``, and a
        :class:`~runbook_lib.errors.StorageError` naming the operation for any other botocore error
        (a connection or parameter error)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except ClientError as exc:
            raise self.diagnose(op, key, exc.response) from None
        except BotoCoreError as exc:
            raise StorageError(f"{op} {self.url(key)} failed: {type(exc).__name__}: {exc}") from None

    def diagnose(self, op: str, key: str, response: Mapping[str, Any]) -> RunbookError:
        """The error for botocore's parsed error ``response`` (``{"Error": {...},
        "ResponseMetadata": {...}}``) of ``op`` on store key ``key``: :func:`diagnose` with the
        bucket's region from the ``x-amz-bucket-region`` header or the error's ``Region``."""
        error = response.get("Error") or {}
        meta = response.get("ResponseMetadata") or {}
        headers = meta.get("HTTPHeaders") or {}
        hint = str(headers.get("x-amz-bucket-region") or error.get("Region") or "")
        return diagnose(op, self.url(key), str(error.get("Code") or ""), int(meta.get("HTTPStatusCode") or 0),
                        str(error.get("Message") or ""), hint, region=self.region, details=error,
                        redact=self.redact)
