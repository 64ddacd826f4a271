"""`token-guard demo`: the vLLM simulator on a loopback port, the guard in front of it, and a short tour.

It shows the three things the guard does at the door: a request that fits passes untouched, one whose
max_tokens would overflow the window is clamped (the simulator, like vLLM 0.31, would have rejected it), and a
prompt that cannot fit is rejected with an OpenAI-style 400 before it reaches the model. Then the same clamp on the
two other APIs agents speak: a Responses request and an Anthropic Messages request as Claude Code sends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from pathlib import Path
from typing import Any

import httpx

from proxy.assets import write_demo_tokenizer_dir
from proxy.counting.registry import ModelRegistry
from proxy.server.app import create_app
from proxy.server.running import running
from proxy.settings import load_settings
from simulator import SimulatorSettings
from simulator import create_app as create_simulator

MODEL = "tiny"
WINDOW = 2048
# vLLM 0.31, not the simulator's default 0.32: 0.32+ clamps an overflowing max_tokens itself, so the tour could not
# show the rejection that the guard exists to prevent (and that every vLLM before 0.32 gives).
PROFILE = "0.31"


def run_demo(port: int = 8080, once: bool = False) -> int:
    with tempfile.TemporaryDirectory(prefix="token-guard-demo-") as tmp:
        asyncio.run(_demo(write_demo_tokenizer_dir(Path(tmp) / "tokenizer"), port, once))
    return 0


async def _demo(tokenizer: Path, port: int, once: bool) -> None:
    simulator = create_simulator(
        SimulatorSettings(tokenizer=tokenizer, model=MODEL, max_model_len=WINDOW, profile=PROFILE, itl_s=0.002)
    )
    async with running(simulator) as upstream:
        flags = {"upstream.url": upstream, "model.name": MODEL, "model.tokenizer": str(tokenizer)}
        settings = load_settings(flags, environ={})
        guard = create_app(settings, ModelRegistry.from_settings(settings.models))
        async with running(guard, port=_free_or_any(port)) as url:
            await _wait_ready(url)
            print(_banner(url, upstream))
            await _tour(url, upstream)
            if not once:
                print(f"\nServing on {url} until Ctrl-C.")
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.Event().wait()


def _free_or_any(port: int) -> int:
    import socket

    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return 0
    return port


async def _wait_ready(url: str) -> None:
    async with httpx.AsyncClient() as client:
        for _ in range(200):
            if (await client.get(f"{url}/health")).status_code == 200:
                return
            await asyncio.sleep(0.05)
    raise RuntimeError("the guard did not become ready")


def _banner(url: str, upstream: str) -> str:
    return f"""
token-guard demo
  guard      {url}  (OpenAI-compatible; point base_url here)
  upstream   {upstream}  (built-in vLLM simulator: model "{MODEL}", max_model_len {WINDOW}, real DeepSeek tokenizer)
             It plays vLLM {PROFILE}, the last release that rejects a prompt + max_tokens over the window; from 0.32
             vLLM clamps max_tokens itself, and `token-guard simulate` defaults to that newer behaviour.

Try it:
  curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 5000}}' -i

  from openai import OpenAI
  client = OpenAI(base_url="{url}/v1", api_key="unused")
  reply = client.chat.completions.create(model="{MODEL}", max_tokens=5000,
                                         messages=[{{"role": "user", "content": "Hello!"}}])
  print(reply.usage)
"""


async def _tour(url: str, upstream: str) -> None:
    hello = [{"role": "user", "content": "Hello! Tell me about token budgets."}]
    notes = [{"role": "user", "content": "Turn these notes into a summary: " + "prompt plus output must fit. " * 30}]
    essay = [{"role": "user", "content": "Summarise this: " + "All work and no play makes Jack a dull boy. " * 300}]
    async with httpx.AsyncClient(timeout=60) as client:
        vllm = _Upstream(client, upstream)
        print("Tour")

        prompt = await vllm.count(hello)
        print(f"\n1. A prompt of {prompt} tokens with max_tokens 32: it fits, so it passes untouched.")
        await _through_guard(client, url, hello, 32)

        prompt, asked = await vllm.count(notes), 2000
        print(
            f"\n2. A prompt of {prompt} tokens with max_tokens {asked}: {prompt} + {asked} = {prompt + asked}, "
            f"more than the {WINDOW}-token window."
        )
        direct = await client.post(f"{upstream}/v1/chat/completions", json=_chat(notes, asked))
        print(f"   straight to vLLM: HTTP {direct.status_code}")
        print(f"   {_message(direct.json())}")
        cut = WINDOW - asked + 1
        print(
            f"   (vLLM {PROFILE} stops counting a prompt at {WINDOW} - {asked} + 1 = {cut} tokens, one more than fits, "
            f'hence "at least {cut}")'
        )
        await _through_guard(client, url, notes, asked)

        prompt, received = await vllm.count(essay), await vllm.received()
        print(f"\n3. A prompt of {prompt} tokens with max_tokens 16: the prompt alone is longer than the window.")
        await _through_guard(client, url, essay, 16)
        print(f"   vLLM received {await vllm.received() - received} requests for it: the guard answered at the door.")

        print(f"\n4. The Responses API (client.responses.create), the same notes with max_output_tokens {asked}.")
        responses = {"model": MODEL, "input": notes[0]["content"], "max_output_tokens": asked}
        await _other_api(client, url, upstream, "/v1/responses", responses, "max_output_tokens")

        print("\n5. The Anthropic Messages API as Claude Code calls it: max_tokens 32000, a system prompt, tools.")
        await _other_api(client, url, upstream, "/v1/messages", _claude_code(), "max_tokens")

        print(
            "\n6. Embeddings (client.embeddings.create) of step 3's text and a short one, with the header "
            "x-token-guard-overflow: truncate, then with the client's own truncate_prompt_tokens -1."
        )
        await _embeddings(client, url, upstream, [essay[0]["content"], hello[0]["content"]])


class _Upstream:
    """What the tour asks the simulator directly: vLLM's own count (POST /tokenize) and how many requests it got."""

    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        self.client = client
        self.url = url

    async def count(self, messages: list[dict[str, str]]) -> int:
        response = await self.client.post(f"{self.url}/tokenize", json={"model": MODEL, "messages": messages})
        return int(response.json()["count"])

    async def received(self) -> int:
        return int((await self.client.get(f"{self.url}/sim/stats")).json()["received"])


async def _through_guard(client: httpx.AsyncClient, url: str, messages: list[dict[str, str]], asked: int) -> None:
    response = await client.post(f"{url}/v1/chat/completions", json=_chat(messages, asked))
    action, prompt, limit = (
        response.headers.get(f"x-token-guard-{k}") for k in ("action", "prompt-tokens", "max-tokens")
    )
    if action == "clamp":
        sent = f"max_tokens {asked} -> {limit} (= {WINDOW} - {prompt})"
    elif action == "pass":
        sent = f"max_tokens {limit} (unchanged)"
    else:
        sent = f"max_tokens {asked} asked, {max(WINDOW - int(prompt or 0), 0)} tokens of room"
    print(f"   through token-guard: HTTP {response.status_code}, action {action}, prompt tokens {prompt}, {sent}")
    body = response.json()
    if response.status_code == 200:
        usage = body["usage"]
        total = usage["prompt_tokens"] + usage["completion_tokens"]
        print(
            f"   usage: prompt {usage['prompt_tokens']} + completion {usage['completion_tokens']} = {total} of {WINDOW}"
        )
    else:
        print(f"   {_message(body)}")


async def _other_api(
    client: httpx.AsyncClient, url: str, upstream: str, path: str, body: dict[str, Any], field: str
) -> None:
    """A request of another API whose limit overflows: what vLLM says, then what the guard does with it."""
    direct = await client.post(f"{upstream}{path}", json=body)
    print(f"   straight to vLLM: HTTP {direct.status_code}")
    print(f"   {_message(direct.json())}")
    response = await client.post(f"{url}{path}", json=body)
    action, prompt, limit, kept = (
        response.headers.get(f"x-token-guard-{k}")
        for k in ("action", "prompt-tokens", "max-tokens", "next-turn-tokens")
    )
    room = f"{WINDOW} - {prompt}" + (f" - {kept} kept for the next turn" if kept else "")
    print(f"   through token-guard: HTTP {response.status_code}, action {action}, prompt tokens {prompt}, "
          f"{field} {body[field]} -> {limit} (= {room})")  # fmt: skip
    usage = response.json()["usage"]
    total = usage["input_tokens"] + usage["output_tokens"]
    print(f"   usage: input {usage['input_tokens']} + output {usage['output_tokens']} = {total} of {WINDOW}")
    if kept:
        print(
            f"   an agent that continues after this answer re-sends it with the conversation: {total} tokens, "
            f"{WINDOW - total} left for its next answer (policy.next_turn_share_*)"
        )


async def _embeddings(client: httpx.AsyncClient, url: str, upstream: str, inputs: list[str]) -> None:
    """An input longer than the window: vLLM refuses it, and so does the guard under truncate (the embedding of a cut
    input is another input's); asked by the client, vLLM cuts it, and the guard counts what it keeps."""
    body = {"model": MODEL, "input": inputs, "encoding_format": "float"}
    direct = await client.post(f"{upstream}/v1/embeddings", json=body)
    print(f"   straight to vLLM: HTTP {direct.status_code}")
    print(f"   {_message(direct.json())}")
    refused = await client.post(f"{url}/v1/embeddings", json=body, headers={"x-token-guard-overflow": "truncate"})
    print(f"   through token-guard: HTTP {refused.status_code}, action {refused.headers.get('x-token-guard-action')}: "
          "the guard does not cut what an embedding is about")  # fmt: skip
    asked = {**body, "truncate_prompt_tokens": -1}
    response = await client.post(f"{url}/v1/embeddings", json=asked)
    action, prompt = (response.headers.get(f"x-token-guard-{k}") for k in ("action", "prompt-tokens"))
    print(f"   with truncate_prompt_tokens -1: HTTP {response.status_code}, action {action}, prompt tokens {prompt}")
    answer = response.json()
    print(f"   usage: prompt {answer['usage']['prompt_tokens']} for {len(answer['data'])} vectors: vLLM kept the first "
          f"{WINDOW} tokens of the long input, the short one whole")  # fmt: skip


def _claude_code() -> dict[str, Any]:
    tool = {
        "name": "read_file",
        "description": "Read a file of the repository",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }
    system = "You are Claude Code, a coding agent. Read before you edit; keep changes small. " * 8
    return {"model": MODEL, "max_tokens": 32000, "system": system, "tools": [tool],
            "messages": [{"role": "user", "content": "Which file defines the route table?"}]}  # fmt: skip


def _chat(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens}


def _message(body: Any) -> str:
    error = body.get("error", {}) if isinstance(body, dict) else {}
    if isinstance(error, dict) and body.get("type") == "error":  # Anthropic's shape: no code, the type instead
        return f"{error.get('type')}: {error.get('message')}"
    return f"{error.get('code')}: {error.get('message')}" if isinstance(error, dict) else str(body)
