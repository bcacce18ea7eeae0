"""``runbook verify --recompute``: every gate verdict of a run derived again from its evidence
alone (raw samples, params, records; no kernel, no provider, no network), compared with the
receipt.

How each gate is derived again (docs/how-to/sign-and-verify.md's table says the same):

* phase 04's measurement gates (latency, throughput, cold start, errors, cost, capacity, SLO,
  noise floor, shift, baseline health, spend limit) from the raw tables
  (:func:`runbook_lib.phases.compare.raw.load_measurement`) by the very functions phase 04 used
  (:func:`runbook_lib.phases.compare.judge.judge`);
* phase 04's fault drills from the rows of ``04/drills.json`` (expectation, observation and
  verdict as recorded), their blocking from params ``drills.blocking``;
* phase 03's artifact checksum from the canary's recorded checksum rows, and its output parity
  from ``01/golden_outputs.npy`` and ``03/canary/outputs.npy`` with the params' tolerances; a
  service's ``service_parity`` from ``01/service_golden.json`` and ``03/canary_answers.json`` under
  its protocol's comparator; in a race, each candidate's (``<gate>[<name>]``) from its own
  ``03/candidates/<name>/``;
* yes/no checks (teardown listing, canary destroyed, reload, ...) from their recorded
  observation (``True`` is PASS, ``False`` FAIL, none INCONCLUSIVE);
* every other gate is compared with the record of the phase that judged it (the hash-chained
  record, which ``runbook verify`` checks), since its inputs are outputs of live resources;
* the decision from all of them by :func:`runbook_lib.gates.decide`.

The comparison covers verdict, blocking, observed value and interval (floats to a relative
1e-9; the same code on the same bytes gives the same floats). A run made by an earlier
``runbook_lib`` (the manifest's ``code.runbook_lib``) is derived again by today's rules: a
difference that a rule change since that version makes, in exactly the fields that change
touches (:data:`RULE_CHANGES`), is shown as that change, not as a difference.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runbook_lib import gates as g
from runbook_lib.errors import EvidenceError, RunbookError
from runbook_lib.evidence.records import (
    CompareData,
    ParityData,
    PhaseData,
    RaceRecord,
    Receipt,
    load_manifest,
    load_receipt,
    read_unchecked,
)
from runbook_lib.layout import (
    CANARY_INFERENCE_OUTPUTS,
    CANARY_OUTPUTS,
    GOLDEN_INFERENCE_OUTPUTS,
    GOLDEN_OUTPUTS,
    KEPT_PARAMS,
)
from runbook_lib.params import LiveProfile, load_params
from runbook_lib.phases import service as service_phase
from runbook_lib.phases.candidates import CANARY_RECORD
from runbook_lib.phases.compare import race_gate
from runbook_lib.phases.compare.judge import costs_at_traffic, judge, window_costs
from runbook_lib.phases.compare.racing import race_from_files
from runbook_lib.phases.compare.raw import load_measurement
from runbook_lib.phases.evidence import scoped_path
from runbook_lib.providers.offers import version_tuple

FROM_RAW = "raw samples"
FROM_DRILLS = "recorded drill rows"
FROM_OBSERVATION = "recorded observation"
FROM_RECORD = "phase record"
REL_TOL = 1e-9

Derived = dict[tuple[str, str], tuple[str, dict[str, Any] | None, str]]
"""Gates derived again, by ``(phase, name)``: the basis, the compared fields (None when they
could not be derived) and why not."""


@dataclass(frozen=True)
class RuleChange:
    """A change to how a gate is judged, as :func:`recompute_run` explains it on older runs.

    Attributes:
        version: the ``runbook_lib`` version that brought it; runs made before it may differ.
        gate: the gate whose recomputation it changes.
        fields: the only fields it changes (:func:`_fields`' keys); a difference in any other
            field is a difference.
        what: the change, in words, with where it is documented.
    """

    version: str
    gate: str
    fields: tuple[str, ...]
    what: str


RULE_CHANGES = (
    RuleChange("0.2.0", "noise_floor", ("blocking",),
               "a training job's A/A control blocks whenever gates.latency_p95_ratio_max is set, as a service's "
               "does (issue 51; docs/explanation/statistics.md, the noise floor)"),
)
"""Rule changes since 0.1.0, by the version that made them."""


@dataclass(frozen=True)
class Recomputed:
    """One gate (or the decision) derived again and compared with the receipt.

    Attributes:
        phase, gate: which gate (``gate`` is ``decision`` for the run's decision).
        basis: what it was derived from (:data:`FROM_RAW`, :data:`FROM_DRILLS`, ...).
        recorded: the receipt's verdict, blocking, observed and interval (None when absent).
        recomputed: the same fields derived again (None when it could not be).
        differences: the fields that differ, as ``"field: recorded -> recomputed"``; empty when same.
        rule_change: when every difference is one a :class:`RuleChange` since the run's version
            makes, that change in words; else "".
    """

    phase: str
    gate: str
    basis: str
    recorded: dict[str, Any] | None
    recomputed: dict[str, Any] | None
    differences: tuple[str, ...]
    rule_change: str = ""

    @property
    def same(self) -> bool:
        return not self.differences


def _fields(d: dict[str, Any]) -> dict[str, Any]:
    return {"verdict": d.get("verdict"), "blocking": d.get("blocking"), "observed": d.get("observed"),
            "interval": list(d["interval"]) if d.get("interval") is not None else None}


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a == b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _compare(phase: str, gate: str, basis: str, recorded: dict[str, Any] | None,
             recomputed: dict[str, Any] | None) -> Recomputed:
    if recorded is None or recomputed is None:
        why = "not in the receipt" if recorded is None else "could not be derived again"
        return Recomputed(phase, gate, basis, recorded, recomputed, (why,))
    diffs = tuple(f"{k}: {recorded.get(k)!r} -> {recomputed.get(k)!r}" for k in recomputed
                  if not _close(recorded.get(k), recomputed.get(k)))
    return Recomputed(phase, gate, basis, recorded, recomputed, diffs)


def explained(row: Recomputed, made_by: str | None) -> Recomputed:
    """``row`` with its :attr:`Recomputed.rule_change` set when the run was made by a
    ``runbook_lib`` older than a :data:`RULE_CHANGES` entry for its gate and every differing field
    is one that change touches. ``made_by``: the manifest's ``code.runbook_lib`` (None: unknown,
    nothing is explained)."""
    if not row.differences or made_by is None or row.recorded is None or row.recomputed is None:
        return row
    fields = {k for k in row.recomputed if not _close(row.recorded.get(k), row.recomputed.get(k))}
    for change in RULE_CHANGES:
        if change.gate == row.gate and version_tuple(made_by) < version_tuple(change.version) \
                and fields <= set(change.fields):
            return replace(row, rule_change=f"runbook_lib {change.version} (this run: {made_by}): {change.what}")
    return row


def _boolean(d: dict[str, Any]) -> dict[str, Any]:
    obs = d.get("observed")
    verdict = "INCONCLUSIVE" if obs is None else ("PASS" if obs == "True" else "FAIL")
    return {**_fields(d), "verdict": verdict}


def recompute_run(run_dir: str | Path) -> list[Recomputed]:
    """Derive every gate of a run again and compare each with ``receipt.json`` (module docstring).

    Args:
        run_dir: ``reports/<run_id>``, sealed or not, intact or not.

    Returns:
        One :class:`Recomputed` per gate in the receipt or derived again, then one for the
        decision. A gate that cannot be derived again (a raw file missing or unreadable) is a row
        with ``recomputed`` None and the reason in ``differences``.

    Raises:
        EvidenceError: the run has no receipt or no kept params (nothing to compare with).
    """
    run_dir = Path(run_dir)
    receipt = load_receipt(run_dir)
    if receipt is None or not (run_dir / KEPT_PARAMS).exists():
        raise EvidenceError(f"{run_dir} has no receipt.json or {KEPT_PARAMS}: there is no decision to recompute; "
                            "run phase 06 first")
    records = read_unchecked(run_dir)
    parity = records.parity
    mig = load_params(run_dir / KEPT_PARAMS)
    race = records.compare.race if records.compare is not None else None
    if (race.goes_on() if race is not None else "") or (parity is not None and parity.target):
        mig = mig.with_target((race.goes_on() if race is not None else "") or parity.target)  # type: ignore[union-attr]
    recorded = {(x.phase, x.name): x.to_dict() for x in receipt.gates}
    in_records = {(x.phase, x.name): x.to_dict() for x in records.gates()}
    derived: Derived = {}

    d04 = records.data("04")
    if d04 is not None:
        try:
            derived.update({("04", x.name): (FROM_RAW, _fields(x.to_dict()), "") for x in _measurement_gates(
                mig, run_dir, d04)})
        except (RunbookError, OSError, KeyError, ValueError) as exc:
            for key in recorded:
                if key[0] == "04" and not key[1].startswith("drill_"):
                    derived[key] = (FROM_RAW, None, f"{type(exc).__name__}: {exc}")
        if race is not None and race.entries:  # every elimination and the pick, from the race's own samples
            derived[("04", "race_pick")] = _race_again(mig, run_dir, race)
        blocking = set(mig.drills.blocking)
        for drill in (records.compare.drills if records.compare else ()):
            derived[("04", f"drill_{drill.drill}")] = (FROM_DRILLS, {
                "verdict": drill.verdict, "blocking": drill.drill in blocking, "observed": drill.observation,
                "interval": None}, "")
    if "03" in records:
        derived.update(_race_phase_03(mig, run_dir, records) if mig.racing else _from_phase_03(mig, run_dir, records))
    r01 = records.freeze
    if r01 is not None and r01.freeze.service is not None and r01.freeze.service.live is not None \
            and isinstance(mig.source, LiveProfile):  # the record says the source was live: nothing launched
        for x in service_phase.live_gates(mig.source, "01"):
            derived[("01", x.name)] = (FROM_OBSERVATION, _fields(x.to_dict()), "")
    for key, d in recorded.items():
        if key in derived:
            continue
        if d.get("unit") == "bool":
            derived[key] = (FROM_OBSERVATION, _boolean(d), "")
        else:
            rec = in_records.get(key)
            derived[key] = (FROM_RECORD, _fields(rec) if rec is not None else None,
                            "" if rec is not None else "no phase record holds this gate")

    rows, made_by = [], _made_by(run_dir)  # a rule change since the version that sealed it explains a difference
    for key in sorted(set(recorded) | set(derived)):
        basis, fields, why = derived.get(key, (FROM_RECORD, None, "not derived"))
        row = _compare(key[0], key[1], basis, _fields(recorded[key]) if key in recorded else None, fields)
        if why and fields is None:
            row = Recomputed(row.phase, row.gate, basis, row.recorded, None, (why,))
        rows.append(explained(row, made_by))
    decided = _decision(receipt, recorded, {k: v[1] for k, v in derived.items()})
    rows.append(decided)
    sealed = _sealed_decision(run_dir, str((decided.recomputed or {}).get("verdict")))
    return rows + ([sealed] if sealed is not None else [])


def _from_phase_03(mig: Any, run_dir: Path, records: Any, *, parity: ParityData | None = None,
                   scope: str = "") -> Derived:
    """Phase 03's gates derived again from the files: a service's parity from the golden and the
    canary's answers; otherwise the checksum and output parity gates (:func:`_parity_gates`),
    unless phase 03 proved no candidate (every one without capacity: no canary ran to judge).
    ``parity`` and ``scope``: a raced candidate's own record data and directory
    (``03/candidates/<name>``), where its canary's files are; by default the run's."""
    parity = parity if scope else records.parity
    if mig.workload.kind == "service":
        freeze = records.freeze
        divergent = freeze.freeze.service.self_divergent if freeze and freeze.freeze.service else ()
        try:
            x = service_phase.parity_from_files(mig, run_dir, divergent, scope=scope)
            return {("03", x.name): (FROM_OBSERVATION, _fields(x.to_dict()), "")}
        except EvidenceError as exc:
            return {("03", "service_parity"): (FROM_OBSERVATION, None, str(exc))}
    if parity is not None and parity.result is None and parity.candidates:
        return {}
    return {("03", x.name): (FROM_OBSERVATION, _fields(x.to_dict()), "")
            for x in _parity_gates(mig, run_dir, parity, scope=scope)}


def _race_phase_03(mig: Any, run_dir: Path, records: Any) -> Derived:
    """A race's phase 03 gates (``<gate>[<name>]``, :func:`runbook_lib.phases.candidates.prove_each`)
    derived again per candidate from its own directory (``03/candidates/<name>/``: its canary's
    files and its record data, :data:`~runbook_lib.phases.candidates.CANARY_RECORD`), under its own
    profile. A gate blocks as recorded for a candidate phase 03 proved and never for one it put out
    (``failed``); a candidate without a canary (no capacity, blocked) has no such files, and its
    gates are compared with the record. ``race_candidates`` is compared with the record."""
    out: Derived = {}
    parity = records.parity
    for fate in (parity.candidates if parity is not None else ()):
        scope = f"03/candidates/{fate.name}"
        kept = run_dir / scoped_path(scope, CANARY_RECORD)
        if fate.outcome not in ("proved", "failed") or not kept.exists():
            continue
        try:
            # by alias, as phase records are written; by name, as runs before 2026-12-08 wrote it
            own = ParityData.model_validate_json(kept.read_text(), by_alias=True, by_name=True)
        except (OSError, ValueError) as exc:
            raise EvidenceError(f"{kept}: candidate {fate.name}'s phase 03 record cannot be read ({exc}); "
                                "run `runbook verify` on the run") from exc
        for (phase, name), (basis, fields, why) in _from_phase_03(
                mig.with_target(fate.name), run_dir, records, parity=own, scope=scope).items():
            if fields is not None:
                fields = {**fields, "blocking": bool(fields["blocking"]) and fate.outcome == "proved"}
            out[(phase, f"{name}[{fate.name}]")] = (basis, fields, why)
    return out


def _race_again(mig: Any, run_dir: Path, race: RaceRecord) -> tuple[str, dict[str, Any] | None, str]:
    """Phase 04's ``race_pick`` gate derived again from the race's samples and the params' prices
    (:func:`runbook_lib.phases.compare.racing.race_from_files`): every elimination and the pick."""
    try:
        again = race_gate(race_from_files(mig, run_dir, [e.name for e in race.entries], final=race.final))
    except (RunbookError, OSError, KeyError, ValueError) as exc:
        return FROM_RAW, None, f"{type(exc).__name__}: {exc}"
    return FROM_RAW, _fields(again.to_dict()), ""


def _measurement_gates(mig: Any, run_dir: Path, data: PhaseData) -> list[g.GateResult]:
    if not isinstance(data, CompareData):
        raise EvidenceError(f"phase 04's record in {run_dir} is not a completed measurement; nothing to recompute")
    res = load_measurement(run_dir, data)
    return judge(mig, res, window_costs(mig, res), costs_at_traffic(mig, res))


def _parity_gates(mig: Any, run_dir: Path, data: ParityData | None, *, scope: str = "") -> list[g.GateResult]:
    """Phase 03's checksum gate from the canary's recorded checksum rows, and its output parity
    (and a checkpoint entry point's inference parity) from the golden outputs phase 01 saved and
    the outputs the canary returned (both files in the run; a raced candidate's canary's under its
    ``scope``), with the params' tolerances."""
    import numpy as np

    checks = data.result.artifact_checksums if data is not None and data.result is not None else []

    def load(rel: str) -> np.ndarray | None:
        path = run_dir / scoped_path(scope, rel)
        return np.load(path) if path.exists() else None

    return g.artifact_parity(checks, load(GOLDEN_OUTPUTS), load(CANARY_OUTPUTS), load(GOLDEN_INFERENCE_OUTPUTS),
                             load(CANARY_INFERENCE_OUTPUTS), dtype=mig.source.dtype, rtol=mig.gates.parity_rtol,
                             atol=mig.gates.parity_atol, entry_point=mig.workload.entry_point)


def _decision(receipt: Receipt, recorded: dict[tuple[str, str], dict[str, Any]],
              derived: dict[tuple[str, str], dict[str, Any] | None]) -> Recomputed:
    """The decision from the gates as derived again (a gate that could not be is taken as ERROR)."""
    results = []
    for key, d in recorded.items():
        f = derived.get(key)
        results.append(g.from_dict({**d, "verdict": f["verdict"] if f else "ERROR",
                                    "blocking": f["blocking"] if f else d.get("blocking", True)}))
    for key, f in derived.items():
        if key not in recorded and f is not None:
            results.append(g.GateResult(key[1], f["verdict"], bool(f["blocking"]), None, None, "", "", "",
                                        phase=key[0]))
    decision, _ = g.decide(results)
    was = receipt.decision
    return Recomputed("06", "decision", "every gate above", {"verdict": was}, {"verdict": decision},
                      () if was == decision else (f"verdict: {was!r} -> {decision!r}",))


def _made_by(run_dir: Path) -> str | None:
    """The ``runbook_lib`` version that sealed the run (``manifest.json``'s ``code.runbook_lib``);
    None when the manifest cannot be read or names none."""
    try:
        manifest = load_manifest(run_dir)
    except EvidenceError:
        return None
    return manifest.code.runbook_lib or None if manifest is not None and manifest.code is not None else None


SEALED_AS = re.compile(r"(?:FAILED \(decision )?(GO|NO-GO|HOLD)\)?")
"""A manifest's sealed decision that names phase 06's: ``GO``, ``NO-GO``, ``HOLD``, or ``FAILED
(decision X)`` when a phase failed after phase 06 decided X (:func:`runbook_lib.evidence.seal.sealed_decision`)."""


def _sealed_decision(run_dir: Path, derived: str) -> Recomputed | None:
    """The decision ``manifest.json`` was sealed with, compared with the one derived again from the
    gates: a manifest edited to another decision (and its hashes recomputed, which anyone with
    write access can do without a signing key) differs here even when every byte verifies. None
    when the manifest names no phase 06 decision (``INTERRUPTED``, ``FAILED``) or cannot be read
    (``verify`` names that)."""
    try:
        manifest = load_manifest(run_dir)
    except (EvidenceError, OSError, ValueError):
        return None
    m = SEALED_AS.fullmatch(manifest.decision or "") if manifest is not None else None
    if m is None:
        return None
    said = m.group(1)
    return Recomputed("06", "sealed decision", "manifest.json against every gate above", {"verdict": said},
                      {"verdict": derived}, () if said == derived else (f"verdict: {said!r} -> {derived!r}",))
