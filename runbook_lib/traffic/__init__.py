"""Moving traffic during a cutover.

- :mod:`.router`: the routers that split one front URL between the source and the target
  (HAProxy over its runtime API, or the user's own commands);
- :mod:`.replay`: the open-loop replay phase 05 sends through a router, from its own process;
- :mod:`.route`: the share of traffic on the target, persisted with its history so phase 06
  can restore the source route.
"""
