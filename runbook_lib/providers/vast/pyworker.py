"""Vast.ai's PyWorker as the Vast.ai simulator runs it on each Serverless worker: the adapter that
fronts a team's own server (here the image's stand-in) on a Vast.ai Serverless endpoint.

It does what the ``vastai`` 1.9.1 PyWorker does with one ``HandlerConfig`` (route ``--route``,
no parallel requests) and the server's health check (``WorkerConfig.model_healthcheck_url``):

* start: the server (the stand-in, ``{port}`` filled with a free port) is started and polled at
  ``--ready-path`` until it answers 200, then the autoscaler's public key is read from
  ``--pubkey-url`` (``https://run.vast.ai/pubkey/``, PEM); only then does the worker listen on
  ``--port``, so a worker that accepts a connection is loaded;
* each request is ``POST {route}`` with ``{"auth_data": <the /route/ answer>, "session_id",
  "payload"}``: ``auth_data`` must carry ``cost``, ``endpoint``, ``reqnum``, ``request_idx``,
  ``signature`` and ``url`` (else 422 naming the field), and its ``signature`` must be the
  autoscaler's RSA PKCS#1 v1.5 SHA-256 signature (base64) of ``json.dumps({"url": url},
  indent=4, sort_keys=True)`` (else 401, empty body); a missing ``payload`` is 422;
* the ``payload`` is POSTed as JSON to the server's same route, one request at a time (FIFO),
  and the server's status and body are passed back.

Sources: ``vastai/serverless/server/lib/backend.py`` (signature, forwarding, codes),
``lib/data_types.py`` (``auth_data`` fields) and ``worker.py`` (``HandlerConfig``) of the
``vastai`` 1.9.1 package; docs.vast.ai "The PyWorker" and "Route".

Usage: ``python -m runbook_lib.providers.vast.pyworker --port P --route /runsync --pubkey-url URL
--command JSON [--ready-path /]``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from runbook_lib.layout import CRASH_EVERY, POD_FAULT_ENV
from runbook_lib.providers.stand_in import start_stand_in, wait_ready

AUTH_FIELDS = ("cost", "endpoint", "reqnum", "request_idx", "signature", "url")
"""What ``auth_data`` must carry (vastai 1.9.1 ``serverless/server/lib/data_types.py``)."""
READY_WAIT_S = 120.0


def signed_message(url: str) -> bytes:
    """What the autoscaler signs for a worker URL (vastai 1.9.1 ``backend.py``: only ``url``)."""
    return json.dumps({"url": url}, indent=4, sort_keys=True).encode()


def verify(pubkey_pem: bytes, auth: dict[str, Any]) -> bool:
    """Whether ``auth["signature"]`` is the autoscaler's signature of ``auth["url"]``."""
    key = serialization.load_pem_public_key(pubkey_pem)
    assert isinstance(key, rsa.RSAPublicKey)
    try:
        key.verify(base64.b64decode(str(auth["signature"])), signed_message(str(auth["url"])), padding.PKCS1v15(),
                   hashes.SHA256())
    except (InvalidSignature, ValueError):
        return False
    return True


def _handler(server_url: str, route: str, pubkey: bytes, crash_after: int = 0) -> type[BaseHTTPRequestHandler]:
    http = httpx.Client(timeout=600.0)
    one_at_a_time = threading.Lock()
    served = [0]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, code: int, body: bytes = b"", kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            size = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(size) if size else b""
            if self.path.split("?")[0] != route:
                return self._send(404, json.dumps({"error": f"no handler for {self.path}"}).encode())
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                return self._send(422, json.dumps({"error": "the body is not JSON"}).encode())
            auth = body.get("auth_data") if isinstance(body, dict) else None
            if not isinstance(auth, dict):
                return self._send(422, json.dumps({"auth_data": "field missing"}).encode())
            missing = {f: "missing parameter" for f in AUTH_FIELDS if f not in auth}
            if missing:
                return self._send(422, json.dumps({"auth_data": missing}).encode())
            if "payload" not in body:
                return self._send(422, json.dumps({"payload": "field missing"}).encode())
            if not verify(pubkey, auth):
                return self._send(401)
            with one_at_a_time:
                if crash_after and served[0] >= crash_after:  # the worker_crash fault: it dies holding this one
                    os._exit(3)
                served[0] += 1
                try:
                    answer = http.post(f"{server_url}{route}", json=body["payload"])
                except httpx.HTTPError:
                    return self._send(500)
            return self._send(answer.status_code, answer.content,
                              answer.headers.get("content-type", "application/json"))

    return Handler


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="pyworker")
    ap.add_argument("--port", type=int, required=True, help="the worker's port (the simulator maps it)")
    ap.add_argument("--route", required=True, help="HandlerConfig.route: clients POST here, forwarded to the server")
    ap.add_argument("--pubkey-url", required=True)
    ap.add_argument("--command", required=True, help="the server's argv as JSON, {port} in it")
    ap.add_argument("--ready-path", default="/", help="the server's health check (model_healthcheck_url)")
    args = ap.parse_args(argv)
    proc, url = start_stand_in(json.loads(args.command))
    with httpx.Client(timeout=10.0) as http:
        wait_ready(http, proc, url, args.ready_path)
        deadline = time.monotonic() + READY_WAIT_S
        while True:
            try:
                pubkey = http.get(args.pubkey_url).raise_for_status().content
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"no public key at {args.pubkey_url}") from None
                time.sleep(0.5)
    crash_after = CRASH_EVERY if os.environ.get(POD_FAULT_ENV) == "worker_crash" else 0
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(url, args.route, pubkey, crash_after))
    server.daemon_threads = True
    def end_with_the_server() -> None:
        proc.wait()
        server.shutdown()

    threading.Thread(target=end_with_the_server, daemon=True).start()
    server.serve_forever()
    return 3  # the server died: the worker dies with it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
