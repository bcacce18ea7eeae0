"""What each phase notebook does, as library calls the notebooks stay thin around.

A notebook opens its phase with :func:`open_phase` (opens the run, verifies the records of the
phases before it), calls its phase module's steps (``freeze``, ``mapping``, ``parity``,
``compare``, ``cutover``, ``decide``), each of which returns a typed result that displays
itself, and closes with :func:`finish`, which writes the chained record from the result's
:meth:`PhaseResult.record`. Every code cell is one call and one display.

The shared parts: :mod:`.context` (the :class:`PhaseContext` a phase works in, opened by
:func:`open_phase`), :mod:`.evidence` (files, plans and gates of a phase), :mod:`.resources`
(providers and the plans that rent and release; their collaborators :mod:`.offerbook` and
:mod:`.access`), :mod:`.agents` (agent pods run to their end) and :mod:`.endpoints`
(serving endpoints), :mod:`.results` (result types and display) and :mod:`.schedules` (the
source's schedules, read in 01, mapped in 02, moved in 05, restored in 06) and :mod:`.candidates`
(the target's documented alternates, proposed in 03 when a candidate has no capacity).
"""

from runbook_lib.phases.access import POD_TIMEOUT_S
from runbook_lib.phases.agents import AgentRun, Agents
from runbook_lib.phases.context import PhaseContext, check_credentials, leak_message, open_phase, scan_phase
from runbook_lib.phases.endpoints import Endpoints
from runbook_lib.phases.evidence import Evidence
from runbook_lib.phases.resources import Resources
from runbook_lib.phases.results import Finished, PhaseResult, PlanShown, Shown, approval_widget, finish, md, table

__all__ = [
    "POD_TIMEOUT_S", "AgentRun", "Agents", "Endpoints", "Evidence", "Finished", "PhaseContext", "PhaseResult",
    "PlanShown", "Resources", "Shown",
    "approval_widget", "check_credentials", "finish", "leak_message", "md", "open_phase", "scan_phase", "table",
]
