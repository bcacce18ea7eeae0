"""Schedules (runbook_lib/traffic/schedules.py): the command and cron kinds against real commands
and real crontab files, and the params that declare them. The Airflow kind is exercised against a
real Airflow API server in the end-to-end tier (tests/airflow_api.py: the training approval walk
moves a DAG's schedule to the target, the rollback case moves it back)."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.errors import ParamsError, ProviderError
from runbook_lib.params import ScheduleParams, validate
from runbook_lib.traffic import schedules as sch

from .conftest import ROOT

SCHEDULER = '''import json, sys
from pathlib import Path
state = Path("state.json")
cmd = sys.argv[1]
if cmd == "read":
    print(state.read_text())
elif cmd == "set":
    if sys.argv[2] not in ("source", "target"):
        sys.exit(2)
    Path("sets.log").open("a").write(sys.argv[2] + "\\n")
    if "--ignore" not in sys.argv:
        body = json.loads(state.read_text())
        state.write_text(json.dumps({**body, "side": sys.argv[2]}))
elif cmd == "garbled":
    print("side=source")
elif cmd == "refuse":
    print("scheduler is read-only today", file=sys.stderr)
    sys.exit(3)
'''


def _command(tmp_path: Path, set_args: tuple[str, ...] = ("set", "{side}"), read: str = "read") -> sch.Schedule:
    (tmp_path / "scheduler.py").write_text(SCHEDULER)
    (tmp_path / "state.json").write_text(json.dumps({"side": "source", "schedule": "0 2 * * *", "job": "train"}))
    p = ScheduleParams(name="nightly", kind="command", read_command=(sys.executable, "scheduler.py", read),
                       set_command=(sys.executable, "scheduler.py", *set_args))
    return sch.make(p, project=tmp_path)


def _sets(tmp_path: Path) -> list[str]:
    log = tmp_path / "sets.log"
    return log.read_text().split() if log.exists() else []


def test_a_command_schedule_is_pointed_at_the_target_read_back_and_pointed_back(tmp_path: Path) -> None:
    s = _command(tmp_path)
    state = s.read()
    assert (state.side, state.cadence) == ("source", "0 2 * * *") and '"job": "train"' in state.detail
    assert s.equivalent().same_cadence is None  # a user's command cannot say what the target's runs at
    [moved] = sch.shift([s], "target")
    assert (moved.ok, moved.before, moved.after, moved.error) == (True, "source", "target", "")
    assert json.loads((tmp_path / "state.json").read_text())["side"] == "target"
    [again] = sch.shift([s], "target")  # already there: read, not set again
    assert again.ok and _sets(tmp_path) == ["target"]
    [back] = sch.shift([s], "source")
    assert (back.ok, back.before, back.after) == (True, "target", "source") and _sets(tmp_path) == ["target", "source"]


def test_a_command_schedule_that_does_not_move_or_cannot_be_read_is_named(tmp_path: Path) -> None:
    # set_command exits 0 but changes nothing: the read-back catches it
    [stuck] = sch.shift([_command(tmp_path, ("set", "{side}", "--ignore"))], "target")
    assert not stuck.ok and stuck.after == "source"
    assert stuck.error.startswith("read back, it starts 'source', not the target") and _sets(tmp_path) == ["target"]
    # set_command fails: its exit status and what it printed
    [refused] = sch.shift([_command(tmp_path, ("refuse", "{side}"))], "target")
    assert not refused.ok and "exited 3: scheduler is read-only today" in refused.error
    assert refused.error.startswith("schedule nightly: set_command [")
    # read_command prints something that is not the JSON asked for
    with pytest.raises(ProviderError, match=r"read_command .* printed 'side=source', not JSON like"):
        _command(tmp_path, read="garbled").read()


CRONTAB = """# m h dom mon dow user command
SHELL=/bin/sh
0 2 * * * trainer /opt/train.sh --on runpod
*/5 * * * * trainer /opt/heartbeat.sh
"""
SOURCE, TARGET = "0 2 * * * trainer /opt/train.sh --on runpod", "0 2 * * * trainer /opt/train.sh --on vast"


def _cron(tmp_path: Path, text: str = CRONTAB, target: str = TARGET) -> tuple[sch.Schedule, Path]:
    f = tmp_path / "cron.d" / "train"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text)
    f.chmod(0o600)
    p = ScheduleParams(name="train", kind="cron", file="cron.d/train", line=SOURCE, target_line=target)
    return sch.make(p, project=tmp_path), f


def test_a_cron_schedule_swaps_the_source_entry_for_the_target_entry_in_place(tmp_path: Path) -> None:
    s, f = _cron(tmp_path)
    state = s.read()
    assert (state.side, state.cadence) == ("source", "0 2 * * *") and str(f) in state.detail
    assert s.equivalent().same_cadence is True
    [moved] = sch.shift([s], "target")
    assert moved.ok and f.read_text() == CRONTAB.replace(SOURCE, TARGET)  # the other lines untouched, in order
    assert stat.S_IMODE(f.stat().st_mode) == 0o600 and sorted(p.name for p in f.parent.iterdir()) == ["train"]
    [back] = sch.shift([s], "source")
    assert back.ok and f.read_text() == CRONTAB  # byte for byte what it was


def test_a_cron_schedule_reads_both_neither_and_a_changed_time_as_they_are(tmp_path: Path) -> None:
    s, _ = _cron(tmp_path, CRONTAB + TARGET + "\n")
    assert s.read().side == "both"  # both would start: a double run, read as such
    [fixed] = sch.shift([s], "target")  # pointing keeps one entry: the target's, once
    assert fixed.ok and s.read().side == "target"
    s, f = _cron(tmp_path, CRONTAB.replace(SOURCE, "# " + SOURCE))
    assert s.read().side == "neither"  # a commented entry starts nothing
    with pytest.raises(ProviderError, match="has neither side's entry"):
        s.point("target")
    assert f.read_text() == CRONTAB.replace(SOURCE, "# " + SOURCE)  # unchanged
    s, _ = _cron(tmp_path, target="30 3 * * * trainer /opt/train.sh --on vast")
    eq = s.equivalent()
    assert eq.same_cadence is False and "'30 3 * * *', the source's at '0 2 * * *'" in eq.reason
    s, _ = _cron(tmp_path / "missing")
    (tmp_path / "missing" / "cron.d" / "train").unlink()
    with pytest.raises(ProviderError, match=r"cannot read crontab file .*train \(FileNotFoundError"):
        s.read()


def _migration(**source: Any) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "params" / "demo-train.yaml").read_text())
    data["source"].update(source)
    return dict(data)


@pytest.mark.parametrize(("entry", "message"), [
    ({"kind": "airflow", "api_url": "http://127.0.0.1:8080", "dag_id": "a"}, "needs target_dag_id"),
    ({"kind": "airflow", "api_url": "http://127.0.0.1:8080", "dag_id": "a", "target_dag_id": "a"},
     "pausing one DAG and unpausing the same one moves nothing"),
    ({"kind": "airflow", "api_url": "127.0.0.1:8080", "dag_id": "a", "target_dag_id": "b"}, "not a usable http"),
    ({"kind": "airflow", "api_url": "http://h:8080", "dag_id": "a", "shift": "variable", "variable": "SIDE",
      "source_value": "runpod", "target_value": "runpod"}, "would not move the schedule"),
    ({"kind": "airflow", "api_url": "http://h:8080", "dag_id": "a", "target_dag_id": "b", "token_env": "T",
      "username_env": "U", "password_env": "P"}, "not both"),
    ({"kind": "cron", "file": "f", "line": "0 2 * * x", "target_line": TARGET}, "is not one crontab entry"),
    ({"kind": "cron", "file": "f", "line": SOURCE, "target_line": SOURCE}, "the same entry"),
    ({"kind": "cron", "file": "f", "line": SOURCE, "target_line": TARGET, "shift": "variable"},
     "shift is not read for kind cron; remove it"),
    ({"kind": "command", "read_command": ["r"], "set_command": ["s"]}, "has no {side}"),
    ({"kind": "command", "read_command": ["r"], "set_command": ["s", "{side}"], "dag_id": "x"},
     "dag_id is not read for kind command; remove it"),
])
def test_a_schedule_missing_what_its_kind_needs_is_refused_naming_it(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ParamsError, match=message.replace("{", r"\{").replace("(", r"\(")):
        validate(_migration(schedules=[{"name": "nightly", **entry}]))


def test_schedules_belong_to_the_source_each_with_its_own_name() -> None:
    entry = {"name": "n", "kind": "command", "read_command": ["r"], "set_command": ["s", "{side}"]}
    assert validate(_migration(schedules=[entry])).source.schedules[0].name == "n"
    with pytest.raises(ParamsError, match="more than once"):
        validate(_migration(schedules=[entry, entry]))
    data = _migration()
    data["target"]["schedules"] = [entry]
    with pytest.raises(ParamsError, match="Move them to source.schedules"):
        validate(data)
