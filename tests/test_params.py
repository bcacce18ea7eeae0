"""Params: both demo files validate; bad input names the field, the value and what is allowed."""

from __future__ import annotations

import errno
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runbook_lib.errors import EXIT_USAGE, ParamsError
from runbook_lib.params import load_params, parse_yaml, validate

from .conftest import ROOT


@pytest.mark.parametrize("name", ["demo.yaml", "demo-train.yaml", "demo-train-ddp.yaml", "demo-s3.yaml",
                                  "demo-haproxy.yaml"])
def test_shipped_params_validate(name: str) -> None:
    mig = load_params(ROOT / "params" / name)
    assert mig.source.name != mig.target.name
    assert mig.source.provider == "local"


def test_bad_field_is_named_with_value_and_limit(make_params) -> None:
    p = make_params(target={"price_usd_per_hour": -3})
    with pytest.raises(ParamsError) as ei:
        load_params(p)
    msg = str(ei.value)
    assert "target.price_usd_per_hour" in msg and "-3" in msg and "greater than or equal to 0" in msg
    assert ei.value.field == "target.price_usd_per_hour" and ei.value.value == -3
    assert ei.value.exit_code == EXIT_USAGE


def test_unknown_field_and_bad_device_are_refused(make_params) -> None:
    with pytest.raises(ParamsError, match=r"source.gpus: Extra inputs are not permitted"):
        load_params(make_params(source={"gpus": 2}))
    with pytest.raises(ParamsError, match=r"target.device: String should match pattern"):
        load_params(make_params(target={"device": "tpu"}))


def test_secret_must_be_a_reference_and_is_never_echoed(make_params) -> None:
    token = "hf_abcdefghijklmnopqrstuvwxyz0123456789"
    with pytest.raises(ParamsError, match=r"source.secrets.0.ref") as ei:
        load_params(make_params(source={"secrets": [{"name": "HF_TOKEN", "ref": token}]}))
    assert token not in str(ei.value) and "env:VAR or file:/path" in str(ei.value)
    assert ei.value.value is None


def test_yaml_12_booleans_and_dates_stay_strings() -> None:
    data = parse_yaml("a: no\nb: 2026-01-02\nc: true\nd: 1.10\n")
    assert data == {"a": "no", "b": "2026-01-02", "c": True, "d": 1.1}


def test_not_a_mapping_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ParamsError, match="top level must be a mapping"):
        parse_yaml("- 1\n- 2\n")
    with pytest.raises(ParamsError, match="cannot read params file"):
        load_params(tmp_path / "nope.yaml")


@pytest.mark.parametrize("steps", [[50, 10], [10, 50, 90], [0, 100], []])
def test_cutover_steps_must_increase_to_100(steps: list[int]) -> None:
    base = parse_yaml((ROOT / "params" / "demo.yaml").read_text())
    base["cutover"]["steps_percent"] = steps
    with pytest.raises(ParamsError, match=r"cutover.steps_percent"):
        validate(base)


@pytest.mark.parametrize("value,kind", [
    ("AKIA" + "ABCDEFGHIJKLMNOP", "AWS access key"),
    ("hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6", "Hugging Face token"),
    ("rpa_" + "ABCDEFGHIJ0123456789KLMN", "Runpod API key"),
    ("-----BEGIN OPENSSH " + "PRIVATE KEY-----\nabc", "private key"),
    ("3f" * 32, "64-hex-digit"),
    ("q8Zr2LxV9pW4mN7kT1sB6yH3gD0fJ5cA", "high-entropy"),
])
def test_key_pasted_anywhere_is_refused_by_field(make_params, value: str, kind: str) -> None:
    p = make_params(description=f"note {value}")
    with pytest.raises(ParamsError) as ei:
        load_params(p)
    assert "description: looks like" in str(ei.value) and kind in str(ei.value)
    assert value not in str(ei.value)


def test_ordinary_values_are_not_mistaken_for_keys() -> None:
    mig = load_params(ROOT / "params" / "demo-s3.yaml")
    assert mig.storage.access_key_id_ref == "env:AWS_ACCESS_KEY_ID"


def test_a_side_accepts_only_its_providers_fields(make_params) -> None:
    # The profile is a discriminated union on `provider`: a field another provider needs is
    # refused where it was written, never silently ignored.
    with pytest.raises(ParamsError, match=r"target.image: Extra inputs are not permitted"):
        load_params(make_params(target={"image": "ghcr.io/example/agent:1"}))
    with pytest.raises(ParamsError, match=r"target.runpod_graphql_spot: Extra inputs are not permitted"):
        load_params(make_params("runpod-to-vast.yaml", target={"runpod_graphql_spot": True}))
    with pytest.raises(ParamsError, match=r"source: provider must be one of local, runpod, vast, live \(got"):
        load_params(make_params(source={"provider": "lambda"}))
    with pytest.raises(ParamsError, match=r"source.fault: Extra inputs are not permitted"):
        load_params(make_params("runpod-to-vast.yaml", source={"fault": "worker_crash"}))


def test_the_cutover_mode_follows_the_data_semantics(make_params) -> None:
    assert load_params(make_params()).cutover_mode == "drain"  # inference default
    assert load_params(make_params("demo-train.yaml")).cutover_mode == "quiesce"  # training: one writer
    assert load_params(make_params(cutover={"mode": "dual_run"})).cutover_mode == "dual_run"
    with pytest.raises(ParamsError, match=r"cutover.mode 'dual_run' does not fit a training job: it has one writer"):
        load_params(make_params("demo-train.yaml", cutover={"mode": "dual_run"}))
    with pytest.raises(ParamsError, match=r"cutover.mode 'quiesce' stops writes; an inference endpoint"):
        load_params(make_params(cutover={"mode": "quiesce"}))
    with pytest.raises(ParamsError, match=r"cutover.on_rollback: Input should be 'keep', 'copy_back' or 'discard'"):
        load_params(make_params(cutover={"on_rollback": "forget"}))


def test_drills_must_be_known_and_only_block_what_runs(make_params) -> None:
    assert load_params(make_params(drills={"run": [], "blocking": []})).drills.run == ()
    with pytest.raises(ParamsError, match=r"drills.run.0: Input should be 'redeliver'"):
        load_params(make_params(drills={"run": ["explode"]}))
    with pytest.raises(ParamsError, match=r"drills.blocking names \['hung_worker'\] that drills.run does not run"):
        load_params(make_params(drills={"run": ["redeliver"], "blocking": ["hung_worker"]}))
    with pytest.raises(ParamsError, match=r"lists a drill twice"):
        load_params(make_params(drills={"run": ["redeliver", "redeliver"], "blocking": []}))


def test_a_checkpoint_workload_needs_no_code_and_its_path_is_the_project_s(make_params, tmp_path: Path) -> None:
    from runbook_lib.params import CHECKPOINT_ENTRY_POINT

    mig = load_params(make_params("demo-checkpoint.yaml"))
    assert mig.workload.entry_point == CHECKPOINT_ENTRY_POINT and mig.cutover_mode == "quiesce"
    assert mig.workload.checkpoint == str(tmp_path / "examples" / "checkpoint-demo")  # relative to the project
    assert mig.workload.unit == "restore"
    assert load_params(make_params("demo-checkpoint.yaml", workload={"checkpoint": "/data/ck"})).workload.checkpoint \
        == "/data/ck"
    pod = tmp_path / "pod"  # a remote pod reads the params it was sent in its own working directory
    pod.mkdir()
    (pod / "params.yaml").write_text(make_params("demo-checkpoint.yaml").read_text())
    assert load_params(pod / "params.yaml").workload.checkpoint == str(pod / "examples" / "checkpoint-demo")
    with pytest.raises(ParamsError, match=r"needs workload.checkpoint"):
        load_params(make_params("demo-checkpoint.yaml", workload={"checkpoint": ""}))
    s3 = load_params(make_params("demo-checkpoint.yaml", workload={
        "checkpoint": "s3://models/llm/v3", "checkpoint_store": {"endpoint_url": "http://127.0.0.1:9000",
                                                                 "access_key_id_ref": "env:MODELS_KEY_ID",
                                                                 "secret_access_key_ref": "env:MODELS_SECRET"}}))
    assert s3.workload.checkpoint == "s3://models/llm/v3"  # a URL, not a project path
    assert s3.workload.checkpoint_store is not None and s3.workload.checkpoint_store.access_key_id_ref == \
        "env:MODELS_KEY_ID"
    with pytest.raises(ParamsError, match=r"names no bucket"):
        load_params(make_params("demo-checkpoint.yaml", workload={"checkpoint": "s3:///ck"}))
    with pytest.raises(ParamsError, match=r"checkpoint_store is how an s3:// checkpoint's bucket is reached"):
        load_params(make_params("demo-checkpoint.yaml", workload={"checkpoint_store": {"region": "eu-west-1"}}))
    with pytest.raises(ParamsError, match=r"access_key_id_ref is set and secret_access_key_ref is not: give both"):
        load_params(make_params("demo-checkpoint.yaml", workload={"checkpoint": "s3://m/ck", "checkpoint_store": {
            "access_key_id_ref": "env:MODELS_KEY_ID"}}))
    with pytest.raises(ParamsError, match=r"secret_access_key_ref is set and access_key_id_ref is not"):
        load_params(make_params(storage={"secret_access_key_ref": "env:AWS_SECRET_ACCESS_KEY"}))
    with pytest.raises(ParamsError, match=r"starts with 's3:', which is neither s3:// nor file://"):
        load_params(make_params("demo-checkpoint.yaml", workload={"checkpoint": "s3:/m/ck"}))
    with pytest.raises(ParamsError, match=r"checkpoint_store.access_key_id_ref: String should match pattern"):
        load_params(make_params("demo-checkpoint.yaml", workload={"checkpoint": "s3://m/ck",
                                                                  "checkpoint_store": {"access_key_id_ref": "AKIA123"}}))
    with pytest.raises(ParamsError, match=r"checkpoint_every \(4\) must be below restores \(3\)"):
        load_params(make_params("demo-checkpoint.yaml", workload={"restores": 3, "checkpoint_every": 4}))
    with pytest.raises(ParamsError, match=r"belong to kind 'checkpoint'"):
        load_params(make_params("demo-train.yaml", workload={"checkpoint": "/data/ck"}))
    with pytest.raises(ParamsError, match=r"entry_point is required for kind 'training'"):
        load_params(make_params("demo-train.yaml", workload={"entry_point": ""}))


def test_a_local_target_s_machines_are_named_once_and_ask_for_no_gpu_by_default(make_params) -> None:
    tgt = load_params(make_params(target={"offer": {"vcpu_min": 2}})).target
    assert tgt.offer.gpu_count_min == 0 and tgt.offer.vcpu_min == 2  # a partial offer section still asks for no GPU
    assert [o.offer_id for o in tgt.offers] == ["local-1cpu", "local-2cpu", "local-1gb"]  # demo.yaml's, in order
    twice = [{"offer_id": "a", "vcpu": 1, "ram_gib": 2, "disk_gb": 20, "usd_per_hour": 0.1}] * 2
    with pytest.raises(ParamsError, match=r"offers names \['a'\] more than once"):
        load_params(make_params(target={"offers": twice}))
    with pytest.raises(ParamsError, match=r"target.offers.0.vcpu"):
        load_params(make_params(target={"offers": [{**twice[0], "vcpu": 0}]}))
    with pytest.raises(ParamsError, match=r"offers is empty: declare the machines \(offers\) or remove offer"):
        load_params(make_params(target={"offers": []}))  # demo.yaml's target.offer, with nothing to apply it to
    with pytest.raises(ParamsError, match=r"source.offers: the source is the machine that runs today"):
        load_params(make_params(source={"offers": twice[:1]}))


@pytest.mark.parametrize(("extra", "said"), [
    ("gates:\n  spend_limit_usd: 100\n", "key 'gates' is given twice"),  # would drop the reviewed section
    ("notes: &n [1, 2]\nmore: *n\n", "an anchor (&n) is not accepted"),  # alias expansion (billion laughs)
    ("notes: {limit: .inf}\n", "'.inf' is not a finite number"),
    ("notes: " + "[" * 3000 + "]" * 3000 + "\n", "nesting deeper than 32 levels"),  # no RecursionError
    ("notes: " + "9" * 5000 + "\n", "an integer of 5000 digits (at most 30)"),  # was Python's ValueError, exit 4
])
def test_params_that_would_change_meaning_or_blow_up_are_refused_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, said: str) -> None:
    from runbook_lib.cli import main as cli_main

    path = tmp_path / "bad.yaml"
    path.write_text((ROOT / "params" / "demo.yaml").read_text() + extra)
    with pytest.raises(ParamsError, match=re.escape(said)):
        load_params(path)
    assert cli_main(["run", str(path)]) == EXIT_USAGE
    assert said in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # nothing was written


@pytest.mark.parametrize(("over", "field"), [
    ({"gates": {"hold_deadline_s": 1.0e308}}, "gates.hold_deadline_s"),  # phase 06 overflowed the clock
    ({"cutover": {"rollback_window_s": 1.0e308}}, "cutover.rollback_window_s"),
    ({"measure": {"warmup_requests": 10**9}}, "measure.warmup_requests"),
    ({"measure": {"arrival_rate_per_s": 1.0e300}}, "measure.arrival_rate_per_s"),
    ({"storage": {"url": "s3:///prefix"}}, "storage.url"),  # passed validation, failed in phase 01
])
def test_huge_values_and_a_bucketless_store_are_refused_naming_the_field_and_its_limit(
        make_params, capsys: pytest.CaptureFixture[str], over: dict, field: str) -> None:
    from runbook_lib.cli import main as cli_main

    path = make_params(**over)
    with pytest.raises(ParamsError) as e:
        load_params(path)
    assert field in str(e.value) and ("less than or equal to" in str(e.value) or "names no bucket" in str(e.value))
    assert cli_main(["run", str(path)]) == EXIT_USAGE
    assert field in capsys.readouterr().err
    assert not (path.parent.parent / "reports").exists()  # nothing was run


@pytest.mark.parametrize(("raw", "said"), [
    (b"\xff\xfe\x00migration: x\n", "not UTF-8 text (byte 0xff at offset 0)"),  # was UnicodeDecodeError, exit 4
    (b"migration: caf\xe9\n", "not UTF-8 text (byte 0xe9 at offset 14)"),  # Latin-1
    (b"# " + b"x" * (1024 * 1024) + b"\n", "larger than 1024 KiB"),
])
def test_a_params_file_that_is_not_utf8_text_or_is_huge_is_a_params_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], raw: bytes, said: str) -> None:
    from runbook_lib.cli import main as cli_main

    path = tmp_path / "bad.yaml"
    path.write_bytes(raw)
    with pytest.raises(ParamsError, match=re.escape(said)):
        load_params(path)
    assert cli_main(["run", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_a_path_that_cannot_be_written_is_a_usage_error_in_one_line(
        make_params, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`runbook init` onto a path whose parent is a file, and `runbook run --reports` there: exit 2
    with the path and what to do (both were exit 4, a failed run). A file as parent is used because
    the tests run as root in CI, where a read-only directory is still writable."""
    from runbook_lib.cli import main as cli_main
    from runbook_lib.errors import EXIT_FAILED, os_error_exit, os_error_line

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert cli_main(["init", str(blocker / "project")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"cannot use {blocker}/project" in err and "each parent must exist" in err and len(err.splitlines()) == 1
    assert cli_main(["run", str(make_params()), "--reports", str(blocker / "reports")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert str(blocker / "reports") in err and "Not a directory" in err and len(err.splitlines()) == 1
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "04.ipynb"))
    assert os_error_exit(full) == EXIT_FAILED  # the run failed for want of disk: named, not a usage error
    assert os_error_line(full).startswith(f"no space left on the device holding {tmp_path}/run/04.ipynb")
    assert os_error_exit(PermissionError(errno.EACCES, "Permission denied", "/x")) == EXIT_USAGE


# -- property: whatever a mutated params file holds, the loader answers in one line, at once -------

_DEMO = parse_yaml((ROOT / "params" / "demo.yaml").read_text())


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path in a parsed params file (list items by index)."""
    out = [prefix] if prefix else []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for k, v in items:
        out += _paths(v, prefix + (k,))
    return out


_PATHS = _paths(_DEMO)
_JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=8), st.integers(), max_size=2),
    st.sampled_from(["../../etc/passwd", "s3:///x", "env:", "file:", "os:system", "1e308", "-1", "NaN", "\u202e"]))
_MUTATION = st.tuples(st.sampled_from(_PATHS), st.sampled_from(["replace", "delete", "add"]), _JUNK)


def _mutated(path: tuple[Any, ...], how: str, junk: Any) -> dict[str, Any]:
    import copy

    data = copy.deepcopy(_DEMO)
    parent = data
    for k in path[:-1]:
        parent = parent[k]
    last = path[-1]
    if how == "replace":
        parent[last] = junk
    elif how == "delete" and isinstance(parent, dict):
        del parent[last]
    elif isinstance(parent, dict):
        parent[f"{last}_extra"] = junk  # a field the schema does not know
    else:
        parent.append(junk)
    return data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_MUTATION)
def test_a_mutated_params_file_is_loaded_or_refused_in_one_line_with_exit_2_at_once(
        tmp_path: Path, mutation: tuple[tuple[Any, ...], str, Any]) -> None:
    """Issue 30 item 1: one key of demo.yaml replaced by junk, deleted, or joined by an unknown
    sibling. The loader either accepts it or raises ParamsError naming a field on the mutated
    path; `runbook run` on a refused file exits 2 with one line, no traceback, within a second,
    and writes nothing. An accepted file is never run here (it could be a valid migration)."""
    import io
    import time
    from contextlib import redirect_stderr

    from runbook_lib.cli import main as cli_main
    from runbook_lib.params import dump_yaml

    path, how, junk = mutation
    case = tmp_path / f"case-{time.monotonic_ns()}"
    (case / "params").mkdir(parents=True)
    params = case / "params" / "m.yaml"
    params.write_text(dump_yaml(_mutated(path, how, junk)))
    t0 = time.monotonic()
    try:
        load_params(params)
    except ParamsError as exc:
        named = {str(k) for k in path} | {f"{path[-1]}_extra", "(top level)"}
        # named by field, or (an integer past 30 digits) refused by the YAML loader at its line
        assert any(n in str(exc) for n in named) or "not valid YAML: an integer of" in str(exc), (mutation, str(exc))
    else:
        return
    err = io.StringIO()
    with redirect_stderr(err):
        code = cli_main(["run", str(params)])
    took = time.monotonic() - t0
    assert code == EXIT_USAGE, (mutation, err.getvalue())
    assert err.getvalue().startswith("error: ") and "Traceback" not in err.getvalue()
    assert took < 1.0, f"{took:.2f} s for {mutation}"
    assert sorted(p.name for p in case.iterdir()) == ["params"]  # nothing was written


def test_a_real_router_is_refused_where_it_cannot_route_and_a_command_router_needs_its_commands(make_params) -> None:
    # demo.yaml's endpoints are queue endpoints: a job's status polls would reach the other side
    with pytest.raises(ParamsError, match=r"endpoint_mode are 'queue' and 'queue' \(a queue endpoint's job is "
                                          r"polled at /status/\{id\}") as ei:
        load_params(make_params(cutover={"router": {"kind": "haproxy"}}))
    assert ei.value.exit_code == EXIT_USAGE
    with pytest.raises(ParamsError, match=r"cutover.mode dual_run sends every request to both sides itself"):
        load_params(make_params("demo-haproxy.yaml", cutover={"mode": "dual_run"}))
    with pytest.raises(ParamsError, match=r"cutover.mode dual_run sends every request to both sides itself"):
        load_params(make_params("demo-service.yaml", cutover={"mode": "dual_run", "router": {"kind": "haproxy"}}))
    with pytest.raises(ParamsError, match="needs set_command, read_command and url"):
        load_params(make_params("demo-haproxy.yaml", cutover={"router": {"kind": "command", "set_command": ["x"]}}))
    with pytest.raises(ParamsError, match="are for router kind 'command', not 'haproxy'"):
        load_params(make_params("demo-haproxy.yaml", cutover={"router": {"kind": "haproxy", "read_command": ["x"]}}))
    with pytest.raises(ParamsError, match="give its front URL in router.url"):
        load_params(make_params("demo-haproxy.yaml", cutover={"router": {"kind": "haproxy", "socket": "/run/h.sock"}}))
    # a router URL requests cannot be sent to, or one the runbook would never use, is refused here,
    # not in phase 05 after phases 01-04 rented and measured
    for url, says in (("http://[::1", "not a usable http(s) URL"), ("http://", "names no host"),
                      ("http://a b:9", "contains a space"), ("ftp://gw:9", "its scheme is 'ftp'")):
        with pytest.raises(ParamsError, match=re.escape(says)):
            load_params(make_params("demo-haproxy.yaml", cutover={"router": {
                "kind": "command", "url": url, "set_command": ["gw", "{source}", "{target}"], "read_command": ["gw"]}}))
    with pytest.raises(ParamsError, match=r"router.socket is empty, so the runbook would start its own HAProxy"):
        load_params(make_params("demo-haproxy.yaml", cutover={"router": {"kind": "haproxy", "url": "http://gw:80"}}))
    # windows that cannot fit phase 05's cell are refused with the arithmetic and the three fixes
    with pytest.raises(ParamsError, match=r"needs at least 600 s \(4 windows of cutover.requests_per_step = 300 "
                                          r"requests at 2/s\), more than run.cell_timeout_s = 120 s"):
        load_params(make_params("demo-service-router.yaml", run={"cell_timeout_s": 120},
                                cutover={"router": {"arrival_rate_per_s": 2}}))
    with pytest.raises(ParamsError, match=r"a training cutover moves pods, not requests"):
        load_params(make_params("demo-train.yaml", cutover={"router": {"kind": "haproxy"}}))
    # a service is routed request by request in every protocol it can speak
    for params in ("demo-service.yaml", "demo-runpod-handler.yaml", "demo-service-router.yaml"):
        mig = load_params(make_params(params, cutover={"router": {"kind": "haproxy"}}))
        assert mig.cutover.router.kind == "haproxy" and mig.cutover_mode == "drain"
    assert load_params(ROOT / "params" / "demo-service-router.yaml").cutover.router.arrival_rate_per_s == 12.5
    ok = load_params(make_params("demo-haproxy.yaml", cutover={"router": {
        "kind": "command", "url": "http://127.0.0.1:9000", "set_command": ["gw", "{source}", "{target}"],
        "read_command": ["gw", "get"]}}))
    assert ok.cutover.router.set_command == ("gw", "{source}", "{target}")
    # a set_command without the weights' placeholders would set the same weights at every step
    with pytest.raises(ParamsError, match=r"router.set_command \['gw', 'set', '\{source\}'\] has no \{target\}"):
        load_params(make_params("demo-haproxy.yaml", cutover={"router": {
            "kind": "command", "url": "http://127.0.0.1:9000", "set_command": ["gw", "set", "{source}"],
            "read_command": ["gw", "get"]}}))
    with pytest.raises(ParamsError, match=r"router.drain_command \['gw', 'drain'\] has no \{side\}"):
        load_params(make_params("demo-haproxy.yaml", cutover={"router": {
            "kind": "command", "url": "http://127.0.0.1:9000", "set_command": ["gw", "{source}", "{target}"],
            "read_command": ["gw", "get"], "drain_command": ["gw", "drain"]}}))


def test_a_router_executable_missing_here_stops_the_run_before_phase_01_with_exit_2(tmp_path: Path,
                                                                                  make_params) -> None:
    """The HAProxy binary or a command router's program, looked up on this machine by the runner's
    preflight: missing, `runbook run` exits 2 at once with one line naming the field, and no run
    directory is created."""
    import io
    from contextlib import redirect_stderr

    from runbook_lib.cli import main as cli_main

    cases = [({"router": {"kind": "haproxy", "binary": "haproxy-not-installed"}},
              "cutover.router.binary: no executable 'haproxy-not-installed' on this machine"),
             ({"router": {"kind": "command", "url": "http://127.0.0.1:9000",
                          "set_command": [str(tmp_path / "gw"), "{source}", "{target}"], "read_command": ["true"]}},
              f"cutover.router.set_command: no executable '{tmp_path / 'gw'}' on this machine")]
    for i, (cut, says) in enumerate(cases):
        params = make_params("demo-haproxy.yaml", f"m{i}.yaml", cutover=cut)
        err = io.StringIO()
        with redirect_stderr(err):
            code = cli_main(["run", str(params)])
        assert code == 2 and says in err.getvalue() and "Traceback" not in err.getvalue(), err.getvalue()
        assert not (params.parent.parent / "reports").exists()
