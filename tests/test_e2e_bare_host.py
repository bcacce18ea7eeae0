"""README: "Both commands need only Python 3.11+ and the package registries: no credentials, no
GPU, no other network." `make test-e2e` runs the whole tier through ``tests/bare-host``: no
credential in the environment, no GPU visible and, as root where the kernel allows a network
namespace (CI), no network but loopback. Every case of the tier runs there; this one checks that
the environment is what it claims and that the demo's migration, with every drill, went GO in it."""

from __future__ import annotations

import errno
import os
import socket

import pytest
import yaml

from runbook_lib.run.runner import RunResult
from runbook_lib.secret_refs import names_present

from .conftest import ROOT

pytestmark = pytest.mark.e2e


@pytest.mark.measure  # reads the shared inference run
def test_the_demo_needs_no_credentials_no_gpu_and_no_network(inference_go_run: RunResult) -> None:
    held = set(filter(None, os.environ.get("RUNBOOK_BARE_HOST", "").split(",")))
    if not held:
        pytest.skip("run through `make test-e2e` (tests/bare-host sets RUNBOOK_BARE_HOST)")
    assert {"credentials", "gpu"} <= held
    assert names_present() == []  # no variable named like a credential (KEY, TOKEN, SECRET, ...)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    import torch

    assert not torch.cuda.is_available()
    demo = yaml.safe_load((ROOT / "params" / "demo.yaml").read_text())
    for side in ("source", "target"):  # what `make demo` runs: local sides on the CPU, secrets optional
        assert demo[side]["provider"] == "local" and demo[side]["device"] == "cpu"
        assert all(s.get("required") is False for s in demo[side].get("secrets", []))
    # The shared run is params/demo.yaml with every drill; its two declared secrets are canary
    # values the secret-handling cases look for, set only while it ran.
    assert (inference_go_run.decision, inference_go_run.exit_code) == ("GO", 0), inference_go_run.reasons
    if "network" not in held:
        pytest.skip("no network namespace on this host (tests/bare-host runs it as root where the kernel allows)")
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # a UDP connect sends nothing; it needs a route
    try:
        with pytest.raises(OSError) as no_route:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1 (RFC 5737): routable only through a default route
        assert no_route.value.errno == errno.ENETUNREACH
    finally:
        probe.close()
    with socket.create_server(("127.0.0.1", 0)) as srv:  # loopback is up: the simulators and servers bind there
        with socket.create_connection(srv.getsockname(), timeout=5):
            pass
