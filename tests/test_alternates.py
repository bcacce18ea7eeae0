"""Documented alternates of the target (``alternates``): the params refuse one that would weaken a
constraint, show what one changes, and an approval that uses one carries its reason. The walk
through phase 03 (no capacity, the proposal, its approval, the canary on the alternate) is
tests/test_e2e_drills.py's capacity case."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EXIT_USAGE, ParamsError
from runbook_lib.evidence import approvals
from runbook_lib.evidence.manifest import write_record
from runbook_lib.evidence.rundir import RunDir
from runbook_lib.params import load_params, profile_differences, relaxed_constraints
from runbook_lib.phases import candidates, open_phase
from runbook_lib.providers.base import Plan

TARGET_OFFERS = [{"offer_id": "big", "vcpu": 2, "ram_gib": 8, "disk_gb": 40, "usd_per_hour": 0.35}]


def _alternate(**over: Any) -> dict[str, Any]:
    """A local alternate of params/demo.yaml's target: another machine, another price."""
    alt = {"name": "target-spare", "provider": "local", "release": "embed-endpoint v1 (spare machine)",
           "threads": 1, "batch_size": 16, "price_usd_per_hour": 0.33, "offers": TARGET_OFFERS,
           "offer": {"vcpu_min": 1, "ram_gib_min": 2, "max_usd_per_hour": 0.40}}
    return {**alt, **over}


def test_an_alternate_that_keeps_the_target_s_constraints_validates_and_says_what_it_changes(make_params) -> None:
    mig = load_params(make_params(alternates=[_alternate()]))
    [alt] = mig.alternates
    assert [c.name for c in mig.candidates] == ["target-local", "target-spare"]
    changes = profile_differences(mig.target, alt)
    # written out from params/demo.yaml's target and the alternate above, field by field
    assert "price_usd_per_hour: 0.29 -> 0.33" in changes
    assert "storage_usd_per_gb_month: 0.07 -> 0.0" in changes
    assert not any(c.startswith(("name:", "release:", "threads:", "batch_size:")) for c in changes)
    assert relaxed_constraints(mig.target, alt) == []


def test_the_phases_after_03_run_on_the_alternate_with_the_other_candidates_kept(make_params) -> None:
    mig = load_params(make_params(alternates=[_alternate(), _alternate(name="target-third")]))
    on = mig.with_target("target-third")
    assert on.target.name == "target-third" and on.source == mig.source
    assert [c.name for c in on.candidates] == ["target-third", "target-local", "target-spare"]
    assert mig.with_target("target-local") is mig
    with pytest.raises(ParamsError, match=r"no target or alternate is named 'elsewhere'.*target-local"):
        mig.with_target("elsewhere")


@pytest.mark.parametrize(("over", "said"), [
    ({"offer": {"vcpu_min": 0.5, "ram_gib_min": 2}}, "offer.vcpu_min 0.5 is below the target's 1"),
    ({"offer": {"vcpu_min": 1, "ram_gib_min": 1}}, "offer.ram_gib_min 1 is below the target's 2"),
    ({"dtype": "bfloat16"}, "dtype 'bfloat16' differs from the target's 'float32'"),
])
def test_an_alternate_that_would_weaken_a_constraint_is_refused_naming_it(make_params, over: dict[str, Any],
                                                                           said: str) -> None:
    with pytest.raises(ParamsError) as ei:
        load_params(make_params(alternates=[_alternate(**over)]))
    assert "alternates[0] (target-spare) relaxes the target's constraints" in str(ei.value)
    assert said in str(ei.value) and ei.value.exit_code == EXIT_USAGE


def test_alternates_need_their_own_names_and_a_profile_the_runbook_launches(make_params) -> None:
    with pytest.raises(ParamsError, match=r"the names \['target-local'\] are used more than once"):
        load_params(make_params(alternates=[_alternate(name="target-local")]))
    with pytest.raises(ParamsError, match=r"alternates\[0\] \(their-api\) is provider 'live'"):
        load_params(make_params(alternates=[{"name": "their-api", "provider": "live", "release": "x",
                                             "price_usd_per_hour": 0, "url": "http://127.0.0.1:9",
                                             "max_rate_per_s": 1}]))


def _proposal() -> Plan:
    return Plan(provider="alternates", action="use_alternate", spec=None, cost_usd_per_hour=0.39, dry_run=False,
                target="m: prove alternate runpod-community (runpod) in place of target vast-4090")


def test_an_approval_names_its_reason_and_a_control_character_in_it_is_refused(tmp_path: Path, capsys) -> None:
    run = tmp_path / "reports" / "20261206T000000Z-m-abcdef"
    run.mkdir(parents=True)
    (run / "params.yaml").write_text((Path(__file__).resolve().parent.parent / "params" / "demo.yaml").read_text())
    plan = _proposal()
    write_record(run, "03", status="completed",
                 data={"plans": [{"plan": plan.to_dict(), "applied": False, "method": "awaiting"}]})
    out = tmp_path / "approval.json"
    assert cli_main(["approve", str(run), "--by", "ops", "--reason", "no 4090 on Vast since 09:00", "-o", str(out)]) == 0
    body = json.loads(out.read_text())
    assert body["reason"] == "no 4090 on Vast since 09:00" and body["fingerprints"] == [plan.fingerprint]
    found = approvals.find(plan, run_dir=run, approval_file=str(out))
    assert found is not None and (found.approved_by, found.reason) == ("ops", "no 4090 on Vast since 09:00")
    assert cli_main(["approve", str(run), "--by", "ops", "--reason", "ok\x1b[2J", "-o", str(out)]) == EXIT_USAGE
    assert "--reason" in capsys.readouterr().err
    assert approvals.find(plan, run_dir=run, approval_file="") is None  # nothing recorded by looking


def test_an_alternate_is_used_only_under_an_approval_that_gives_a_reason(make_params, tmp_path: Path) -> None:
    params = make_params(alternates=[_alternate()])
    run = RunDir.create(params)
    for phase in ("01", "02"):
        write_record(run.path, phase, status="completed", data={})
    approval = tmp_path / "approval.json"
    ctx = open_phase("03", str(params), str(run.path), run_mode="headless", approval_ref=str(approval))
    plan = candidates.proposal(ctx, ctx.mig.alternates[0])
    assert plan.provider == "alternates" and "target-spare (local) in place of target target-local" in plan.target
    assert "price_usd_per_hour: 0.29 -> 0.33" in plan.target
    # a local plan, yet the params' pre-approval of local plans never covers it
    assert ctx.mig.approvals.preapproved_local and candidates.approved_with_reason(ctx, plan) is None
    click = approvals.record(run.path, approvals.Approval(plan.fingerprint, "ops", "2026-12-06T09:00:00Z", "widget"),
                             plan)  # an Approve click gives no reason: it does not count, nor hide a file that does
    assert candidates.approved_with_reason(ctx, plan) is None
    approval.write_text(json.dumps({"approved_by": "ops", "approved_at": "2026-12-06T10:00:00Z",
                                    "fingerprints": [plan.fingerprint]}))
    assert candidates.approved_with_reason(ctx, plan) is None  # approved, but without a reason
    approval.write_text(json.dumps({"approved_by": "ops", "approved_at": "2026-12-06T10:00:00Z",
                                    "reason": "the 1-CPU machines are all taken", "fingerprints": [plan.fingerprint]}))
    found = candidates.approved_with_reason(ctx, plan)
    assert found is not None and found.reason == "the 1-CPU machines are all taken"
    kept = json.loads(click.read_text())  # the click's record stands (evidence is only added to) beside the file's
    assert (kept["approval"]["method"], kept["approval"]["reason"]) == ("widget", "")
    assert [p.method for p in ctx.evidence.plans] == [f"file:{approval}; reason: the 1-CPU machines are all taken"]


def test_phase_03s_plan_cell_shows_an_alternate_an_earlier_try_proposed_for_one_click_with_a_reason(
        make_params, tmp_path: Path) -> None:
    params = make_params(alternates=[_alternate()])
    run = RunDir.create(params)
    for phase in ("01", "02"):
        write_record(run.path, phase, status="completed", data={})
    ctx = open_phase("03", str(params), str(run.path), run_mode="interactive")
    canary = Plan(provider="local", action="launch_pod", target="canary", spec=None, cost_usd_per_hour=0.33,
                  dry_run=False)
    assert candidates.awaiting(ctx, lambda alt: (canary,)) == []  # nothing proposed yet: the plan cell shows the canary
    proposed = candidates.proposal(ctx, ctx.mig.alternates[0])
    # an earlier try found no capacity and left the proposal waiting (`runbook approve` lists it too)
    (run.path / "approvals").mkdir(exist_ok=True)
    (run.path / "approvals" / f"pending-{proposed.fingerprint[:16]}.json").write_text(
        json.dumps({"plan": proposed.to_dict()}))
    shown = candidates.awaiting(ctx, lambda alt: (canary,) if alt.mig.target.name == "target-spare" else ())
    assert [(side, p.fingerprint) for side, p, _ in shown] == [("target", proposed.fingerprint),
                                                              ("target", canary.fingerprint)]
    assert shown[0][2].startswith("only if the target still has no capacity")
    panel = approvals.approval_widget([p for _, p, _ in shown], run_dir=run.path, interactive=True)
    panel.click(by="ops", reason="the 1-CPU machines are all taken")
    found = candidates.approved_with_reason(ctx, proposed)  # what phase 03's next cell looks for
    assert found is not None and (found.approved_by, found.method) == ("ops", "widget")
