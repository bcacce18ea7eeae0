"""An existing checkpoint migrated with no user code (``workload.kind: checkpoint``).

The checkpoint is a file or a directory of shards (torch.save files, safetensors, a sharded
index, or a torch distributed checkpoint read by :func:`runbook_lib.portability.checkpoint.load_dcp`) named
by ``workload.checkpoint``. Loading it freezes it first: every file is copied with
its sha256 into a private directory next to a ``checkpoint-manifest.json``; every tensor file is
then loaded by :func:`runbook_lib.portability.checkpoint.load_state` (``weights_only``, remapped to the
profile's device, the operator's ``allow_globals`` honoured only for files whose sha256 matches
that manifest). One step is one full restore of the artifact: read every file, check its sha256
against the manifest, load it. The outputs are a digest of every tensor, so phase 03 compares
what the canary loaded with what the source loaded.

Inference checks: a ``workload.entry_point`` that subclasses :class:`CheckpointWorkload` and
overrides :meth:`~CheckpointWorkload.inference_outputs` builds the model from :attr:`state` and
answers fixed inputs; the source's answers are golden in phase 01 and the canary's must match
them in phase 03 (``inference_parity``). ``runbook_lib/examples/checkpoint_model.py`` is one.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runbook_lib.layout import POD_VOLUME_ENV
from runbook_lib.portability.checkpoint import (
    DCP_METADATA,
    CheckpointError,
    iter_tensor_files,
    load_dcp,
    load_state,
    natural_key,
    sha256_of,
)
from runbook_lib.workload import AcceptanceWorkload

if TYPE_CHECKING:
    import numpy as np

CHECKPOINT_MANIFEST = "checkpoint-manifest.json"
"""``{relative path: sha256}`` of every file of the checkpoint, written next to the files."""

VOLUME_ENV = POD_VOLUME_ENV
"""Where a pod's volume is mounted (the local provider sets it at spawn); the container disk is
the pod's working directory."""


def location(path: Path | str, *, env: dict[str, str] | None = None, cwd: Path | None = None) -> dict[str, Any]:
    """Where the checkpoint sits from the pod's side: ``{"path", "where", "volume_dir"}`` with
    ``where`` one of ``volume`` (survives a stop), ``container disk`` (the pod's working
    directory: wiped on stop or replacement), ``outside the pod's disks`` (a host path or network
    mount), ``object store`` (an ``s3://`` URL: outlives every pod) or ``not checked`` (the pod
    names no volume directory)."""
    import os

    if str(path).startswith("s3://"):
        return {"path": str(path), "where": "object store", "volume_dir": None}
    path = Path(path)
    env = dict(os.environ) if env is None else env
    vol = env.get(VOLUME_ENV, "")
    p = path.resolve()
    if vol and p.is_relative_to(Path(vol).resolve()):
        where = "volume"
    elif p.is_relative_to((cwd or Path.cwd()).resolve()):
        where = "container disk"
    elif vol:
        where = "outside the pod's disks"
    else:
        where = "not checked"
    return {"path": str(path), "where": where, "volume_dir": vol or None}


class FrozenCheckpoint:
    """A frozen checkpoint: its files in one directory with :data:`CHECKPOINT_MANIFEST` (the
    sha256 of each), verified against it on every restore.

    Args:
        root: the directory (a copy :meth:`freeze` made, or one exported from it).
        tmp: the private directory holding ``root`` when :meth:`freeze` made it (removed by
            :meth:`close`).

    Raises:
        CheckpointError: ``root`` has no manifest (it was never frozen).
    """

    def __init__(self, root: Path, tmp: tempfile.TemporaryDirectory[str] | None = None) -> None:
        path = root / CHECKPOINT_MANIFEST
        if not path.is_file():
            raise CheckpointError(f"{root} has no {CHECKPOINT_MANIFEST}: it is not a frozen checkpoint; freeze it "
                                  "in phase 01")
        self.root = root
        self.tmp = tmp
        self.manifest: dict[str, str] = json.loads(path.read_text())
        # What the last restore converted, per tensor file (the path in the checkpoint): the device
        # tags it was saved with that load_state mapped elsewhere ({"cuda:1": "cpu"}), and a wrapper
        # prefix stripped from every key; a file loaded as saved is not listed.
        self.conversions: dict[str, dict[str, Any]] = {}

    @classmethod
    def freeze(cls, src: Path, *, host: str) -> FrozenCheckpoint:
        """Copy the checkpoint file or directory at ``src`` into a private directory and write the
        sha256 of every file next to them.

        Raises:
            CheckpointError: ``src`` does not exist on this host (``host``: the profile's name).
        """
        if not src.exists():
            raise CheckpointError(f"workload.checkpoint {src} does not exist on this host ({host}); "
                                  "name the checkpoint file or directory as this side sees it")
        tmp = tempfile.TemporaryDirectory(prefix="checkpoint-")
        dest = Path(tmp.name) / "checkpoint"
        if src.is_file():
            dest.mkdir()
            shutil.copy2(src, dest / src.name)
        else:
            shutil.copytree(src, dest)
        files = sorted((p for p in dest.rglob("*") if p.is_file()), key=lambda p: natural_key(str(p)))
        manifest = {p.relative_to(dest).as_posix(): sha256_of(p) for p in files}
        (dest / CHECKPOINT_MANIFEST).write_text(json.dumps(manifest, indent=2))
        return cls(dest, tmp)

    def tensor_files(self) -> list[Path]:
        """The tensor files (torch.save files, safetensors) a restore loads one by one."""
        return list(iter_tensor_files(self.root))

    def dcp_files(self) -> list[Path]:
        """A torch distributed checkpoint's shards and metadata, when the root is one."""
        if not (self.root / DCP_METADATA).is_file():
            return []
        return sorted(self.root.glob("*.distcp"), key=lambda p: natural_key(p.name)) + [self.root / DCP_METADATA]

    def _verify(self, f: Path) -> str:
        """The manifest's sha256 of ``f``, once the file's own matches it.

        Raises:
            CheckpointError: it does not (the file changed after it was frozen).
        """
        rel = f.relative_to(self.root).as_posix()
        want = self.manifest.get(rel, "")
        got = sha256_of(f)
        if got != want:
            raise CheckpointError(f"{rel}: sha256 {got[:16]}… does not match the frozen manifest's "
                                  f"{want[:16] or 'missing'}…; the file changed after it was frozen. Freeze again")
        return want

    def restore(self, *, device: str, allow_globals: Any) -> dict[str, Any]:
        """Read, verify and load every tensor file onto ``device`` (``allow_globals``: the
        operator's, honoured for files matching the manifest); tensors keyed ``<file>/<name>``.

        Raises:
            CheckpointError: a file does not match the manifest, cannot be loaded safely, or there
                is no tensor file.
        """
        state: dict[str, Any] = {}
        self.conversions = {}
        for f in self.tensor_files():
            want = self._verify(f)
            loaded = load_state(f, device=device, allow_globals=allow_globals, frozen_sha256=want)
            rel = f.relative_to(self.root).as_posix()
            moved = {tag: to for tag, to in loaded.remap.items() if tag != to}
            if moved or loaded.stripped_prefix:
                self.conversions[rel] = {"remap": moved, "stripped_prefix": loaded.stripped_prefix}
            for name, value in _tensors(loaded.state).items():
                state[f"{rel}/{name}"] = value
        dcp = self.dcp_files()
        if dcp:  # a torch distributed checkpoint: its shards and metadata, verified, then loaded
            for f in dcp:
                self._verify(f)
            for name, value in load_dcp(self.root, device=device).items():
                state[f"{DCP_METADATA}/{name}"] = value
        if not state:
            raise CheckpointError(f"{self.root} holds no tensor file (.pt, .pth, .bin, .ckpt, .safetensors, or a "
                                  "torch distributed checkpoint)")
        return state

    def export(self, dest_dir: Path) -> list[Path]:
        """Copy every file, manifest included, under ``dest_dir``; returns the copies."""
        dest_dir.mkdir(parents=True, exist_ok=True)
        out = []
        for f in sorted((p for p in self.root.rglob("*") if p.is_file()), key=lambda p: natural_key(str(p))):
            target = dest_dir / f.relative_to(self.root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
            out.append(target)
        return out

    def close(self) -> None:
        """Remove the private directory :meth:`freeze` made (nothing for a directory it did not)."""
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None


DIGEST_COLUMNS = ("numel", "ndim", "first_dim", "last_dim", "itemsize", "mean", "std", "min", "max")
"""One row of :meth:`CheckpointWorkload.outputs` per tensor, in natural name order."""


class CheckpointWorkload(AcceptanceWorkload):
    """The built-in workload of ``kind: checkpoint`` (see the module docstring); the checkpoint
    it loads is a :class:`FrozenCheckpoint`.

    Raises (from :meth:`load`):
        CheckpointError: the checkpoint is missing, a file does not match its manifest, or a
            file cannot be loaded safely.
    """

    kind = "checkpoint"

    def __init__(self, workload: Any, profile: Any) -> None:
        super().__init__(workload, profile)
        self._frozen: FrozenCheckpoint | None = None
        self._location: dict[str, Any] = {}
        self._state: dict[str, Any] = {}
        self._done = 0

    def identity(self) -> dict[str, Any]:
        """What phase 01 records of the checkpoint: model id, path, each file's sha256, the number
        of tensor files, the allowlist, where it sat (:func:`location`), and ``conversions``: per
        tensor file, the saved device tags the last restore mapped to this side's device and a
        stripped wrapper prefix (:attr:`FrozenCheckpoint.conversions`)."""
        frozen = self._frozen
        return {"model_id": self.workload.model_id, "checkpoint": self.workload.checkpoint,
                "files_sha256": dict(frozen.manifest) if frozen else {},
                "tensor_files": len(frozen.tensor_files() + frozen.dcp_files()) if frozen else 0,
                "allow_globals": list(self.workload.allow_globals), "location": dict(self._location),
                "conversions": dict(frozen.conversions) if frozen else {}}

    def load(self, artifact_dir: Path | None = None) -> None:
        """Load a frozen copy (``artifact_dir``), or freeze ``workload.checkpoint`` and load that,
        noting where it sat (:func:`location`).

        Raises:
            CheckpointError: see the class; also an ``s3://`` checkpoint with no ``artifact_dir``:
                phase 01 copies it into the run's store and the freeze pod calls
                :meth:`load_input` on that copy.
        """
        if artifact_dir is None and self.workload.checkpoint.startswith("s3://"):
            raise CheckpointError(f"workload.checkpoint {self.workload.checkpoint} is in a bucket: phase 01 copies it "
                                  "into the run's store, and the freeze pod loads that copy (load_input)")
        if artifact_dir is not None:
            self._open(FrozenCheckpoint(Path(artifact_dir)))
        else:
            src = Path(self.workload.checkpoint.removeprefix("file://"))
            self._location = location(src)
            self._open(FrozenCheckpoint.freeze(src, host=self.profile.name))

    def load_input(self, copy_dir: Path) -> None:
        """Freeze and load ``copy_dir``, a verified copy of ``workload.checkpoint`` (an ``s3://``
        checkpoint as phase 01 copied it in); its location is recorded as the URL's.

        Raises:
            CheckpointError: as :meth:`load`.
        """
        self._location = location(self.workload.checkpoint)
        self._open(FrozenCheckpoint.freeze(Path(copy_dir), host=self.profile.name))

    def _open(self, frozen: FrozenCheckpoint) -> None:
        self._frozen = frozen
        self._state = self._restore()
        self._done = 0

    def _restore(self) -> dict[str, Any]:
        assert self._frozen is not None
        return self._frozen.restore(device=self.profile.device, allow_globals=self.workload.allow_globals)

    def close(self) -> None:
        """Remove the private frozen copy :meth:`load` made (a process that exits removes it too)."""
        if self._frozen is not None:
            self._frozen.close()

    @property
    def state(self) -> dict[str, Any]:
        """Every tensor the last restore loaded, keyed ``<file>/<name>`` (``<file>``: the path in
        the checkpoint, e.g. ``model-00001-of-00002.safetensors``; ``<name>``: the dotted key in
        it), on the profile's device; empty before :meth:`load`."""
        return dict(self._state)

    def tensor_table(self) -> list[dict[str, Any]]:
        """Every tensor loaded, in natural name order: ``{"name", "dtype", "shape", "sha256"}``
        (``sha256``: hex digest of its bytes as loaded, in row-major order, moved to the CPU).
        Phase 03 requires the canary's table to equal the source's: the same names, dtypes and
        shapes, and bit-identical values (a load copies bytes; nothing may change them)."""
        import torch

        rows = []
        for name in sorted(self._state, key=natural_key):
            t = self._state[name].detach().to("cpu").resolve_conj().resolve_neg().contiguous()
            raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
            rows.append({"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                         "sha256": hashlib.sha256(raw.numpy().tobytes()).hexdigest()})
        return rows

    def export_artifact(self, dest_dir: Path) -> list[Path]:
        assert self._frozen is not None
        return self._frozen.export(dest_dir)

    def num_steps(self) -> int:
        return self.workload.restores

    def step(self, i: int) -> dict[str, float]:
        """One full restore: read, verify and load every tensor file. Metrics: ``restore_s``
        (seconds), ``bytes`` restored, ``tensors`` loaded, ``verified`` (1.0: every sha256 matched)."""
        t0 = time.perf_counter()
        self._state = self._restore()
        took = time.perf_counter() - t0
        self._done = i + 1
        assert self._frozen is not None
        files = self._frozen.tensor_files() + self._frozen.dcp_files()
        return {"restore_s": took, "bytes": float(sum(f.stat().st_size for f in files)),
                "tensors": float(len(self._state)), "verified": 1.0}

    def state_dict(self) -> dict[str, Any]:
        import torch

        return {"restores_done": torch.tensor(self._done)}

    def load_state_dict(self, state: dict[str, Any]) -> int:
        self._done = int(state["restores_done"])
        return self._done

    def outputs(self) -> np.ndarray:
        """Digest of every tensor loaded, float32 ``(n_tensors, 9)``, columns :data:`DIGEST_COLUMNS`
        (statistics in float64 before the cast), rows in natural name order."""
        import numpy as np
        import torch

        rows = []
        for name in sorted(self._state, key=natural_key):
            t = self._state[name].detach().to("cpu")
            x = (t.real if t.is_complex() else t).to(torch.float64)
            shape = list(t.shape) or [1]
            rows.append([t.numel(), t.dim(), shape[0], shape[-1], t.element_size(),
                         float(x.mean()) if t.numel() else 0.0, float(x.std()) if t.numel() > 1 else 0.0,
                         float(x.min()) if t.numel() else 0.0, float(x.max()) if t.numel() else 0.0])
        return np.asarray(rows, dtype=np.float64).astype(np.float32)


def _tensors(state: Any, prefix: str = "") -> dict[str, Any]:
    """Every tensor in a (nested) state dict, keyed by dotted path."""
    import torch

    out: dict[str, Any] = {}
    if isinstance(state, torch.Tensor):
        out[prefix] = state
    elif isinstance(state, dict):
        for k, v in state.items():
            out.update(_tensors(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(_tensors(v, f"{prefix}.{i}" if prefix else str(i)))
    return out
