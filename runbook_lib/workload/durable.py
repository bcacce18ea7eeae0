"""A training job's checkpoints kept in the run's store (``workload.checkpoint_location: store``).

A pod's container disk goes with the pod, and so does its volume on Runpod (a pod's volume "dies
on terminate") and locally (removed on destroy): a job whose machine is destroyed or reclaimed
resumes only from what outlives it. With ``store``, every checkpoint the job saves is also
committed to the store as a set (the checkpoint and its ``.sha256`` sidecar, then the manifest,
then the ``_SUCCESS`` marker: seed 000's completion-marker rule) before the job goes on, so a
machine that vanishes mid-write leaves at most an unmarked set, which a resume refuses. A resume
with no verified checkpoint of its own takes the newest set that verifies
(:meth:`runbook_lib.storage.Store.newest_verified_set`).

Layout: ``<parent>/step-NNNNNN/{step-NNNNNN.pt, step-NNNNNN.pt.sha256, MANIFEST.json, _SUCCESS}``,
``<parent>`` being ``<the agent's prefix>/checkpoints``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runbook_lib.storage import ObjectInfo, Store

PARENT = "checkpoints"
"""Where under an agent's store prefix its job's checkpoint sets go."""
LOST = {"container": "the container disk goes with its pod",
        "volume": "a pod's volume outlives a stop, not a destroy (Runpod: dies on terminate; local: removed with "
                  "the pod)"}
"""Why checkpoints kept there (``workload.checkpoint_location``) do not outlive a destroyed pod
(docs/reference/providers.md; :mod:`runbook_lib.providers.local`)."""


@dataclass(frozen=True)
class StoreCheckpoints:
    """Checkpoint sets under ``parent`` in ``store``, committed with ``run_id``; a resume restores
    from ``restore_from`` (default ``parent``: a job's own earlier checkpoints; a new pod's drill
    names the destroyed pod's)."""

    store: Store
    parent: str
    run_id: str
    restore_from: str = ""

    def saved(self, path: Path) -> ObjectInfo:
        """Commit checkpoint ``path`` (``step-NNNNNN.pt``, its ``.sha256`` sidecar beside it, as
        :func:`runbook_lib.workload.job.save_checkpoint` writes them) as the set
        ``<parent>/step-NNNNNN``; returns the manifest object.

        Raises:
            StorageError: an upload failed (the job stops: a checkpoint it cannot keep is not a
                checkpoint); OSError: the sidecar is missing.
        """
        prefix = f"{self.parent}/{path.stem}"
        side = path.with_name(path.name + ".sha256")
        objs = [self.store.put_file(path, f"{prefix}/{path.name}", sha256=side.read_text().strip()),
                self.store.put_file(side, f"{prefix}/{side.name}")]
        return self.store.commit_set(prefix, objs, run_id=self.run_id, about={"checkpoint": path.name})

    def restore(self, ckpt_dir: Path) -> dict[str, Any]:
        """Download the newest set under ``restore_from`` that verifies into ``ckpt_dir``, each
        object re-hashed as it streams.

        Returns:
            ``{"from": parent, "set": prefix or None, "rejected": [{"prefix", "reason"}, ...]}``
            (``set`` None: the store holds no complete checkpoint there).
        """
        parent = self.restore_from or self.parent
        newest, rejected = self.store.newest_verified_set(parent)
        if newest is not None:
            self.store.fetch_set(newest, ckpt_dir)
        return {"from": parent, "set": newest, "rejected": rejected}
