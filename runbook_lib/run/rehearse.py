"""Rehearse a real migration offline: the same params, the same adapter code, simulated providers.

``runbook rehearse params/runpod-to-vast-train.yaml`` starts loopback simulators of Runpod and
Vast.ai (:mod:`runbook_lib.providers.simulator`) and moto's S3 server, writes a rehearsal copy of
each params file with declared overrides (real providers' dry-run off, CPU devices, the
simulators' URLs, the loopback bucket, shorter measurements and the margins a shared 2-core
machine needs, approvals granted for simulated providers only), and runs all six phases on it.
The copy's ``rehearsal`` section lists every override, so the evidence says what differs from
the real migration; the simulators name themselves in every answer, so the receipt, the manifest
and ``runbook list`` mark the run as a rehearsal.

The committed params stay dry-run and real-sized; nothing here edits them.
"""

from __future__ import annotations

import copy
import hashlib
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from runbook_lib.errors import ParamsError
from runbook_lib.layout import STATE_DIR, project_root
from runbook_lib.params import Migration, dump_yaml, load_params, validate
from runbook_lib.providers.simulator import SimServer, free_port, sim_module, simulate, simulated
from runbook_lib.run.runner import RunResult, run_migration

REHEARSAL_DIR = "rehearsal"  # under .runbook/: the rehearsal copies of params, and the simulators' machines

SIM_POLL_S = 1.0  # a simulator answers at once: its machines are polled every second, not every 10 s

SHORTER: dict[str, dict[str, Any]] = {
    "inference": {"measure.requests_per_round": 60, "measure.warmup_requests": 10, "measure.throughput_requests": 32,
                  "measure.rounds": 4, "measure.arrival_rate_per_s": 10, "measure.error_retry_interval_s": 1.0, "gates.latency_p95_ratio_max": 3.0,
                  "gates.throughput_ratio_min": 0.3, "gates.cold_start_ratio_max": 4.0, "gates.required_saving": 0.0,
                  "gates.min_latency_samples": 40, "cutover.steps_percent": [10, 50, 100],
                  "cutover.requests_per_step": 20, "cutover.rollback_window_s": 3600},
    "service": {"measure.requests_per_round": 48, "measure.warmup_requests": 24, "measure.throughput_requests": 16,
                "measure.rounds": 4, "measure.arrival_rate_per_s": 5, "gates.latency_p95_ratio_max": 3.0,
                "gates.throughput_ratio_min": 0.5, "gates.required_saving": 0.0, "gates.min_latency_samples": 40,
                "workload.service.parity.min_exact_match": 1.0, "cutover.steps_percent": [10, 50, 100],
                "cutover.requests_per_step": 20, "cutover.rollback_window_s": 3600},
    "training": {"workload.train_steps": 60, "measure.rounds": 4, "gates.latency_p95_ratio_max": 4.0,
                 "gates.throughput_ratio_min": 0.3, "gates.cold_start_ratio_max": 4.0, "gates.required_saving": 0.0,
                 "gates.min_latency_samples": 40, "cutover.rollback_window_s": 3600},
}
"""Per workload kind: the measurement and margin overrides a rehearsal on a shared 2-core machine
uses (the embedded demos' values, params/demo.yaml, params/demo-train.yaml and
params/demo-service.yaml, with the latency and cold-start margins of a machine running both
sides' workers and the simulators at once), listed in the evidence like any other. A size in
:data:`SIZES` only shortens: params that ask for less keep their own value.

The inference arrival rate is 10 requests/s: a simulated Runpod queue endpoint whose handler
writes an idempotency record to the loopback S3 store per job completes about 20 requests/s on
2 cores, so the 20/s of params/runpod-to-vast.yaml kept its queue near saturation, where
open-loop latency is mostly queue growth and two source rounds can differ twofold; at 10/s the
source runs at about half its capacity."""

SIZES = frozenset({"measure.requests_per_round", "measure.warmup_requests", "measure.throughput_requests",
                   "measure.rounds", "measure.arrival_rate_per_s", "workload.train_steps"})
"""The counts and rates of :data:`SHORTER` a rehearsal never raises: a rehearsal measures at most
what the params ask, at no more load (a fault drill that needs ten requests a round is not made to
send sixty)."""

MARGINS: dict[str, Callable[[float, float], bool]] = {
    "gates.latency_p95_ratio_max": lambda own, ours: own >= ours,
    "gates.cold_start_ratio_max": lambda own, ours: own >= ours,
    "gates.throughput_ratio_min": lambda own, ours: own <= ours,
}
"""The margins of :data:`SHORTER` a rehearsal never tightens, each with the test "the params' own
value is at least as wide as the rehearsal's": a ratio's upper bound that is already higher, a
lower bound that is already lower. A shared 2-core machine needs at least SHORTER's margins; params
that allow more (a drill whose subject is not latency, run beside other work) keep their own."""


def _dotted(data: dict[str, Any], path: str) -> Any:
    """``data["a"]["b"]`` for ``path`` ``"a.b"`` (a list's item by its index: ``alternates.0``);
    None where a level is missing or not a mapping or list."""
    node: Any = data
    for key in path.split("."):
        node = node.get(key) if isinstance(node, dict) else \
            node[int(key)] if isinstance(node, list) and key.isdigit() and int(key) < len(node) else None
    return node


def shorter(data: dict[str, Any]) -> dict[str, Any]:
    """The :data:`SHORTER` overrides for the workload kind of params ``data`` (the YAML as a
    mapping). A size of :data:`SIZES` only lowers and a margin of :data:`MARGINS` only widens:
    where the params already ask for a smaller number, or a wider margin, there is no override and
    the params' own value stands."""
    out = dict(SHORTER.get((data.get("workload") or {}).get("kind", ""), {}))
    for path in sorted((SIZES | MARGINS.keys()) & out.keys()):
        own = _dotted(data, path)
        if not isinstance(own, int | float) or isinstance(own, bool):
            continue
        if own <= out[path] if path in SIZES else MARGINS[path](float(own), float(out[path])):
            del out[path]
    return out


@dataclass
class Rehearsal:
    """Simulators and a loopback S3 endpoint, with the environment that points the adapters at them.

    Attributes:
        sims: provider name -> running simulator.
        s3_url: the moto server's URL.
        env: variables set for the run (keys and URLs; restored by :meth:`close`).
        faults: the scripted faults the simulators serve, per provider (recorded in the evidence).
    """

    sims: dict[str, SimServer]
    s3_url: str
    env: dict[str, str]
    _moto: Any = None
    faults: dict[str, Any] = field(default_factory=dict)
    _saved: dict[str, str | None] = field(default_factory=dict)

    def close(self) -> None:
        """Stop the simulators (destroying every machine they still run) and the S3 server, and
        restore the environment."""
        for sim in self.sims.values():
            sim.close()
        if self._moto is not None:
            self._moto.stop()
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start(project: Path, faults: dict[str, dict[str, Any]] | None = None) -> Rehearsal:
    """Start the Runpod and Vast.ai simulators and moto's S3 server on 127.0.0.1, each with a
    fresh key, and export what the adapters and the pods read (``RUNPOD_API_KEY``,
    ``VAST_API_KEY``, dummy AWS keys moto accepts). ``faults``: per provider, the ``script``,
    ``lies`` and ``limits`` of :func:`runbook_lib.providers.simulator.simulate` (a fault drill)."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request otherwise
    state = project / STATE_DIR / REHEARSAL_DIR
    keys = {name: sim_module(name).KEY_PREFIX + secrets.token_hex(16) for name in simulated()}
    faults = faults or {}
    sims = {name: simulate(name, state_dir=state, key=key, script=faults.get(name, {}).get("script"),
                           lies=faults.get(name, {}).get("lies"), limits=faults.get(name, {}).get("limits"))
            for name, key in keys.items()}
    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    env = {sim_module(name).KEY_ENV: key for name, key in keys.items()}
    env.update(AWS_ACCESS_KEY_ID="AKSIM" + secrets.token_hex(8).upper(),  # moto accepts any AWS keys
               AWS_SECRET_ACCESS_KEY=secrets.token_hex(20))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    return Rehearsal(sims, f"http://127.0.0.1:{port}", env, _moto=moto, _saved=saved,
                     faults={k: v for k, v in faults.items() if v})


def overrides_for(data: dict[str, Any], reh: Rehearsal) -> dict[str, Any]:
    """The dotted-path overrides a rehearsal applies to one migration's params ``data``."""
    out: dict[str, Any] = {}
    sides = ["source", *(["target"] if "target" in data or not data.get("targets") else []),
             *(f"alternates.{i}" for i in range(len(data.get("alternates") or ()))),
             *(f"targets.{i}" for i in range(len(data.get("targets") or ())))]
    for side in sides:
        prof = _dotted(data, side) or {}
        provider = prof.get("provider", "local")
        if provider in reh.sims:
            out[f"{side}.dry_run"] = False
            out.update({f"{side}.{k}": v for k, v in sim_module(provider).overrides(reh.sims[provider].url).items()})
            out[f"{side}.poll_s"] = SIM_POLL_S
        out[f"{side}.device"] = "cpu"
    if str((data.get("storage") or {}).get("url", "")).startswith("s3://"):
        out["storage.endpoint_url"] = reh.s3_url
        out["storage.create_bucket"] = True
    out["approvals.preapproved_simulator"] = True
    out.update(shorter(data))
    return out


def service_stand_ins(mig: Migration, project: Path, reh: Rehearsal) -> dict[str, list[str]]:
    """A service's stand-in given to every simulator for its image (``{project}`` filled; the
    simulated machine fills ``{port}`` and its environment's ``{NAME}``), as the copy's
    ``rehearsal.stand_ins`` records it; empty for other workloads and for a service whose sides
    are all local (the local provider runs the stand-in itself).

    Raises:
        ParamsError: a side runs on a simulated provider and the service declares no stand-in
            (nothing here can run the image).
    """
    svc = mig.workload.service
    simulated_sides = [side for side, prof in (("source", mig.source), *(("target", c) for c in mig.candidates))
                       if prof.provider in reh.sims]
    if svc is None or not simulated_sides:
        return {}
    if svc.stand_in is None:
        raise ParamsError(f"{', '.join(simulated_sides)} run image {svc.image!r} on a simulated provider, which has no "
                          "container runtime: declare workload.service.stand_in.command, a local command serving the "
                          "same API, to rehearse it")
    argv = [a.replace("{project}", str(project)) for a in svc.stand_in.command]
    for sim in reh.sims.values():
        sim.api.stand_ins[svc.image] = tuple(argv)  # type: ignore[attr-defined]
    return {svc.image: argv}


def registry_placeholders(mig: Migration, reh: Rehearsal) -> list[str]:
    """A private image's registry login, where its reference is an unset ``env:`` variable, gets a
    placeholder for the rehearsal (the simulators pull nothing; the adapters still send it in the
    create request); each is listed, like an override, and restored by :meth:`Rehearsal.close`."""
    svc = mig.workload.service
    out = []
    for side, prof in (("source", mig.source), *(("target", c) for c in mig.candidates)):
        ref = next((s.ref for s in prof.secrets if svc is not None and s.name == svc.registry_credential), "")
        var = ref[len("env:"):] if ref.startswith("env:") else ""
        if var and prof.provider in reh.sims and not os.environ.get(var):
            reh._saved.setdefault(var, os.environ.get(var))
            os.environ[var] = f"sim-registry-{secrets.token_hex(8)}"
            out.append(f"{side} registry login {var} = a simulator placeholder (nothing is pulled)")
    return out


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, name = dotted.split(".")
    node: Any = data
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
    node[name] = value


def write_copy(params_path: Path, reh: Rehearsal) -> Path:
    """Write the rehearsal copy of ``params_path`` under ``.runbook/rehearsal/``, with its
    overrides applied and listed in its ``rehearsal`` section; validated before it is written.

    Raises:
        ParamsError: the params (or the copy) are invalid.
    """
    mig = load_params(params_path)  # the real file must be valid as it is
    project = project_root(params_path)
    data = yaml.safe_load(params_path.read_text())
    over = overrides_for(data, reh)
    copy_data = copy.deepcopy(data)
    for k, v in over.items():
        _set(copy_data, k, v)
    rel = params_path.resolve().relative_to(project) if params_path.resolve().is_relative_to(project) else params_path
    copy_data["rehearsal"] = {"of": str(rel), "sha256": hashlib.sha256(params_path.read_bytes()).hexdigest(),
                              "overrides": [f"{k} = {v}" for k, v in over.items()]}
    stand_ins = service_stand_ins(mig, project, reh)
    if stand_ins:
        copy_data["rehearsal"]["stand_ins"] = stand_ins
        copy_data["rehearsal"]["overrides"] += registry_placeholders(mig, reh)
    if reh.faults:
        copy_data["rehearsal"]["faults"] = reh.faults
    validate(copy_data, origin=f"rehearsal copy of {params_path}")
    out = project / STATE_DIR / REHEARSAL_DIR / params_path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("# Written by `runbook rehearse`: a rehearsal copy; see its rehearsal section.\n"
                   + dump_yaml(copy_data))
    return out


@dataclass
class Outcome:
    """One rehearsed migration: the params rehearsed, the run, and its wall seconds."""

    params: Path
    result: RunResult
    seconds: float


def rehearse(params_files: list[Path], *, echo: Callable[[str], None] = print,
             faults: dict[str, dict[str, Any]] | None = None) -> Iterator[Outcome]:
    """Rehearse each migration in turn against one set of simulators (with ``faults`` scripted,
    as :func:`start` takes them); yield each outcome.

    Raises:
        ParamsError: a params file is invalid (nothing of it runs).
    """
    project = project_root(params_files[0])
    reh = start(project, faults)
    try:
        echo(f"simulators: runpod {reh.sims['runpod'].url}, vast {reh.sims['vast'].url}; S3 (moto) {reh.s3_url}")
        for p in params_files:
            copy_path = write_copy(p, reh)
            echo(f"rehearsing {p} as {copy_path.relative_to(project)}")
            t0 = time.perf_counter()
            res = run_migration(copy_path, echo=echo)
            yield Outcome(p, res, time.perf_counter() - t0)
        for name, sim in reh.sims.items():
            echo(f"{name} simulator requests: " + ", ".join(f"{k} x{n}" for k, n in sim.request_summary().items()))
    finally:
        reh.close()
