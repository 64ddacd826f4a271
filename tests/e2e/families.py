"""The model families of `make e2e`: a tiny random-weight model around each family's real tokenizer and template
(tests/support/zoo.py), served by real vLLM with the flags people serve it with, token-guard in front configured to
match. One family at a time: start its vLLMs and guards, let the tests run, stop them."""

from __future__ import annotations

import contextlib
import gzip
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from tests.e2e import runtime
from tests.e2e.stack import PROXY_READY_TIMEOUT, VLLM_READY_TIMEOUT
from tests.support import zoo
from tests.support.polling import eventually

WINDOW = 512  # small, so that a clamped answer of random weights (which never stop early) stays short
CORPORA = Path(__file__).resolve().parents[1] / "counting" / "families"


@dataclass(frozen=True)
class Family:
    name: str
    zoo_family: str
    vllm_args: tuple[str, ...] = ()
    guard_args: tuple[str, ...] = ()
    tokenize_is_reference: bool = True  # POST /tokenize renders chat as generation does (not for harmony, mistral)
    exact: bool = True  # the guard is configured as vLLM is served, so it counts as vLLM charges


THINKING_OFF = '{"enable_thinking": false}'
FAMILIES = (
    Family("llama3.1", "llama3.1"),
    # Qwen3 served with thinking off by default: the guard is not told, and learns it from vLLM's POST /tokenize
    Family("qwen3-nothink", "qwen3", ("--default-chat-template-kwargs", THINKING_OFF)),
    Family("mistral-nemo-mistral", "mistral-nemo", ("--tokenizer-mode", "mistral"), ("--tokenizer-mode", "mistral"),
           tokenize_is_reference=False),
    Family("mistral-nemo-hf", "mistral-nemo"),  # tokenizer_mode auto on both sides: its Jinja template
    Family("gpt-oss", "gpt-oss", tokenize_is_reference=False),  # harmony, chosen from config.json on both sides
    Family("gemma", "gemma"),
)  # fmt: skip


# vLLM in mistral mode, the guard not told (tokenizer_mode auto finds no consolidated weights, so it renders the
# template): counting.source auto decides from the start-up check, and no request vLLM serves may be refused.
UNSAID_MISTRAL = Family("mistral-nemo-mistral", "mistral-nemo", ("--tokenizer-mode", "mistral"),
                        tokenize_is_reference=False, exact=False)  # fmt: skip


@dataclass
class Served:
    family: Family
    version: str
    vllm_url: str
    guard_url: str
    http: httpx.Client
    first: tuple[int | None, int | None]  # the first corpus request, sent once /health said 200: counted, charged


def corpus(family: Family) -> list[dict[str, Any]]:
    with gzip.open(CORPORA / f"{family.name}.jsonl.gz", "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def one_token(case: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The corpus request as sent: one greedy token; tools with tool_choice "none" (vLLM refuses "auto" without a
    tool parser, and the choice does not change the prompt)."""
    body = {**case["body"], "model": runtime.SERVED_NAME, "max_tokens": 1, "temperature": 0}
    if body.get("tools") and "tool_choice" not in body:
        body["tool_choice"] = "none"
    return ("/v1/chat/completions" if case["kind"] == "chat" else "/v1/completions"), body


def first_counted(http: httpx.Client, guard: str, family: Family) -> tuple[int | None, int | None]:
    """The family's first corpus request through the guard: its count (None: the guard gave none) and what vLLM
    charged for it (None: it was refused)."""
    path, body = one_token(corpus(family)[0])
    answer = http.post(guard + path, json=body)
    counted = answer.headers.get("x-token-guard-prompt-tokens")
    charged = answer.json()["usage"]["prompt_tokens"] if answer.status_code == 200 else None
    return (int(counted) if counted is not None else None), charged


BILLED = {"model": runtime.SERVED_NAME, "max_tokens": 1, "temperature": 0, "messages": [
    {"role": "system", "content": "x-anthropic-billing-header: cc_version=1; cch=0\nBe brief."},
    {"role": "user", "content": "Hi"},
]}  # fmt: skip


def _checked(http: httpx.Client, guard: str, exact: bool) -> bool:
    if not exact:  # the start-up check has run (/health says so); the count need not agree
        return bool(http.get(guard + "/health").json().get("checked"))
    answer = http.post(guard + "/v1/chat/completions", json=BILLED)
    return answer.status_code == 200 and answer.headers.get("x-token-guard-prompt-tokens") == str(
        answer.json()["usage"]["prompt_tokens"]
    )


@contextlib.contextmanager
def served(family: Family, versions: Sequence[str], workdir: Path) -> Iterator[dict[str, Served]]:
    """Every vLLM version serving the family's tiny model (started together: start-up is mostly waiting), each with
    the guard in front, until the block ends. vLLM serves its render routes (--enable-scale-out), and the guard
    answers its own (render.local), so the two can be compared."""
    model = zoo.model_dir(family.zoo_family)
    processes: list[runtime.Process] = []
    try:
        vllms = {}
        for version in versions:
            vllms[version] = runtime.start_vllm(runtime.vllm_venv(version), model, workdir / version / "vllm",
                                                ["--max-model-len", str(WINDOW), "--enable-scale-out",
                                                 *family.vllm_args])  # fmt: skip
            processes.append(vllms[version])
        guards = {}
        for version, vllm in vllms.items():
            vllm.wait_ready("/v1/models", VLLM_READY_TIMEOUT)
            extra = ["--max-model-len", str(WINDOW), *family.guard_args]
            guards[version] = runtime.start_proxy(vllm.url, model, workdir / version / "guard", extra_args=extra,
                                                  settings={"TOKEN_GUARD_RENDER_LOCAL": "true"})  # fmt: skip
            processes.append(guards[version])
        with httpx.Client(timeout=120) as http:
            first = {}
            for version, guard in guards.items():
                guard.wait_ready("/health", PROXY_READY_TIMEOUT)
                first[version] = first_counted(http, guard.url, family)  # the moment the guard says it is ready
            for guard in guards.values():
                # The start-up check runs once /health is ready; it reads the upstream's version, on which 0.32's
                # billing-header rule depends: wait until the guard counts such a request as vLLM charges it.
                if not eventually(partial(_checked, http, guard.url, family.exact), timeout_s=60, interval_s=0.5):
                    raise TimeoutError(f"the guard's start-up check did not finish:\n{runtime.tail(guard.log)}")
            yield {v: Served(family, v, vllms[v].url, guards[v].url, http, first[v]) for v in versions}
    finally:
        for process in reversed(processes):
            process.stop()
