"""The render servers `python -m bench tokens` compares, each a process (tree) of its own on a loopback port:
`token-guard render` (no upstream) for one model or for several, and a real vLLM API server started with
--enable-scale-out, as the end-to-end suite starts it (tests/e2e/runtime.py), serving the same tiny model."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.systems import Running, free_port, spawn, wait_ready

MODEL = "tiny"
VLLM_VERSION = "0.32.0"


@dataclass
class Server:
    name: str
    url: str
    pid: int
    stop: Callable[[], None]


def start_guard(tokenizer: Path, max_model_len: int, workdir: Path) -> Server:
    flags = ["--model", MODEL, "--tokenizer", str(tokenizer), "--max-model-len", str(max_model_len)]
    return _guard("token-guard render", flags, workdir)


def start_guard_models(tokenizers: dict[str, Path], max_model_len: int, workdir: Path) -> Server:
    """One `token-guard render` serving a model per tokenizer, named after it ([[models]] of a settings file)."""
    config = workdir / "render-models.toml"
    tables = [
        f"[[models]]\nname = {json.dumps(name)}\ntokenizer = {json.dumps(str(path))}\nmax_model_len = {max_model_len}\n"
        for name, path in tokenizers.items()
    ]
    config.write_text("\n".join(tables))
    return _guard(f"token-guard render, {len(tokenizers)} models", ["--config", str(config)], workdir)


def _guard(name: str, flags: list[str], workdir: Path) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "proxy", "render", *flags, "--vllm-version", VLLM_VERSION, "--port", str(port),
            "--log-level", "warning"]  # fmt: skip
    process, log = spawn(name.replace(" ", "-").replace(",", ""), argv, workdir)
    running = Running(name, f"http://127.0.0.1:{port}", process, log)
    wait_ready(running, "/health")
    return Server(name, running.url, process.pid, running.stop)


def vllm_model_dir() -> Path:
    """The end-to-end suite's tiny model (random weights, the demo DeepSeek tokenizer), built on first use."""
    from tests.e2e import runtime

    return runtime.tiny_model(runtime.vllm_venv(VLLM_VERSION) / "bin" / "python")


def start_vllm(model_dir: Path, max_model_len: int, workdir: Path) -> Server:
    """vLLM 0.32.0's API server with --enable-scale-out (its render routes); the tiny model's 4,096 positions raised to
    the window, and a KV cache that holds one prompt of it (vLLM refuses to start otherwise: 1 KiB a token here)."""
    from tests.e2e import runtime

    kv_bytes = max_model_len * 1024 + 32 * 2**20
    extra = ["--max-model-len", str(max_model_len), "--enable-scale-out", "--kv-cache-memory-bytes", str(kv_bytes),
             "--hf-overrides", json.dumps({"max_position_embeddings": max_model_len})]  # fmt: skip
    process = runtime.start_vllm(runtime.vllm_venv(VLLM_VERSION), model_dir, workdir / "vllm", extra)
    process.wait_ready("/health", 600)
    return Server(f"vLLM {VLLM_VERSION}", process.url, process.popen.pid, process.stop)
