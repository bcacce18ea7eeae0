"""Verified transfer vs plain boto3 on the same loopback S3 endpoint, and our peak memory.

Writes a file of ``--size-mib`` (default 2048) whose sha256 is computed while it is written (as
the checkpoint writers do), starts moto's S3 server in its own process (its memory is not
counted), then in one run:

* plain:    boto3 ``upload_file`` + ``download_file``;
* verified: :meth:`S3Store.put_file` with the writer's sha256 (streamed re-hash, metadata at
  upload) + :meth:`S3Store.get_file` (ordered ranged GETs, streamed re-hash, size and sha256
  checked);
* verified without a known sha256 (the digest recorded by a server-side copy), for information.

Peak RSS is this process's ``ru_maxrss`` (the server runs elsewhere). Ends with the line
``ratio=<verified/plain> peak_rss_mb=<MB>``. Targets: ratio <= 1.15, peak RSS < 300 MB.

Usage: python benchmarks/transfer.py [--size-mib 2048]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MIB = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_file(path: Path, size_mib: int) -> str:
    """Pseudo-random bytes, 8 MiB at a time; returns the sha256 computed while writing."""
    rng = np.random.default_rng(0)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(size_mib // 8):
            block = rng.integers(0, 256, size=8 * MIB, dtype=np.uint8).tobytes()
            h.update(block)
            f.write(block)
    return h.hexdigest()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=2048)
    args = ap.parse_args(argv)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    port = _free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from runbook_lib.storage.s3 import S3Store

        endpoint = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        store = S3Store("bench", endpoint_url=endpoint, create_bucket=True)
        client = store.client
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "checkpoint.bin"
            digest = write_file(src, args.size_mib)
            size = src.stat().st_size

            t0 = time.perf_counter()
            client.upload_file(str(src), "bench", "plain/checkpoint.bin", Config=store.transfer.config())
            t1 = time.perf_counter()
            client.download_file("bench", "plain/checkpoint.bin", str(Path(tmp) / "plain.out"), Config=store.transfer.config())
            t2 = time.perf_counter()
            os.unlink(Path(tmp) / "plain.out")
            client.delete_object(Bucket="bench", Key="plain/checkpoint.bin")

            t3 = time.perf_counter()
            info = store.put_file(src, "verified/checkpoint.bin", sha256=digest)
            t4 = time.perf_counter()
            store.get_file("verified/checkpoint.bin", Path(tmp) / "verified.out", expect=info)
            t5 = time.perf_counter()
            os.unlink(Path(tmp) / "verified.out")
            store.delete("verified/checkpoint.bin")

            t6 = time.perf_counter()
            store.put_file(src, "copy/checkpoint.bin")
            t7 = time.perf_counter()
            store.delete("copy/checkpoint.bin")
    finally:
        server.terminate()
        server.wait(timeout=30)
    plain_put, plain_get = t1 - t0, t2 - t1
    ver_put, ver_get = t4 - t3, t5 - t4
    ratio = (ver_put + ver_get) / (plain_put + plain_get)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    gib = size / (1 << 30)
    print(f"file: {size} bytes ({gib:.2f} GiB), sha256 {digest[:16]}...")
    print(f"plain    put {plain_put:7.2f} s ({gib / plain_put:.2f} GiB/s)  get {plain_get:7.2f} s ({gib / plain_get:.2f} GiB/s)")
    print(f"verified put {ver_put:7.2f} s ({gib / ver_put:.2f} GiB/s)  get {ver_get:7.2f} s ({gib / ver_get:.2f} GiB/s)")
    print(f"verified put without a known sha256 (server-side copy records it): {t7 - t6:.2f} s")
    print(f"put ratio {ver_put / plain_put:.3f}, get ratio {ver_get / plain_get:.3f}")
    print(f"ratio={ratio:.3f} peak_rss_mb={peak_mb:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
