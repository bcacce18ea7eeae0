"""Provider registry: one module per provider, named in one read-only table, imported lazily.

Adding a provider means one module with a ``create(**kwargs)`` factory and one line here.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import Any

from runbook_lib.errors import ProviderError

PROVIDERS = MappingProxyType({
    "local": "runbook_lib.providers.local",
})
"""Registry name -> module path. Read-only; tests build their own providers directly."""


def create_provider(name: str, **kwargs: Any) -> Any:
    """Build the provider registered as ``name``.

    Raises:
        ProviderError: unknown name (the message lists the valid ones).
    """
    try:
        module = PROVIDERS[name]
    except KeyError:
        raise ProviderError(f"unknown provider {name!r}; known providers: {sorted(PROVIDERS)}") from None
    return importlib.import_module(module).create(**kwargs)
