"""Phase 01, freeze source truth: what exactly runs today, and what it silently depends on.

Evidence: this host's inventory; the source pod's own environment; immutable identities (weights
or dataset sha256); the frozen artifact (weights or checkpoint) as a verified set with its
manifest; golden outputs for fixed inputs; declared ports, protocols and host needs; secret
*names*; the SLOs the later gates hold the target to.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from runbook_lib import secrets as secret_refs
from runbook_lib.inventory import probe
from runbook_lib.phases import PhaseContext


def prefix(ctx: PhaseContext, *parts: str) -> str:
    """Store prefix of this run: ``runs/<run_id>/<parts...>``."""
    return "/".join(("runs", ctx.run_id, *parts))


def host_inventory(ctx: PhaseContext) -> dict[str, Any]:
    """Probe the machine the runbook runs on (device from the source profile)."""
    inv = probe(device=ctx.mig.source.device)
    ctx.write_json("01/host_inventory.json", inv)
    return inv


def freeze_source(ctx: PhaseContext) -> dict[str, Any]:
    """Run the source profile's agent in a pod: freeze the artifact, compute golden outputs.

    The pod is destroyed afterwards and verified gone.

    Returns:
        ``{"pod", "environment", "identity", "frozen", "golden", "golden_run"}``.

    Raises:
        WorkloadError: the agent failed (log tail in the message). StorageError: a set does
            not verify.
    """
    pod = ctx.launch_agent("source", "source-freeze", "freeze", prefix=prefix(ctx, "source"))
    pod = ctx.wait_pod("source", pod)
    frozen = ctx.store.verify_set(prefix(ctx, "source", "frozen"), run_id=ctx.run_id)
    result_objs = ctx.store.verify_set(prefix(ctx, "source", "result"), run_id=ctx.run_id)
    files = ctx.fetch(prefix(ctx, "source", "result"), "01/source_result")
    result = json.loads(files["result.json"].read_text())
    golden = np.load(files["outputs.npy"])
    np.save(ctx.path("01/golden_outputs.npy"), golden)
    if "final_outputs.npy" in files:
        np.save(ctx.path("01/golden_final_outputs.npy"), np.load(files["final_outputs.npy"]))
    ctx.destroy("source", pod.id)
    gone = ctx.provider("source").get(pod.id).state == "DESTROYED"
    attempt = result["attempts"][0]
    return {
        "pod": {"id": pod.id, "state_after_destroy": "DESTROYED" if gone else "STILL PRESENT"},
        "environment": result["environment"],
        "identity": result["identity"],
        "store": ctx.store.settings(),
        "frozen": {"prefix": prefix(ctx, "source", "frozen"), "manifest_sha256": result["frozen_manifest_sha256"],
                   "objects": {k: {"size_bytes": o.size_bytes, "sha256": o.sha256} for k, o in frozen.items()}},
        "golden": {"prefix": prefix(ctx, "source", "result"), "shape": list(golden.shape), "dtype": str(golden.dtype),
                   "outputs_sha256": result_objs["outputs.npy"].sha256},
        "golden_run": {"losses": [m.get("loss") for m in attempt["metrics"] if "loss" in m],
                       "aa_losses": result.get("aa_losses"),
                       "step_times_s": attempt["step_times_s"], "load_s": attempt["load_s"]},
    }


def secrets_table(ctx: PhaseContext) -> list[dict[str, Any]]:
    """Secret names and references of both sides, whether each resolves here (never values),
    and credential-looking variable names in this environment (a finding, by name only)."""
    rows = []
    for side in ("source", "target"):
        for s in ctx.profile(side).secrets:
            present = secret_refs.resolve(s.name, s.ref, required=False) is not None
            rows.append({"side": side, "name": s.name, "ref": s.ref, "required": s.required, "resolves_here": present})
    ambient = secret_refs.names_present()
    for name in ambient:
        rows.append({"side": "environment", "name": name, "ref": "(ambient, not injected into pods)",
                     "required": False, "resolves_here": True})
    return rows


def credential_findings(ctx: PhaseContext, source_env: dict[str, Any]) -> list[dict[str, Any]]:
    """Credential-looking variables inside the source pod (names only). A name the source profile
    or the storage section does not declare is a finding: a key baked into the image or exported
    into the container, which the target must not inherit."""
    from runbook_lib.storage import credential_env

    declared = {s.name for s in ctx.mig.source.secrets} | {n for n, _ in credential_env(ctx.mig.storage)}
    return [{"variable": n, "declared": n in declared,
             "finding": "" if n in declared else "undeclared credential in the source environment"}
            for n in source_env.get("credential_env_names", [])]


def requirements(ctx: PhaseContext) -> dict[str, Any]:
    """Declared host needs and SLOs of the workload (from params)."""
    req = ctx.mig.workload.requirements
    return {
        "ports": [{"port": p.port, "protocol": p.protocol} for p in req.ports],
        "shm_gb": req.shm_gb, "disk_gb": req.disk_gb, "memory_gb": req.memory_gb,
        "gpu_memory_gb": req.gpu_memory_gb, "max_request_s": req.max_request_s,
        "docker_compose": req.docker_compose, "privileged": req.privileged,
        "persistent_volume": req.persistent_volume, "device": ctx.mig.source.device,
        "dtype": ctx.mig.source.dtype,
    }


def inventory_rows(host: dict[str, Any], source_env: dict[str, Any]) -> list[dict[str, Any]]:
    """A display table: host vs the source pod's environment."""
    def flat(d: dict[str, Any]) -> dict[str, Any]:
        return {
            "python": d["python"], "torch": d["torch"], "torch threads": d["torch_threads"],
            "device": d["device"], "CUDA available": d["cuda"]["available"],
            "CUDA runtime": d["cuda"]["runtime"], "driver": d["cuda"]["driver_version"],
            "GPUs": ", ".join(f"{g['name']} (cc {g['compute_capability']}, {g['memory_bytes'] / 2**30:.1f} GiB)"
                              for g in d["cuda"]["devices"]) or "none",
            "CPU": f"{d['cpu']['model']} x{d['cpu']['logical']}", "RAM GiB": round(d["memory_bytes"] / 2**30, 1),
            "/dev/shm GiB": round(d["shm_bytes"] / 2**30, 2), "disk free GiB": round(d["disk_free_bytes"] / 2**30, 1),
            "OS": d["os"],
        }
    h, s = flat(host), flat(source_env)
    return [{"item": k, "this host": h[k], "source pod": s[k]} for k in h]
