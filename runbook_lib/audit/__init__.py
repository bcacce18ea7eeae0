"""The audit commands: a finished run checked again from its evidence alone.

- :mod:`.verify`: ``runbook verify``, the chain, the seal, its signature and its links;
- :mod:`.recompute`: ``runbook verify --recompute``, every gate verdict derived again from the
  raw evidence by the functions the phases used.

High in the layers, because recomputing a verdict calls the phases' own judging code; the
format they check is :mod:`runbook_lib.evidence`.
"""
