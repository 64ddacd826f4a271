"""Build the tiny random-weight Llama that the end-to-end suite serves with a real vLLM.

Run with the vLLM environment's own python (it has torch): `python build_tiny_model.py <model_dir>`.
The tokenizer files are written into the same directory by the caller.
"""

from __future__ import annotations

import sys

import torch  # type: ignore[import-not-found, unused-ignore]  # only in the vLLM environment
from transformers import LlamaConfig, LlamaForCausalLM


def main(model_dir: str) -> None:
    torch.manual_seed(0)  # the same weights on every machine, so cached and fresh builds answer alike
    config = LlamaConfig(
        vocab_size=129280,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,  # head_dim 32: vLLM's CPU attention refuses 16
        num_key_value_heads=4,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(model_dir, safe_serialization=True)


if __name__ == "__main__":
    main(sys.argv[1])
