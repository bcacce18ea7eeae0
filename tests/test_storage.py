"""File store: streamed sha256, sets with manifest then marker, and refusals that name the object."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from runbook_lib.errors import StorageError
from runbook_lib.storage import FileStore, ObjectInfo


def test_put_get_roundtrip_hash_matches_hashlib(tmp_path: Path) -> None:
    src = tmp_path / "blob"
    data = bytes(range(256)) * 9000
    src.write_bytes(data)
    store = FileStore(tmp_path / "store")
    info = store.put_file(src, "a/blob")
    assert info == ObjectInfo("a/blob", len(data), hashlib.sha256(data).hexdigest())
    got = store.get_file("a/blob", tmp_path / "out", expect=info)
    assert got == info and (tmp_path / "out").read_bytes() == data


def test_truncated_object_is_refused_and_no_partial_left(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    info = store.put_bytes(b"x" * 1000, "k")
    (store.root / "k").write_bytes(b"x" * 10)
    with pytest.raises(StorageError, match="got 10 bytes"):
        store.get_file("k", tmp_path / "out", expect=info)
    assert not (tmp_path / "out").exists()


def test_set_needs_marker_and_matching_objects(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    objs = [store.put_bytes(b"shard-%d" % i, f"ck/shard{i}") for i in range(3)]
    with pytest.raises(StorageError, match="no completion marker"):
        store.verify_set("ck")
    store.commit_set("ck", objs, run_id="r1")
    assert sorted(store.verify_set("ck")) == ["shard0", "shard1", "shard2"]
    manifest = json.loads((store.root / "ck" / "MANIFEST.json").read_text())
    assert manifest["producer_run_id"] == "r1"
    (store.root / "ck" / "shard1").write_bytes(b"shard-X")
    with pytest.raises(StorageError, match="ck/shard1"):
        store.verify_set("ck")
    (store.root / "ck" / "shard1").unlink()
    with pytest.raises(StorageError, match="shard1 does not exist"):
        store.verify_set("ck")


def test_key_cannot_escape_root(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="escapes the store root"):
        FileStore(tmp_path / "s").put_bytes(b"x", "../evil")
