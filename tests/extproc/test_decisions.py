"""vLLM 0.33's Decisions API behind a real Envoy (1.40) with token-guard as its external processor, held to what
`serve` does (tests/server/test_decisions.py): each question counted as vLLM renders it (a real Qwen3 tokenizer and
template), the call admitted by its fan-out against the KV budget, and refused before the simulator where vLLM would
refuse it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from bench.envoy import cluster, processor
from tests.support import zoo
from tests.support.envoy import Envoy, envoy
from tests.support.extproc import extproc
from tests.support.ports import free_port
from tests.support.servers import MODEL, simulator

WINDOW = 1024
BUDGET = 1500
QUESTIONS: list[dict[str, Any]] = [
    {"type": "predicate", "instructions": "Is the customer angry?"},
    {"type": "choice", "instructions": "Which team?", "choices": [{"value": "billing"}, {"value": "support"}]},
]
TICKET = "My invoice is wrong for the third month running and nobody answers my mails."


@dataclass
class Rig:
    envoy: Envoy
    stats: Any


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    port, tokenizer = free_port(), zoo.family_dir("qwen3")
    with simulator(tokenizer, max_model_len=WINDOW, profile="0.33") as (sim, stats, _):
        listeners = {"guard": [processor("guard", "BUFFERED")]}
        log = tmp_path_factory.mktemp("extproc") / "extproc.log"
        with (
            extproc(sim.url, tokenizer, log, port, TOKEN_GUARD_ADMISSION_MAX_INFLIGHT_TOKENS=str(BUDGET)),
            envoy(tmp_path_factory.mktemp("envoy"), int(sim.url.rsplit(":", 1)[1]), listeners,
                  [cluster("guard", port, grpc=True)]) as running,
        ):  # fmt: skip
            yield Rig(running, stats)


def decide(rig: Rig, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{rig.envoy.urls['guard']}/v1/decisions", json={"model": MODEL, **body}, timeout=30)


def test_the_count_is_vllms_usage(rig: Rig) -> None:
    response = decide(rig, {"input": TICKET, "questions": QUESTIONS})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert int(response.headers["x-token-guard-prompt-tokens"]) == usage["input_tokens"] > 2 * 30
    assert usage["output_tokens"] == 2 and response.headers["x-token-guard-action"] == "pass"


@pytest.mark.parametrize(
    "body,status,words",
    [({"input": TICKET, "questions": QUESTIONS[:1] * 65}, 400, "at most 64"),
     ({"input": "apple " * 1100, "questions": QUESTIONS}, 400, "maximum context length is 1024"),
     ({"input": TICKET, "questions": QUESTIONS * 20}, 400, "40 questions"),  # its fan-out outgrows the KV budget
     ({"input": TICKET, "questions": QUESTIONS, "top_k": 1}, 400, "extra inputs")],
)  # fmt: skip
def test_what_vllm_or_the_budget_refuses_never_reaches_it(rig: Rig, body: dict[str, Any], status: int,
                                                          words: str) -> None:  # fmt: skip
    before = rig.stats.received
    response = decide(rig, body)
    assert response.status_code == status and words in response.json()["error"]["message"]
    assert rig.stats.received == before
