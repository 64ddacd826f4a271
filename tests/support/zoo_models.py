"""Tiny random-weight models around the zoo's tokenizers, written without torch (numpy and a hand-made safetensors
header), for real vLLM on the CPU.

Every family but gpt-oss and Qwen3 is a 2-layer Llama with the family's vocabulary size: vLLM renders their chat from
the tokenizer and template alone. gpt-oss needs its own architecture: vLLM switches to harmony on `model_type:
gpt_oss`; Qwen3's is Llama's with per-head query and key norms, so that vLLM's Decisions API (0.33+) serves it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VOCAB_IDS: dict[
    str, tuple[int, int | None, int | list[int]]
] = {  # vocab_size (at least the tokenizer's length), bos, eos
    "llama3.1": (128256, 128000, [128001, 128008, 128009]),
    "qwen3": (151936, None, [151645, 151643]),
    "mistral-nemo": (131072, 1, 2),
    "gemma": (262144, 2, [1, 106]),
}
# The smallest gpt-oss shape vLLM 0.31/0.32 load and serve on the CPU (head_dim 32: the CPU attention refuses 16).
GPT_OSS_SHAPE = {"hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
                 "head_dim": 32, "num_local_experts": 2, "num_experts_per_tok": 1}  # fmt: skip


def llama_config(vocab_size: int, bos: int | None, eos: int | list[int]) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size,
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "head_dim": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "tie_word_embeddings": True, "rope_theta": 10000.0, "attention_bias": False,
        "mlp_bias": False, "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "bfloat16",
    }  # fmt: skip


def gpt_oss_config() -> dict[str, Any]:
    shape = GPT_OSS_SHAPE
    return {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 201088,
        "num_hidden_layers": 2, **shape, "experts_per_token": shape["num_experts_per_tok"],
        "max_position_embeddings": 4096, "initial_context_length": 4096, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "sliding_window": 128, "swiglu_limit": 7.0, "layer_types": ["sliding_attention", "full_attention"],
        "tie_word_embeddings": False, "attention_bias": True, "router_aux_loss_coef": 0.9,
        "output_router_logits": False, "use_cache": True,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                            "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
        "bos_token_id": 199998, "eos_token_id": 200002, "pad_token_id": 199999, "torch_dtype": "bfloat16",
    }  # fmt: skip


def llama_shapes(c: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    h, i, v, hd = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (nh * hd, h), p + "self_attn.k_proj.weight": (nkv * hd, h),
                   p + "self_attn.v_proj.weight": (nkv * hd, h), p + "self_attn.o_proj.weight": (h, nh * hd),
                   p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                   p + "mlp.down_proj.weight": (h, i)}  # fmt: skip
    return shapes


def qwen3_norms(c: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """What Qwen3ForCausalLM adds to Llama's parameters: an RMSNorm of each head's queries and keys."""
    names = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
    layers = range(c["num_hidden_layers"])
    return {f"model.layers.{layer}.{name}": (c["head_dim"],) for layer in layers for name in names}


def gpt_oss_shapes(c: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Hugging Face GptOssForCausalLM parameter names (the unquantized bf16 checkpoint layout)."""
    h, i, v, hd = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    nh, nkv, ne = c["num_attention_heads"], c["num_key_value_heads"], c["num_local_experts"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,),
                                          "lm_head.weight": (v, h)}  # fmt: skip
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (nh * hd, h), p + "self_attn.q_proj.bias": (nh * hd,),
                   p + "self_attn.k_proj.weight": (nkv * hd, h), p + "self_attn.k_proj.bias": (nkv * hd,),
                   p + "self_attn.v_proj.weight": (nkv * hd, h), p + "self_attn.v_proj.bias": (nkv * hd,),
                   p + "self_attn.o_proj.weight": (h, nh * hd), p + "self_attn.o_proj.bias": (h,),
                   p + "self_attn.sinks": (nh,), p + "mlp.router.weight": (ne, h), p + "mlp.router.bias": (ne,),
                   p + "mlp.experts.gate_up_proj": (ne, h, 2 * i), p + "mlp.experts.gate_up_proj_bias": (ne, 2 * i),
                   p + "mlp.experts.down_proj": (ne, i, h), p + "mlp.experts.down_proj_bias": (ne, h)}  # fmt: skip
    return shapes


def write_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], seed: int = 0) -> None:
    """Random bf16 weights (std 0.02, norms at 1), the same on every machine."""
    import numpy as np

    rng = np.random.default_rng(seed)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, shape in shapes.items():
        values = np.ones(shape, np.float32) if name.endswith("norm.weight") else rng.standard_normal(shape, np.float32)
        if not name.endswith("norm.weight"):
            values *= 0.02
        blob = (values.view(np.uint32) >> 16).astype("<u2").tobytes()  # float32 -> bfloat16 by truncation
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    with path.open("wb") as out:
        out.write(len(raw).to_bytes(8, "little"))
        out.write(raw)
        for blob in blobs:
            out.write(blob)


def write_model(family: str, dest: Path) -> None:
    if family == "gpt-oss":
        config = gpt_oss_config()
        shapes = gpt_oss_shapes(config)
        generation = {"bos_token_id": 199998, "eos_token_id": [200002, 199999, 200012], "pad_token_id": 199999}
    else:
        vocab_size, bos, eos = VOCAB_IDS[family]
        config = llama_config(vocab_size, bos, eos)
        shapes = llama_shapes(config)
        if family == "qwen3":  # its own architecture, which vLLM's Decisions API (0.33+) reads; Llama's it refuses
            config |= {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
            shapes |= qwen3_norms(config)
        generation = {"bos_token_id": bos, "eos_token_id": eos}
    config["transformers_version"] = "5.17.0"  # else transformers 5 warns about Mistral's old regex on every load
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    (dest / "generation_config.json").write_text(json.dumps({**generation, "do_sample": False}, indent=2))
    write_safetensors(dest / "model.safetensors", shapes)
