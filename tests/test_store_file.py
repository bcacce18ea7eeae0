"""FileStore passes the store contract."""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.errors import StorageError
from runbook_lib.storage import FileStore

from .contract.store_contract import StoreContract


class TestFileStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> FileStore:
        return FileStore(tmp_path / "store")

    def corrupt(self, store: FileStore, key: str, data: bytes) -> None:
        (store.root / key).write_bytes(data)


def test_key_cannot_escape_root(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="escapes the store root"):
        FileStore(tmp_path / "s").put_bytes(b"x", "../evil")
