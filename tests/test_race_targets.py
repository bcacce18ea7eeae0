"""Several candidate targets in one run (``targets``, issue 50): the params' form and its refusals,
a candidate's own place in the run's files and store, phase 02's gate over every candidate, and
the race's price of an accepted unit. The race measured end to end is tests/test_e2e_race.py's."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from runbook_lib.errors import ParamsError
from runbook_lib.evidence.records import AlternateMap, DependencyRow, RaceEntry, RaceRecord
from runbook_lib.evidence.rundir import RunDir
from runbook_lib.params import load_params
from runbook_lib.phases.compare.racing import lane_costs, lane_usd_per_hour
from runbook_lib.phases.evidence import Evidence
from runbook_lib.phases.mapping import raced_dependency_gate

OFFERS = [{"offer_id": "one", "vcpu": 2, "ram_gib": 8, "disk_gb": 40, "usd_per_hour": 0.29}]
SHOOTOUT = Path(__file__).resolve().parents[1] / "params" / "demo-shootout.yaml"


def _candidate(name: str, **over: Any) -> dict[str, Any]:
    """A local candidate like params/demo.yaml's target, under its own name."""
    return {"name": name, "provider": "local", "release": f"embed-endpoint v1 ({name})", "threads": 1,
            "batch_size": 16, "price_usd_per_hour": 0.29, "offers": OFFERS,
            "offer": {"vcpu_min": 1, "ram_gib_min": 2, "max_usd_per_hour": 0.40}, **over}


def _raced(make_params: Any, targets: list[dict[str, Any]], **over: Any) -> Path:
    """params/demo.yaml with ``targets`` in place of its one target."""
    return make_params(targets=targets, target=None, **over)


def test_targets_name_the_candidates_and_the_first_is_the_target(make_params) -> None:
    mig = load_params(_raced(make_params, [_candidate("cand-a"), _candidate("cand-b", price_usd_per_hour=0.5)]))
    assert mig.racing and mig.target.name == "cand-a" and [c.name for c in mig.candidates] == ["cand-a", "cand-b"]
    assert mig.race.objective == "cost_per_accepted_unit"
    on = mig.with_target("cand-b")  # the race's pick: the other candidates stay in targets
    assert on.target.name == "cand-b" and on.target.price_usd_per_hour == 0.5 and on.racing
    shootout = load_params(SHOOTOUT)
    assert [c.name for c in shootout.targets] == ["target-best", "target-pricey", "target-slow"]
    assert shootout.targets[2].fault == "slow_worker" and shootout.targets[1].price_usd_per_hour == 0.58
    single = load_params(make_params())
    assert not single.racing and single.targets == () and [c.name for c in single.candidates] == ["target-local"]


@pytest.mark.parametrize(("targets", "over", "said"), [
    ([_candidate("cand-a")], {}, "targets lists 1 candidate; a race needs two or more"),
    ([_candidate("cand-a"), _candidate("cand-a")], {}, r"the names \['cand-a'\] are used more than once"),
    ([_candidate("cand-a"), _candidate("source-local")], {}, r"the names \['source-local'\]"),
    ([_candidate("cand-a"), _candidate("cand-b")], {"gates": {"method": "fixed", "latency_p95_ratio_max": 2.0}},
     "set gates.method: sequential"),
    ([_candidate("cand-a"), _candidate("cand-b", offer={"vcpu_min": 0.5, "ram_gib_min": 2})], {},
     r"targets\[1\] \(cand-b\) relaxes the first candidate's constraints: offer.vcpu_min 0.5 is below"),
    ([_candidate("cand-a"), _candidate("cand-b")], {"alternates": [_candidate("cand-c")]},
     "List the alternates as targets instead"),
])
def test_a_race_the_runbook_cannot_run_is_refused_naming_why(make_params, targets, over, said) -> None:
    with pytest.raises(ParamsError, match=said):
        load_params(_raced(make_params, targets, **over))


def test_both_forms_at_once_and_a_race_block_without_targets_are_refused(make_params) -> None:
    with pytest.raises(ParamsError, match="target: and targets: are both given and target is not targets"):
        load_params(make_params(targets=[_candidate("cand-a"), _candidate("cand-b")]))
    with pytest.raises(ParamsError, match="race: is read only with targets:"):
        load_params(make_params(race={"objective": "throughput"}))


def test_a_raced_candidates_files_go_under_its_own_directory_and_approvals_stay_shared(tmp_path: Path) -> None:
    run = RunDir(path=tmp_path, project=tmp_path, params_path=tmp_path / "m.yaml", mig=None)  # type: ignore[arg-type]
    ev = Evidence(run)
    mine = ev.scoped("03/candidates/cand-b")
    assert mine.where("03/canary/outputs.npy") == "03/candidates/cand-b/canary/outputs.npy"
    assert mine.where("approvals/abc.json") == "approvals/abc.json"  # not in the phase's directory
    assert mine.where("030/x") == "030/x" and ev.where("03/canary/x") == "03/canary/x"
    mine.write_json("03/canary_record.json", {"ok": True})
    assert (tmp_path / "03" / "candidates" / "cand-b" / "canary_record.json").exists()
    assert ev.files == ["03/candidates/cand-b/canary_record.json"]  # one record hashes both


def _rows(status: str) -> tuple[DependencyRow, ...]:
    return (DependencyRow(dependency="ports", source="8000/http", target="8000/http", status=status, reason="r"),)


def test_phase_02_fails_a_race_only_when_every_candidate_has_a_dependency_without_an_equivalent() -> None:
    blocked = AlternateMap(name="cand-b", dependency_map=_rows("no equivalent"), blocked=True)
    fine = AlternateMap(name="cand-c", dependency_map=_rows("equivalent"))
    one_out = raced_dependency_gate("cand-a", _rows("equivalent"), [blocked, fine])
    assert one_out.verdict == "PASS" and one_out.blocking and one_out.observed == 1 and one_out.threshold == 2
    assert "2 of 3 candidates" in one_out.detail and "cand-b out: no target equivalent for ['ports']" in one_out.detail
    all_out = raced_dependency_gate("cand-a", _rows("no equivalent"), [blocked])
    assert all_out.verdict == "FAIL" and all_out.observed == 2


def test_a_round_is_priced_at_the_lanes_measured_capacity_over_its_accepted_share(make_params) -> None:
    samples = pd.DataFrame({"round": [0, 0, 0, 0, 2, 2, 4], "accepted": [True, True, True, False, True, True, False]})
    throughput = pd.DataFrame({"round": [4, 0, 2, 6], "throughput_units_per_s": [10.0, 20.0, 40.0, 0.0]})
    # by hand: 0.72 USD/h is 0.0002 USD/s; round 0 serves 20/s with 3 of 4 accepted, round 2 40/s all
    # accepted, round 4 nothing accepted, round 6 no burst and no requests
    assert lane_costs(samples, throughput, 0.72) == pytest.approx([0.0002 / 20 / 0.75, 0.0002 / 40, math.inf])
    mig = load_params(SHOOTOUT)
    # demo-shootout.yaml: 0.58 USD/h, one worker, 1 GB at 0.07 USD per GB-month over 730 hours
    assert lane_usd_per_hour(mig, "target-pricey") == pytest.approx(0.58 + 0.07 / 730)
    assert lane_usd_per_hour(mig, "source") == pytest.approx(0.44 + 0.10 / 730)


def test_the_run_goes_on_with_the_pick_or_the_best_undecided_candidate() -> None:
    def entry(name: str, ratio: float | None, fate: str) -> RaceEntry:
        return RaceEntry(name=name, objective_ratio=ratio, fate=fate)

    picked = RaceRecord(objective="cost_per_accepted_unit", pick="b", entries=(entry("a", 0.5, "eliminated"),
                                                                                entry("b", 0.9, "picked")))
    assert picked.goes_on() == "b"
    held = RaceRecord(objective="cost_per_accepted_unit", undecided=("a", "b"),
                      entries=(entry("a", 0.8, "undecided"), entry("b", 0.7, "undecided"), entry("c", 0.1, "eliminated")))
    assert held.goes_on() == "b"  # the lower cost among the undecided, never the eliminated one
    assert held.model_copy(update={"objective": "throughput"}).goes_on() == "a"
    assert RaceRecord(objective="latency_p95").goes_on() == ""
