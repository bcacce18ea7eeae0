"""Phase 06's reconciliation after a rollback (``decide.reconcile``), each ``cutover.on_rollback``
rule against a real file store holding the checkpoint sets a target wrote during its slices. The
whole-run case (tests/test_e2e.py, copy_back) proves the path end to end; the branches are here."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runbook_lib.evidence.manifest import jsonable, read_chain, write_record
from runbook_lib.evidence.records import Chain
from runbook_lib.params import load_params
from runbook_lib.phases.context import PhaseContext
from runbook_lib.phases.decide import reconcile
from runbook_lib.storage import open_store

from .conftest import ROOT

RUN_ID = "20261202T000000Z-reconcile"


class _Evidence:
    """The phase's evidence writer: JSON files under the run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def write_json(self, rel: str, data: Any) -> Path:
        p = self.run_dir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(data, default=jsonable))
        return p


def _context(tmp_path: Path, rule: str, *, phase05: str = "completed") -> SimpleNamespace:
    """A phase 06 context over a file store with the frozen set and one committed set per slice."""
    store = open_store(f"file://{tmp_path / 'store'}")
    prefix = f"runs/{RUN_ID}"

    def commit(where: str, payload: bytes) -> str:
        (tmp_path / "blob").write_bytes(payload)
        info = store.put_file(tmp_path / "blob", f"{where}/checkpoint.pt")
        store.commit_set(where, [info], run_id=RUN_ID)
        return where

    frozen = commit(f"{prefix}/source/frozen", b"frozen weights")
    steps = [{"step": i, "checkpoint_prefix": commit(f"{prefix}/cutover/{i}/checkpoint", f"slice {i}".encode())}
             for i in range(3)]
    mig = load_params(ROOT / "params" / "demo-train.yaml")
    mig = mig.model_copy(update={"cutover": mig.cutover.model_copy(update={"on_rollback": rule})})
    run = tmp_path / "run"
    run.mkdir()
    write_record(run, "01", status="completed", data={"freeze": {"frozen": {"prefix": frozen,
                                                                            "manifest_sha256": "0" * 64}}})
    write_record(run, "05", status=phase05, data={"cutover": {"steps": steps}})
    records = Chain({r.phase: r for r in read_chain(run)})
    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params" / "demo-train.yaml").read_text())
    ctx = SimpleNamespace(records=records, mig=mig, store=store, run_id=RUN_ID, run_dir=tmp_path / "run",
                          run=SimpleNamespace(params_path=params), evidence=_Evidence(tmp_path / "run"),
                          store_prefix=lambda *p: "/".join((prefix, *p)))
    ctx.set_about = lambda *a, **k: PhaseContext.set_about(ctx, *a, **k)  # type: ignore[arg-type]
    return ctx


def test_discard_lists_every_set_then_deletes_it_and_keeps_the_rollback_point(tmp_path: Path) -> None:
    ctx = _context(tmp_path, "discard")
    res = reconcile(ctx, "NO-GO")
    out = res.model_dump(mode="json") if res is not None else None
    assert out is not None and out["rule"] == "discard" and out["copied_to"] is None
    assert [w["prefix"].rsplit("/", 2)[-2] for w in out["writes"]] == ["0", "1", "2"]  # listed before deleting
    assert all(w["verified"] and len(next(iter(w["objects"].values()))) == 64 for w in out["writes"])
    assert all(ctx.store.list(w["prefix"]) == [] for w in out["writes"])  # gone from the store
    frozen = ctx.records.need_freeze().frozen().prefix
    assert ctx.store.verify_set(frozen, run_id=RUN_ID)  # the rollback point is untouched
    assert "deleted the 3 set(s)" in out["action"] and frozen in out["action"]
    assert json.loads((ctx.run_dir / "06" / "reconciliation.json").read_text()) == out


def test_keep_lists_every_set_and_leaves_it_in_place(tmp_path: Path) -> None:
    ctx = _context(tmp_path, "keep")
    res = reconcile(ctx, "HOLD")
    out = res.model_dump(mode="json") if res is not None else None
    assert out is not None and out["copied_to"] is None and len(out["writes"]) == 3
    assert all(ctx.store.verify_set(w["prefix"], run_id=RUN_ID) for w in out["writes"])
    assert out["action"].startswith("kept the 3 set(s)")


@pytest.mark.parametrize(("decision", "phase05"), [("GO", "completed"), ("NO-GO", "failed")])
def test_nothing_to_reconcile_on_go_or_without_a_completed_cutover(tmp_path: Path, decision: str,
                                                                   phase05: str) -> None:
    ctx = _context(tmp_path, "discard", phase05=phase05)
    assert reconcile(ctx, decision) is None
    sets = [f"runs/{RUN_ID}/cutover/{i}/checkpoint" for i in range(3)]
    assert all(ctx.store.list(prefix) for prefix in sets)


def test_copy_back_copies_the_newest_verified_set_with_what_moves_with_it(tmp_path: Path) -> None:
    ctx = _context(tmp_path, "copy_back")
    res = reconcile(ctx, "NO-GO")
    out = res.model_dump(mode="json") if res is not None else None
    assert out is not None and out["copied_to"] == f"runs/{RUN_ID}/reconciled"
    held = ctx.store.verify_set(out["copied_to"], run_id=RUN_ID)
    assert held["checkpoint.pt"].sha256 == out["writes"][-1]["objects"]["checkpoint.pt"]  # the newest slice's set
    about = ctx.store.read_manifest(out["copied_to"], run_id=RUN_ID)["about"]
    assert (about["run_id"], about["mode"]) == (RUN_ID, "reconciled")
    assert about["validation"]["copied_from"] == f"runs/{RUN_ID}/cutover/2/checkpoint"
    assert about["model"]["model_id"] == ctx.mig.workload.model_id and about["configuration"]["params_sha256"]
