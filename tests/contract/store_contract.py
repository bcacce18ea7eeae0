"""The conformance suite every store passes. Subclasses supply the ``store`` fixture (an empty
store) and ``corrupt(store, key, data)``, which overwrites an object's bytes *without* updating
what the store recorded about it, as a faulty disk or a broken copy would."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.errors import StorageError
from runbook_lib.storage import ObjectInfo, Store


class StoreContract:
    """Tests shared by FileStore and S3Store."""

    def corrupt(self, store: Any, key: str, data: bytes) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _set(self, store: Store, prefix: str, run_id: str = "r1", n: int = 3) -> list[ObjectInfo]:
        objs = [store.put_bytes(b"shard-%d-" % i * 100, f"{prefix}/shard{i}") for i in range(n)]
        store.commit_set(prefix, objs, run_id=run_id)
        return objs

    def test_put_get_file_roundtrip_hash_matches_hashlib(self, store: Store, tmp_path: Path) -> None:
        data = bytes(range(256)) * 9000
        (tmp_path / "blob").write_bytes(data)
        info = store.put_file(tmp_path / "blob", "a/blob")
        assert info == ObjectInfo("a/blob", len(data), hashlib.sha256(data).hexdigest())
        assert store.head("a/blob") == info
        got = store.get_file("a/blob", tmp_path / "out", expect=info)
        assert got == info and (tmp_path / "out").read_bytes() == data
        assert store.list("a") == ["a/blob"] and store.head("a/nope") is None

    def test_known_sha256_is_checked_on_upload(self, store: Store, tmp_path: Path) -> None:
        data = b"checkpoint-bytes" * 1000
        (tmp_path / "ck").write_bytes(data)
        good = hashlib.sha256(data).hexdigest()
        assert store.put_file(tmp_path / "ck", "k/ck", sha256=good).sha256 == good
        assert store.head("k/ck").sha256 == good
        with pytest.raises(StorageError, match="changed after it was written"):
            store.put_file(tmp_path / "ck", "k/ck2", sha256="0" * 64)
        assert store.head("k/ck2") is None

    def test_truncated_download_is_refused_and_no_partial_left(self, store: Store, tmp_path: Path) -> None:
        info = store.put_bytes(b"x" * 1000, "k/obj")
        self.corrupt(store, "k/obj", b"x" * 10)
        with pytest.raises(StorageError, match=r"k/obj.*got 10 bytes"):
            store.get_file("k/obj", tmp_path / "out", expect=info)
        assert not (tmp_path / "out").exists()

    def test_set_roundtrip_and_fetch(self, store: Store, tmp_path: Path) -> None:
        objs = self._set(store, "ck")
        assert sorted(store.verify_set("ck", run_id="r1")) == ["shard0", "shard1", "shard2"]
        paths = store.fetch_set("ck", tmp_path / "dl")
        assert paths["shard1"].read_bytes() == b"shard-1-" * 100
        manifest = json.loads(store.get_bytes("ck/MANIFEST.json"))
        assert manifest["producer_run_id"] == "r1" and len(manifest["objects"]) == len(objs)

    def test_a_set_carries_what_moves_with_it_in_its_manifest(self, store: Store) -> None:
        objs = [store.put_bytes(b"w" * 10, "out/weights.bin")]
        about = {"run_id": "r1", "model": {"model_id": "m", "identity": {"weights_sha256": objs[0].sha256}},
                 "runtime": {"torch": "2.13.0"}, "configuration": {"params_sha256": "ab" * 32},
                 "validation": {"artifact_checksums": {"objects": 1, "all_match": True}}}
        store.commit_set("out", objs, run_id="r1", about=about)
        assert store.read_manifest("out", run_id="r1")["about"] == about
        store.commit_set("plain", [store.put_bytes(b"x", "plain/x")], run_id="r1")
        assert "about" not in store.read_manifest("plain", run_id="r1")

    def test_missing_marker_means_incomplete(self, store: Store) -> None:
        store.put_bytes(b"a", "up/shard0")
        with pytest.raises(StorageError, match="no completion marker"):
            store.verify_set("up")

    def test_missing_shard_is_named(self, store: Store) -> None:
        self._set(store, "ck")
        store.delete("ck/shard1")
        store.delete("ck/shard1")  # idempotent
        with pytest.raises(StorageError, match=r"ck/shard1 is listed in the manifest but missing"):
            store.verify_set("ck")

    def test_wrong_size_in_manifest_is_refused(self, store: Store) -> None:
        objs = self._set(store, "ck")
        bad = [ObjectInfo(o.key, o.size_bytes + (1 if i == 2 else 0), o.sha256) for i, o in enumerate(objs)]
        store.commit_set("ck", bad, run_id="r1")
        with pytest.raises(StorageError, match=r"ck/shard2: got 800 bytes .* expected 801 bytes"):
            store.verify_set("ck")

    def test_corrupted_shard_is_caught_on_fetch(self, store: Store, tmp_path: Path) -> None:
        self._set(store, "ck")
        self.corrupt(store, "ck/shard0", b"SHARD-0-" * 100)  # same size, other bytes
        with pytest.raises(StorageError, match=r"ck/shard0"):
            store.fetch_set("ck", tmp_path / "dl")

    def test_stale_marker_from_earlier_run(self, store: Store) -> None:
        self._set(store, "ck", run_id="old-run")
        with pytest.raises(StorageError, match=r"stale marker"):
            store.verify_set("ck", run_id="new-run")

    def test_newest_verified_checkpoint_skips_zero_byte_and_incomplete(self, store: Store) -> None:
        self._set(store, "ckpt/step-000010")
        self._set(store, "ckpt/step-000020")
        zero = store.put_bytes(b"", "ckpt/step-000030/shard0")
        store.commit_set("ckpt/step-000030", [ObjectInfo(zero.key, 800, "0" * 64)], run_id="r1")  # truncated to 0
        store.put_bytes(b"partial", "ckpt/step-000040/shard0")                                      # no marker
        newest, rejected = store.newest_verified_set("ckpt")
        assert newest == "ckpt/step-000020"
        assert [r["prefix"] for r in rejected] == ["ckpt/step-000040", "ckpt/step-000030"]
        assert "no completion marker" in rejected[0]["reason"] and "0 bytes" in rejected[1]["reason"]

    def test_interrupted_upload_then_retry(self, store: Store, tmp_path: Path) -> None:
        store.put_bytes(b"first-attempt", "job/shard0")  # the producer died here: no manifest, no marker
        with pytest.raises(StorageError, match="no completion marker"):
            store.verify_set("job")
        objs = [store.put_bytes(b"retry-%d" % i, f"job/shard{i}") for i in range(2)]  # the retry overwrites
        store.commit_set("job", objs, run_id="r2")
        assert sorted(store.verify_set("job", run_id="r2")) == ["shard0", "shard1"]
        assert store.fetch_set("job", tmp_path / "dl")["shard0"].read_bytes() == b"retry-0"

    def test_delete_prefix_is_idempotent(self, store: Store) -> None:
        self._set(store, "gone")
        store.delete_prefix("gone")
        store.delete_prefix("gone")
        assert store.list("gone") == []
