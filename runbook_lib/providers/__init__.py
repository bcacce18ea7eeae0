"""Provider registry: one package per provider, listed in :data:`runbook_lib.params.PROVIDER_TABLE`
(which also gives each provider its params model), imported lazily.

Adding a provider: one package with what :class:`ProviderModule` declares (a ``create(**kwargs)``
factory; a remote one also ``default_key(ref)``), one table row, its fixtures (``GUIDE.md`` in this
directory).
"""

from __future__ import annotations

import importlib
import os
from types import MappingProxyType
from typing import Any, Protocol, cast

from runbook_lib.errors import ProviderError
from runbook_lib.params import PROVIDER_TABLE, REMOTE_PROVIDERS
from runbook_lib.providers.api import KeySource
from runbook_lib.providers.base import Provider

PROVIDERS = MappingProxyType({e.name: e.adapter for e in PROVIDER_TABLE})
"""Registry name -> adapter module path (from the provider table). Read-only."""


REMOTE = REMOTE_PROVIDERS
"""Registry names of the providers that rent real machines (dry-run by default, keys needed)."""


class ProviderModule(Protocol):
    """What a provider package supplies (its ``__init__``): everything the runbook finds in it is
    declared here, none of it looked up by name."""

    def create(self, **kwargs: Any) -> Provider:
        """The adapter, from ``root`` (local state), ``profile`` (the params profile), and for a
        remote provider ``key`` (:class:`~runbook_lib.providers.api.KeySource`), ``transport`` and
        ``poll_s``."""
        ...

    def default_key(self, ref: str = "") -> KeySource:
        """Where the provider's API key comes from: ``ref`` (``env:NAME`` or ``file:PATH``) or the
        provider's own default variable. A local provider needs no key and raises ProviderError."""
        ...


def provider_module(name: str) -> ProviderModule:
    """The package registered as ``name`` (:data:`PROVIDERS`), imported.

    Raises:
        ProviderError: unknown name (the message lists the valid ones).
    """
    try:
        return cast(ProviderModule, importlib.import_module(PROVIDERS[name]))
    except KeyError:
        raise ProviderError(f"unknown provider {name!r}; known providers: {sorted(PROVIDERS)}") from None


def create_provider(name: str, **kwargs: Any) -> Provider:
    """Build the provider registered as ``name``.

    With ``RUNBOOK_PROVIDER_FIXTURES`` set (the documented test option ``runbook run
    --provider-fixtures``), remote providers talk to the recorded-shape fixture APIs in
    :mod:`runbook_lib.providers.fixtures` instead of the network, with the fixture key.

    Raises:
        ProviderError: unknown name (the message lists the valid ones).
    """
    module = provider_module(name)
    if name in REMOTE and os.environ.get("RUNBOOK_PROVIDER_FIXTURES"):
        from runbook_lib.providers import fixtures

        kwargs.setdefault("transport", fixtures.transport_from_env(name))
        kwargs.setdefault("key", KeySource(name, ("fixture mode (no key)",), _value=fixtures.FIXTURE_KEY))
        kwargs.setdefault("poll_s", 0.05)  # the fake APIs answer at once
    if name in REMOTE and kwargs.get("profile") is not None:
        kwargs.setdefault("poll_s", kwargs["profile"].poll_s)  # the profile's status poll interval
    prov = module.create(**kwargs)
    if not isinstance(prov, Provider):
        raise ProviderError(f"{PROVIDERS[name]}.create returned {type(prov).__name__}, not a Provider")
    return prov
