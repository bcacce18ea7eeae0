"""The evidence format: what a run directory holds and how a reader checks it.

Low in the layers (above the params, the gates and the measurements it records; below every
workload, provider and phase), so every part of the runbook that writes or reads evidence uses
one definition of it:

- :mod:`.manifest`: phase records chained by sha256, the manifest and the completion marker;
- :mod:`.closedworld`: the rule for every file of a sealed run, and the links written after it;
- :mod:`.signing`: signing and checking a sealed run (TUF's ``securesystemslib``);
- :mod:`.rundir`: a run directory's lifecycle (created, opened by each phase, sealed);
- :mod:`.records`: the typed records between phases, the receipt and the manifest;
- :mod:`.approvals`: plans approved before anything remote is created, changed or destroyed;
- :mod:`.seal`: the receipt and the seal a run ends with;
- :mod:`.resolve`: a person's decision on a HOLD, kept as a sealed link;
- :mod:`.auditpage` and :mod:`.report`: the report an auditor reads.

The commands that check evidence again from outside a run are in :mod:`runbook_lib.audit`.
"""
