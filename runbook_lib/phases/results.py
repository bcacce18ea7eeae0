"""What a phase's steps return, and how a notebook shows it: typed results that display
themselves, a plan shown before its approval, and the written record."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence

from runbook_lib.errors import EvidenceError
from runbook_lib.evidence import approvals, report
from runbook_lib.evidence.cells import readable_frame
from runbook_lib.evidence.manifest import Record
from runbook_lib.evidence.records import PhaseData
from runbook_lib.gates import GateResult
from runbook_lib.phases.context import PhaseContext
from runbook_lib.providers.base import Plan


class Shown(ABC):
    """A step's result a notebook displays as is (IPython calls ``_ipython_display_``): its
    :meth:`parts`, in order."""

    @abstractmethod
    def parts(self) -> list[Any]:
        """What a notebook shows, in order: Markdown, DataFrames, Stylers, figures."""

    def _ipython_display_(self) -> None:
        from IPython.display import display

        for part in self.parts():
            bundle = table_bundle(part)
            display(part if bundle is None else bundle, raw=bundle is not None)


def table_bundle(part: Any) -> dict[str, str] | None:
    """A DataFrame as the notebook shows it: HTML and text without row numbers (they are not
    evidence), but with row labels kept: a table built from a dict (cost at traffic per side, the
    declared requirements) keeps its labels in the index, which becomes a labelled first column
    (named by the index, else ``item``); an unnamed integer index is row numbers and is dropped.
    Cells read as words and units (:func:`runbook_lib.evidence.cells.readable_frame`). None for
    anything else, displayed as it is."""
    import pandas as pd

    if not isinstance(part, pd.DataFrame):
        return None
    labelled = any(n is not None for n in part.index.names) or not pd.api.types.is_integer_dtype(part.index.dtype)
    if labelled:  # an unnamed integer index is row numbers (a filtered table keeps its old ones): dropped
        names = [n or ("item" if len(part.index.names) == 1 else f"item {i + 1}")
                 for i, n in enumerate(part.index.names)]
        part = part.rename_axis(names).reset_index()
    part = readable_frame(part)  # money, times, flags and missing values as an auditor reads them
    return {"text/html": part.to_html(index=False), "text/plain": part.to_string(index=False)}


class PhaseResult(Shown):
    """What a phase's main step returns: a frozen dataclass whose fields are typed, shown as
    :class:`Shown`, and whose :meth:`record` is the phase's record model
    (:data:`runbook_lib.evidence.records.MODELS`), written into the phase record."""

    @abstractmethod
    def record(self) -> PhaseData:
        """The phase's record data."""


def md(text: str) -> Any:
    """IPython Markdown for a result's display (IPython imported only when displaying)."""
    from IPython.display import Markdown

    return Markdown(text)


def table(rows: Any, **kwargs: Any) -> Any:
    """A pandas DataFrame of ``rows``: a sequence of records (dicts, or record models from
    :mod:`runbook_lib.evidence.records`, shown by their field aliases), a dict of columns, or a mapping
    shown as one column."""
    import pandas as pd
    from pydantic import BaseModel

    if isinstance(rows, (list, tuple)):
        rows = [r.model_dump(by_alias=True) if isinstance(r, BaseModel) else r for r in rows]
    return pd.DataFrame(rows, **kwargs)


@dataclass(frozen=True)
class PlanShown:
    """The plans one step will apply, as a notebook shows them before its approval cell: one row
    per plan (provider, action, target, USD per hour, fingerprint; ``side`` and ``when`` where
    given) and the ranked offers a remote launch tries in order. ``note`` says what the step
    rents, or that it rents nothing new.

    Attributes:
        plans: the plans, in the order the step applies them.
        sides: the side of each plan (``source`` or ``target``), same order, or empty.
        when: per plan, when it is applied (``always``, or the condition), or empty.
        note: one Markdown line shown above the table.
    """

    plans: tuple[Plan, ...]
    sides: tuple[str, ...] = ()
    when: tuple[str, ...] = ()
    note: str = ""

    @classmethod
    def of(cls, pairs: Sequence[tuple[str, Plan]] | Sequence[tuple[str, Plan, str]], note: str = "") -> PlanShown:
        """From ``(side, plan)`` or ``(side, plan, when)`` tuples, as the phases build them."""
        return cls(tuple(t[1] for t in pairs), tuple(t[0] for t in pairs),
                   tuple(t[2] if len(t) > 2 else "always" for t in pairs), note)

    @property
    def plan(self) -> Plan:
        """The single plan of a one-plan step.

        Raises:
            EvidenceError: the step applies no plan or more than one.
        """
        if len(self.plans) != 1:
            raise EvidenceError(f"this step applies {len(self.plans)} plans, not one; use .plans")
        return self.plans[0]

    def _repr_html_(self) -> str:
        import html

        rows = []
        for i, p in enumerate(self.plans):
            d = {"side": self.sides[i] if self.sides else "", **p.to_dict()}
            d.pop("spec")
            if self.when:
                d["applied"] = self.when[i]
            d["offers tried in order"] = ", ".join(getattr(p.spec, "offers", ()) or ())
            rows.append(d)
        head = f"<p>{html.escape(self.note)}</p>" if self.note else ""
        if not rows:
            return head or "<p>This step applies no plan.</p>"
        return head + str(readable_frame(table(rows)).to_html(index=False))


@dataclass(frozen=True)
class Finished:
    """A phase's written record, with the gates it judged (shown as a verdict table)."""

    record: Record
    gates: tuple[GateResult, ...]

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if self.gates:
            display(report.gates_table(self.gates))
        prev = self.record.body["prev_sha256"][:16]
        display(md(f"Record `{self.record.path.name}` · sha256 `{self.record.sha256}` · previous `{prev}…`"))


def approval_widget(ctx: PhaseContext, plan: PlanShown | Plan) -> approvals.ApprovalPanel:
    """The approval cell for ``plan`` (a plan, or a step's :class:`PlanShown`;
    :class:`runbook_lib.evidence.approvals.ApprovalPanel`): what approves each plan, as static text;
    interactively, with one Approve button while any plan waits. A headless run
    shows the text and never waits: the next cell applies the plan or stops with HOLD."""
    return approvals.approval_widget(plan.plans if isinstance(plan, PlanShown) else plan,
                                     interactive=ctx.run_mode == "interactive", **ctx.resources.approval_terms(),
                                     preapproved_simulator=ctx.mig.approvals.preapproved_simulator)


def finish(ctx: PhaseContext, result: PhaseResult) -> Finished:
    """Write the phase's record from ``result.record()`` (see :meth:`PhaseContext.finish`)."""
    return Finished(ctx.finish(result.record()), tuple(ctx.evidence.gates))
