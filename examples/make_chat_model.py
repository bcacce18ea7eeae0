"""Build the chat model ``make demo-service`` serves with ``transformers serve``: a randomly
initialised two-layer Llama (hidden size 64, vocabulary 512, about 600 KB of float32 weights)
with a byte-level BPE tokenizer trained on runbook_lib/workload/data/sentences.txt and a one-line
chat template. Nothing is downloaded; the weights depend only on ``--seed`` (torch's CPU
generator), so seed 0 built twice is the same model and seed 1 is a different one (the
re-seeded target of ``params/demo-service-reseeded.yaml``).

Usage: ``python examples/make_chat_model.py OUT_DIR --seed N`` (skips a directory that already
holds this seed's model).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SENTENCES = Path(__file__).resolve().parent.parent / "runbook_lib" / "workload" / "data" / "sentences.txt"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
"""One line per message, then the assistant's turn: the smallest template ``apply_chat_template`` takes."""
STAMP = "built_by.json"


def build(out: Path, seed: int) -> None:
    """Write the tokenizer, config and weights of seed ``seed``'s model into ``out``."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train([str(SENTENCES)], vocab_size=512, min_frequency=1, special_tokens=["<s>", "</s>", "<pad>"],
              show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                  pad_token="<pad>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(out)
    (out / STAMP).write_text(json.dumps({"seed": seed, "by": "examples/make_chat_model.py"}))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    stamp = args.out / STAMP
    if stamp.exists() and json.loads(stamp.read_text()).get("seed") == args.seed:
        print(f"{args.out}: seed {args.seed} model already built")
        return 0
    build(args.out, args.seed)
    print(f"{args.out}: built seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
