"""What a phase's steps return, and how a notebook shows it: typed results that display
themselves, a plan shown before its approval, and the written record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runbook_lib import approvals, report
from runbook_lib.gates import GateResult
from runbook_lib.manifest import Record
from runbook_lib.phases.context import PhaseContext
from runbook_lib.providers.base import Plan


class PhaseResult:
    """What a phase's main step returns: a frozen dataclass whose fields are typed, which a
    notebook displays as is (IPython calls ``_ipython_display_``) and whose :meth:`record` is the
    data written into the phase record (JSON-serialisable)."""

    def record(self) -> dict[str, Any]:
        raise NotImplementedError

    def parts(self) -> list[Any]:
        """What a notebook shows, in order: Markdown, DataFrames, Stylers, figures."""
        raise NotImplementedError

    def _ipython_display_(self) -> None:
        from IPython.display import display

        for part in self.parts():
            display(part)


def md(text: str) -> Any:
    """IPython Markdown for a result's display (IPython imported only when displaying)."""
    from IPython.display import Markdown

    return Markdown(text)


def table(rows: Any, **kwargs: Any) -> Any:
    """A pandas DataFrame of ``rows`` (records, a dict of columns, or a mapping shown as one column)."""
    import pandas as pd

    return pd.DataFrame(rows, **kwargs)


@dataclass(frozen=True)
class PlanShown:
    """A launch plan as a notebook shows it before its approval cell: the plan, its fingerprint,
    and the ranked offers a remote launch tries in order."""

    plan: Plan

    def _repr_html_(self) -> str:
        d = self.plan.to_dict()
        d.pop("spec")
        offers = list(getattr(self.plan.spec, "offers", ()) or ())
        head = table([d]).to_html(index=False)
        return head + (f"<p>ranked offers tried in order: {', '.join(offers)}</p>" if offers else "")


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
    """The approval cell for ``plan`` (:class:`runbook_lib.approvals.ApprovalPanel`): what approves
    it, as static text; interactively, with an Approve button while nothing does. A headless run
    shows the text and never waits: the next cell applies the plan or stops with HOLD."""
    a = ctx.mig.approvals
    return approvals.approval_widget(plan.plan if isinstance(plan, PlanShown) else plan, run_dir=ctx.run_dir,
                                     interactive=ctx.run_mode == "interactive",
                                     preapproved_local=a.preapproved_local,
                                     approval_file=ctx.approval_ref or a.approval_file,
                                     preapproved_simulator=a.preapproved_simulator)


def finish(ctx: PhaseContext, result: PhaseResult) -> Finished:
    """Write the phase's record from ``result.record()`` (see :meth:`PhaseContext.finish`)."""
    return Finished(ctx.finish(result.record()), tuple(ctx.evidence.gates))
