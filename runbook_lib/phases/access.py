"""What a pod or worker may reach: the run's store through a short-lived grant (never the run's
storage keys), and its side's own secrets (never another side's, never a provider's API key)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from runbook_lib.errors import ParamsError
from runbook_lib.evidence.records import Credential
from runbook_lib.params import Migration, RemoteProfile
from runbook_lib.providers import provider_module
from runbook_lib.providers.base import Plan
from runbook_lib.storage import GRANT_ENV, GrantScope, Store, build_grant

POD_TIMEOUT_S = 900.0  # a pod's acceptance job must finish within this, seconds
GRANT_MARGIN_S = 300.0
"""Added to every store grant's lifetime, seconds: the clock skew S3 tolerates between signer and
store (15 minutes on AWS) is not spent by the job, but a pod's last upload after its timeout
check and the host's wait are."""
ENDPOINT_GRANT_TTL_S = 12 * 3600.0
"""Store grant lifetime of a queue endpoint's workers beyond the run's rollback window, seconds:
an endpoint serves phase 04's measurement, phase 05's slices and phase 06's decision, and, for
the source, the rollback window after it. STS caps it at 36 h; an endpoint used longer must be
created again (its workers' record writes then fail naming the expiry)."""
STS_MAX_TTL_S = 129_600.0  # AWS STS GetFederationToken / AssumeRole maximum session, 36 h


@dataclass(frozen=True)
class StoreAccess:
    """The store grants a run's pods and workers get, and the store's URL as they see it.

    Attributes:
        mig: the run's params. store_factory: opens the run's store (resolving its keys).
    """

    mig: Migration
    store_factory: Callable[[], Store]

    def url(self) -> str:
        """The store's URL as a pod sees it (a local directory made absolute; an S3 URL as given,
        without opening the store or resolving its keys)."""
        url = self.mig.storage.url
        return self.store_factory().url() if url.startswith("file://") else url

    def scope(self, kind: str, *, read_sets: tuple[str, ...] = (), write_prefix: str = "",
              ttl_s: float) -> GrantScope | None:
        """The store grant a pod's spec names (:mod:`runbook_lib.storage.grants`): ``urls`` for an
        agent, ``session`` for queue endpoint workers; None for a ``file://`` store, which a local
        pod shares and which needs no keys. Pure: built at plan time, so the approval covers it;
        the grant itself is built at launch (:meth:`attach`)."""
        if not self.mig.storage.url.startswith("s3://"):
            return None
        return GrantScope("session" if kind == "session" else "urls", tuple(read_sets), write_prefix, ttl_s)

    def agent_ttl_s(self, side: str) -> float:
        """Lifetime of an agent pod's store grant, seconds: the launch budget (a remote profile's
        ``offer.capacity_budget_s``, its tries at ready capacity; 0 locally) plus the agent's
        :data:`POD_TIMEOUT_S` plus :data:`GRANT_MARGIN_S`. A replacement after an interruption
        is a new launch with a new grant."""
        prof = self.mig.source if side == "source" else self.mig.target
        launch = prof.offer.capacity_budget_s if isinstance(prof, RemoteProfile) else 0.0
        return launch + POD_TIMEOUT_S + GRANT_MARGIN_S

    def endpoint_ttl_s(self) -> float:
        """Lifetime of queue endpoint workers' store grant, seconds: :data:`ENDPOINT_GRANT_TTL_S`
        plus the run's rollback window, at most :data:`STS_MAX_TTL_S`."""
        return min(ENDPOINT_GRANT_TTL_S + self.mig.cutover.rollback_window_s, STS_MAX_TTL_S)

    def attach(self, plan: Plan) -> tuple[Plan, Credential]:
        """``plan`` with the store grant its spec's ``store_grant`` names built now (the keys stay
        on this host) and added to the environment as :data:`~runbook_lib.storage.GRANT_ENV`,
        and the grant's evidence (names, objects, prefix and expiry; never a URL or credential).
        The fingerprint is unchanged (it leaves the grant out), so the approval still matches.

        Raises:
            StorageError: a set the pod reads does not verify (nothing is rented on it).
            AuthError: the store refused to issue the grant.
        """
        spec = plan.spec
        assert spec is not None and spec.store_grant is not None
        grant = build_grant(self.store_factory(), spec.store_grant)
        env = tuple(kv for kv in spec.env if kv[0] != GRANT_ENV) + ((GRANT_ENV, grant.to_env()),)
        return replace(plan, spec=replace(spec, env=env)), Credential.model_validate(grant.evidence())


def pod_secret_refs(mig: Migration, side: str) -> tuple[tuple[str, str], ...]:
    """``(NAME, ref)`` of the secrets ``side``'s pods receive: its profile's own, nothing else.
    The run's storage keys never reach a pod (it gets a store grant, :meth:`StoreAccess.scope`),
    and no provider's API key does either (the adapters use them; a pod never needs one), so the
    source's credentials cannot reach the target.

    Raises:
        ParamsError: a profile secret refers to a storage key or a provider API key.
    """
    storage = mig.storage
    reserved = {storage.access_key_id_ref: "storage.access_key_id_ref",
                storage.secret_access_key_ref: "storage.secret_access_key_ref"}
    for other in ("source", "target"):
        prof = mig.source if other == "source" else mig.target
        if isinstance(prof, RemoteProfile):
            for ref in provider_module(prof.provider).default_key(prof.api_key_ref).refs:
                reserved[ref] = f"the {other} provider's API key ({prof.provider})"
    reserved.pop("", None)
    refs = tuple((s.name, s.ref) for s in (mig.source if side == "source" else mig.target).secrets)
    for name, ref in refs:
        if ref in reserved:
            raise ParamsError(f"{side}.secrets: {name} refers to {ref}, the same reference as {reserved[ref]}; "
                              "pods never receive the run's storage keys or a provider's API key. Remove the "
                              "secret (pods reach the store through a short-lived grant), or name a scoped "
                              "credential of its own.")
    return refs
