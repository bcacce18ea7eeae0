"""A fake Vast.ai API (``api/v0`` bundles, asks, instances; ``api/v1`` instances, paginated)
built from the recorded shapes in ``recorded/`` (``docs/reference/providers.md`` section 3.9).
Instances walk null -> loading -> running as they are polled; ``FixtureApi``'s ``script`` queues
failure answers (a plain-text 429, a 410 offer gone, an outbid instance, an OCI error)."""

from __future__ import annotations

import json
import time
from typing import Any

from runbook_lib.providers.fixtures import FixtureApi, load

SERVERLESS_PATHS = {"template": "template", "endptjobs": "endptjobs", "autojobs": "autojobs",
                    "workergroups": "autojobs"}
"""Console API paths of Vast.ai Serverless and the table each reads (``workergroups/`` is the
async client's name for ``autojobs/``)."""


class FakeApi(FixtureApi):
    """Vast.ai's answers (see :class:`runbook_lib.providers.fixtures.FixtureApi` for the arguments);
    Serverless templates, endpoints and workergroups in :attr:`serverless` (by table, then id)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.serverless: dict[str, dict[str, dict[str, Any]]] = {}

    def unauthorized(self) -> Any:
        import httpx

        return httpx.Response(401, json={"success": False, "error": "auth_error", "msg": "Invalid API key"})

    def answer(self, request: Any, body: Any) -> Any:
        import httpx

        m, path = request.method, request.url.path
        parts = path.strip("/").split("/")
        if m == "GET" and path == "/api/v0/users/current/":
            return self._json(200, load("vast", "users_current.json"))
        if m == "POST" and path == "/api/v0/bundles/":
            if self._next("search", "ok") == "rate":
                return httpx.Response(429, text=load("vast", "rate_limited_429.txt"))
            name = "bundles_search_bid.json" if (body or {}).get("type") == "bid" else "bundles_search_ondemand.json"
            return self._json(200, load("vast", name))
        if m == "PUT" and parts[:3] == ["api", "v0", "asks"]:
            answer = self._next("create", "ok")
            if answer == "rate":
                return httpx.Response(429, text=load("vast", "rate_limited_429.txt"))
            if answer == "gone":
                return self._json(410, load("vast", "asks_create_410.json"))
            iid = str(7_000_000 + next(self._ids))
            offer = next(o for o in load("vast", "bundles_search_ondemand.json")["offers"] if str(o["id"]) == parts[3])
            inst = load("vast", "instance_null_status.json", id=iid, label=body.get("label", ""),
                        image=body["image"])["instances"]
            inst.update({k: offer[k] for k in ("gpu_name", "num_gpus", "gpu_ram", "cuda_max_good", "dph_base",
                                                "dph_total", "storage_cost", "machine_id", "host_id")})
            inst.update(id=int(iid), label=body.get("label"), disk_space=body.get("disk"),
                        _serves=any(k.startswith("-p ") for k in (body.get("env") or {})),
                        extra_env=[[k, v] for k, v in (body.get("env") or {}).items() if not k.startswith("-p ")],
                        image_args=[str(a) for a in body.get("args") or []],
                        _image_login=bool(body.get("image_login")))
            self.state[iid] = inst
            if answer == "created_then_502":  # the gateway failed after the instance was created
                return httpx.Response(502, text="<html><body>502 Bad Gateway</body></html>")
            if answer == "bid_fail":
                inst.update(actual_status="stopped", intended_status="stopped")
                return self._json(400, load("vast", "asks_create_bid_fail_with_contract.json", id=iid))
            return self._json(200, {**load("vast", "asks_create_ok.json"), "new_contract": int(iid)})
        if m == "GET" and path == "/api/v1/instances/":
            if request.url.params.get("after_token"):
                page = load("vast", "instances_v1_page2.json")
                page["instances"] = [self.poll_instance(i, advance=False) for i in self.state
                                     if not self.state[i].get("destroyed")]
                return self._json(200, page)
            return self._json(200, load("vast", "instances_v1_page1.json"))
        if parts[:3] == ["api", "v0", "instances"] and len(parts) == 4:
            iid = parts[3]
            if iid not in self.state or self.state[iid].get("destroyed"):
                if m == "DELETE":
                    return self._json(404, load("vast", "destroy_not_found.json"))
                return self._json(200, load("vast", "instance_gone.json"))
            if m == "GET":
                return self._json(200, {"instances": self.poll_instance(iid)})
            if m == "PUT":
                self.state[iid].update(actual_status=body.get("state"), intended_status=body.get("state"))
                return self._json(200, load("vast", "manage_stop_ok.json"))
            if m == "DELETE":
                self.state[iid]["destroyed"] = True
                return self._json(200, load("vast", "destroy_ok.json"))
        if parts[:2] == ["api", "v0"] and len(parts) >= 3 and parts[2] in SERVERLESS_PATHS:
            return self.serverless_answer(m, parts, body or {}, request.url.params)
        return self._json(404, {"success": False, "error": "not_found", "msg": f"no route {m} {path}"})

    def serverless_answer(self, m: str, parts: list[str], body: dict[str, Any], params: Any = None) -> Any:
        """Vast.ai Serverless on the console API: ``template/`` (create, delete), ``endptjobs/``
        (create, list, delete: its workergroups with it) and ``autojobs/`` (alias
        ``workergroups/``: create, list, delete), in the shapes the ``vastai`` 1.9.1 client reads
        (``{"success": true, "result": id}`` for an endpoint, ``"id"`` and ``"result"`` for a
        workergroup, ``{"template": {"id", "hash_id"}}``)."""
        import httpx

        kind = SERVERLESS_PATHS[parts[2]]
        table = self.serverless.setdefault(kind, {})
        rid = parts[3] if len(parts) > 3 else ""
        if m == "POST" and kind == "template":
            tid = next(self._ids)
            row = {**body, "id": tid, "hash_id": f"{tid:08x}{'0' * 24}", "created_at": time.time()}
            table[str(tid)] = row
            return self._json(200, {"success": True, "template": row})
        if m == "GET" and kind == "template":
            want = json.loads(params.get("select_filters") or "{}").get("hash_id", {}).get("eq")
            return self._json(200, {"templates": [v for v in table.values() if v["hash_id"] == want]})
        if m == "DELETE" and kind == "template":
            gone = [k for k, v in table.items() if body.get("hash_id") in (None, v["hash_id"])
                    and body.get("template_id") in (None, v["id"])]
            for k in gone:
                del table[k]
            return self._json(200, {"success": True}) if gone else \
                self._json(404, {"success": False, "msg": "no such template"})
        if m == "POST" and kind in ("endptjobs", "autojobs"):
            new = next(self._ids)
            row = {**{k: v for k, v in body.items() if k != "client_id"}, "id": new, "created_at": time.time(),
                   "user_id": 1}
            if kind == "endptjobs":
                row.update(api_key=f"ep-key-{new:06d}", endpoint_state="active")
                table[str(new)] = row
                return self._json(200, {"success": True, "result": new})
            ep = self.serverless.get("endptjobs", {}).get(str(body.get("endpoint_id")))
            if ep is None or self._next("workergroup", "ok") == "invalid":
                return self._json(400, {"success": False, "error": "invalid_args",
                                        "msg": "Please assign your workergroup to a valid endpoint identifier"})
            row.update(endpoint_name=ep["endpoint_name"], api_key=ep["api_key"])
            table[str(new)] = row
            self.workergroup_created(row)
            return self._json(200, {"success": True, "id": new, "result": new})
        if m == "GET" and not rid:
            return self._json(200, {"success": True, "results": list(table.values())})
        if m == "DELETE" and rid:
            if rid not in table:
                return self._json(404, {"success": False, "msg": f"No {kind} by that id is available."})
            row = table.pop(rid)
            cascade = [k for k, v in self.serverless.get("autojobs", {}).items()
                       if kind == "endptjobs" and str(v.get("endpoint_id")) == rid]
            removed = [row] if kind == "autojobs" else [self.serverless["autojobs"].pop(k) for k in cascade]
            workers = [w for wg in removed for w in self.workergroup_deleted(wg)]
            return self._json(200, {"success": True, "deleted_workers": workers, "failed_workers": []})
        return httpx.Response(405, json={"success": False, "msg": f"{m} /{'/'.join(parts)}"})

    def workergroup_created(self, row: dict[str, Any]) -> None:
        """A workergroup was created (the simulator starts its workers; a fake starts none)."""

    def workergroup_deleted(self, row: dict[str, Any]) -> list[int]:
        """A workergroup was deleted: the worker instance ids destroyed with it (a fake has none)."""
        return []

    def poll_instance(self, iid: str, *, advance: bool = True) -> dict[str, Any]:
        inst = self.state[iid]
        if advance and (inst.get("actual_status") in (None, "loading") or self.script.get("poll")):
            step = self._next("poll", "running" if inst.get("actual_status") == "loading" else "loading")
            inst.update(load("vast", f"instance_{step}.json")["instances"])
            if step == "running":
                inst["public_ipaddr"] = f" {self.ip}\n"
        elif advance and inst.get("actual_status") == "running" and self._agent_poll(inst, inst.get("_serves", True)):
            inst.update(actual_status="exited", status_msg="container exited (code 0)")
        return inst
