"""S3 errors are diagnosed by their error code, not the HTTP status alone: each cause of a refusal
(clock, token, key id, signature, region, policy, KMS key, SSE-C key, throttling, a HEAD without a
body) gets its own message naming the code, the value seen and the fix, and no credential.

The responses are botocore Stubber errors on a real boto3 S3 client, shaped as S3 sends them
(https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html)."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import boto3
import pytest
from botocore.stub import Stubber

from runbook_lib.errors import AuthError, RunbookError, StorageError
from runbook_lib.storage.s3 import S3Store, diagnose

KEY_ID = "AKIDEXAMPLE"
SECRET = "secret-never-shown"
WHERE = "s3://ckpt/runs/model.pt"


@pytest.fixture
def stubbed() -> Iterator[tuple[S3Store, Stubber]]:
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)
    with Stubber(client) as stub:
        # the store knows the keys it resolved (as from_url's options give them in a run)
        yield S3Store("ckpt", "runs", client=client, region="us-east-1", access_key_id=KEY_ID,
                      secret_access_key=SECRET), stub
        stub.assert_no_pending_responses()


def raised(call: Callable[[], Any], cls: type[RunbookError]) -> str:
    """The message of the error ``call`` raises, checked to be ``cls`` and free of credentials."""
    with pytest.raises(RunbookError) as info:
        call()
    assert type(info.value) is cls, f"{type(info.value).__name__}: {info.value}"
    msg = str(info.value)
    assert KEY_ID not in msg and SECRET not in msg
    return msg


def test_clock_skew_names_both_times_and_the_clock_fix(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    stub.add_client_error("get_object", "RequestTimeTooSkewed",
                          "The difference between the request time and the current time is too large.", 403,
                          service_error_meta={"RequestTime": "20250101T000000Z", "ServerTime": "2025-01-01T00:20:00Z",
                                              "MaxAllowedSkewMilliseconds": "900000", "AWSAccessKeyId": KEY_ID})
    msg = raised(lambda: store.get_bytes("model.pt"), AuthError)
    assert msg.startswith(f"get {WHERE}: ")
    assert "RequestTimeTooSkewed, HTTP 403" in msg and "2025-01-01T00:20:00Z" in msg and "Sync the clock" in msg


def test_expired_session_token_asks_for_fresh_credentials(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    stub.add_client_error("get_object", "ExpiredToken", "The provided token has expired.", 400)
    msg = raised(lambda: store.get_bytes("model.pt"), AuthError)
    assert "ExpiredToken" in msg and "session token has expired" in msg and "fresh temporary credentials" in msg


def test_unknown_access_key_id_is_not_a_signature_or_policy_problem(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    stub.add_client_error("get_object", "InvalidAccessKeyId",
                          "The AWS Access Key Id you provided does not exist in our records.", 403,
                          service_error_meta={"AWSAccessKeyId": KEY_ID})
    msg = raised(lambda: store.get_bytes("model.pt"), AuthError)
    assert "InvalidAccessKeyId" in msg and "does not know the access key id" in msg and "endpoint_url" in msg


def test_signature_mismatch_points_at_the_secret_key(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    stub.add_client_error("get_object", "SignatureDoesNotMatch",
                          "The request signature we calculated does not match the signature you provided. "
                          "Check your key and signing method.", 403,
                          service_error_meta={"AWSAccessKeyId": KEY_ID, "StringToSign": "AWS4-HMAC-SHA256\n...",
                                              "SignatureProvided": "abc123"})
    msg = raised(lambda: store.get_bytes("model.pt"), AuthError)
    assert "SignatureDoesNotMatch" in msg and "secret access key does not belong" in msg
    assert "abc123" not in msg and "StringToSign" not in msg


def test_wrong_region_names_the_region_the_bucket_is_in(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    stub.add_client_error("get_object", "AuthorizationHeaderMalformed",
                          "The authorization header is malformed; the region 'us-east-1' is wrong; expecting "
                          "'eu-west-1'", 400, service_error_meta={"Region": "eu-west-1"})
    msg = raised(lambda: store.get_bytes("model.pt"), AuthError)
    assert "AuthorizationHeaderMalformed" in msg and "bucket is in region 'eu-west-1'" in msg
    assert "configured for 'us-east-1'" in msg and "Set the storage region to eu-west-1" in msg


def test_permanent_redirect_names_the_region_from_the_header(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    stub.add_client_error("list_objects_v2", "PermanentRedirect",
                          "The bucket you are attempting to access must be addressed using the specified endpoint.",
                          301, service_error_meta={"Endpoint": "ckpt.s3.ap-southeast-2.amazonaws.com"},
                          response_meta={"HTTPHeaders": {"x-amz-bucket-region": "ap-southeast-2"}})
    msg = raised(lambda: store.list(), AuthError)
    assert "PermanentRedirect, HTTP 301" in msg and "Set the storage region to ap-southeast-2" in msg


def test_head_in_the_wrong_region_is_named_from_the_header(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    stub.add_client_error("head_object", "400", "Bad Request", 400,
                          response_meta={"HTTPHeaders": {"x-amz-bucket-region": "eu-central-1"}})
    msg = raised(lambda: store.head("model.pt"), AuthError)
    assert "bucket is in region 'eu-central-1'" in msg and "400, HTTP 400" in msg


def test_policy_denial_names_the_action_to_grant(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    stub.add_client_error("put_object", "AccessDenied", "Access Denied", 403)
    msg = raised(lambda: store.put_bytes(b"x", "model.pt"), AuthError)
    assert "AccessDenied, HTTP 403" in msg and "bucket policy" in msg and "Grant s3:PutObject" in msg
    assert "get-caller-identity" in msg


@pytest.mark.parametrize(("code", "message", "status", "cls", "fix"), [
    ("AccessDenied", "User: arn:aws:iam::111122223333:user/ci is not authorized to perform: kms:Decrypt on "
     "resource: arn:aws:kms:us-east-1:111122223333:key/1234", 403, AuthError, "Grant kms:Decrypt"),
    ("KMS.AccessDeniedException", "Access to KMS is not allowed", 403, AuthError, "Grant kms:Decrypt"),
    ("KMS.DisabledException", "arn:aws:kms:us-east-1:111122223333:key/1234 is disabled.", 400, StorageError,
     "aws kms enable-key"),
    ("KMS.NotFoundException", "Invalid keyId alias/ckpt", 400, StorageError, "get-bucket-encryption"),
    ("KMS.KMSInvalidStateException", "arn:aws:kms:us-east-1:111122223333:key/1234 is pending deletion.", 400,
     StorageError, "cancel-key-deletion"),
])
def test_kms_key_causes_are_told_apart(stubbed: tuple[S3Store, Stubber], code: str, message: str, status: int,
                                       cls: type[RunbookError], fix: str) -> None:
    store, stub = stubbed
    stub.add_client_error("get_object", code, message, status)
    msg = raised(lambda: store.get_bytes("model.pt"), cls)
    assert f"{code}, HTTP {status}" in msg and "KMS key" in msg and fix in msg


def test_sse_c_object_read_without_its_key(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    stub.add_client_error("get_object", "InvalidRequest",
                          "The object was stored using a form of Server Side Encryption. The correct parameters must "
                          "be provided to retrieve the object.", 400)
    msg = raised(lambda: store.get_bytes("model.pt"), StorageError)
    assert "InvalidRequest, HTTP 400" in msg and "customer-provided key (SSE-C)" in msg and "SSE-KMS" in msg


@pytest.mark.parametrize(("code", "status", "fix"), [
    ("SlowDown", 503, "is throttling requests"),
    ("InternalError", 500, "failed internally"),
])
def test_throttling_and_server_errors_say_retry_later(stubbed: tuple[S3Store, Stubber], code: str, status: int,
                                                      fix: str) -> None:
    store, stub = stubbed
    stub.add_client_error("get_object", code, "Please reduce your request rate.", status)
    msg = raised(lambda: store.get_bytes("model.pt"), StorageError)
    assert f"{code}, HTTP {status}" in msg and fix in msg and "Retry later" in msg


def test_head_403_without_a_code_says_the_cause_cannot_be_told(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    stub.add_client_error("head_object", "403", "Forbidden", 403)
    msg = raised(lambda: store.head("model.pt"), AuthError)
    assert msg.startswith(f"head {WHERE}: HTTP 403 with no error body (403, HTTP 403: Forbidden)")
    assert "cannot be told" in msg and "SSE-C" in msg and "kms:Decrypt" in msg and "s3:ListBucket" in msg
    assert "aws sts get-caller-identity" in msg and "aws s3api get-object" in msg


def test_head_404_is_still_no_object(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    stub.add_client_error("head_object", "404", "Not Found", 404)
    assert store.head("model.pt") is None


def test_missing_bucket_and_unknown_codes_keep_their_messages(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    stub.add_client_error("get_object", "NoSuchBucket", "The specified bucket does not exist", 404)
    stub.add_client_error("get_object", "EntityTooLarge", "Your proposed upload exceeds the maximum", 400)
    msg = raised(lambda: store.get_bytes("model.pt"), StorageError)
    assert msg.startswith(f"get {WHERE}: object or bucket does not exist (NoSuchBucket)")
    msg = raised(lambda: store.get_bytes("model.pt"), StorageError)
    assert msg == f"get {WHERE} failed: EntityTooLarge: Your proposed upload exceeds the maximum"


def test_credentials_echoed_by_a_store_are_masked(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    stub.add_client_error("get_object", "Forbidden", f"key {KEY_ID} with secret {SECRET} refused", 403)
    msg = raised(lambda: store.get_bytes("model.pt"), AuthError)
    assert "refused the credentials (Forbidden, HTTP 403" in msg and "[credential]" in msg
    err = diagnose("get", WHERE, "InvalidAccessKeyId", 403, "AKIAIOSFODNN7EXAMPLE is not known")
    assert isinstance(err, AuthError) and "AKIAIOSFODNN7EXAMPLE" not in str(err) and "[access key id]" in str(err)
