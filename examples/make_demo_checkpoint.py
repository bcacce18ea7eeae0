"""Write the demo checkpoint that ``params/demo-checkpoint.yaml`` migrates: the weights of a small
MLP (64 -> 64 -> 10, the shape of the digits demo's model) as two safetensors shards with their
index, as ``transformers`` writes sharded checkpoints
(https://huggingface.co/docs/transformers/main/en/big_models), and a torch.save trainer state
(step count and SGD momentum buffers) with tensors and plain values only.

Run it to rebuild ``examples/checkpoint-demo/``: ``.venv/bin/python examples/make_demo_checkpoint.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent / "checkpoint-demo"


def main() -> None:
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    shards = {"model-00001-of-00002.safetensors": ["0.weight", "0.bias"],
              "model-00002-of-00002.safetensors": ["2.weight", "2.bias"]}
    OUT.mkdir(parents=True, exist_ok=True)
    for name, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(OUT / name), metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(v.numel() * v.element_size() for v in state.values())},
             "weight_map": {k: name for name, keys in shards.items() for k in keys}}
    (OUT / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    momentum = {k: torch.randn_like(v) * 0.01 for k, v in state.items()}
    torch.save({"step": 60, "epoch": 2, "optimizer": {"momentum_buffer": momentum, "lr": 0.05}},
               OUT / "trainer_state.pt")


if __name__ == "__main__":
    main()
