"""The embedded local provider: pods and endpoint workers are real OS processes on this machine.

A pod gets ``<root>/pods/<id>/container`` (its container disk, wiped on stop and destroy),
``<root>/pods/<id>/volume`` (survives stop, removed on destroy), an injected environment, a
device and a price. Pods are started in their own session so they outlive the notebook kernel
that launched them, as real pods do; :meth:`LocalProvider.list` finds them again by label.

An endpoint is a front-door process that holds the job queue and serves the job API on
127.0.0.1, plus ``workers`` worker processes that each load the model once
(:mod:`runbook_lib.providers.local.endpoint`).

The provider's parts: :class:`~runbook_lib.providers.local.state.StateDir` (the records, disks
and logs under ``root``), :class:`~runbook_lib.providers.local.lifecycle.LocalLifecycle` (the
processes it starts and stops), and this class (capabilities, the profile's offers, reads).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable

from runbook_lib.errors import ProviderError, ProviderTimeout
from runbook_lib.providers.api import KeySource
from runbook_lib.providers.base import (
    Capabilities,
    Capability,
    Endpoint,
    Pod,
    Provider,
    payload_capabilities,
)
from runbook_lib.providers.local import procs
from runbook_lib.providers.local.lifecycle import LocalLifecycle
from runbook_lib.providers.local.state import StateDir
from runbook_lib.providers.offers import Offer


class LocalProvider(Provider):
    """Local pods and endpoints under ``root``.

    Args:
        root: state directory (``.runbook/local`` by default); one per machine, shared by runs.
        clock: wall clock in epoch seconds (injected for tests).
        python: interpreter used for pod and worker processes.
        term_grace_s: on stop and destroy, seconds between SIGTERM and SIGKILL.
        on_teardown_step: called as ``(step, pids)`` at each step of stopping a resource's
            processes (``listed``, ``signalled``, ``killed``); lets a test make processes exit at
            exactly those moments.
        offers: the profile's machines (:class:`runbook_lib.params.LocalOffer`), for offer searches.
    """

    name = "local"
    dry_run_default = False  # the local provider never dry-runs

    def __init__(
        self,
        *,
        root: str | Path = ".runbook/local",
        clock: Callable[[], float] = time.time,
        python: str = sys.executable,
        term_grace_s: float = procs.TERM_GRACE_S,
        on_teardown_step: procs.StepHook | None = None,
        offers: tuple[Any, ...] = (),
    ) -> None:
        self.root = Path(root).resolve()
        self.state = StateDir(self.root, clock)
        self.lifecycle = LocalLifecycle(self.state, python=python, term_grace_s=term_grace_s,
                                        on_step=on_teardown_step)
        self.attempts = []
        self._offers = tuple(offers)
        self._withdrawn: set[str] = set()

    # -- offers ------------------------------------------------------------------------------

    def search_offers(self, req: Any, *, ports: int = 0) -> list[Offer]:
        """The profile's machines (``offers``, :class:`runbook_lib.params.LocalOffer`) as offers:
        no GPUs, loopback ports without limit, region ``local``; less those withdrawn
        (:meth:`withdraw_offer`). ``req`` is applied by the caller
        (:func:`runbook_lib.providers.offers.filter_offers`), as for every provider.

        Raises:
            ProviderError: the profile declares no offers (the side is this one machine).
        """
        if not self._offers:
            return super().search_offers(req, ports=ports)
        return [Offer(provider=self.name, offer_id=o.offer_id, gpu_name="", gpu_name_raw="", gpu_count=0, vram_mib=0,
                      vcpu=float(o.vcpu), ram_gib=float(o.ram_gib), disk_gb=float(o.disk_gb), cuda_max="",
                      usd_per_hour=float(o.usd_per_hour), interruptible_usd_per_hour=None, storage_usd_per_gb_month=0.0,
                      egress_usd_per_gb=0.0, region="local", reliability=None, availability="listed")
                for o in self._offers if o.offer_id not in self._withdrawn]

    def withdraw_offer(self, offer_id: str) -> None:
        """Take ``offer_id`` off this provider's later searches (the ``preferred_offer_removed``
        drill: a machine is no longer available). Nothing running is touched.

        Raises:
            ProviderError: no offer of the profile has that id.
        """
        known = [o.offer_id for o in self._offers]
        if offer_id not in known:
            raise ProviderError(f"cannot withdraw offer {offer_id!r}: the profile's offers are {known}", provider=self.name)
        self._withdrawn.add(offer_id)

    # -- declared capabilities ---------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        import torch

        gpu = torch.cuda.is_available()
        return Capabilities(
            provider=self.name,
            udp=Capability(True, "loopback sockets, any protocol"),
            docker_compose=Capability(False, "pods are plain processes, not containers", "runbook_lib.providers.local"),
            privileged=Capability(False, "pods run as the invoking user"),
            persistent_volume=Capability(True, "volume directory survives stop, removed on destroy"),
            max_request_s=None,
            gpu=Capability(gpu, f"{torch.cuda.device_count()} CUDA device(s)" if gpu else "CPU only on this host"),
            billing="per second, from params price_usd_per_hour",
            queue_endpoints=Capability(True, "a local front door with a job queue and worker processes",
                                       "runbook_lib/providers/local/endpoint.py"),
            load_balancing=Capability(True, "one worker process serving its own HTTP port on loopback",
                                      "runbook_lib/providers/local/endpoint.py"),
            restart=Capability(False, "a stopped local pod's process is gone; its volume is kept for a new pod"),
            lifecycle="stop ends the processes and keeps the volume directory; no restart (launch a new pod); "
                      "never interrupted",
            network="loopback ports, any protocol, no proxy",
            extra=payload_capabilities(queue=True, load_balancing=True),
        )

    # -- reads -------------------------------------------------------------------------------

    def get(self, resource_id: str) -> Pod | Endpoint:
        """The pod or endpoint as its record says now (a leader that exited makes it EXITED).

        Raises:
            NotFound: no record of ``resource_id`` under ``root``.
        """
        return self.state.get(resource_id)

    def list(self, *, labels: dict[str, str]) -> list[Pod | Endpoint]:
        return self.state.list(labels)

    def log_tail(self, resource_id: str, n_bytes: int = 4000) -> str:
        """Last ``n_bytes`` of a pod's combined stdout/stderr."""
        return self.state.log_tail(resource_id, n_bytes)

    def describe(self, resource_id: str) -> dict[str, Any]:
        """:meth:`Provider.describe`, plus what runs in the pod now: each process but the
        provider's own leader (``runbook_lib.providers.local.pod``, the container runtime's part),
        with its command line and the names of the ``RUNBOOK_*`` variables in its environment
        (their values are never read out). A process that ends while it is read is left out.

        Raises:
            NotFound: no record of ``resource_id``.
        """
        import psutil

        out = super().describe(resource_id)
        meta = self.state.read(resource_id)
        rows = []
        for p in procs.find(resource_id, str(self.state.dir(resource_id) / "volume")):
            try:
                if p.pid == meta.get("pid"):
                    continue
                rows.append({"pid": p.pid, "cmdline": p.cmdline(),
                             "runbook_env": sorted(k for k in p.environ() if k.startswith("RUNBOOK_"))})
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        out["processes"] = rows
        return out

    def wait_exit(self, resource_id: str, *, timeout_s: float, finished: Callable[[], bool] | None = None,
                  poll_s: float = 0.1, sleep: Callable[[float], None] = time.sleep) -> Pod:
        """Wait until a pod has exited, or ``finished()`` says its work is done.

        Raises:
            ProviderTimeout: still running after ``timeout_s`` seconds.
            ProviderError: ``resource_id`` is an endpoint (endpoints do not exit).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            pod = self.get(resource_id)
            if not isinstance(pod, Pod):
                raise ProviderError(f"{resource_id} is an endpoint; only pods exit", provider=self.name,
                                    resource_id=resource_id)
            if pod.state != "RUNNING" or (finished is not None and finished()):
                return pod
            if time.monotonic() > deadline:
                raise ProviderTimeout(f"pod {resource_id} still running after {timeout_s} s; log tail:\n"
                                      f"{self.log_tail(resource_id, 1500)}", provider=self.name,
                                      resource_id=resource_id)
            sleep(poll_s)


def default_key(ref: str = "") -> KeySource:
    """The local provider rents nothing and takes no API key.

    Raises:
        ProviderError: always; a local profile has no ``api_key_ref``.
    """
    raise ProviderError("the local provider takes no API key (it rents nothing): a local profile has no api_key_ref",
                        provider="local")


def create(*, root: str | Path = ".runbook/local", profile: Any = None, **kwargs: Any) -> LocalProvider:
    """Registry factory: ``profile`` (a :class:`runbook_lib.params.LocalProfile`, or None) gives
    the machines the provider offers."""
    return LocalProvider(root=root, offers=tuple(getattr(profile, "offers", ())), **kwargs)
