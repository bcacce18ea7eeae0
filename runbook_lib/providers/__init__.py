"""Provider registry: one module per provider, named in one read-only table, imported lazily.

Adding a provider means one module with a ``create(**kwargs)`` factory and one line here.
"""

from __future__ import annotations

import importlib
import os
from types import MappingProxyType
from typing import Any

from runbook_lib.errors import ProviderError
from runbook_lib.params import REMOTE_PROVIDERS
from runbook_lib.providers.base import Provider

PROVIDERS = MappingProxyType({
    "local": "runbook_lib.providers.local",
    "runpod": "runbook_lib.providers.runpod",
    "vast": "runbook_lib.providers.vast",
})
"""Registry name -> module path. Read-only; tests build their own providers directly."""


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
        from runbook_lib.providers._http import KeySource

        kwargs.setdefault("transport", fixtures.transport_from_env(name))
        kwargs.setdefault("key", KeySource(name, ("fixture mode (no key)",), _value=fixtures.FIXTURE_KEY))
        kwargs.setdefault("poll_s", 0.05)  # the fake APIs answer at once
    prov = importlib.import_module(module).create(**kwargs)
    if not isinstance(prov, Provider):
        raise ProviderError(f"{module}.create returned {type(prov).__name__}, not a Provider")
    return prov
