"""Behavioural promises the documentation makes (README.md and the docs site under docs/) that no
other case checks, one case per promise, each
against the real code: the CLI (``runbook_lib.cli.main``, or ``python -m runbook_lib.cli`` as a
process), params loading, the adapters over real HTTP to the loopback simulators, moto's S3 and
real torch. The page each case checks is named in its docstring (the quoted phrase is what to
search for)."""

from __future__ import annotations

import gc
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
import yaml

from runbook_lib.cli import main as cli_main
from runbook_lib.errors import ApprovalRequired, AuthError, ParamsError, StorageError
from runbook_lib.evidence.approvals import Approval, require
from runbook_lib.params import RemoteProfile, dump_yaml, load_params
from runbook_lib.providers import create_provider
from runbook_lib.providers.api import SIMULATOR_HEADER, KeySource
from runbook_lib.providers.base import PodSpec
from runbook_lib.providers.local.lifecycle import free_port
from runbook_lib.providers.simulator import SimServer, sim_module, simulate
from runbook_lib.providers.vast import default_key as vast_default_key
from runbook_lib.providers.vast.wire import BASE_URL as VAST_BASE_URL
from runbook_lib.storage.s3 import S3Store

from .conftest import ROOT

RUN_ID = "20261130T000000Z-embed-runpod-to-vast-rdm001"
SIM_KEY = "sim-readme-key-0123456789abcdef"
REMOTE_PARAMS = ROOT / "params" / "runpod-to-vast.yaml"  # source: runpod, target: vast, both dry_run: true
KEY_VARS = ("RUNPOD_API_KEY", "VAST_API_KEY", "RUNBOOK_RUNPOD_API_URL", "RUNBOOK_RUNPOD_JOB_API_URL",
            "RUNBOOK_RUNPOD_PROXY_URL", "RUNBOOK_RUNPOD_LB_URL", "RUNBOOK_VAST_API_URL", "RUNBOOK_PROVIDER_FIXTURES")


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No provider key or base URL from this machine: the variables unset and HOME an empty
    directory (where ``~/.runpod/config.toml`` and the Vast.ai key files are looked for)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in KEY_VARS:
        monkeypatch.delenv(var, raising=False)
    return home


def _remote_run_dir(tmp_path: Path) -> Path:
    """``reports/<RUN_ID>`` holding the Runpod-to-Vast.ai example params as the run's kept params."""
    (tmp_path / "pyproject.toml").write_text("")  # the project `runbook cleanup` finds from the run
    run_dir = tmp_path / "reports" / RUN_ID
    run_dir.mkdir(parents=True)
    shutil.copyfile(REMOTE_PARAMS, run_dir / "params.yaml")
    return run_dir


# -- docs/how-to/interrupt-and-cleanup.md: `runbook cleanup` "exits 1 if anything is left or a provider could not be listed" --


def test_cleanup_exits_1_when_a_provider_could_not_be_listed(tmp_path: Path, no_keys: Path, capsys) -> None:
    """docs/how-to/interrupt-and-cleanup.md: `runbook cleanup` "exits 1 if ... a provider could not be listed". The run's
    params name Runpod and Vast.ai and neither key is set here, so neither account can be listed:
    the cleanup cannot say nothing is left, exits 1 (a dry run too) and records both sides as
    not listed in ``cleanup.json``."""
    run_dir = _remote_run_dir(tmp_path)
    assert cli_main(["cleanup", str(run_dir), "--dry-run"]) == 1
    assert cli_main(["cleanup", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert "could not list" in out and "not listed" in out
    record = json.loads((run_dir / "cleanup.json").read_text())
    assert record["clean"] is False and record["found"] == [] and record["remaining"] == []
    assert [u.split(":")[0] for u in record["unlisted"]] == ["source (runpod)", "target (vast)"]
    assert "no API key found" in record["unlisted"][0]


@pytest.fixture
def sims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_keys: Path) -> Iterator[dict[str, SimServer]]:
    """Both providers' simulators on 127.0.0.1, with the variables ``runbook simulate`` prints
    exported (their URLs and keys), as a user rehearsing cleanup would."""
    servers: dict[str, SimServer] = {}
    try:
        for name in ("runpod", "vast"):
            servers[name] = simulate(name, state_dir=tmp_path / "sim", key=f"{SIM_KEY}-{name}")
            for k, v in sim_module(name).exports(servers[name].url, f"{SIM_KEY}-{name}").items():
                monkeypatch.setenv(k, v)
        yield servers
    finally:
        for srv in servers.values():
            srv.close()  # destroys every machine the simulators still run


def _vast_instance(tmp_path: Path, run_id: str) -> str:
    """One Vast.ai instance labelled with ``run_id``, created through the real adapter (the
    simulator runs a sleeping process behind it); returns its id."""
    prov = create_provider("vast", root=tmp_path / ".runbook" / "vast", profile=load_params(REMOTE_PARAMS).target)
    spec = PodSpec(name="canary", command=("python", "-c", "import time; time.sleep(600)"), device="cpu",
                   price_usd_per_hour=0.4, labels=(("run_id", run_id), ("side", "target"), ("role", "canary")),
                   image="ghcr.io/example/embed-api:2.3.1", offers=("8812345",), disk_gb=40)
    plan = prov.plan_launch(spec, dry_run=False)
    pod = prov.apply(plan, Approval(plan.fingerprint, "test", "2026-11-30T00:00:00Z", "test"))
    prov.close()
    return str(pod.id)


def test_cleanup_exits_1_when_a_resource_is_left(tmp_path: Path, sims: dict[str, SimServer], capsys) -> None:
    """docs/how-to/interrupt-and-cleanup.md: `runbook cleanup` "exits 1 if anything is left". A Vast.ai instance labelled
    with the run is found, but the API answers its DELETE with HTTP 500 (nothing destroyed): the
    cleanup exits 1 and ``cleanup.json`` lists the instance as remaining. Once the API destroys
    again, the next cleanup destroys it and exits 0."""
    run_dir = _remote_run_dir(tmp_path)
    iid = _vast_instance(tmp_path, RUN_ID)
    api = sims["vast"].api
    real_handle = api.handle

    def refuse_deletes(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(500, json={"error": "internal", "msg": "try again later"})
        return real_handle(request)

    api.handle = refuse_deletes  # type: ignore[method-assign]
    assert cli_main(["cleanup", str(run_dir)]) == 1
    record = json.loads((run_dir / "cleanup.json").read_text())
    assert record["clean"] is False and record["unlisted"] == [] and record["destroyed"] == []
    assert [(r["id"], r["provider"]) for r in record["remaining"]] == [(iid, "vast")]
    assert "HTTP 500" in record["remaining"][0]["why"]
    assert iid in capsys.readouterr().out

    api.handle = real_handle  # type: ignore[method-assign]
    assert cli_main(["cleanup", str(run_dir)]) == 0
    record = json.loads((run_dir / "cleanup.json").read_text())
    assert record["clean"] is True and record["destroyed"] == [iid]
    gc.collect()  # cleanup closes each provider it opens: no unclosed connection is left to warn about


# -- docs/how-to/runpod-to-vast.md: the Vast.ai key: VAST_API_KEY, ~/.config/vastai/vast_api_key, ~/.vast_api_key --


def test_the_vast_key_is_read_in_vast_clis_order_and_never_shown(no_keys: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """docs/how-to/runpod-to-vast.md: "`VAST_API_KEY`, `~/.config/vastai/vast_api_key`, `~/.vast_api_key`" (in that
    order), "sent as `Authorization: Bearer`, never written to evidence". Each place wins over
    the ones after it; with none, the error lists the places and no value; a key the API refuses
    (and echoes back in its error body) is sent as a Bearer token and not quoted in the error."""
    env_key, config_key, legacy_key = ("env-key-aaaaaaaaaaaaaaaa", "config-key-bbbbbbbbbbbbbbbb",
                                       "legacy-key-cccccccccccccccc")
    config = no_keys / ".config" / "vastai" / "vast_api_key"
    config.parent.mkdir(parents=True)
    config.write_text(config_key + "\n")
    (no_keys / ".vast_api_key").write_text(legacy_key + "\n")
    monkeypatch.setenv("VAST_API_KEY", env_key)
    assert vast_default_key().resolve() == env_key
    monkeypatch.delenv("VAST_API_KEY")
    assert vast_default_key().resolve() == config_key
    config.unlink()
    assert vast_default_key().resolve() == legacy_key
    (no_keys / ".vast_api_key").unlink()
    with pytest.raises(AuthError) as missing:
        vast_default_key().resolve()
    assert "env:VAST_API_KEY, file:~/.config/vastai/vast_api_key, file:~/.vast_api_key" in str(missing.value)

    (no_keys / ".vast_api_key").write_text(legacy_key + "\n")
    sent: list[str] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers["Authorization"])
        return httpx.Response(401, json={"error": "invalid_api_key",
                                         "msg": f"{request.headers['Authorization']} is not a valid key"})

    prov = create_provider("vast", profile=load_params(REMOTE_PARAMS).target, transport=httpx.MockTransport(refuse))
    with pytest.raises(AuthError, match="HTTP 401") as refused:
        prov.list(labels={"run_id": "x"})
    prov.close()
    assert sent == [f"Bearer {legacy_key}"]
    assert legacy_key not in str(refused.value) and "<redacted>" in str(refused.value)


# -- docs/how-to/runpod-to-vast.md: "`dry_run: true` (the default for real providers)" --


def test_remote_profiles_default_to_dry_run_and_local_ones_never_are(tmp_path: Path) -> None:
    """docs/how-to/runpod-to-vast.md: "`dry_run: true` (the default for real providers)". The Runpod-to-Vast.ai
    example with ``dry_run`` left out of both sides loads with both in dry-run, and phase 06's
    resources treat both as plan-only; the local provider (the demo) is never dry-run: it has no
    such field (a ``dry_run`` on a local side is refused when params load, exit 2) and its plans
    are applied."""
    from runbook_lib.evidence.rundir import RunDir
    from runbook_lib.phases import open_phase

    (tmp_path / "params").mkdir()
    data = yaml.safe_load(REMOTE_PARAMS.read_text())
    for side in ("source", "target"):
        assert data[side].pop("dry_run") is True  # the example spells it out; here it is omitted
    remote = tmp_path / "params" / "remote.yaml"
    remote.write_text(dump_yaml(data))
    mig = load_params(remote)
    assert (mig.source.provider, mig.target.provider) == ("runpod", "vast")
    assert isinstance(mig.source, RemoteProfile) and isinstance(mig.target, RemoteProfile)
    assert (mig.source.dry_run, mig.target.dry_run) == (True, True)
    run = RunDir.create(remote, reports_dir=tmp_path / "reports")
    ctx = open_phase("06", str(remote), str(run.path), run_mode="headless")
    assert (ctx.resources.dry_run("source"), ctx.resources.dry_run("target")) == (True, True)

    demo = yaml.safe_load((ROOT / "params" / "demo.yaml").read_text())
    local = tmp_path / "params" / "local.yaml"
    local.write_text(dump_yaml(demo))
    lmig = load_params(local)
    assert (lmig.source.provider, lmig.target.provider) == ("local", "local")
    assert not hasattr(lmig.source, "dry_run") and not isinstance(lmig.source, RemoteProfile)
    lrun = RunDir.create(local, reports_dir=tmp_path / "reports")
    lctx = open_phase("06", str(local), str(lrun.path), run_mode="headless")
    assert (lctx.resources.dry_run("source"), lctx.resources.dry_run("target")) == (False, False)
    demo["source"]["dry_run"] = True
    local.write_text(dump_yaml(demo))
    with pytest.raises(ParamsError, match=r"source\.dry_run: Extra inputs are not permitted"):
        load_params(local)


# -- docs/how-to/rehearse.md: "A non-default base URL alone marks nothing (it may be a real proxy)" --


def _proxy(upstream: str) -> ThreadingHTTPServer:
    """A plain reverse proxy on 127.0.0.1 in front of ``upstream``: it forwards each request and
    answer as they are, except that it does not pass on the simulator's own header (as a proxy in
    front of the real API would have none to pass)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _forward(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(size) if size else b""
            keep = ("authorization", "content-type", "accept")
            r = httpx.request(self.command, upstream + self.path, content=body, timeout=30,
                              headers={k: v for k, v in self.headers.items() if k.lower() in keep})
            self.send_response(r.status_code)
            drop = (SIMULATOR_HEADER.lower(), "content-length", "transfer-encoding", "connection", "content-encoding")
            for k, v in r.headers.items():
                if k.lower() not in drop:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(r.content)))
            self.end_headers()
            self.wfile.write(r.content)

        do_GET = do_POST = do_PUT = do_DELETE = _forward  # noqa: N815 - http.server's names

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_non_default_base_url_alone_does_not_mark_a_rehearsal(tmp_path: Path) -> None:
    """docs/how-to/rehearse.md: "A non-default base URL alone marks nothing (it may be a real proxy), and
    `approvals.preapproved_simulator` approves only plans on an API that said it is a simulator".
    The Vast.ai adapter pointed at a non-default URL, a proxy whose answers are the API's but carry
    no ``X-Runbook-Simulator``, works (it lists the account) yet is no simulator, so a plan on it
    is not pre-approved by ``preapproved_simulator``; pointed straight at the simulator, the same
    adapter is marked and the same plan is approved as a simulator's."""
    srv = simulate("vast", state_dir=tmp_path / "sim", key=SIM_KEY)
    proxy = _proxy(srv.url)
    profile = load_params(REMOTE_PARAMS).target
    spec = PodSpec(name="canary", command=("python", "-c", "pass"), device="cpu", price_usd_per_hour=0.4,
                   labels=(("run_id", "r"),), image="ghcr.io/example/embed-api:2.3.1", offers=("8812345",),
                   disk_gb=40)
    try:
        proxy_url = f"http://127.0.0.1:{proxy.server_address[1]}"
        marks: dict[str, str] = {}
        for via, url in (("proxy", proxy_url), ("simulator", srv.url)):
            prov = create_provider("vast", profile=profile.model_copy(update={"api_url": url}),
                                   key=KeySource("vast", ("env:NONE",), _value=SIM_KEY))
            assert prov.api.base_url == url != VAST_BASE_URL  # both non-default
            assert prov.list(labels={"run_id": "r"}) == []  # the API answers either way
            marks[via] = prov.simulator(ask=True)
            plan = prov.plan_launch(spec, dry_run=False)
            run_dir = tmp_path / via
            if via == "proxy":
                with pytest.raises(ApprovalRequired):
                    require(plan, run_dir=run_dir, preapproved_local=False, simulator=marks[via])
            else:
                got = require(plan, run_dir=run_dir, preapproved_local=False, simulator=marks[via])
                assert "preapproved_simulator" in got.method and "vast simulator" in got.method
            prov.close()
        assert marks == {"proxy": "", "simulator": "vast"}
    finally:
        proxy.shutdown()
        proxy.server_close()
        srv.close()


# -- docs/how-to/rehearse.md: `runbook simulate runpod --port N` serves until Ctrl-C and prints the exports --


def _lines(stream: Any) -> queue.Queue[str]:
    """Each line of ``stream`` as it arrives, read by a thread (``""`` at its end)."""
    q: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in iter(stream.readline, ""):
            q.put(line)
        q.put("")

    threading.Thread(target=pump, daemon=True).start()
    return q


def _until(q: queue.Queue[str], found: Callable[[str], bool], timeout_s: float) -> list[str]:
    """Lines from ``q`` up to the first one ``found`` accepts; fails after ``timeout_s``."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            line = q.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail(f"no such line within {timeout_s} s; got {seen}")
        if line == "":
            pytest.fail(f"the output ended first; got {seen}")
        seen.append(line)
        if found(line):
            return seen


@pytest.mark.parametrize(("provider", "names", "probe"), [
    ("runpod", ["RUNBOOK_RUNPOD_API_URL", "RUNBOOK_RUNPOD_JOB_API_URL", "RUNBOOK_RUNPOD_LB_URL", "RUNBOOK_RUNPOD_PROXY_URL",
                "RUNPOD_API_KEY"],
     ("RUNBOOK_RUNPOD_API_URL", "/v2/pods")),
    ("vast", ["RUNBOOK_VAST_API_URL", "RUNBOOK_VAST_AUTOSCALER_URL", "VAST_API_KEY"],
     ("RUNBOOK_VAST_API_URL", "/api/v0/users/current/")),
])
def test_runbook_simulate_serves_until_ctrl_c_and_prints_the_exports(
        tmp_path: Path, provider: str, names: list[str], probe: tuple[str, str]) -> None:
    """docs/how-to/rehearse.md: "`runbook simulate runpod --port 9001` (or `vast`) serves one simulator
    until Ctrl-C and prints the variables to export". The command, as a process, prints an
    ``export`` line with exactly those variables, the URL on the port asked for; the printed key
    is accepted there (and a request without it refused); Ctrl-C (SIGINT) stops it within a few
    seconds, saying its machines are destroyed, and it exits 0: Ctrl-C is how the command is meant
    to end (``_cmd_simulate`` returns 0; 130 is ``runbook run``'s code for an interrupted run)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in KEY_VARS}
    # Started with SIGINT ignored, as a shell's background job starts its commands: Ctrl-C must
    # still stop it (the command sets its own handler).
    proc = subprocess.Popen([sys.executable, "-m", "runbook_lib.cli", "simulate", provider, "--port", str(port),
                             "--state", str(tmp_path / "state")], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        out = _lines(proc.stdout)
        shown = _until(out, lambda s: s.strip().startswith("export "), timeout_s=30)
        assert f"simulator at http://127.0.0.1:{port}" in "".join(shown)
        exports = dict(pair.split("=", 1) for pair in shown[-1].split()[1:])
        exports = {k: v.strip("'") for k, v in exports.items()}
        assert sorted(exports) == sorted(names)
        url, key = exports[probe[0]], exports[names[-1]]
        assert url == f"http://127.0.0.1:{port}" and key
        ok = httpx.get(url + probe[1], headers={"Authorization": f"Bearer {key}"}, timeout=10)
        assert ok.status_code == 200 and ok.headers[SIMULATOR_HEADER] == provider
        assert httpx.get(url + probe[1], timeout=10).status_code == 401  # the printed key is the one it demands
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # the command's faulthandler prints every thread's stack
            time.sleep(2)
            stacks = []
            while not out.empty():
                stacks.append(out.get())
            pytest.fail("still running 30 s after SIGINT; its threads:\n" + "".join(stacks))
        assert time.monotonic() - t0 < 30
        rest = []
        while (line := out.get(timeout=5)) != "":
            rest.append(line)
        assert "simulator stopped; its machines are destroyed" in "".join(rest)
        assert rc == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


# -- docs/how-to/checkpoint.md: "`runbook init` copies it with the example params" --


def test_runbook_init_copies_the_demo_checkpoint_the_example_params_name(tmp_path: Path) -> None:
    """docs/how-to/checkpoint.md: "`examples/make_demo_checkpoint.py` writes the demo checkpoint; `runbook init`
    copies it with the example params". After ``runbook init DIR``, every example params file in
    DIR loads, ``params/demo-checkpoint.yaml`` there names DIR's own copy of the demo checkpoint
    (a relative path is the project's), that copy holds the packaged files byte for byte (every
    shard its index names included), and the inspection finds no blocker in it."""
    from runbook_lib.portability.checkpoint import inspect

    proj = tmp_path / "proj"
    assert cli_main(["init", str(proj)]) == 0
    for p in sorted((proj / "params").glob("*.yaml")):
        load_params(p)
    mig = load_params(proj / "params" / "demo-checkpoint.yaml")
    ck = Path(mig.workload.checkpoint)
    assert ck == proj / "examples" / "checkpoint-demo" and ck.is_dir()
    packaged = ROOT / "examples" / "checkpoint-demo"
    names = sorted(p.name for p in packaged.iterdir() if p.is_file())
    assert sorted(p.name for p in ck.iterdir()) == names
    assert all((ck / n).read_bytes() == (packaged / n).read_bytes() for n in names)
    index = json.loads((ck / "model.safetensors.index.json").read_text())
    assert all((ck / shard).is_file() for shard in set(index["weight_map"].values()))
    assert inspect(ck).blockers == []


# -- docs/how-to/approve.md: "Rolling a route back to the source needs none" (no approval) --


def test_rolling_the_route_back_to_the_source_needs_no_approval(make_params: Callable[..., Path],
                                                                   tmp_path: Path) -> None:
    """docs/how-to/approve.md: "Rolling a route back to the source needs none" (approval). With local plans not
    pre-approved (``approvals.preapproved_local: false``) and no approval file, moving the route
    forward (phase 05's first slice step) stops for approval; rolling a route left at 20 % back to
    the source (phase 06 on NO-GO) applies at once, without any approval record. (Phase 05's own
    rollback after a failed step calls the same ``Route.set(0, ...)`` with no approval check; it
    needs phase 04's endpoints to reach, so it is not run here.)"""
    from runbook_lib.evidence.rundir import RunDir
    from runbook_lib.phases import cutover, decide, open_phase
    from runbook_lib.traffic.route import Route

    params = make_params("demo.yaml", approvals={"preapproved_local": False, "approval_file": ""})
    assert load_params(params).approvals.preapproved_local is False
    run = RunDir.create(params, reports_dir=tmp_path / "reports")
    ctx = open_phase("06", str(params), str(run.path), run_mode="headless")
    forward = cutover.slices(ctx)[0]
    assert forward.target_percent > 0 and forward.plan.action == "route"
    with pytest.raises(ApprovalRequired):
        ctx.resources.approve_change("target", forward.plan)
    approvals_dir = run.path / "approvals"
    assert sorted(p.name for p in approvals_dir.glob("*.json")) == [f"pending-{forward.plan.fingerprint[:16]}.json"]

    Route(run.path / "route.json", actor="cutover").set(20, "slice step 1")
    actions = decide.act(ctx, "NO-GO")
    assert actions.route is not None and actions.route["target_percent"] == 0
    assert actions.route["history"][-1]["reason"] == "NO-GO: source route restored"
    assert Route(run.path / "route.json").target_percent == 0
    # no approval was asked for or recorded: still only the forward step's pending file
    assert sorted(p.name for p in approvals_dir.glob("*.json")) == [f"pending-{forward.plan.fingerprint[:16]}.json"]


# -- docs/how-to/checkpoint.md: quantized tensors are a blocker of the checkpoint inspection --


# torch 2.x deprecates creating quantized tensors, and rebuilding one on load uses TypedStorage:
# warnings, not errors, outside this suite (which turns every warning into an error).
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning",
                            "ignore:TypedStorage is deprecated:UserWarning")
def test_a_quantized_tensor_is_a_blocker_naming_it(tmp_path: Path) -> None:
    """docs/how-to/checkpoint.md: "also blockers: ... sparse or quantized tensors (neither digested nor
    compared)". A torch.save checkpoint holding one quantized tensor (``torch.quantize_per_tensor``)
    among dense ones is inspected without crashing and has exactly one blocker,
    ``unsupported_layout``, naming that file and that tensor; the dense file beside it has none."""
    import torch

    from runbook_lib.portability.checkpoint import inspect

    ck = tmp_path / "ck"
    ck.mkdir()
    q = torch.quantize_per_tensor(torch.tensor([0.5, 1.0, -1.0]), 0.1, 0, torch.qint8)
    torch.save({"head.qweight": q, "head.bias": torch.zeros(3)}, ck / "quantized.pt")
    torch.save({"ok": torch.ones(2)}, ck / "dense.pt")
    ins = inspect(ck)
    assert [(f.file, f.check, f.severity) for f in ins.blockers] == [("quantized.pt", "unsupported_layout", "blocker")]
    assert "'head.qweight'" in ins.blockers[0].seen and "qint8" in ins.blockers[0].seen
    assert "dequantize()" in ins.blockers[0].fix


# -- docs/how-to/checkpoint.md: the S3 copy is "pinned to the version (or ETag) its HEAD saw" --

KEY_ID, SECRET = "AKIAREADMEPROMISES01", "readme-promises-secret-never-shown"


def _replace_after_head(store: S3Store, key: str, data: bytes) -> list[str]:
    """Overwrite ``key`` with ``data`` right after the store's next HEAD of it answers (between the
    HEAD and the GET of a copy), through a second client; returns the new version ids."""
    other = S3Store(store.bucket, "", endpoint_url=store.endpoint_url, access_key_id=KEY_ID, secret_access_key=SECRET)
    written: list[str] = []

    def replace(**kwargs: Any) -> None:
        if not written:
            r = other.client.put_object(Bucket=store.bucket, Key=key, Body=data)
            written.append(str(r.get("VersionId") or ""))

    store.client.meta.events.register("after-call.s3.HeadObject", replace)
    return written


def test_an_s3_copy_is_pinned_to_what_its_head_saw(s3_endpoint: str, tmp_path: Path) -> None:
    """docs/how-to/checkpoint.md: phase 01 "copies every object to this host, pinned to the version (or ETag) its
    HEAD saw". The object is replaced between the copy's HEAD and its GET. In an unversioned bucket
    (pinned by ETag) the copy is refused as changed while read and leaves no partial file; in a
    versioned bucket (pinned by version) the copy gets the bytes and the version the HEAD saw, not
    the newer ones."""
    old, new = b"weights v1 " * 100, b"weights v2, replaced " * 100
    plain = S3Store("readme-unversioned", "", endpoint_url=s3_endpoint, create_bucket=True,
                    access_key_id=KEY_ID, secret_access_key=SECRET)
    plain.client.put_object(Bucket=plain.bucket, Key="ck/model.pt", Body=old)
    written = _replace_after_head(plain, "ck/model.pt", new)
    with pytest.raises(StorageError, match="changed while it was read"):
        plain.copy_foreign("ck/model.pt", tmp_path / "a" / "model.pt")
    assert written == [""] and not (tmp_path / "a" / "model.pt").exists()

    versioned = S3Store("readme-versioned", "", endpoint_url=s3_endpoint, create_bucket=True,
                        access_key_id=KEY_ID, secret_access_key=SECRET)
    versioned.client.put_bucket_versioning(Bucket=versioned.bucket, VersioningConfiguration={"Status": "Enabled"})
    first = versioned.client.put_object(Bucket=versioned.bucket, Key="ck/model.pt", Body=old)["VersionId"]
    written = _replace_after_head(versioned, "ck/model.pt", new)
    got = versioned.copy_foreign("ck/model.pt", tmp_path / "b" / "model.pt")
    assert written and written[0] and written[0] != first  # a newer version exists now ...
    assert got.version_id == first and (tmp_path / "b" / "model.pt").read_bytes() == old  # ... the copy is the one seen
    assert got.size_bytes == len(old) and "md5 (single-part ETag)" in got.verified_by
