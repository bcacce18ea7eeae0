"""A team's own service, judged from outside over its own API (``workload.kind: service``).

Nothing of the runbook runs inside the service: a pod runs the image's own command (or, on the
embedded local provider and in rehearsals, a declared local command standing in for the image),
and every phase talks to it over its protocol from the runbook's host:

- :mod:`runbook_lib.service.protocols`: the clients (``openai-chat``, ``http-json``) and their
  per-request metrics;
- :mod:`runbook_lib.service.compare`: how an answer is compared with its golden answer;
- :mod:`runbook_lib.phases.service_pods`: launching a service pod, its readiness and what the provider
  reports about what it runs;
- :mod:`runbook_lib.service.samples`: the sample inputs.
"""
