"""What real vLLM runs besides the JSON body's text, through token-guard: `prompt_embeds` (with
`--enable-prompt-embeds`, 0.31 and 0.32: the 0.34 built here cannot run them) counted by each tensor's rows, clamped
and never cut; and on /invocations the model the SageMaker adapter header names (with `--served-model-name tiny
other`, so `other` is a model vLLM runs) checked against the key, not the body's.

A stack of its own per version, started for this module and stopped after it (one vLLM at a time, about 50 s
each): the shared stack runs without these flags, and --enable-prompt-embeds changes how vLLM renders chat."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.e2e import runtime
from tests.e2e.runtime import MAX_MODEL_LEN
from tests.e2e.wire import GUARD_ACTION, GUARD_MAX, GUARD_PROMPT
from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.torch_save import embeds

pytestmark = pytest.mark.e2e
HIDDEN = 128  # the tiny model's (tests/e2e/build_tiny_model.py)
ADAPTER = "X-Amzn-SageMaker-Adapter-Identifier"
KEYS = """
[[keys]]
name = "tiny-only"
key = "sk-tiny"
models = ["tiny"]

[[keys]]
name = "other-only"
key = "sk-other"
models = ["other"]

[[keys]]
name = "any"
key = "sk-any"
"""
TORCH_SAVED = """
import base64, io, sys, torch
rows, legacy = int(sys.argv[1]), sys.argv[2] == "legacy"
out = io.BytesIO()
torch.save(torch.randn(rows, {hidden}).to(torch.bfloat16), out, _use_new_zipfile_serialization=not legacy)
print(base64.b64encode(out.getvalue()).decode())
"""


@dataclass
class Sides:
    version: str
    vllm: str
    proxy: str
    python: Path  # the vLLM environment's, which has torch
    http: httpx.Client

    def complete(self, body: dict[str, object], direct: bool = False) -> httpx.Response:
        url = (self.vllm if direct else self.proxy) + "/v1/completions"
        return self.http.post(url, json={"model": "tiny", **body}, headers={"authorization": "Bearer sk-any"})

    def invoke(self, key: str, body: dict[str, object], direct: bool = False, model: str | None = None
               ) -> httpx.Response:  # fmt: skip
        url = (self.vllm if direct else self.proxy) + "/invocations"
        adapter = {ADAPTER: model} if model is not None else {}
        return self.http.post(url, json=body, headers={"authorization": f"Bearer {key}", **adapter})

    def torch_saved(self, rows: int, legacy: bool = False) -> str:
        """base64 of torch.save itself, run in the vLLM environment."""
        script = TORCH_SAVED.format(hidden=HIDDEN)
        argv = [str(self.python), "-c", script, str(rows), "legacy" if legacy else "zip"]
        return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120).stdout.strip()


def start_guard(upstream: str, model_dir: Path, workdir: Path) -> runtime.Process:
    """The guard serving both names vLLM serves, with keys held to one each (its own config, no --model flags)."""
    workdir.mkdir(parents=True, exist_ok=True)
    models = "".join(f'[[models]]\nname = "{name}"\ntokenizer = "{model_dir}"\nmax_model_len = {MAX_MODEL_LEN}\n\n'
                     for name in ("tiny", "other"))  # fmt: skip
    config = workdir / "guard.toml"
    config.write_text(models + KEYS)
    port = free_port()
    argv: list[str | Path] = [sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--config", config,
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    env = {key: value for key, value in runtime.quiet_env().items() if not key.startswith("TOKEN_GUARD_")}
    env["PYTHONPATH"] = str(runtime.project_root())
    return runtime.spawn("token-guard", argv, workdir / "proxy.log", f"http://127.0.0.1:{port}", env)


def runs_embeds(version: str) -> bool:
    """The overlay's 0.33/0.34 run on the CPU model runner without Triton, which refuses --enable-prompt-embeds
    ("does not yet support: prompt embeddings"); an official x86 build runs them."""
    return version in runtime.CPU_WHEELS


@pytest.fixture
def embedding(sides: Sides) -> Sides:
    if not runs_embeds(sides.version):
        pytest.skip(f"vLLM {sides.version} as built here (tests/e2e/overlay) cannot run prompt embeddings")
    return sides


@pytest.fixture(scope="module", params=runtime.VERSIONS)
def sides(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sides]:
    workdir: Path = tmp_path_factory.mktemp(f"sides-{request.param}")
    model_dir = runtime.tiny_model(runtime.vllm_venv(min(runtime.VERSIONS)) / "bin" / "python")
    venv = runtime.vllm_venv(request.param)
    embedding = ["--enable-prompt-embeds"] if runs_embeds(request.param) else []
    extra = [*embedding, "--served-model-name", "tiny", "other"]  # the last --served-model-name wins
    vllm = runtime.start_vllm(venv, model_dir, workdir / "vllm", extra)
    proxy = None
    try:
        proxy = start_guard(vllm.url, model_dir, workdir / "guard")
        vllm.wait_ready("/v1/models", 240)
        proxy.wait_ready("/health", 60)
        with httpx.Client(timeout=120) as http:
            yield Sides(request.param, vllm.url, proxy.url, venv / "bin" / "python", http)
    finally:
        for process in (proxy, vllm):
            if process is not None:
                process.stop()


def test_each_tensor_is_counted_as_the_prompt_vllm_runs(embedding: Sides) -> None:
    sides = embedding
    tensors = [embeds((30, HIDDEN), "BFloat16"), embeds((1, 12, HIDDEN), "BFloat16"), sides.torch_saved(20)]
    body = {"prompt": "x", "prompt_embeds": tensors, "n": 2, "max_tokens": 3}
    answer = sides.complete(body)
    assert answer.status_code == 200, answer.text
    alone = sides.complete({"prompt": "x", "max_tokens": 1}, direct=True).json()["usage"]["prompt_tokens"]
    assert answer.json()["usage"]["prompt_tokens"] == 30 + 12 + 20 + alone  # vLLM ran every tensor
    assert len(answer.json()["choices"]) == 4 * 2 and answer.headers[GUARD_PROMPT] == "30"  # the longest decides


def test_the_clamp_leaves_room_for_the_longest_tensor(embedding: Sides) -> None:
    sides = embedding
    answer = sides.complete({"prompt": "x", "prompt_embeds": embeds((2000, HIDDEN), "BFloat16"), "max_tokens": 100})
    assert answer.status_code == 200, answer.text  # vLLM 0.31 refuses 2,000 + 100 over 2,048
    assert answer.headers[GUARD_ACTION] == "clamp" and answer.headers[GUARD_MAX] == str(MAX_MODEL_LEN - 2000)
    assert answer.json()["usage"]["completion_tokens"] == 2 * (MAX_MODEL_LEN - 2000)  # "x" and the tensor


def test_a_tensor_over_the_window_gets_the_overflow_400_never_a_cut(embedding: Sides) -> None:
    sides = embedding
    tensor = embeds((2100, HIDDEN), "BFloat16")
    assert sides.complete({"prompt_embeds": tensor, "max_tokens": 4}, direct=True).status_code == 400
    refused = sides.http.post(sides.proxy + "/v1/completions", json={
        "model": "tiny", "prompt_embeds": tensor, "max_tokens": 4}, headers={
        "authorization": "Bearer sk-any", "x-token-guard-overflow": "truncate"})  # fmt: skip
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["code"] == "context_length_exceeded"
    assert "2100 input tokens" in error["message"] and "cannot cut them" in error["message"]


def test_a_tensor_the_guard_cannot_read_is_refused_though_vllm_would_run_it(embedding: Sides) -> None:
    sides = embedding
    legacy = sides.torch_saved(5, legacy=True)
    assert sides.complete({"prompt_embeds": legacy, "max_tokens": 1}, direct=True).status_code == 200
    refused = sides.complete({"prompt_embeds": legacy, "max_tokens": 1})
    assert refused.status_code == 400 and "the legacy format" in refused.json()["error"]["message"]


def test_the_adapter_header_names_the_model_that_runs(sides: Sides) -> None:
    body = {"model": "tiny", "prompt": "x", "max_tokens": 2}
    assert sides.invoke("sk-any", body, direct=True, model="nope").status_code == 404  # vLLM takes it
    refused = sides.invoke("sk-tiny", body, model="other")  # vLLM would run `other` for a key held to tiny
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
    allowed = sides.invoke("sk-other", body, model="other")
    assert allowed.status_code == 200, allowed.text


def test_without_the_header_the_default_model_runs_whatever_the_body_names(sides: Sides) -> None:
    body = {"model": "nope", "prompt": "x", "max_tokens": 2}
    assert sides.invoke("sk-any", body, direct=True).status_code == 200  # vLLM drops the body's model
    # /health turns 200 before the guard has learned the upstream's default model (a model-less request gets a
    # "try again shortly" 503 until then): wait for it, bounded
    assert eventually(lambda: sides.invoke("sk-any", body).status_code != 503, timeout_s=30, interval_s=0.5)
    through = sides.invoke("sk-any", body)
    assert through.status_code == 200, through.text
    refused = sides.invoke("sk-other", {**body, "model": "other"})  # the default, tiny, is what would run
    message = refused.json()["error"]["message"]  # naming no model the key may not use (`tiny`)
    assert refused.status_code == 404 and "names no model" in message and "tiny" not in message


def test_prompt_ids_sent_in_kv_transfer_params_are_what_is_counted(sides: Sides) -> None:
    """vLLM's chat renderer runs kv_transfer_params.prompt_token_ids in place of the messages, no KV connector
    needed: a two-token message carrying 1,900 ids."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200,
            "kv_transfer_params": {"prompt_token_ids": list(range(1000, 2900))}}  # fmt: skip
    answer = sides.http.post(
        sides.proxy + "/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-any"}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] == 1900 == int(answer.headers[GUARD_PROMPT])
    assert answer.headers[GUARD_MAX] == str(MAX_MODEL_LEN - 1900)
