"""``runbook``: run a migration, one phase, verify a run's evidence, report it as HTML, list runs,
approve the plans a run showed, resolve a HOLD run, or clean up what a run left behind.

Exit codes (also in docs/reference/exit-codes.md):
    0  GO: every blocking gate passed (``resolve``: a person decided GO)
    1  NO-GO: a blocking gate failed (source route restored, target resources destroyed);
       ``resolve``: a person decided NO-GO, or the hold deadline passed
    2  usage or params error: nothing ran (a path named that cannot be used included)
    3  HOLD: evidence inconclusive, or an approval is missing; a person must decide
       (``resolve`` without a decision: still waiting, before the deadline)
    4  failed run: a phase crashed, timed out or lost its kernel (executed notebook kept);
       a full disk, named as such
    130  interrupted by SIGINT (Ctrl-C): the phase stopped, the run's resources torn down
    143  interrupted by SIGTERM: as for SIGINT (129: SIGHUP, the terminal closed)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runbook_lib.errors import EXIT_FAILED, EXIT_USAGE, RunbookError, UsageError, os_error_exit, os_error_line
from runbook_lib.layout import COMPLETION_MARKER, KEPT_PARAMS, MANIFEST, RESOLUTION
from runbook_lib.providers.simulator import fault_problems, sim_module, simulated

if TYPE_CHECKING:
    from runbook_lib.run.runner import PhaseOutcome, RunResult

REHEARSED = ("params/runpod-to-vast.yaml", "params/runpod-to-vast-train.yaml", "params/runpod-to-vast-service.yaml",
             "params/runpod-serverless-to-vast-handler.yaml")
"""What ``runbook rehearse`` (and ``make rehearse``) runs by default: the inference endpoint, the
training job and the team's own chat service, each from Runpod to Vast.ai."""


def _use_fixtures(args: argparse.Namespace, params: str | Path | None = None) -> None:
    """``--provider-fixtures``: remote providers answer from recorded-shape fixtures (a test
    option: no network, no key, nothing real is planned against); request lines are logged under
    ``.runbook/fixtures/``. Kernels inherit the setting through the environment."""
    if getattr(args, "provider_fixtures", False):
        from runbook_lib.layout import project_root
        from runbook_lib.providers.fixtures import ENV

        where = project_root(params or args.params) / ".runbook" / "fixtures"
        os.environ[ENV] = str(where)
        print(f"provider fixtures: remote APIs answer from recorded shapes (request log: {where})", flush=True)


def _echo(line: str) -> None:
    """Progress to stdout; a reader that went away (a closed pipe or terminal) must not stop a run
    that holds paid resources, so progress is then dropped and the run goes on to its teardown."""
    try:
        print(line, flush=True)
    except (BrokenPipeError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # later prints (and the interpreter's flush at exit) go nowhere


def _cmd_run(args: argparse.Namespace) -> int:
    from runbook_lib.run.runner import environment_ok, run_migration
    from runbook_lib.run.runstore import is_location

    _use_fixtures(args)
    environment_ok()
    if is_location(args.reports):
        return _run_stored(args)
    res = run_migration(args.params, reports_dir=args.reports, approval_ref=args.approval_file or "",
                        notebooks_dir=args.notebooks, echo=_echo)
    return _say_result(res)


def _say_result(res: RunResult, where: str = "") -> int:
    """Print how a run ended (its evidence, reasons, the exit codes' meanings, the decision); its exit code."""
    _echo(f"evidence: {where or res.run_dir}")
    for reason in res.reasons[1:]:
        _echo(f"  - {reason}")
    _echo(EXIT_MEANINGS)
    _echo(decision_line(res.decision, res.exit_code, res.reasons[0] if res.reasons else ""))
    return res.exit_code


def _stored_params(params: str) -> tuple[Path, tuple[str, str], str]:
    """The project of a params file, the providers of its two sides and the migration's name
    (for a stored run)."""
    from runbook_lib.layout import project_root
    from runbook_lib.params import load_params

    mig = load_params(params)
    return project_root(params), (mig.source.provider, mig.target.provider), mig.migration


def _run_stored(args: argparse.Namespace) -> int:
    """``runbook run --reports s3://bucket/prefix``: the run created in this worker's
    ``reports/<run_id>``, under the run's lease, pushed after every phase and after its seal
    (:mod:`runbook_lib.run.runstore`)."""
    from runbook_lib.evidence.manifest import new_run_id
    from runbook_lib.run.runner import run_migration
    from runbook_lib.run.runstore import RunLocation, worked_on

    project, providers, migration = _stored_params(args.params)
    loc = RunLocation.under(args.reports, new_run_id(migration))
    with worked_on(loc, project, phase="run", providers=providers, echo=_echo) as stored:

        def pushed(out: PhaseOutcome) -> None:  # a failed push never stops the run before its teardown
            try:
                stored.push(out.phase, out.status)
            except RunbookError as exc:
                _echo(f"  push of phase {out.phase} to {loc.url} failed: {exc}")

        res = run_migration(args.params, run_path=stored.path, approval_ref=args.approval_file or "",
                            notebooks_dir=args.notebooks, echo=_echo, after_phase=pushed)
        state = stored.push("seal", res.decision)
        _echo(f"pushed to {loc.url} (push {state.generation}); this worker's copy: {res.run_dir}")
    return _say_result(res, loc.url)


EXIT_MEANINGS = "exit codes: 0 GO, 1 NO-GO, 3 HOLD (each a decision, not a crash), 4 failed, 2 usage, 128+N signal N"


def decision_line(decision: str, exit_code: int, reason: str) -> str:
    """The last line `runbook run` prints (after :data:`EXIT_MEANINGS`): the decision, its exit
    code and its first reason."""
    return f"decision: {decision} (exit {exit_code})" + (f": {reason}" if reason else "")


STOPPED = "stopped the migration"  # what `runbook phase` says of a completed phase that stops it (orchestrators match it)


def _cmd_phase(args: argparse.Namespace) -> int:
    """One phase into a run, through the same path as ``runbook run`` (scan, stamp, record).
    SIGINT, SIGTERM and SIGHUP are handled as ``runbook run`` handles them: the phase stops, what
    the run created is torn down, the run is sealed ``INTERRUPTED`` and the exit is 128 + signal.

    ``run_dir`` may be a run location ``s3://bucket/prefix/<run_id>``: the phase runs under the
    run's lease on this worker's copy of its last push, and its files are pushed back whatever
    the phase's end (:mod:`runbook_lib.run.runstore`)."""
    from runbook_lib.errors import EXIT_HOLD
    from runbook_lib.run.runstore import RunLocation, is_location, worked_on

    if not is_location(args.run_dir):
        return _phase_into(args, Path(args.run_dir))
    loc = RunLocation.parse(args.run_dir)
    project, providers, _ = _stored_params(args.params)
    with worked_on(loc, project, phase=args.phase, providers=providers, echo=_echo) as stored:
        if args.phase != "01":
            stored.require_run(f"phase {args.phase}")
        code = _phase_into(args, stored.path)
        statuses = {0: "completed", EXIT_HOLD: "held"}
        state = stored.push(args.phase, statuses.get(code, "failed" if code == EXIT_FAILED else "interrupted"))
        print(f"pushed to {loc.url} (push {state.generation}, phase {args.phase})")
    return code


def _phase_into(args: argparse.Namespace, run_dir: Path) -> int:
    """``runbook phase`` into the run directory ``run_dir`` (a worker's copy of a stored run, or a local run)."""
    from runbook_lib.errors import EXIT_HOLD
    from runbook_lib.evidence.manifest import phase_name
    from runbook_lib.evidence.rundir import RunDir
    from runbook_lib.run.interrupt import Interrupts
    from runbook_lib.run.runner import (
        environment_ok,
        phase_out_of_order,
        preflight,
        run_phase,
        stop_full_disk,
        stop_interrupted,
        teardown_after_failed_phase_06,
    )

    if args.phase == "01" and not (run_dir / KEPT_PARAMS).exists():
        run = RunDir.create(args.params, path=run_dir)
    else:
        run = RunDir.open(run_dir.resolve(), args.params)
    early = phase_out_of_order(run, args.phase)
    if early:
        raise UsageError(early)
    nb_dir = Path(args.notebooks).resolve() if args.notebooks else None
    preflight(run.mig, run.project, nb_dir)
    _use_fixtures(args)
    environment_ok()
    scans: list[dict[str, Any]] = []
    with Interrupts() as intr:
        out = run_phase(run, args.phase, notebooks_dir=nb_dir, approval_ref=args.approval_file or "",
                        cell_timeout_s=args.cell_timeout_s or None, interrupts=intr, scans=scans, echo=_echo)
        if intr.signum:
            res = stop_interrupted(intr, run, [out], scans, _echo, phases_from_records=True)
            _echo(f"decision: {res.decision} (exit {res.exit_code})")
            _echo(f"evidence: {res.run_dir}")
            return res.exit_code
    if out.disk_full:  # torn down and cut-off notebooks removed, as `runbook run` does
        res = stop_full_disk(run, [out], scans, _echo, phases_from_records=True)
        print(f"phase {phase_name(args.phase)} failed: {res.reasons[0]}", file=sys.stderr)
        return EXIT_FAILED
    if out.status == "held":  # waiting on a person, not broken
        print(f"phase {phase_name(args.phase)} held: {out.reason}", file=sys.stderr)
        return EXIT_HOLD
    if out.status != "completed":
        print(f"phase {phase_name(args.phase)} {out.status}: {out.reason}", file=sys.stderr)
        if args.phase == "06" and out.status == "failed":
            teardown_after_failed_phase_06(run, _echo)
        return EXIT_FAILED
    print(f"phase {phase_name(args.phase)} completed in {out.seconds:.1f} s: {run.path / phase_name(args.phase)}.ipynb")
    if out.stop and args.phase != "06":
        print(f"phase {args.phase} {STOPPED}: a blocking gate failed or was inconclusive; `runbook run` would run "
              "no phase after it but 06, which tears down and decides (`runbook status` names the gates)")
    return 0


def _person_signer(ref: str | None) -> Any:
    """The signer of ``--key REF`` (a person's ed25519 private key), or None without one.

    Raises:
        UsageError: the reference cannot be read or is not such a key (named, its value never shown).
    """
    from runbook_lib.errors import AuthError
    from runbook_lib.evidence.signing import load_signer

    if not ref:
        return None
    try:
        return load_signer(ref, what="--key")
    except AuthError as exc:
        raise UsageError(f"{exc}; nothing was written") from None


def _cmd_approve(args: argparse.Namespace) -> int:
    from runbook_lib.evidence.approvals import write_approval_file
    from runbook_lib.evidence.text import MAX_BY, MAX_REASON, checked_text
    from runbook_lib.run.runstore import is_location

    checked_text(args.by, what="--by", max_len=MAX_BY)
    checked_text(args.reason or "", what="--reason", max_len=MAX_REASON)
    with _readable_run(args.run_dir) if is_location(args.run_dir) else contextlib.nullcontext(Path(args.run_dir)) \
            as run_dir:
        out = args.output
        if not out:
            from runbook_lib.layout import project_root
            from runbook_lib.params import load_params

            kept = run_dir / KEPT_PARAMS
            mig = load_params(kept) if kept.exists() else None
            if mig is None or not mig.approvals.approval_file:
                raise UsageError("no approvals.approval_file in the run's params: pass -o FILE")
            # a stored run is read from a temporary copy: its approval file goes where this project keeps it
            home = Path.cwd() if is_location(args.run_dir) else project_root(kept)
            out = str(home / mig.approvals.approval_file)
        signer = _person_signer(args.key)  # before anything is written
        body = write_approval_file(run_dir, out, approved_by=args.by, signer=signer, reason=args.reason or "")
    for p in body["plans"]:
        print(f"  approved {p['action']} {p['target']} on {p['provider']} ({p['cost_usd_per_hour']:.3f} USD/h, "
              f"offers {p['offers'] or '-'}): {p['fingerprint']}")
    print(f"approval file: {out} (name it in approvals.approval_file or pass --approval-file; set dry_run: false "
          "to apply)" + (f"; signed in {Path(out).with_name(Path(out).stem + '.dsse.json')}" if signer else ""))
    return 0


def _cmd_cleanup(args: argparse.Namespace) -> int:
    from runbook_lib.run.cleanup import cleanup_run, summary

    run_dir = Path(args.run_dir)
    if not (run_dir / KEPT_PARAMS).exists():
        raise UsageError(f"{run_dir} is not a run directory (no params.yaml in it); pass reports/<run_id>")
    _use_fixtures(args, run_dir / KEPT_PARAMS)
    print(f"resources labelled run_id={run_dir.resolve().name}" + (" (dry run: nothing is destroyed)" if args.dry_run
                                                                    else ""))
    res = cleanup_run(run_dir, project=args.project, dry_run=args.dry_run, echo=print)
    print(f"found {len(res.found)}; {summary(res)}")
    print(f"recorded in {run_dir / 'cleanup.json'}")
    return 0 if res.clean or (args.dry_run and not res.unlisted) else 1


def _cmd_rehearse(args: argparse.Namespace) -> int:
    import time

    from runbook_lib.errors import EXIT_BY_DECISION
    from runbook_lib.run.rehearse import rehearse
    from runbook_lib.run.runner import environment_ok

    environment_ok()
    t0 = time.perf_counter()
    worst = 0
    lines = []
    faults = _faults(args.faults, per_provider=True) if args.faults is not None else {}
    for out in rehearse([Path(p) for p in args.params], echo=_echo, faults=faults):
        res = out.result
        lines.append(f"{out.params}: {res.decision} (exit {res.exit_code}) in {out.seconds:.1f} s; evidence {res.run_dir}")
        for reason in res.reasons:
            lines.append(f"  - {reason}")
        worst = max(worst, res.exit_code if res.exit_code in EXIT_BY_DECISION.values() else EXIT_FAILED)
    for line in lines:
        _echo(line)
    _echo(f"rehearse_s={time.perf_counter() - t0:.1f}")
    return worst


def _faults(path: str, *, per_provider: bool, provider: str = "") -> dict[str, Any]:
    """A ``--faults`` JSON file: ``{"script": ..., "lies": ..., "limits": ...}`` for one simulator,
    or (with ``per_provider``) one such object per provider name.

    Raises:
        UsageError: the file is unreadable, not JSON, or has unknown keys (nothing was started).
    """
    if not path:
        raise UsageError("--faults needs a file name; nothing was started")
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--faults {path}: cannot read it as JSON ({exc}); nothing was started") from None
    if per_provider:
        if not isinstance(data, dict):
            raise UsageError(f"--faults {path}: must be an object of provider: faults ({{\"runpod\": ..., \"vast\": "
                             f"...}}), got {type(data).__name__}; nothing was started")
        if set(data) - set(simulated()):
            raise UsageError(f"--faults {path}: unknown providers {sorted(set(data) - set(simulated()))}; use runpod and "
                             "vast, each with script, lies and limits; nothing was started")
    parts = data if per_provider else {provider: data}
    for name, part in parts.items():
        problems = fault_problems(name, part)
        if problems:
            where = f" under {name}" if per_provider else ""
            raise UsageError(f"--faults {path}{where}: {'; '.join(problems)}; nothing was started")
    return dict(data)


def _cmd_simulate(args: argparse.Namespace) -> int:
    import faulthandler
    import secrets
    import signal
    import time

    from runbook_lib.providers.simulator import simulate

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: a TCP port is 0-65535 (0: a free one); nothing was started")
    key = args.key or f"sim-{args.provider}-{secrets.token_hex(16)}"
    faults = _faults(args.faults, per_provider=False, provider=args.provider) if args.faults is not None else {}
    try:
        srv = simulate(args.provider, state_dir=args.state, key=key, port=args.port, script=faults.get("script"),
                       lies=faults.get("lies"), limits=faults.get("limits"))
    except OSError as exc:
        raise UsageError(f"--port {args.port}: cannot listen on 127.0.0.1:{args.port} ({exc.strerror or exc}); choose "
                         "another port or 0 for a free one; nothing was started") from None
    # SIGTERM (a service manager, `kill`) stops it like Ctrl-C: its machines are destroyed, not orphaned.
    # SIGINT is set explicitly too: a process started with SIGINT ignored (a shell's background
    # job without job control) would otherwise keep ignoring it, and Python installs its
    # KeyboardInterrupt handler only where SIGINT was not ignored at start
    # (https://docs.python.org/3/library/signal.html#execution-of-python-signal-handlers).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # `kill -USR1 <pid>` prints every thread's stack to stderr: a simulator that stops answering, or
    # does not stop, shows where it waits (https://docs.python.org/3/library/faulthandler.html).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    exports = sim_module(args.provider).exports(srv.url, key)
    print(f"{args.provider} simulator at {srv.url} (Ctrl-C stops it and destroys its machines). Point a run at it:")
    print("  export " + " ".join(f"{k}='{v}'" for k, v in exports.items()))
    print("  and set approvals.preapproved_simulator: true (or approve its plans) and dry_run: false.", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        srv.close()
        print("simulator stopped; its machines are destroyed")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from runbook_lib.run.runstore import is_location, pull_for_reading, stored_runs

    if is_location(args.reports):  # every stored run pulled (its last completed push), then listed as here
        with tempfile.TemporaryDirectory(prefix="runbook-pulled-") as tmp:
            for loc in stored_runs(args.reports):
                pull_for_reading(loc, Path(tmp) / loc.run_id)
            return _list_runs(Path(tmp), args.reports)
    return _list_runs(Path(args.reports), args.reports)


def _list_runs(reports: Path, shown: str) -> int:
    from runbook_lib.audit.verify import unreadable_manifest
    from runbook_lib.evidence.records import load_manifest, load_receipt
    from runbook_lib.evidence.resolve import standing
    from runbook_lib.evidence.signing import record_envelope, signed_by
    from runbook_lib.evidence.text import printable

    rows = []
    for d in sorted(reports.glob("*/")):
        unreadable = unreadable_manifest(d)
        if unreadable:  # one broken run never hides the others
            rows.append(printable(f"{d.name:<55} {'?':<8} {'unknown':<10} {'ALTERED':<9} {unreadable}"))
            continue
        evidence = _evidence_state(d)
        st = standing(d)  # a HOLD past its deadline shows as NO-GO; `runbook resolve` records it
        receipt = load_receipt(d)
        src, tgt = (receipt.source.release, receipt.target.release) if receipt else ("", "")
        complete = (d / COMPLETION_MARKER).exists()
        manifest = load_manifest(d)
        note = f"  [{printable(st.note)}]" if st.note else ""  # an older run's free text is shown, never obeyed
        kind = "REHEARSAL: " if manifest and manifest.rehearsal else ""  # never mistaken for a real migration
        if evidence == "verified" and st.resolution is not None and signed_by(d):
            # the seal is signed, and the decision shown is a person's: unsigned, or signed by a key that
            # list cannot check (anyone can make one; verify --person-key checks it against the people's keys)
            evidence = "UNCHECKED" if record_envelope(d / RESOLUTION).is_file() else "UNSIGNED"
        complete = complete and evidence != "INCOMPLETE"
        rows.append(printable(f"{d.name:<55} {st.decision:<8} {'complete' if complete else 'incomplete':<10} "
                              f"{evidence:<10} {kind}{src} -> {tgt}") + note)
    if rows:
        print(f"{'run id':<55} {'decision':<8} {'state':<10} {'evidence':<10} source -> target")
    print("\n".join(rows) if rows else f"no runs under {shown.rstrip('/')}/")
    for word, meaning in LIST_WORDS.items():
        if any(f" {word} " in r for r in rows):
            print(f"{word}: {meaning}")
    return 0


LIST_WORDS = {
    "ALTERED": "a file differs from the seal, or was added or removed; `runbook verify RUN` names it",
    "INCOMPLETE": "the run lacks an executed notebook, its provenance, a secret scan or a host-lock record (its "
                  "notebooks ran without `runbook run` or `runbook phase`); `runbook verify RUN` names each",
    "UNSIGNED": "the run's seal is signed but the resolution deciding it is not: a person's word, not verified "
                "evidence; `runbook resolve --key` signs one",
    "UNCHECKED": "the decision comes from a resolution signed by a person's key, which list does not check (any key "
                 "can sign); `runbook verify --person-key KEY.pub RUN` checks it against the people who may decide",
}
"""The evidence words of ``runbook list`` that need a line saying what they mean."""


def _evidence_state(run_dir: Path) -> str:
    """What ``runbook list`` says of a run's evidence: ``verified`` (a closed-world seal, every
    file as sealed, nothing the runner writes missing), ``legacy`` (an older open-world seal, its
    listed files as sealed), ``ALTERED`` (:func:`runbook_lib.audit.verify.verify_run` found a file
    changed, added or missing), ``INCOMPLETE`` (every file as sealed, but a phase's notebook,
    provenance, secret scan or host-lock record is missing:
    :func:`runbook_lib.audit.verify.incomplete_rows`) or ``unsealed`` (no manifest: still running,
    or stopped before its seal)."""
    from runbook_lib.audit.verify import verify_run
    from runbook_lib.evidence.closedworld import seal_kind

    kind = seal_kind(run_dir)
    if kind == "none":
        return "unsealed"
    problems = {r["status"] for r in verify_run(run_dir)} - {"intact"}
    if problems:
        return "INCOMPLETE" if problems == {"incomplete"} else "ALTERED"
    return "legacy" if kind == "legacy" else "verified"


def _cmd_resolve(args: argparse.Namespace) -> int:
    from runbook_lib.run.runstore import RunLocation, is_location, worked_on

    if not is_location(args.run_dir):
        return _resolve(args, Path(args.run_dir))
    loc = RunLocation.parse(args.run_dir)  # the resolution is written into the run: under its lease, then pushed
    with worked_on(loc, Path.cwd(), phase="resolve", providers=(), echo=_echo) as stored:
        stored.require_run("resolve")
        code = _resolve(args, stored.path)
        if (stored.path / RESOLUTION).exists():
            state = stored.push("resolve", "resolved")
            print(f"pushed to {loc.url} (push {state.generation})")
    return code


def _resolve(args: argparse.Namespace, run_dir: Path) -> int:
    from runbook_lib.errors import EXIT_BY_DECISION, EXIT_HOLD
    from runbook_lib.evidence.resolve import resolve_run, standing
    from runbook_lib.evidence.text import printable

    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a run directory")
    if args.decision is None:
        st = standing(run_dir)
        if st.decision == "HOLD" and st.resolution is None:
            print(f"{run_dir.name}: HOLD; {printable(st.note)}. Decide with --decision GO|NO-GO --by NAME "
                  "[--reason TEXT].")
            return EXIT_HOLD
    elif not args.by:
        raise UsageError("--by NAME is required with --decision: a resolution names the person who decided")
    signer = _person_signer(args.key)  # before anything is written
    res = resolve_run(run_dir, decision=args.decision, by=args.by, reason=args.reason or "", signer=signer)
    print(f"{run_dir.name}: HOLD resolved to {res['decision']} by {printable(res['by'])} at {res['resolved_at']} "
          f"(deadline {res['hold_deadline']}); {res['rollback']}")
    print(f"recorded in {run_dir / 'resolution.json'} (sha256 of the manifest it resolves: {res['resolves']['sha256']})")
    return EXIT_BY_DECISION[res["decision"]]


def run_status(run_dir: Path) -> dict[str, Any]:
    """Where a run stands, for a person or an orchestrator (``runbook status --json``).

    Returns:
        ``run_id``; ``sealed`` (bool); ``decision``: the effective decision of a sealed run
        (:func:`runbook_lib.evidence.resolve.standing`: GO, NO-GO, HOLD, FAILED, INTERRUPTED), or
        ``WAITING FOR APPROVAL`` (a phase held for want of an approval) / ``IN PROGRESS`` before
        the seal; ``exit_code``: what ``runbook run`` exits with for that decision (0, 1, 3, 4),
        None while in progress; ``reasons`` (the receipt's); ``hold_deadline`` (UTC ISO 8601, for a
        HOLD); ``phases``: each recorded phase's status; ``plans_waiting``: the fingerprint,
        provider, action and target of each plan shown and not applied (what ``runbook approve``
        would approve); ``stopped``: ``{"phase", "why"}`` of the first completed phase whose record
        stops the migration (a blocking gate failed or was inconclusive: ``runbook run`` runs no
        phase after it but 06), else None.
    """
    from runbook_lib.errors import EXIT_BY_DECISION, EXIT_HOLD
    from runbook_lib.evidence.approvals import plans_awaiting
    from runbook_lib.evidence.manifest import read_chain
    from runbook_lib.evidence.records import load_receipt
    from runbook_lib.evidence.resolve import standing
    from runbook_lib.run.runner import stopped_by

    chain = read_chain(run_dir)
    phases = {r.phase: str(r.body.get("status")) for r in chain}
    stops = [{"phase": r.phase, "why": stopped_by(r.body)} for r in chain
             if r.body.get("status") == "completed" and stopped_by(r.body)]
    sealed = (run_dir / MANIFEST).exists()
    waiting = [{k: p.get(k) for k in ("fingerprint", "provider", "action", "target")} for p in plans_awaiting(run_dir)]
    receipt = load_receipt(run_dir) if sealed else None
    if sealed:
        st = standing(run_dir)
        decision, deadline = st.decision, st.deadline.isoformat() if st.deadline else None
        code: int | None = EXIT_BY_DECISION.get(decision, EXIT_FAILED)
    else:
        decision = "WAITING FOR APPROVAL" if "held" in phases.values() else "IN PROGRESS"
        deadline, code = None, EXIT_HOLD if decision == "WAITING FOR APPROVAL" else None
    return {"run_id": run_dir.name, "sealed": sealed, "decision": decision, "exit_code": code,
            "reasons": receipt.reasons if receipt else [], "hold_deadline": deadline, "phases": phases,
            "plans_waiting": waiting, "stopped": stops[0] if stops else None}


def _cmd_status(args: argparse.Namespace) -> int:
    from runbook_lib.evidence.text import printable

    with _readable_run(args.run_dir) as run_dir:
        st = run_status(run_dir)
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print(f"{st['run_id']}: {st['decision']}" + (f" (exit {st['exit_code']})" if st["exit_code"] is not None else ""))
    print("phases: " + (", ".join(f"{p} {s}" for p, s in st["phases"].items()) or "none recorded"))
    for reason in st["reasons"]:
        print(f"  - {printable(reason)}")
    if st["hold_deadline"]:
        print(f"a person decides until {st['hold_deadline']} (`runbook resolve`)")
    if st["stopped"] and not st["sealed"]:
        print(f"phase {st['stopped']['phase']} stopped the migration ({st['stopped']['why']}): phase 06 tears down "
              "and decides")
    for p in st["plans_waiting"]:
        print(f"waiting for approval: {p['action']} {p['target']} on {p['provider']} ({p['fingerprint']}; "
              "`runbook approve`)")
    return 0


def _cmd_slot(args: argparse.Namespace) -> int:
    """``runbook slot take|give LOCATION --limit N``: a fleet's bound on migrations in flight
    (:mod:`runbook_lib.run.fleet`). ``take`` exits 0 with a slot, 3 when every slot is held by a
    run in flight (try again later: an orchestrator's sensor does); ``give`` exits 0."""
    from runbook_lib.errors import EXIT_HOLD
    from runbook_lib.run.fleet import give_slot, take_slot
    from runbook_lib.run.runstore import RunLocation

    loc = RunLocation.parse(args.location)
    if args.action == "give":
        given = give_slot(loc, args.limit)
        print(f"{loc.run_id}: gave back slot {given.index + 1} of {args.limit}" if given else
              f"{loc.run_id}: holds no slot of {args.limit} under {loc.base_url}")
        return 0
    slot, held = take_slot(loc, args.limit)
    if slot is None:
        print(f"{loc.run_id}: all {args.limit} slots under {loc.base_url} are held by migrations in flight ("
              + ", ".join(f"{s.run_id} since {s.since}" for s in held) + "); try again when one ends")
        return EXIT_HOLD
    print(f"{loc.run_id}: holds slot {slot.index + 1} of {args.limit} under {loc.base_url}")
    return 0


@contextlib.contextmanager
def _readable_run(value: str) -> Iterator[Path]:
    """The run directory ``value`` names (:func:`_run_dir_arg`), or, for a run location
    ``s3://bucket/prefix/<run_id>``, its last completed push pulled into a temporary directory
    (removed afterwards), every file checked against the sha256 the push recorded."""
    from runbook_lib.run.runstore import RunLocation, is_location, pull_for_reading

    if not is_location(value):
        yield _run_dir_arg(value)
        return
    loc = RunLocation.parse(value)
    with tempfile.TemporaryDirectory(prefix="runbook-pulled-") as tmp:
        state = pull_for_reading(loc, Path(tmp) / loc.run_id)
        print(f"pulled {loc.url} (push {state.generation}, after phase {state.phase}, {len(state.files)} files, "
              "each matching the sha256 its push recorded) into a temporary directory")
        yield Path(tmp) / loc.run_id


def _run_dir_arg(value: str) -> Path:
    """``value`` as a run directory (``reports/<run_id>``).

    Raises:
        UsageError: it is not a directory a run wrote (no params.yaml, manifest.json or phase
            record in it), e.g. ``/etc``.
    """
    from runbook_lib.evidence.closedworld import looks_like_run_dir

    run_dir = Path(value)
    if not looks_like_run_dir(run_dir):
        raise UsageError(f"{run_dir} is not a run directory (no params.yaml, manifest.json or NN_<phase>.json in "
                         "it); pass reports/<run_id>")
    return run_dir


SEAL_LINES = {
    "closed": "seal: closed world (every file of the run is in the seal or a link after it)",
    "legacy": "seal: LEGACY, open world (written before closed-world seals: the files it lists are checked, a "
              "file added to the directory is not)",
}


def _signature_rows(run_dir: Path, key_path: str | None, *, legacy: bool) -> list[dict[str, str]]:
    """Prints whether the run is signed; rows for its attestation: without ``key_path``, whether
    its in-toto statements (``attestation.intoto.jsonl``, signed or not) attest the run as it is;
    with ``key_path`` (``--key PUBKEY``), also that every statement is signed by that key (an
    unsigned run, or another key, fails: no downgrade)."""
    from runbook_lib.evidence.attestation import attestation_problems
    from runbook_lib.evidence.closedworld import BUNDLE, read_links
    from runbook_lib.evidence.signing import load_public_key, signed_by

    keys = signed_by(run_dir)
    if legacy:
        print("signature: NOT SIGNED (a legacy seal is never signed)")
        return [] if key_path is None else [{"path": MANIFEST, "status": "altered", "by": "a legacy seal is never signed"}]
    if key_path is None:  # the statements themselves are checked by verify_run (audit.verify.attestation_rows)
        print(f"signature: signed by key {', '.join(keys)} (not checked: pass --key PUBKEY to check it)" if keys
              else f"signature: NOT SIGNED (integrity only: anyone who can write the directory could reseal it; the "
                   f"statements in {BUNDLE} are written unsigned)")
        return []
    key = load_public_key(Path(key_path))
    name, problems = attestation_problems(run_dir, key)
    stale = problems and not any("signature verifies" in p or "not signed" in p for p in problems)
    print(f"signature: signed by key {key.keyid}, verified" if not problems else
          f"signature: signed by key {key.keyid}, but its statements no longer match the run" if stale else
          f"signature: DOES NOT VERIFY with key {key.keyid}")
    links = read_links(run_dir)
    if links:
        print(f"signature: does not cover the {len(links)} link(s) written after the seal "
              f"({', '.join(link.path for link in links)}): each may hold only its command's own files (a person's "
              "resolution is checked by --person-key)")
    if not problems:
        return [{"path": name, "status": "intact", "by": f"ed25519 key {key.keyid} (--key)"}]
    return [{"path": name, "status": "altered", "by": p} for p in problems]


def _person_rows(run_dir: Path, key_paths: list[str]) -> list[dict[str, str]]:
    """Prints who signed the people's records (resolution, approvals by file); with
    ``key_paths`` (``--person-key``), rows checking each against those keys."""
    import json

    from runbook_lib.audit.verify import person_records, person_signature_rows
    from runbook_lib.evidence.signing import envelope_keyids, load_public_key

    for what, _, env in person_records(run_dir):
        ids = envelope_keyids(json.loads(env.read_text())) if env is not None else []
        print(f"{what}: " + (f"signed by key {', '.join(ids)}" + ("" if key_paths else " (not checked: pass "
                                                                  "--person-key PUBKEY)") if ids else "NOT SIGNED"))
    if not key_paths:
        return []
    return person_signature_rows(run_dir, [load_public_key(Path(k)) for k in key_paths])


def _cmd_verify(args: argparse.Namespace) -> int:
    with _readable_run(args.run_dir) as run_dir:
        return _verify(args, run_dir)


def _verify(args: argparse.Namespace, run_dir: Path) -> int:
    from runbook_lib.audit.verify import unreadable_manifest, verify_run
    from runbook_lib.evidence.closedworld import seal_kind

    unreadable = unreadable_manifest(run_dir)
    if unreadable:  # nothing it vouches for can be checked: ALTERED, named, not a crash
        print(f"{'altered':<12} {MANIFEST:<45} ({unreadable})")
        print("0 intact, 1 altered: the seal cannot be read, so no file of the run is vouched for")
        return 1
    kind = seal_kind(run_dir)
    if kind == "none":
        print(f"not a sealed run: {run_dir} has no {MANIFEST} (the seal is written when the run ends, or when "
              "it is interrupted): nothing vouches for its files. Finish the run, or start a new one")
        return 1
    print(SEAL_LINES[kind])
    rows = verify_run(run_dir)
    rows += _signature_rows(run_dir, args.key, legacy=kind == "legacy")
    rows += _person_rows(run_dir, args.person_key)
    bad = [r for r in rows if r["status"] != "intact"]
    for r in sorted(rows, key=lambda r: (r["status"] == "intact", r["path"])):
        print(f"{r['status']:<12} {r['path']:<45} ({r['by']})")
    print(f"{len(rows) - len(bad)} intact, {sum(r['status'] == 'altered' for r in rows)} altered, "
          f"{sum(r['status'] == 'missing' for r in rows)} missing, "
          f"{sum(r['status'] == 'broken-link' for r in rows)} broken links"
          + (f", {sum(r['status'] == 'incomplete' for r in rows)} phases incomplete: not every phase ran through "
             "`runbook run` or `runbook phase`, so the run is not verified" if any(r['status'] == 'incomplete'
                                                                                 for r in rows) else ""))
    if not args.recompute:
        return 1 if bad else 0
    from runbook_lib.audit.recompute import recompute_run

    print("\nrecomputed from the evidence (runbook verify --recompute):")
    redone = recompute_run(run_dir)
    for x in redone:
        got = (x.recomputed or {}).get("verdict", "-")
        was = (x.recorded or {}).get("verdict", "-")
        status = "same" if x.same else ("RULE" if x.rule_change else "DIFFERS")
        print(f"{status:<8} {x.phase} {x.gate:<28} {was:<13} {got:<13} ({x.basis})")
        for d in x.differences:
            print(f"{'':<12}{d}")
        if x.rule_change:
            print(f"{'':<12}a rule change since this run explains it: {x.rule_change}")
    ruled = [x for x in redone if not x.same and x.rule_change]
    differ = [x for x in redone if not x.same and not x.rule_change]
    print(f"{len(redone) - len(differ) - len(ruled)} of {len(redone)} recomputed the same" +
          (f"; {len(ruled)} differ only as a rule change since the run's version makes them differ (RULE): "
           f"{', '.join(x.gate for x in ruled)}" if ruled else "") +
          (f"; differ: {', '.join(x.gate for x in differ)}" if differ else ""))
    return 1 if bad or differ else 0


def _cmd_keygen(args: argparse.Namespace) -> int:
    from runbook_lib.evidence.signing import generate_key

    private, public = generate_key(Path(args.path))
    print(f"wrote {private} (private, mode 0600: name it in params as evidence.signing_key: \"file:{private}\") "
          f"and {public} (public: give it to whoever checks a run, `runbook verify --key {public} reports/<run_id>`)")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    with _readable_run(args.run_dir) as run_dir:
        return _report(args, run_dir)


def _report(args: argparse.Namespace, run_dir: Path) -> int:
    from runbook_lib.audit.verify import verify_run
    from runbook_lib.evidence.closedworld import seal_kind
    from runbook_lib.evidence.report import chromium_path, pdf_problem, write_html, write_pdf
    from runbook_lib.layout import REPORTS_DIR
    from runbook_lib.run.runstore import is_location

    problems = [f"{r['path']}: {r['status']} ({r['by']})" for r in verify_run(run_dir) if r["status"] != "intact"]
    if seal_kind(run_dir) == "none":
        problems.insert(0, f"not a sealed run (no {MANIFEST})")
    if problems and not args.allow_unverified:  # exit 1, as `runbook verify` exits on the same run
        print(f"error: {run_dir.name} does not verify ({len(problems)} problem(s): "
              f"{'; '.join(problems[:5])}{' ...' if len(problems) > 5 else ''}); no report written. "
              f"Run `runbook verify {run_dir}` for the list, or pass --allow-unverified to write one "
              "stamped with what failed on every section", file=sys.stderr)
        return 1
    cannot_print = pdf_problem(chromium_path(args.chromium)) if args.pdf else ""
    if cannot_print:  # checked before anything is written
        raise UsageError(cannot_print)
    if args.output:
        dest: Path | None = Path(args.output)
    else:  # beside the run, or for a stored run (pulled into a temporary directory) in ./reports/
        dest = Path(REPORTS_DIR) / f"{run_dir.name}.html" if is_location(args.run_dir) else None
        if dest is not None:
            dest.parent.mkdir(exist_ok=True)
    out = write_html(run_dir, dest, unverified=problems)
    print(f"report: {out}" + (f" (UNVERIFIED: {len(problems)} problem(s) stamped on every section)" if problems else ""))
    if args.pdf:
        pdf = out.with_suffix(".pdf") if out.suffix != ".pdf" else out.with_name(out.name + ".pdf")
        print(f"pdf: {write_pdf(out, pdf, chromium=chromium_path(args.chromium))}")
    return 0


def _cmd_init(args: argparse.Namespace) -> int:
    """Copy the packaged notebooks and example params into a directory to edit them."""
    from runbook_lib.run.phase_notebooks import init_project

    target = Path(args.dir)
    written = init_project(target)
    print(f"wrote {len(written)} files under {target}: notebooks/ (the six phase notebooks, run instead of the "
          f"packaged ones for params under {target / 'params'}) and params/ (examples).\n"
          f"next: runbook run {target / 'params' / 'demo.yaml'}   or   "
          f"jupyter lab --ServerApp.root_dir={target} (open notebooks/)")
    return 0


def _add_person_commands(sub: Any) -> None:
    """``runbook resolve`` and ``runbook approve``: what a person decides, signed with their key when given."""
    rs = sub.add_parser("resolve", help="record a person's GO/NO-GO on a HOLD run (or NO-GO once its deadline passed)")
    rs.add_argument("run_dir", help="reports/<run_id>, or s3://BUCKET/PREFIX/<run_id> (under the run's lease: "
                                    "pulled, resolved, pushed)")
    rs.add_argument("--decision", choices=["GO", "NO-GO"],
                    help="the person's decision; without it: show the hold, or record NO-GO after its deadline")
    rs.add_argument("--by", help="who decided (required with --decision)")
    rs.add_argument("--reason", help="why, free text")
    rs.add_argument("--key", metavar="REF", help="sign the resolution with your ed25519 private key: env:VAR or "
                                                 "file:PATH (`runbook keygen` writes one)")
    rs.set_defaults(func=_cmd_resolve)
    ap_ = sub.add_parser("approve", help="approve every plan a run showed (dry-run or held): write an approval file")
    ap_.add_argument("run_dir", help="reports/<run_id>, or s3://BUCKET/PREFIX/<run_id> (pulled first; the default "
                                     "approval file is then approvals.approval_file under this directory)")
    ap_.add_argument("--by", required=True, help="who approves (recorded)")
    ap_.add_argument("-o", "--output", help="approval file (default: the run's approvals.approval_file)")
    ap_.add_argument("--reason", help="why, free text, recorded with the approval (a documented alternate of the "
                                      "target is used only under an approval with a reason)")
    ap_.add_argument("--key", metavar="REF", help="sign the approval file with your ed25519 private key: env:VAR "
                                                  "or file:PATH; the signature is written beside it (.dsse.json)")
    ap_.set_defaults(func=_cmd_approve)


def _add_evidence_commands(sub: Any) -> None:
    """``runbook verify`` and ``runbook keygen``: checking a run's evidence, and the key that signs it."""
    v = sub.add_parser("verify", help="recompute every hash of a run's evidence offline; non-zero on any problem")
    v.add_argument("run_dir", help="reports/<run_id>, or s3://BUCKET/PREFIX/<run_id> (its last push is pulled into "
                                   "a temporary directory first, each file checked against that push)")
    v.add_argument("--recompute", action="store_true",
                   help="also derive every gate verdict again from the raw samples, params and records, and compare "
                        "each with the receipt")
    v.add_argument("--key", metavar="PUBKEY",
                   help="an ed25519 public key (PEM, `runbook keygen` writes it): the seal must be signed by it over "
                        "the files as they are; an unsigned run fails")
    v.add_argument("--person-key", metavar="PUBKEY", action="append", default=[],
                   help="a public key of a person who may resolve or approve (repeat for several): the run's "
                        "resolution and every approval given by file must be signed by one of them; an unsigned "
                        "one fails")
    v.set_defaults(func=_cmd_verify)
    kg = sub.add_parser("keygen", help="write a new ed25519 key pair for signing seals: PATH (private, mode 0600) "
                                       "and PATH.pub")
    kg.add_argument("path")
    kg.set_defaults(func=_cmd_keygen)


def _add_orchestrator_commands(sub: Any) -> None:
    """``runbook status``, ``list`` and ``slot``: where runs stand, and a fleet's slots."""
    st = sub.add_parser("status", help="where one run stands: its decision (or that a phase waits for approval), "
                                       "reasons, hold deadline, phases and the plans waiting; --json for an "
                                       "orchestrator (exit 0 whenever the run can be read)")
    st.add_argument("run_dir", help="reports/<run_id>, or s3://BUCKET/PREFIX/<run_id> (pulled first, as for verify)")
    st.add_argument("--json", action="store_true", help="one JSON object (its fields: runbook_lib.cli.run_status)")
    st.set_defaults(func=_cmd_status)
    sl = sub.add_parser("slot", help="take or give back one of a fleet's N slots for migrations in flight, kept "
                                      "beside the runs in S3 (exit 3: every slot is held; try again later)")
    sl.add_argument("action", choices=["take", "give"])
    sl.add_argument("location", help="the run's location s3://BUCKET/PREFIX/<run_id>: the fleet's slots are kept "
                                     "under s3://BUCKET/PREFIX")
    sl.add_argument("--limit", type=int, required=True, help="migrations in flight at once under that prefix")
    sl.set_defaults(func=_cmd_slot)
    ls = sub.add_parser("list", help="list past runs with their decision")
    ls.add_argument("--reports", default="reports",
                    help="directory of runs (default: reports), or s3://BUCKET/PREFIX (every stored run pulled first)")
    ls.set_defaults(func=_cmd_list)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="runbook", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run all six phases of a migration")
    r.add_argument("params", help="migration YAML, e.g. params/demo.yaml")
    r.add_argument("--reports", default="reports",
                   help="directory for run directories (default: reports), or s3://BUCKET/PREFIX: the run is kept "
                        "there, pushed after every phase (docs/how-to/orchestrator.md)")
    r.add_argument("--approval-file", help="JSON approval record for plans on remote providers")
    r.add_argument("--notebooks", help="phase notebooks directory holding all six (default, per phase: "
                                       "<project>/notebooks/ if it has that phase's notebook, else the packaged one)")
    r.add_argument("--provider-fixtures", action="store_true",
                   help="test option: Runpod and Vast.ai answer from recorded-shape fixtures (no network, no key)")
    r.set_defaults(func=_cmd_run)
    it = sub.add_parser("init", help="copy the packaged phase notebooks and example params into DIR, to edit them "
                                     "(refuses to overwrite anything)")
    it.add_argument("dir")
    it.set_defaults(func=_cmd_init)
    p = sub.add_parser("phase", help="run one phase notebook into an existing run directory")
    p.add_argument("phase", choices=["01", "02", "03", "04", "05", "06"])
    p.add_argument("params")
    p.add_argument("run_dir", help="reports/<run_id>, or a run location s3://BUCKET/PREFIX/<run_id>: the phase "
                                   "takes the run's lease, pulls its last push, runs, and pushes (phase 01 starts it)")
    p.add_argument("--cell-timeout-s", type=int, default=None,
                   help="seconds per cell (default: the params' run.cell_timeout_s)")
    p.add_argument("--approval-file")
    p.add_argument("--notebooks", help="as for run")
    p.add_argument("--provider-fixtures", action="store_true", help="as for run")
    p.set_defaults(func=_cmd_phase)
    _add_evidence_commands(sub)
    rp = sub.add_parser("report", help="one offline HTML report of a run (code hidden, plots inline, no script); "
                                       "refuses a run that does not verify")
    rp.add_argument("run_dir", help="reports/<run_id>, or s3://BUCKET/PREFIX/<run_id> (pulled first, as for verify; "
                                    "the report goes to reports/<run_id>.html here)")
    rp.add_argument("-o", "--output", help="output file (default: reports/<run_id>.html)")
    rp.add_argument("--allow-unverified", action="store_true",
                    help="write the report of a run that does not verify, stamped with what failed")
    rp.add_argument("--pdf", action="store_true", help="also print it to a PDF beside the HTML (Chromium, through "
                                                       "Playwright)")
    rp.add_argument("--chromium", help="the Chromium binary for --pdf (default: $RUNBOOK_CHROMIUM, else chromium "
                                       "on the PATH)")
    rp.set_defaults(func=_cmd_report)
    _add_person_commands(sub)
    cl = sub.add_parser("cleanup", help="destroy every resource labelled with a run's id, on the providers its "
                                        "params name (after Ctrl-C, a dead kernel, or to check nothing is left)")
    cl.add_argument("run_dir")
    cl.add_argument("--dry-run", action="store_true", help="list and show the destroy plans; destroy nothing")
    cl.add_argument("--project", help="project whose .runbook/ holds local state (default: found from run_dir)")
    cl.add_argument("--provider-fixtures", action="store_true", help="as for run")
    cl.set_defaults(func=_cmd_cleanup)
    rh = sub.add_parser("rehearse", help="run migrations end to end against loopback Runpod and Vast.ai simulators "
                                         "and a loopback S3 (declared overrides, evidence marked as a rehearsal)")
    rh.add_argument("params", nargs="*", default=list(REHEARSED),
                    help=f"migration YAMLs (default: {', '.join(REHEARSED)})")
    rh.add_argument("--faults", help="JSON file of scripted faults per simulator: {\"runpod\": {\"script\": ..., "
                                     "\"lies\": ..., \"limits\": ...}, \"vast\": {...}} (the simulate --faults shape, per provider)")
    rh.set_defaults(func=_cmd_rehearse)
    sm = sub.add_parser("simulate", help="serve a loopback simulator of a provider API until Ctrl-C, to rehearse "
                                         "your own params before spending money")
    sm.add_argument("provider", choices=list(simulated()))
    sm.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    sm.add_argument("--key", default="", help="the Bearer key it accepts (default: a new random one, printed)")
    sm.add_argument("--state", default=".runbook/simulator", help="where its machines keep disks and logs")
    sm.add_argument("--faults", help="JSON file of scripted faults: {\"script\": {operation: [answers]}, "
                                     "\"lies\": {offer_id: {field: value}}, \"limits\": {name: seconds}} (operations "
                                     "and answers: each simulator's SCRIPTS; limits: its LIMITS, runbook_lib/providers/<name>/sim.py)")
    sm.set_defaults(func=_cmd_simulate)
    _add_orchestrator_commands(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit code documented in the module docstring."""
    if not (sys.argv[1:] if argv is None else argv):  # `runbook` alone: what it does, not "required: cmd"
        build_parser().print_help()
        return EXIT_USAGE
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except RunbookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"error: {os_error_line(exc)}", file=sys.stderr)
        return os_error_exit(exc)
    except ValueError as exc:  # anything else unexpected: a failed run, not "NO-GO"
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:  # `runbook run` handles its own signals; this is any other command
        hint = f" `runbook cleanup {args.run_dir}` tears down what the run created" if getattr(args, "run_dir", "") else ""
        print(f"interrupted.{hint}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
