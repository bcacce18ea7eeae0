"""Running a migration: the phases executed as notebooks, one host at a time, stopped cleanly.

- :mod:`.runner`: ``runbook run`` and ``runbook phase``: each phase's notebook executed with
  papermill, its provenance, the credential scan, the seal;
- :mod:`.phase_notebooks`: which notebook runs each phase, and ``runbook init``;
- :mod:`.hostlock`: one timed phase at a time on a machine, and who holds the lock;
- :mod:`.interrupt`: Ctrl-C, SIGTERM and SIGHUP during a run;
- :mod:`.cleanup`: tearing down what a run created, found by the run's label;
- :mod:`.rehearse`: a real migration's params run against the loopback simulators.
"""
