"""Entry of a local pod process: run the pod's command, then record its exit code.

Usage: ``python -m runbook_lib.providers.local.pod <pod_dir> <argv...>`` (started by
:class:`runbook_lib.providers.local.LocalProvider` in its own session, cwd = container disk).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    pod_dir, command = Path(argv[0]), argv[1:]
    started = time.time()
    code = subprocess.call(command)
    tmp = pod_dir / ".exit.json"
    tmp.write_text(json.dumps({"exit_code": code, "started_at": started, "ended_at": time.time()}))
    tmp.replace(pod_dir / "exit.json")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
