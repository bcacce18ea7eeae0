"""The streaming measurement path against a bare httpx streaming loop, on the same real server.

Starts ``transformers serve`` (from ``.venv-serve``, on the demo's chat model: ``make
demo-service-models`` builds both) on a loopback port, then alternates blocks of requests: a bare
loop (``httpx.Client.stream`` over server-sent events, timing send to first content chunk and to
the last byte, each request sent at its time in a Poisson schedule by a plain sleep) and the
runbook's path on the same schedule (:func:`runbook_lib.measure.timing.run_open_loop` with
:class:`runbook_lib.service.protocols.OpenAIChat`, at an arrival rate low enough that requests
never queue). Both send the same requests; the blocks alternate so drift in the server hits both.
Ends with ``ratio_p50_e2e=<harness / bare> ratio_p50_ttft=<harness / bare>``. Target: each within
5 % (0.95 to 1.05).

Usage: python benchmarks/streaming.py [--blocks 4] [--per-block 25]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from runbook_lib.measure.timing import Request, poisson_schedule, run_open_loop
from runbook_lib.params import Service
from runbook_lib.providers.local.lifecycle import free_port
from runbook_lib.service.protocols import OpenAIChat

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / ".venv-serve" / "bin" / "transformers"
MODEL = ROOT / ".runbook" / "models" / "chat-seed0"


def bare(c: httpx.Client, body: dict) -> tuple[float, float]:
    """One streamed request the plainest way, on a kept-alive client: (TTFT, E2E) in seconds
    from the send."""
    t0 = time.perf_counter()
    first = None
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if first is None and line.startswith("data:") and '"content"' in line:
                data = json.loads(line[5:])
                if (data.get("choices") or [{}])[0].get("delta", {}).get("content"):
                    first = time.perf_counter()
    return (first or time.perf_counter()) - t0, time.perf_counter() - t0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--per-block", type=int, default=25)
    args = ap.parse_args(argv)
    if not SERVER.exists() or not MODEL.exists():
        print(f"needs {SERVER} and {MODEL}: run `make demo-service-models`", file=sys.stderr)
        return 2
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([str(SERVER), "serve", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
                             "--device", "cpu", "--log-level", "warning"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        svc = Service(image="bench", protocol="openai-chat", samples="-", max_tokens=16)
        client = OpenAIChat(svc, url)
        plain = httpx.Client(base_url=url, timeout=30)
        msgs = [[{"role": "user", "content": f"The training job {i % 12}"}] for i in range(args.per_block)]
        for m in msgs:  # warm-up: every prompt once, both paths
            bare(plain, client.body(m))
            client.runsync(m)
        b_ttft, b_e2e, h_ttft, h_e2e = [], [], [], []
        for k in range(args.blocks):
            sched = poisson_schedule(len(msgs), 2.0, seed=k)  # ~2 per second: a ~50 ms answer never queues
            start = time.perf_counter()
            for t_at, m in zip(sched, msgs, strict=True):  # the same schedule, kept by a plain sleep
                time.sleep(max(0.0, start + float(t_at) - time.perf_counter()))
                t, e = bare(plain, client.body(m))
                b_ttft.append(t)
                b_e2e.append(e)
            rows = run_open_loop(client, [Request(i, float(t), m, 0) for i, (t, m) in enumerate(zip(sched, msgs,
                                                                                                    strict=True))],
                                 side="harness", round_id=k, max_in_flight=8)
            h_ttft += [r["ttft_s"] for r in rows if r["status"] == "COMPLETED"]
            h_e2e += [r["execution_s"] for r in rows if r["status"] == "COMPLETED"]
        client.close()
        plain.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    rb, rt = float(np.median(h_e2e) / np.median(b_e2e)), float(np.median(h_ttft) / np.median(b_ttft))
    print(f"{len(b_e2e)} bare and {len(h_e2e)} harness requests, {args.blocks} alternating blocks, 16 tokens each")
    print(f"bare    p50 e2e {np.median(b_e2e) * 1000:.2f} ms, ttft {np.median(b_ttft) * 1000:.2f} ms")
    print(f"harness p50 e2e {np.median(h_e2e) * 1000:.2f} ms, ttft {np.median(h_ttft) * 1000:.2f} ms")
    print(f"ratio_p50_e2e={rb:.3f} ratio_p50_ttft={rt:.3f} (target 0.95 to 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
