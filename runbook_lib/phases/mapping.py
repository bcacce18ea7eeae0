"""Phase 02, map target equivalents: what each source dependency becomes on the target.

Every row is ``equivalent``, ``adapter needed`` (a known change that later phases test) or
``no equivalent`` (blocks cutover: design and test an adapter first). The target's
provider capabilities are declared data (:class:`runbook_lib.providers.base.Capabilities`).
"""

from __future__ import annotations

from typing import Any

from runbook_lib import secrets as secret_refs
from runbook_lib.gates import GateResult
from runbook_lib.phases import PhaseContext

EQUIVALENT, ADAPTER, NONE = "equivalent", "adapter needed", "no equivalent"
GIB = 2**30


def _row(dep: str, source: Any, target: Any, status: str, reason: str) -> dict[str, Any]:
    return {"dependency": dep, "source": str(source), "target": str(target), "status": status, "reason": reason}


def dependency_map(ctx: PhaseContext) -> list[dict[str, Any]]:
    """Build the dependency / control map from phase 01's record and the target's capabilities."""
    rec = ctx.records["01"].data
    req, env = rec["requirements"], rec["freeze"]["environment"]
    host = rec["host"]
    src, tgt = ctx.mig.source, ctx.mig.target
    caps = ctx.provider("target").capabilities()
    rows = []
    if tgt.device.startswith("cuda") and not caps.gpu.supported:
        rows.append(_row("device", src.device, tgt.device, NONE, f"target asks for {tgt.device}: {caps.gpu.detail}"))
    elif src.device.split(":")[0] != tgt.device.split(":")[0]:
        rows.append(_row("device", src.device, tgt.device, ADAPTER, "device type changes; parity is proven in phase 03"))
    else:
        rows.append(_row("device", src.device, tgt.device, EQUIVALENT, caps.gpu.detail))
    rows.append(_row("dtype", src.dtype, tgt.dtype, EQUIVALENT if src.dtype == tgt.dtype else ADAPTER,
                     "same compute dtype" if src.dtype == tgt.dtype else
                     "numerics change; outputs are held to the source dtype's tolerance in phase 03"))
    rows.append(_row("python / torch", f"{env['python']} / {env['torch']}", f"{host['python']} / {host['torch']}",
                     EQUIVALENT if (env["python"], env["torch"]) == (host["python"], host["torch"]) else ADAPTER,
                     "same interpreter and framework build" if env["torch"] == host["torch"] else
                     "framework version differs; parity decides"))
    rows.append(_row("CUDA runtime / driver", f"{env['cuda']['runtime']} / {env['cuda']['driver_version']}",
                     f"{host['cuda']['runtime']} / {host['cuda']['driver_version']}",
                     EQUIVALENT if env["cuda"]["runtime"] == host["cuda"]["runtime"] else ADAPTER,
                     "recorded; must satisfy the image's CUDA build"))
    for p in req["ports"]:
        label = f"port {p['port']}/{p['protocol']}"
        if p["protocol"] == "udp" and not caps.udp.supported:
            rows.append(_row(label, "listens", "-", NONE, f"UDP not supported: {caps.udp.detail} ({caps.udp.source})"))
        elif p["protocol"] == "http" and caps.max_request_s is not None and req["max_request_s"] > caps.max_request_s:
            rows.append(_row(label, f"requests up to {req['max_request_s']} s", f"proxy limit {caps.max_request_s} s",
                             NONE, "requests can outlive the target's HTTP proxy timeout"))
        else:
            rows.append(_row(label, "listens", "reachable", EQUIVALENT, caps.udp.detail if p["protocol"] == "udp" else
                             "loopback/TCP"))
    for need, cap in (("docker_compose", caps.docker_compose), ("privileged", caps.privileged)):
        if req[need]:
            rows.append(_row(need, "required", "supported" if cap.supported else "unsupported",
                             EQUIVALENT if cap.supported else NONE, cap.detail))
    if req["persistent_volume"]:
        rows.append(_row("persistent volume", "required", caps.persistent_volume.detail,
                         EQUIVALENT if caps.persistent_volume.supported else NONE, "checkpoints survive a stop"))
    for key, need_gb, have in (("/dev/shm", req["shm_gb"], host["shm_bytes"]),
                               ("memory", req["memory_gb"], host["memory_bytes"]),
                               ("disk", req["disk_gb"], host["disk_free_bytes"])):
        ok = have >= need_gb * 1e9
        rows.append(_row(key, f"{need_gb} GB needed", f"{have / 1e9:.1f} GB available", EQUIVALENT if ok else NONE,
                         "enough" if ok else "target host is too small"))
    rows.append(_row("storage route", ctx.mig.storage.url, ctx.mig.storage.url, EQUIVALENT,
                     "same store on both sides; objects moved with sha256 manifests"))
    for s in tgt.secrets:
        ok = secret_refs.resolve(s.name, s.ref, required=False) is not None
        status = EQUIVALENT if ok or not s.required else NONE
        rows.append(_row(f"secret {s.name}", "by reference", s.ref, status,
                         "injected at launch, scoped to the pod" if ok else
                         ("not set here, optional" if not s.required else f"required and {s.ref} is not set")))
    if src.batch_size != tgt.batch_size or src.threads != tgt.threads or src.workers != tgt.workers:
        rows.append(_row("serving config", f"threads {src.threads}, batch {src.batch_size}, workers {src.workers}",
                         f"threads {tgt.threads}, batch {tgt.batch_size}, workers {tgt.workers}", ADAPTER,
                         "changes throughput and latency; measured in phase 04"))
    rows.append(_row("billing", f"{src.price_usd_per_hour} USD/h", f"{tgt.price_usd_per_hour} USD/h ({caps.billing})",
                     EQUIVALENT, "cost per accepted unit is compared in phase 04"))
    return rows


def capabilities_dict(caps: Any) -> dict[str, Any]:
    """Declared capabilities as plain JSON (for the record)."""
    from dataclasses import asdict

    return asdict(caps)


def dependency_gate(rows: list[dict[str, Any]], *, phase: str = "02") -> GateResult:
    """FAIL when any dependency has no target equivalent (seed 001: block cutover)."""
    blocked = [r["dependency"] for r in rows if r["status"] == NONE]
    return GateResult("dependency_map", "FAIL" if blocked else "PASS", True, len(blocked), 0, "rows without equivalent",
                      "dependency map over declared requirements and provider capabilities",
                      f"no target equivalent for {blocked}: design and test an adapter before cutover" if blocked
                      else f"all {len(rows)} dependencies have an equivalent or a tested adapter path",
                      samples={"rows": len(rows)}, source="failure responses (README): no target equivalent blocks cutover", phase=phase)
