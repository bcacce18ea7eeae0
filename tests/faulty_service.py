"""A chat server that misbehaves on cue: OpenAI's wire format (``POST /v1/chat/completions``,
streamed as server-sent events or whole), scripted to each way a service's answer can fail.

The fault comes from the prompt (in-process tests send it as the message) or, for whole runs,
from the ``FAULT`` environment variable of the process (the service pod's environment), with
``FAULT_AFTER`` clean answers first (phase 03's canary answers cleanly, then phase 04 sees the
fault) and ``FAULT_EVERY`` (one answer in N faulty after that), or from the file ``FAULT_FILE``
names, read at each request (absent or empty: no fault), so a test can turn a fault on mid-phase:

==============  ===================================================================================
fault           what the server does
==============  ===================================================================================
(none)          "Hello world!" in five chunks, a finish_reason chunk with usage, ``data: [DONE]``
error200        status 200, one chunk, then vLLM's streamed error ``{"error": {"message": ...}}``
                and ``[DONE]`` (a whole answer: ``{"error": {...}}`` with status 200)
error200-raw    ``transformers serve``'s streamed error: ``data: {"error": "..."}`` written unescaped
html502         status 200 with a ``text/html`` 502 page
cut             two chunks, then the connection closes
noterm          every chunk, then the stream ends with no finish_reason and no ``[DONE]``
onlydone        every chunk, then ``[DONE]`` with no finish_reason
oversize        chunks of 4 KiB until 64 KiB (past a small ``max_answer_bytes``)
trickle         headers, then an SSE comment every 0.2 s, never a chunk (bounded: 60 s)
gap             one chunk, then silence for 3 s, then the rest
silent          reads the request and never answers (no status line; bounded: 60 s)
nousage         the normal stream without ``usage``
empty           a finish_reason with no content
==============  ===================================================================================

As a team's live service (a source the runbook must not change), three more variables:
``REQUEST_LOG`` names a file that gets one JSON line per request as it arrives (``t``, Unix
seconds; ``method``; ``path``), ``SIGNAL_LOG`` one that gets the name of every signal the process
receives (it exits on SIGTERM and SIGINT after writing it), and ``REQUIRE_TOKEN`` makes every
request without ``Authorization: Bearer <that token>`` answer 401.

Run as a stand-in: ``python tests/faulty_service.py PORT``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHUNKS = ["Hel", "lo", " wor", "ld", "!"]
ERROR_TEXT = "CUDA error: out of memory (tried to allocate 2.00 GiB)"
FIRST_S = 0.01


class Faulty(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked streams and keep-alive, as real servers
    disable_nagle_algorithm = True
    answered = 0
    lock = threading.Lock()

    def log_message(self, *a: Any) -> None:
        pass

    def _logged(self) -> bool:
        """Log the request (``REQUEST_LOG``) and check its token (``REQUIRE_TOKEN``): False when
        it was answered 401."""
        if os.environ.get("REQUEST_LOG"):
            line = json.dumps({"t": time.time(), "method": self.command, "path": self.path}) + "\n"
            with Faulty.lock, open(os.environ["REQUEST_LOG"], "a") as f:
                f.write(line)
        token = os.environ.get("REQUIRE_TOKEN")
        if token and self.headers.get("Authorization") != f"Bearer {token}":
            if self.command == "POST":
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._json(401, {"error": {"message": "missing or wrong bearer token"}})
            return False
        return True

    def do_GET(self) -> None:
        if not self._logged():
            return
        if self.path == "/v1/models":
            return self._json(200, {"object": "list", "data": [{"id": "faulty-chat", "object": "model"}]})
        if self.path == "/health":
            return self._json(200, {"status": "ok"})
        if self.path == "/ping":  # a Runpod load-balancing worker's health route
            return self._json(200, {"status": "healthy"})
        self._json(404, {"detail": "Not Found"})

    def fault(self, prompt: str) -> str:
        if os.environ.get("FAULT_FILE"):
            try:
                with open(os.environ["FAULT_FILE"]) as f:
                    return f.read().strip()
            except FileNotFoundError:
                return ""
        env = os.environ.get("FAULT", "")
        if not env:
            return prompt if prompt in FAULTS else ""
        with Faulty.lock:
            n = Faulty.answered
            Faulty.answered += 1
        after, every = int(os.environ.get("FAULT_AFTER", "0")), int(os.environ.get("FAULT_EVERY", "1"))
        return env if n >= after and (n - after) % every == 0 else ""

    def do_POST(self) -> None:
        if not self._logged():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            return self._json(404, {"detail": "Not Found"})
        fault = self.fault(str(body["messages"][-1]["content"]))
        if fault == "silent":
            time.sleep(60)
            return
        if fault == "html502":
            page = b"<html><head><title>502 Bad Gateway</title></head><body>502 Bad Gateway</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        if not body.get("stream"):
            if fault == "error200":
                return self._json(200, {"error": {"message": ERROR_TEXT, "type": "InternalServerError", "code": 500}})
            if fault == "empty":
                return self._json(200, {"choices": [{"message": {"content": ""}, "finish_reason": "stop"}]})
            return self._json(200, {"choices": [{"message": {"content": "".join(CHUNKS)}, "finish_reason": "stop"}],
                                    "usage": {"completion_tokens": len(CHUNKS)}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        time.sleep(FIRST_S)
        if fault == "trickle":
            for _ in range(300):
                self._raw(b": keep-alive\n\n")
                time.sleep(0.2)
            return self._end()
        if fault == "oversize":
            for _ in range(16):
                self._event({"choices": [{"delta": {"content": "x" * 4096}, "index": 0}]})
            return self._end()
        for i, c in enumerate(CHUNKS if fault != "empty" else []):
            if fault == "cut" and i == 2:
                self.wfile.flush()
                self.close_connection = True
                return
            if fault == "gap" and i == 1:
                time.sleep(3)
            self._event({"choices": [{"delta": {"content": c}, "index": 0}]})
            if fault == "error200":
                self._event({"error": {"message": ERROR_TEXT, "type": "InternalServerError", "code": 500}})
                self._raw(b"data: [DONE]\n\n")
                return self._end()
            if fault == "error200-raw":
                self._raw(f'data: {{"error": "{ERROR_TEXT} in "model.forward""}}\n\n'.encode())
                return self._end()
        if fault == "noterm":
            return self._end()
        if fault != "onlydone":
            final: dict[str, Any] = {"choices": [{"delta": {}, "finish_reason": "stop", "index": 0}]}
            if fault != "nousage":
                final["usage"] = {"completion_tokens": len(CHUNKS)}
            self._event(final)
        self._raw(b"data: [DONE]\n\n")
        self._end()

    def _raw(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _event(self, obj: dict[str, Any]) -> None:
        self._raw(f"data: {json.dumps(obj)}\n\n".encode())

    def _json(self, code: int, obj: dict[str, Any]) -> None:
        send_json(self, code, obj)


def send_json(handler: BaseHTTPRequestHandler, code: int, obj: Any) -> None:
    """Answer ``obj`` as JSON with status ``code`` and its Content-Length."""
    data = json.dumps(obj).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


FAULTS = ("error200", "error200-raw", "html502", "cut", "noterm", "onlydone", "oversize", "trickle", "gap", "silent",
          "nousage", "empty")


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up on a stalled answer is the point, not an error


def serve(port: int = 0) -> ThreadingHTTPServer:
    """A server on 127.0.0.1:``port`` (0: any free port), serving in a daemon thread."""
    srv = Server(("127.0.0.1", port), Faulty)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _log_signals(path: str) -> None:
    import signal

    def note(signum: int, _frame: Any) -> None:
        with open(path, "a") as f:
            f.write(signal.Signals(signum).name + "\n")
        if signum in (signal.SIGTERM, signal.SIGINT):
            os._exit(0)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):
        signal.signal(sig, note)


if __name__ == "__main__":
    if os.environ.get("SIGNAL_LOG"):
        _log_signals(os.environ["SIGNAL_LOG"])
    Server(("127.0.0.1", int(sys.argv[1])), Faulty).serve_forever()
