"""Provider registry: one package per provider, listed in :data:`runbook_lib.params.PROVIDER_TABLE`
(which also gives each provider its params model), imported lazily.

Adding a provider: one package with a ``create(**kwargs)`` factory, one table row, its fixtures
(``GUIDE.md`` in this directory).
"""

from __future__ import annotations

import importlib
import os
from types import MappingProxyType
from typing import Any

from runbook_lib.errors import ProviderError
from runbook_lib.params import PROVIDER_TABLE, REMOTE_PROVIDERS
from runbook_lib.providers.base import Provider

PROVIDERS = MappingProxyType({e.name: e.adapter for e in PROVIDER_TABLE})
"""Registry name -> adapter module path (from the provider table). Read-only."""


REMOTE = REMOTE_PROVIDERS
"""Registry names of the providers that rent real machines (dry-run by default, keys needed)."""


def create_provider(name: str, **kwargs: Any) -> Provider:
    """Build the provider registered as ``name``.

    With ``RUNBOOK_PROVIDER_FIXTURES`` set (the documented test option ``runbook run
    --provider-fixtures``), remote providers talk to the recorded-shape fixture APIs in
    :mod:`runbook_lib.providers.fixtures` instead of the network, with the fixture key.

    Raises:
        ProviderError: unknown name (the message lists the valid ones).
    """
    try:
        module = PROVIDERS[name]
    except KeyError:
        raise ProviderError(f"unknown provider {name!r}; known providers: {sorted(PROVIDERS)}") from None
    if name in REMOTE and os.environ.get("RUNBOOK_PROVIDER_FIXTURES"):
        from runbook_lib.providers import fixtures
        from runbook_lib.providers.api import KeySource

        kwargs.setdefault("transport", fixtures.transport_from_env(name))
        kwargs.setdefault("key", KeySource(name, ("fixture mode (no key)",), _value=fixtures.FIXTURE_KEY))
        kwargs.setdefault("poll_s", 0.05)  # the fake APIs answer at once
    if name in REMOTE and kwargs.get("profile") is not None:
        kwargs.setdefault("poll_s", kwargs["profile"].poll_s)  # the profile's status poll interval
    prov = importlib.import_module(module).create(**kwargs)
    if not isinstance(prov, Provider):
        raise ProviderError(f"{module}.create returned {type(prov).__name__}, not a Provider")
    return prov
