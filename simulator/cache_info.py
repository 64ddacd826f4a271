"""vLLM's `vllm:cache_config_info` gauge on /metrics: CacheConfig.metrics_info() (every field, as str()) plus the
engine's index, in declaration order (v1/metrics/loggers.py log_metrics_info). The label sets below are what
`CacheConfig().metrics_info()` printed for each release's defaults (0.31 and 0.32 installed; 0.33 and 0.34 from
their wheels' sources); `{blocks}` and `{block_size}` are the simulator's cache."""

from __future__ import annotations

_MIDDLE = (
    ("cache_dtype", "auto"), ("is_attention_free", "False"), ("num_gpu_blocks_override", "None"),
    ("sliding_window", "None"), ("enable_prefix_caching", "True"), ("prefix_caching_hash_algo", "sha256"),
    ("prefix_cache_retention_interval", "0"), ("kv_cache_dtype_skip_layers", "[]"), ("mamba_page_size_padded", "None"),
    ("skip_page_size_padded", "None"), ("mamba_block_size", "None"), ("mamba_cache_dtype", "auto"),
    ("mamba_ssm_cache_dtype", "auto"), ("mamba_cache_mode", "none"), ("enable_mamba_shared_prefix_checkpoint", "False"),
    ("replayssm_buffer_len", "16"), ("use_replayssm", "False"), ("use_kda_recoverssm", "False"),
    ("num_gpu_blocks", "{blocks}"), ("num_cpu_blocks", "None"),
)  # fmt: skip
_SIZES = (("effective_attention_block_size", "None"), ("kv_cache_size_tokens", "None"),
          ("kv_cache_max_concurrency", "None"))  # fmt: skip
_HASH = (("hash_block_size", "None"), ("cache_hit_alignment_tokens", "None"))
_SHARING = (("kv_sharing_fast_prefill", "False"), ("swa_bounded_replay", "True"), ("kv_cache_memory_bytes", "None"))
_OFFLOAD = (("kv_offloading_size", "None"), ("kv_offloading_backend", "native"))

Labels = tuple[tuple[str, str], ...]


def _head(*, mamba_user: bool, utilization: str) -> Labels:
    mamba = (("user_specified_mamba_block_size", "False"),) if mamba_user else ()
    head = (("block_size", "{block_size}"), ("user_specified_block_size", "False"), *mamba)
    return (*head, ("kv_cache_layout", "None"), ("prefix_match_unit", "None"), ("gpu_memory_utilization", utilization))


LABELS_031: Labels = (*_head(mamba_user=True, utilization="0.92"), *_MIDDLE, *_SIZES, *_SHARING, *_OFFLOAD,
                      ("_block_size_resolved", "True"))  # fmt: skip
LABELS_032: Labels = (*_head(mamba_user=False, utilization="0.92"), *_MIDDLE, *_SIZES, *_HASH, *_SHARING, *_OFFLOAD,
                      ("_block_size_resolved", "True"))  # fmt: skip
# 0.33: simple_cpu_offload_num_blocks after num_cpu_blocks
LABELS_033: Labels = (*_head(mamba_user=False, utilization="0.92"), *_MIDDLE,
                      ("simple_cpu_offload_num_blocks", "None"), *_SIZES, *_HASH, *_SHARING, *_OFFLOAD,
                      ("_block_size_resolved", "True"))  # fmt: skip
# 0.34: gpu_memory_utilization defaults to None (resolved per device later, the label keeps "None"), and
# enable_extensible_kv_cache, _extensible_kv_cache_resolved
LABELS_034: Labels = (*_head(mamba_user=False, utilization="None"), *_MIDDLE,
                      ("simple_cpu_offload_num_blocks", "None"), *_SIZES, *_HASH, *_SHARING,
                      ("enable_extensible_kv_cache", "None"), *_OFFLOAD, ("_block_size_resolved", "True"),
                      ("_extensible_kv_cache_resolved", "False"))  # fmt: skip

BLOCK_SIZE = 16


def cache_config_info(labels: Labels, capacity_tokens: int) -> str:
    """The gauge as prometheus_client writes it: HELP, TYPE, one sample for engine 0."""
    blocks = str(capacity_tokens // BLOCK_SIZE)
    values = {"{blocks}": blocks, "{block_size}": str(BLOCK_SIZE)}
    pairs = ",".join(f'{name}="{values.get(value, value)}"' for name, value in (*labels, ("engine", "0")))
    return (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        f"vllm:cache_config_info{{{pairs}}} 1.0\n"
    )
