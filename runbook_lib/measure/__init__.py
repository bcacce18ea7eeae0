"""What is measured, and what it costs.

- :mod:`.timing`: open-loop load against an endpoint, saturation throughput, job timing and
  the raw samples every summary is computed from;
- :mod:`.cost`: price x billed time, storage and egress, cost per accepted unit, the spend meter.

The gates that judge these figures are :mod:`runbook_lib.gates`; the records that keep them,
:mod:`runbook_lib.evidence.records`.
"""
