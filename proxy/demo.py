"""`token-guard demo`: the vLLM simulator on a loopback port, the guard in front of it, and a short tour.

It shows the three things the guard does at the door: a request that fits passes untouched, one whose
max_tokens would overflow the window is clamped (the simulator, like vLLM 0.31, would have rejected it), and a
prompt that cannot fit is rejected with an OpenAI-style 400 before it reaches the model.
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
from proxy.simulator import SimulatorSettings
from proxy.simulator import create_app as create_simulator

MODEL = "tiny"
WINDOW = 2048


def run_demo(port: int = 8080, once: bool = False) -> int:
    with tempfile.TemporaryDirectory(prefix="token-guard-demo-") as tmp:
        asyncio.run(_demo(write_demo_tokenizer_dir(Path(tmp) / "tokenizer"), port, once))
    return 0


async def _demo(tokenizer: Path, port: int, once: bool) -> None:
    simulator = create_simulator(
        SimulatorSettings(tokenizer=tokenizer, model=MODEL, max_model_len=WINDOW, profile="0.31", itl_s=0.002)
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
  upstream   {upstream}  (built-in vLLM simulator, 0.31 profile, model "{MODEL}", max_model_len {WINDOW},
             real DeepSeek tokenizer)

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
        print("Tour")
        await _show(client, url, "1. a request that fits", {"messages": hello, "max_tokens": 32})
        direct = await client.post(f"{upstream}/v1/chat/completions", json=_chat(notes, 2000))
        print(f"\n2. a 200-token prompt with max_tokens 2000, sent straight to the upstream: HTTP {direct.status_code}")
        print(f"   {_message(direct.json())}")
        await _show(client, url, "   the same request through token-guard", {"messages": notes, "max_tokens": 2000})
        await _show(
            client,
            url,
            "3. a prompt longer than the window, through token-guard",
            {"messages": essay, "max_tokens": 16},
        )


async def _show(client: httpx.AsyncClient, url: str, title: str, fields: dict[str, Any]) -> None:
    response = await client.post(f"{url}/v1/chat/completions", json={"model": MODEL, **fields})
    action, prompt, limit = (
        response.headers.get(f"x-token-guard-{k}") for k in ("action", "prompt-tokens", "max-tokens")
    )
    print(f"\n{title}: HTTP {response.status_code}, action {action}, prompt tokens {prompt}, max_tokens {limit}")
    body = response.json()
    if response.status_code == 200:
        usage = body["usage"]
        total = usage["prompt_tokens"] + usage["completion_tokens"]
        print(
            f"   usage: prompt {usage['prompt_tokens']} + completion {usage['completion_tokens']} = {total} of {WINDOW}"
        )
    else:
        print(f"   {_message(body)}")


def _chat(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens}


def _message(body: Any) -> str:
    error = body.get("error", {}) if isinstance(body, dict) else {}
    return f"{error.get('code')}: {error.get('message')}" if isinstance(error, dict) else str(body)
