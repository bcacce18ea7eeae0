"""Approval records: who approved which plan (by fingerprint), when, and how.

Nothing blocks waiting for a click in a headless run. Interactively a widget button writes the
record (:func:`approval_widget`; the kernel handles the click between cells, and the next cell
finds the record); headlessly the same cell shows what will approve the plan, and the record
comes from params (``approvals.preapproved_local`` for the embedded local provider) or from an
approval file. A missing or mismatched record raises :class:`ApprovalRequired` (HOLD).
"""

from __future__ import annotations

import getpass
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence, TypedDict

from runbook_lib._time import utc_now
from runbook_lib.errors import ApprovalRequired, UsageError
from runbook_lib.evidence.closedworld import read_json_object
from runbook_lib.evidence.manifest import sha256_file, write_json_atomic
from runbook_lib.evidence.records import read_unchecked
from runbook_lib.evidence.signing import record_envelope, sign_record
from runbook_lib.evidence.text import MAX_REASON, checked_text

ALTERNATE_ACTION = "use_alternate"
"""The action of a plan that proves a documented alternate in place of the target
(:func:`runbook_lib.phases.candidates.proposal`)."""
REASON_ACTIONS = (ALTERNATE_ACTION,)
"""Plan actions only an approval that gives a reason covers: they change where the workload runs
(seed 001: "delay or approve a documented alternate; do not weaken constraints silently")."""


@dataclass(frozen=True)
class Approval:
    """An approval of one plan. ``fingerprint`` is :attr:`Plan.fingerprint`; ``reason`` is why,
    as the approver wrote it (``runbook approve --reason``; a documented alternate needs one)."""

    fingerprint: str
    approved_by: str
    approved_at: str
    method: str  # "params:preapproved_local", "file:<path>", "widget"
    reason: str = ""


def _record_dir(run_dir: str | Path) -> Path:
    d = Path(run_dir) / "approvals"
    d.mkdir(parents=True, exist_ok=True)
    return d


def record(run_dir: str | Path, approval: Approval, plan: Any) -> Path:
    """Write the approval next to the plan it approves: ``approvals/<fingerprint[:16]>.json``,
    unless the same plan's approval is on record already (its first record stands: a sealed
    record is never rewritten, and ``runbook cleanup`` destroying what an interrupted teardown
    approved adds nothing).
    An approval from a file its author signed (``runbook approve --key``: the envelope beside it,
    :func:`runbook_lib.evidence.signing.record_envelope`) keeps a copy of both in the run
    (``approvals/signed-<sha256[:16]>.json`` and ``.dsse.json``), named in the record as
    ``signed_file``, so the signature travels with the evidence."""
    path = _record_dir(run_dir) / f"{approval.fingerprint[:16]}.json"
    body: dict[str, Any] = {"approval": asdict(approval), "plan": plan.to_dict()}
    if path.is_file() and ((read_json_object(path) or {}).get("plan") or {}).get("fingerprint") == plan.fingerprint:
        return path  # the same plan approved before in this run: that record stands (evidence is only added to)
    source = Path(approval.method[len("file:"):]) if approval.method.startswith("file:") else None
    if source is not None and source.is_file() and record_envelope(source).is_file():
        kept = _record_dir(run_dir) / f"signed-{sha256_file(source)[:16]}.json"
        if not kept.exists():
            write_json_atomic(kept, json.loads(source.read_text()))
            write_json_atomic(record_envelope(kept), json.loads(record_envelope(source).read_text()))
        body["signed_file"] = kept.name
    write_json_atomic(path, body)
    return path


RUN_TEARDOWN = "teardown of a resource this run created under an approved launch"


def run_teardown(plan: Any, run_dir: str | Path, *, method: str = RUN_TEARDOWN) -> Approval:
    """The approval of destroying a resource the run itself created (its ``run_id`` label): covered
    by the approval of the launch that created it, since a destroy plan's fingerprint names an id
    nobody can know in advance and tearing down only stops spending. Recorded like any other."""
    a = Approval(plan.fingerprint, "runbook", utc_now(), method)
    record(run_dir, a, plan)
    return a


def replacement(plan: Any, *, of: Any, approval: Approval, run_dir: str | Path) -> Approval:
    """The approval of ``plan``, a replacement for a machine the provider interrupted: the launch
    ``of`` (approved as ``approval``) with the same spec on the ranked offers it had not yet
    tried. It is covered by that approval: same command, image, labels and price bound, on offers
    the approver already saw, one machine at a time. Recorded like any other.

    Raises:
        ApprovalRequired: ``plan`` differs from ``of`` in more than its offers (nothing is created).
    """
    if plan.spec is None or of.spec is None or replace(plan.spec, offers=of.spec.offers) != of.spec \
            or not set(plan.spec.offers) <= set(of.spec.offers):
        raise ApprovalRequired(f"plan {plan.fingerprint[:16]} is not a replacement of approved plan "
                               f"{of.fingerprint[:16]} (it changes more than the offers left to try); approve it "
                               "on its own")
    a = Approval(plan.fingerprint, approval.approved_by, utc_now(),
                 f"replacement of an interrupted machine under approved plan {of.fingerprint[:16]} "
                 f"({approval.method}), on its untried offers")
    record(run_dir, a, plan)
    return a


class ApprovalTerms(TypedDict):
    """What decides whether a plan is approved, as :func:`require`, :func:`require_all` and
    :func:`approval_widget` take it: the run directory (its approval records), whether local
    plans are preapproved, and the approval file (empty: none)."""

    run_dir: str | Path
    preapproved_local: bool
    approval_file: str


def require(plan: Any, *, run_dir: str | Path, preapproved_local: bool, approval_file: str = "",
            simulator: str = "") -> Approval:
    """Find the approval for ``plan`` or stop.

    Order: an existing record in the run directory (a widget click), params pre-approval (for
    the ``local`` provider; or, given ``simulator``, the name a pre-approved simulator gave for
    the plan's provider API), then ``approval_file`` (JSON with a ``fingerprints`` list,
    ``approved_by`` and ``approved_at``).

    Raises:
        ApprovalRequired: no record names this plan's fingerprint; the message says what to approve.
    """
    found = _lookup(plan, run_dir=run_dir, preapproved_local=preapproved_local, approval_file=approval_file,
                    simulator=simulator)
    if found is None:
        write_json_atomic(_record_dir(run_dir) / f"pending-{plan.fingerprint[:16]}.json", {"plan": plan.to_dict()})
        raise ApprovalRequired(
            f"plan {plan.action} {plan.target!r} on provider {plan.provider!r} (fingerprint "
            f"{plan.fingerprint}) has no approval record. Approve it in the notebook, or add the "
            "fingerprint to an approval file named by approvals.approval_file (`runbook approve "
            f"reports/{Path(run_dir).name} --by NAME` writes one from this run's plans), then run again."
        )
    approval, recorded = found
    if not recorded:
        record(run_dir, approval, plan)
    # A plan that once stopped the phase for want of approval waits no longer.
    (_record_dir(run_dir) / f"pending-{plan.fingerprint[:16]}.json").unlink(missing_ok=True)
    return approval


def require_all(plans: Sequence[Any], *, run_dir: str | Path, preapproved_local: bool, approval_file: str = "",
                simulators: dict[str, str] | None = None) -> None:
    """Check that every plan in ``plans`` is approved (:func:`require`'s order), writing no record:
    each plan's record is written when it is applied. Every plan found waiting gets its pending
    file, so one ``runbook approve`` (or one click on the approval cell) covers them all.
    ``simulators``: per fingerprint, the name a pre-approved simulator gave (see :func:`require`).

    Raises:
        ApprovalRequired: one or more plans are waiting; the message counts and lists them.
    """
    sims = simulators or {}
    waiting = []
    for p in plans:
        pending = _record_dir(run_dir) / f"pending-{p.fingerprint[:16]}.json"
        if _lookup(p, run_dir=run_dir, preapproved_local=preapproved_local, approval_file=approval_file,
                   simulator=sims.get(p.fingerprint, "")) is None:
            waiting.append(p)
            write_json_atomic(pending, {"plan": p.to_dict()})
        else:  # approved, whether or not the step ends up applying it (a conditional extra round)
            pending.unlink(missing_ok=True)
    if waiting:
        listed = "; ".join(f"{p.action} {p.target!r} on {p.provider!r} ({p.fingerprint[:16]})" for p in waiting[:6])
        more = f"; and {len(waiting) - 6} more" if len(waiting) > 6 else ""
        raise ApprovalRequired(
            f"{len(waiting)} of the {len(plans)} plans this step applies have no approval record ({listed}{more}); "
            "nothing was created. Approve them in the notebook's approval cell, or run `runbook approve "
            f"reports/{Path(run_dir).name} --by NAME` and pass the file it writes as approvals.approval_file "
            "(or --approval-file), then run again."
        )


def find(plan: Any, *, run_dir: str | Path, approval_file: str = "", preapproved_local: bool = False,
         simulator: str = "", with_reason: bool = False) -> Approval | None:
    """What approves ``plan`` in :func:`require`'s order, writing nothing: a person's approval (a
    record in the run, else the approval file), or, when given, the params' pre-approvals. None
    when nothing does. ``with_reason``: only a person's approval that gives a reason counts (a
    record without one, such as an Approve click, does not hide an approval file that gives one)."""
    found = _lookup(plan, run_dir=run_dir, preapproved_local=preapproved_local, approval_file=approval_file,
                    simulator=simulator, with_reason=with_reason)
    return found[0] if found is not None else None


def _lookup(plan: Any, *, run_dir: str | Path, preapproved_local: bool, approval_file: str,
            simulator: str, with_reason: bool = False) -> tuple[Approval, bool] | None:
    """What approves ``plan``, in :func:`require`'s order, writing nothing: the approval and
    whether its record already exists; None when nothing does. ``with_reason``: :func:`find`'s."""
    existing = _record_dir(run_dir) / f"{plan.fingerprint[:16]}.json"
    if existing.exists():
        a = json.loads(existing.read_text())["approval"]
        if a["fingerprint"] == plan.fingerprint and (a.get("reason") or not with_reason):
            return Approval(**a), True
    if with_reason:
        preapproved_local, simulator = False, ""  # a pre-approval gives no reason
    if preapproved_local and plan.provider == "local":
        return Approval(plan.fingerprint, "params", utc_now(), "params:approvals.preapproved_local"), False
    if simulator and plan.provider != "local":
        return Approval(plan.fingerprint, "params", utc_now(),
                        f"params:approvals.preapproved_simulator (the {plan.provider} API is the {simulator} "
                        "simulator)"), False
    if approval_file:
        p = Path(approval_file)
        if p.exists():
            body = json.loads(p.read_text())
            if plan.fingerprint in body.get("fingerprints", []) and (body.get("reason") or not with_reason):
                return Approval(plan.fingerprint, str(body.get("approved_by", "?")),
                                str(body.get("approved_at", utc_now())), f"file:{p}", str(body.get("reason") or "")), False
    return None


def plans_awaiting(run_dir: str | Path) -> list[dict[str, Any]]:
    """Plans a run showed but did not apply: dry-run plans in its phase records and plans that
    stopped a phase for want of an approval (``approvals/pending-*.json``), one per fingerprint."""
    run_dir = Path(run_dir)
    found: dict[str, dict[str, Any]] = {}
    for data in read_unchecked(run_dir).all_data():
        for p in data.plans:
            if not p.applied:
                found.setdefault(p.plan["fingerprint"], p.plan)
    for f in sorted((run_dir / "approvals").glob("pending-*.json")):
        plan = json.loads(f.read_text())["plan"]
        found.setdefault(plan["fingerprint"], plan)
    return list(found.values())


def write_approval_file(run_dir: str | Path, out: str | Path, *, approved_by: str, signer: Any = None,
                        reason: str = "") -> dict[str, Any]:
    """Approve every plan :func:`plans_awaiting` finds in ``run_dir``: write the approval file
    (``fingerprints``, ``approved_by``, ``approved_at``, ``reason`` when given, and a summary of
    each plan) to ``out``;
    with ``signer`` (the approver's key, :func:`runbook_lib.evidence.signing.load_signer`), also its
    signature beside it (:func:`runbook_lib.evidence.signing.sign_record`).

    Raises:
        UsageError: no plan is waiting, or no approver is named.
    """
    if not approved_by.strip():
        raise UsageError("--by NAME is required: an approval names the person who approved")
    plans = plans_awaiting(run_dir)
    if not plans:
        raise UsageError(f"{Path(run_dir).name} shows no plan waiting for approval (nothing was dry-run or held)")
    body = {"approved_by": approved_by, "approved_at": utc_now(), **({"reason": reason.strip()} if reason.strip() else {}),
            "run_reviewed": Path(run_dir).name,
            "fingerprints": [p["fingerprint"] for p in plans],
            "plans": [{k: p[k] for k in ("fingerprint", "provider", "action", "target", "cost_usd_per_hour")}
                      | {"offers": list((p.get("spec") or {}).get("offers") or []),
                         "image": (p.get("spec") or {}).get("image", "")} for p in plans]}
    write_json_atomic(Path(out), body)
    if signer is not None:
        sign_record(Path(out), signer, kind="approval")
    else:
        record_envelope(Path(out)).unlink(missing_ok=True)  # a signature of an earlier file would not be this one's
    return body


def standing(plan: Any, *, run_dir: str | Path, preapproved_local: bool, approval_file: str = "",
             preapproved_simulator: bool = False) -> str:
    """What approves ``plan`` right now, as one line of text, without writing anything: an
    existing record (who, when, how), the params pre-approval that :func:`require` will record,
    an approval file that lists it, or what is missing and how to give it. The same order as
    :func:`require`."""
    summary = f"{plan.action} {plan.target!r} on {plan.provider!r} (plan {plan.fingerprint[:16]})"
    if plan.action in REASON_ACTIONS:
        found = _lookup(plan, run_dir=run_dir, preapproved_local=False, approval_file=approval_file, simulator="",
                        with_reason=True)
        if found is not None:
            a = found[0]
            return f"Approved: {summary} by {a.approved_by} at {a.approved_at} ({a.method}); reason: {a.reason}."
        return (f"Awaiting approval with a reason: {summary}. Only a person's approval that says why covers it: type "
                f"the reason in the box and click Approve in JupyterLab, or run `runbook approve reports/"
                f"{Path(run_dir).name} --by NAME --reason TEXT`.")
    # The simulator pre-approval depends on what the provider's API answers when the plan is
    # applied, so it is looked up without it and said conditionally, in require's order.
    found = _lookup(plan, run_dir=run_dir, preapproved_local=preapproved_local, approval_file=approval_file,
                    simulator="")
    if found is not None and found[1]:
        a = found[0]
        return f"Approved: {summary} by {a.approved_by} at {a.approved_at} ({a.method})."
    if found is not None and found[0].method == "params:approvals.preapproved_local":
        return f"Approved by params: {summary} (approvals.preapproved_local, the embedded local provider)."
    if preapproved_simulator and plan.provider != "local":
        return (f"Approved by params if the {plan.provider} API says it is a loopback simulator: {summary} "
                "(approvals.preapproved_simulator; a real API never says so).")
    if found is not None:
        a = found[0]
        return f"Approved by file {Path(approval_file).name}: {summary} by {a.approved_by} at {a.approved_at}."
    return (f"Awaiting approval: {summary}. Nothing is created until a person approves: click Approve in "
            f"JupyterLab, or run `runbook approve reports/{Path(run_dir).name} --by NAME` and pass the file it "
            "writes as approvals.approval_file (or --approval-file). Without one, applying the plan stops the "
            "phase with HOLD.")


class ApprovalPanel:
    """The approval cell's output (interactive and headless alike) for the plans one step applies.

    Shown as static text (``text/plain`` and ``text/html``), one line per plan saying what
    approves it (:func:`standing`). In an interactive session with any plan still waiting, it also
    shows one Approve button; a click writes an approval record for every waiting plan (method
    ``widget``, the session's user) and replaces the whole output with static text naming who
    approved and when, so a saved or exported notebook says so without any widget or script. A
    headless run shows the text only. A step that applies no plan shows that nothing needs approval.
    """

    def __init__(self, plans: Sequence[Any], *, run_dir: str | Path, interactive: bool, lines: Sequence[str]) -> None:
        self.plans, self.run_dir, self.interactive = tuple(plans), Path(run_dir), interactive
        self.lines = list(lines) or ["Nothing to approve: this step creates, changes and destroys nothing."]
        self.approvals: list[Approval] = []

    @property
    def text(self) -> str:
        """The panel's lines as plain text (one per plan)."""
        return "\n".join(self.lines)

    @property
    def waiting(self) -> list[Any]:
        """The plans no approval covers yet."""
        return [p for p, line in zip(self.plans, self.lines, strict=False) if line.startswith("Awaiting approval")]

    @staticmethod
    def static_forms(text: str) -> dict[str, str]:
        """``text/plain`` and ``text/html`` forms of ``text`` (escaped; per line, the state before
        the first colon in bold, marked green when approved, amber otherwise)."""
        import html

        paras = []
        for line in text.splitlines() or [""]:
            state = line.split(":", 1)[0]
            colour = "#1a7f37" if state.startswith("Approved") or state.startswith("Nothing to approve") else "#9a6700"
            rest = html.escape(line.split(":", 1)[1]) if ":" in line else ""
            paras.append(f'<p style="border-left:4px solid {colour};padding-left:8px"><b>{html.escape(state)}</b>:{rest}</p>')
        return {"text/plain": text, "text/html": "".join(paras)}

    @property
    def asks_reason(self) -> bool:
        """A waiting plan is one only an approval with a reason covers (:data:`REASON_ACTIONS`)."""
        return any(p.action in REASON_ACTIONS for p in self.waiting)

    def click(self, by: str | None = None, reason: str = "") -> list[Path]:
        """What the Approve button does: write an approval record for each waiting plan, with the
        reason typed beside it; returns their paths. A plan only an approval with a reason covers
        (:data:`REASON_ACTIONS`) stays waiting while the reason is empty.

        Raises:
            UsageError: the reason holds a control character or is too long (:func:`checked_text`);
                nothing is written.
        """
        why = checked_text(reason, what="the reason", max_len=MAX_REASON).strip()
        who, at = by or getpass.getuser(), utc_now()
        paths = []
        for i, (plan, line) in enumerate(zip(self.plans, self.lines, strict=False)):
            if not line.startswith("Awaiting approval"):
                continue
            if plan.action in REASON_ACTIONS and not why:
                self.lines[i] = (f"Awaiting approval with a reason: {plan.action} {plan.target!r} (plan "
                                 f"{plan.fingerprint[:16]}) was not approved: type why in the reason box, then click "
                                 "Approve.")
                continue
            a = Approval(plan.fingerprint, who, at, "widget", why)
            path = record(self.run_dir, a, plan)
            self.approvals.append(a)
            paths.append(path)
            self.lines[i] = (f"Approved: {plan.action} {plan.target!r} on {plan.provider!r} (plan "
                             f"{plan.fingerprint[:16]}) by {who} at {at} (widget click; record approvals/{path.name})"
                             + (f"; reason: {why}." if why else "."))
        return paths

    def _ipython_display_(self) -> None:  # pragma: no cover - needs a kernel with a frontend
        from IPython.display import DisplayHandle

        handle = DisplayHandle()
        waiting = self.waiting
        if not self.interactive or not waiting:
            handle.display(self.static_forms(self.text), raw=True)
            return
        import ipywidgets as widgets

        first = waiting[0]
        label = (f"Approve {first.action} {first.target}" if len(waiting) == 1 else
                 f"Approve {len(waiting)} plans")
        button = widgets.Button(description=label, button_style="warning",
                                tooltip=", ".join(p.fingerprint[:16] for p in waiting),
                                layout=widgets.Layout(width="auto"))
        reason = widgets.Text(placeholder="reason (required to use an alternate)" if self.asks_reason else
                              "reason (optional)", description="Reason:", layout=widgets.Layout(width="60%"))

        def _on_click(_: Any) -> None:
            try:
                self.click(reason=reason.value)
            except UsageError as exc:  # said under the box, nothing written
                text.value = self.static_forms(f"{self.text}\nNot approved: {exc}")["text/html"]
                return
            if not self.waiting:
                handle.update(self.static_forms(self.text), raw=True)  # the panel gives way to static text
            else:
                text.value = self.static_forms(self.text)["text/html"]  # what still waits, and why

        button.on_click(_on_click)
        static = self.static_forms(self.text)
        text = widgets.HTML(static["text/html"])
        panel = widgets.VBox([text, reason, button])
        # Where widgets render (JupyterLab) the panel shows; elsewhere (a saved notebook without
        # widget state, an HTML export) the same text shows from the static forms.
        handle.display({**(panel._repr_mimebundle_() or {}), **static}, raw=True)


def approval_widget(plans: Any, *, run_dir: str | Path, interactive: bool = True, preapproved_local: bool = False,
                    approval_file: str = "", preapproved_simulator: bool = False) -> ApprovalPanel:
    """The approval cell's output for ``plans`` (one plan or a sequence): an :class:`ApprovalPanel`
    holding :func:`standing`'s line for each, with one Approve button when ``interactive`` and
    any plan is still waiting."""
    seq = tuple(plans) if isinstance(plans, (list, tuple)) else (plans,)
    return ApprovalPanel(seq, run_dir=run_dir, interactive=interactive,
                         lines=[standing(p, run_dir=run_dir, preapproved_local=preapproved_local,
                                         approval_file=approval_file, preapproved_simulator=preapproved_simulator)
                                for p in seq])
