"""An inference check for the demo checkpoint (``examples/checkpoint-demo``): a ``kind:
checkpoint`` entry point that rebuilds the model from the loaded shards and answers fixed inputs.

Name it in params to check inference as well as the tensors::

    workload:
      kind: checkpoint
      checkpoint: examples/checkpoint-demo
      entry_point: runbook_lib.examples.checkpoint_model:DemoMLPCheckpoint

The checkpoint is still frozen, verified and loaded by
:class:`~runbook_lib.workload.checkpoint_set.CheckpointWorkload` (``weights_only``); this class
only reads :attr:`~runbook_lib.workload.checkpoint_set.CheckpointWorkload.state`. Write your own
the same way: subclass it and override ``inference_outputs``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runbook_lib.portability.checkpoint import strip_wrapper_prefix
from runbook_lib.workload.checkpoint_set import CheckpointWorkload


class DemoMLPCheckpoint(CheckpointWorkload):
    """The 64 -> 64 -> 10 MLP of ``examples/make_demo_checkpoint.py``, built from the
    checkpoint's safetensors shards (``trainer_state.pt`` is not part of the model)."""

    def inference_outputs(self) -> np.ndarray:
        """Logits for ``workload.sample_size`` inputs drawn from N(0, 1) with ``workload.seed``
        (float32 ``(sample_size, 64)`` on CPU, then moved to the profile's device and dtype):
        float32 ``(sample_size, 10)``.

        Raises:
            RuntimeError: the shards do not hold exactly the model's weights (``load_state_dict``
                with ``strict=True``).
        """
        import torch

        weights: dict[str, Any] = {name.split("/", 1)[1]: t for name, t in self.state.items()
                                   if name.split("/", 1)[0].endswith(".safetensors")}
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
        # saved from a DataParallel or torch.compile wrapper: its prefix goes before the strict load
        weights, _ = strip_wrapper_prefix(weights, model.state_dict(), name="the safetensors shards")
        model.load_state_dict(weights, strict=True)
        dtype = getattr(torch, self.profile.dtype)
        model = model.to(device=self.profile.device, dtype=dtype).eval()
        inputs = torch.randn(self.workload.sample_size, 64, generator=torch.Generator().manual_seed(self.workload.seed))
        with torch.inference_mode():
            logits = model(inputs.to(device=self.profile.device, dtype=dtype))
        return np.asarray(logits.to(device="cpu", dtype=torch.float32).numpy())
