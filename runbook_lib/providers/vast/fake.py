"""A fake Vast.ai API (``api/v0`` bundles, asks, instances; ``api/v1`` instances, paginated)
built from the recorded shapes in ``recorded/`` (``docs/reference/providers.md`` section 3.9).
Instances walk null -> loading -> running as they are polled; ``FixtureApi``'s ``script`` queues
failure answers (a plain-text 429, a 410 offer gone, an outbid instance, an OCI error)."""

from __future__ import annotations

from typing import Any

from runbook_lib.providers.fixtures import FixtureApi, load


class FakeApi(FixtureApi):
    """Vast.ai's answers (see :class:`runbook_lib.providers.fixtures.FixtureApi` for the arguments)."""

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
        return self._json(404, {"success": False, "error": "not_found", "msg": f"no route {m} {path}"})

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
