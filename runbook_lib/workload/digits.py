"""Training acceptance workload: a small MLP on the UCI handwritten digits that scikit-learn ships
(``sklearn.datasets.load_digits``: 1,797 images of 8x8 pixels, values 0..16, 10 classes).

Deterministic on one host: data order comes from a seeded ``torch.Generator`` whose state is
part of the checkpoint, so a resumed run continues exactly where the killed one stopped.

Data-parallel when the profile's ``world_size`` is above 1 (:mod:`runbook_lib.workload.ddp`):
each step draws one global batch of ``batch_size * world_size`` rows, rank ``r`` trains on its
``r``-th slice of ``batch_size`` rows under DistributedDataParallel (gradients averaged over the
ranks), and the step's loss is the ranks' mean. Two processes of 16 rows and one of 32 thus
take the same rows and the same averaged gradient in every step: the loss curve changes by
floating-point order only, and a checkpoint saved by either reloads in the other.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from runbook_lib.portability.checkpoint import load_state
from runbook_lib.workload import AcceptanceWorkload, ddp
from runbook_lib.workload._torch import configure, synchronize

CHECKPOINT_FILE = "checkpoint.pt"
EVAL_ROWS = 297  # the last 297 of a seeded permutation are held out (1,500 train / 297 eval)
HIDDEN = 64


class DigitsWorkload(AcceptanceWorkload):
    """MLP 64 -> 64 -> 10 trained with SGD (momentum 0.9); one step is one mini-batch."""

    kind = "training"
    distributed = True

    def __init__(self, workload: Any, profile: Any) -> None:
        super().__init__(workload, profile)
        self._state: dict[str, Any] = {}
        self._ddp: Any = None
        self._changed = True  # rank 0's state is not yet the other ranks'

    def _data(self) -> tuple[Any, Any, Any, Any]:
        import torch
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
        y = torch.tensor(digits.target, dtype=torch.int64)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(self.workload.seed))
        train, held = perm[:-EVAL_ROWS], perm[-EVAL_ROWS:]
        return x[train], y[train], x[held], y[held]

    def identity(self) -> dict[str, Any]:
        from sklearn.datasets import load_digits

        digits = load_digits()
        data_hash = hashlib.sha256(np.ascontiguousarray(digits.data).tobytes()).hexdigest()
        return {
            "model_id": self.workload.model_id,
            "dataset_id": self.workload.dataset_id or "sklearn.datasets.load_digits",
            "dataset_sha256": data_hash,
            "dataset_rows": int(digits.data.shape[0]),
        }

    def load(self, artifact_dir: Path | None = None) -> None:
        import torch

        self._device, self._dtype = configure(self.profile.device, self.profile.threads, self.profile.dtype)
        self._xtr, self._ytr, self._xev, self._yev = (t.to(self._device) for t in self._data())
        torch.manual_seed(self.workload.seed)
        self._model = torch.nn.Sequential(
            torch.nn.Linear(64, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 10)
        ).to(self._device, self._dtype)
        self._opt = torch.optim.SGD(self._model.parameters(), lr=self.workload.learning_rate, momentum=0.9)
        self._gen = torch.Generator().manual_seed(self.workload.seed + 1)
        self._order = torch.randperm(len(self._ytr), generator=self._gen)
        self._pos = 0
        self._step = 0
        if self.profile.world_size > 1 and ddp.leading():  # the ranks start here, not in the first step the watchdog times
            ddp.ranks(self.workload, self.profile)
        if artifact_dir is not None:
            path = Path(artifact_dir) / CHECKPOINT_FILE
            # weights_only, remapped to this side's device; a pickle naming any other global is
            # refused before it runs (runbook_lib.portability.checkpoint.load_state)
            self.load_state_dict(load_state(path, device=str(self._device)).state)
        self._base_step = self._step

    def export_artifact(self, dest_dir: Path) -> list[Path]:
        import torch

        dest_dir.mkdir(parents=True, exist_ok=True)
        out = dest_dir / CHECKPOINT_FILE
        torch.save(self.state_dict(), out)
        return [out]

    def num_steps(self) -> int:
        return self.workload.train_steps

    def global_batch(self) -> int:
        return self.profile.batch_size * self.profile.world_size

    def step(self, i: int) -> dict[str, float]:
        import torch

        g = self.global_batch()
        if self._pos + g > len(self._order):
            self._order = torch.randperm(len(self._ytr), generator=self._gen)
            self._pos = 0
        idx = self._order[self._pos:self._pos + g]
        self._pos += g
        if self.profile.world_size > 1:
            ranks = ddp.ranks(self.workload, self.profile)
            ranks.sync(self, changed=self._changed)
            self._changed = False
            ranks.step(i, idx)
        out = self.replica_step(idx)
        self._step += 1
        return out

    def replica_step(self, indices: Any) -> dict[str, float]:
        import torch
        import torch.distributed as dist

        bs, ws = self.profile.batch_size, self.profile.world_size
        rank = dist.get_rank() if ws > 1 else 0
        mine = indices[rank * bs:(rank + 1) * bs].to(self._device)
        model = self._ddp if ws > 1 else self._model
        model.train()
        self._opt.zero_grad(set_to_none=True)
        logits = model(self._xtr[mine].to(self._dtype))
        loss = torch.nn.functional.cross_entropy(logits.float(), self._ytr[mine])
        loss.backward()  # DistributedDataParallel averages the gradients over the ranks here
        self._opt.step()
        seen = loss.detach()
        if ws > 1:
            seen = seen.clone()
            dist.all_reduce(seen)
            seen /= ws
        synchronize(self._device)
        return {"loss": float(seen), "samples": float(bs * ws)}

    def replica_state(self) -> dict[str, Any]:
        return {"model": {k: v.detach().cpu() for k, v in self._model.state_dict().items()},
                "optimizer": self._opt.state_dict()}

    def replica_load(self, state: dict[str, Any]) -> None:
        from torch.nn.parallel import DistributedDataParallel

        self._model.load_state_dict(state["model"])  # rank 0 loads its own: the same values
        self._opt.load_state_dict(state["optimizer"])
        index = [self._device.index] if self._device.type == "cuda" else None
        self._ddp = DistributedDataParallel(self._model, device_ids=index)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self._step,
            "model": {k: v.detach().cpu().clone() for k, v in self._model.state_dict().items()},
            "optimizer": self._opt.state_dict(),
            "generator": self._gen.get_state(),
            "order": self._order.clone(),
            "pos": self._pos,
        }

    def load_state_dict(self, state: dict[str, Any]) -> int:
        self._model.load_state_dict(state["model"])
        self._opt.load_state_dict(state["optimizer"])
        self._gen.set_state(state["generator"])
        self._order = state["order"].clone()
        self._pos = int(state["pos"])
        self._step = int(state["step"])
        self._changed = True
        return self._step - getattr(self, "_base_step", 0)

    def outputs(self) -> np.ndarray:
        import torch

        self._model.eval()
        with torch.inference_mode():
            logits = self._model(self._xev.to(self._dtype)).float()
        synchronize(self._device)
        return np.asarray(logits.cpu().numpy(), dtype=np.float32)

    def eval_accuracy(self) -> float:
        """Top-1 accuracy on the 297 held-out digits, in [0, 1]."""
        return float((self.outputs().argmax(axis=1) == self._yev.cpu().numpy()).mean())
