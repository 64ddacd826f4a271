"""The simulator reads Responses and Anthropic Messages bodies as vLLM 0.31.0 and 0.32.0 do: every request of
`tests/counting/endpoints/vllm_counts.json` (real vLLM's own renderer, per version and template), sent to a simulator
of that version and template, is charged the input tokens vLLM counted, or refused with vLLM's message.

The simulator's readers are its own (simulator/responses_*.py), written from vLLM's source: this holds them to vLLM's
measured counts, not to the guard's conversions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.assets import write_demo_tokenizer_dir
from simulator import SimulatorSettings
from tests.support.sim_fixtures import RunningSim, running_simulator

HERE = Path(__file__).parents[1] / "counting" / "endpoints"
CASES: list[dict[str, Any]] = json.loads((HERE / "vllm_counts.json").read_text())
PROFILES = sorted({key for case in CASES for key in case["vllm"]})
PATHS = {"responses": "/v1/responses", "messages": "/v1/messages", "count_tokens": "/v1/messages/count_tokens"}
# Refused by a vLLM started without a tool parser, which the simulator never has: its Messages tool choices pass.
SERVER_FLAGS = {"tool_choice any", "tool_choice named"}
# Recorded by calling vLLM's conversion with merge_inline_system at its default (false): a vLLM server probes its
# template at start-up (_detect_merge_inline_system), finds that a system-first template refuses an inline system
# message, and merges it into the leading one, as the simulator does; the corpus holds no count for that.
UNPROBED = "inline system message"
BOS = {"SpecialToken": {"id": "<｜begin▁of▁sentence｜>", "type_id": 0}}


def _bos_tokenizer(path: Path) -> Path:
    """The model's tokenizer with a BOS post-processor, as vllm_counts.json's `bos` profile."""
    spec = json.loads((path / "tokenizer.json").read_text())
    spec["post_processor"] = {
        "type": "TemplateProcessing", "single": [BOS, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [BOS, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<｜begin▁of▁sentence｜>": {"id": "<｜begin▁of▁sentence｜>", "ids": [0],
                                                       "tokens": ["<｜begin▁of▁sentence｜>"]}},
    }  # fmt: skip
    (path / "tokenizer.json").write_text(json.dumps(spec))
    return path


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningSim]]:
    """One simulator per profile (version/template), started when first asked for."""
    plain = write_demo_tokenizer_dir(tmp_path_factory.mktemp("tok"))
    bos = _bos_tokenizer(write_demo_tokenizer_dir(tmp_path_factory.mktemp("bos")))
    with _Sims(plain, bos) as started:
        yield started


class _Sims(dict[str, RunningSim]):
    def __init__(self, plain: Path, bos: Path) -> None:
        super().__init__()
        self._plain, self._bos = plain, bos
        self._exits: list[Any] = []

    def __missing__(self, profile: str) -> RunningSim:
        version, template = profile.split("/")
        settings = SimulatorSettings(
            tokenizer=self._bos if template == "bos" else self._plain, profile=version, reasoning_parser="deepseek_r1",
            chat_template=None if template in ("model", "bos") else HERE / f"{template}.jinja",
        )  # fmt: skip
        context = running_simulator(settings)
        self[profile] = sim = context.__enter__()
        self._exits.append(context)
        return sim

    def __enter__(self) -> _Sims:
        return self

    def __exit__(self, *exc: object) -> None:
        for context in reversed(self._exits):
            context.__exit__(None, None, None)


def _send(sim: RunningSim, case: dict[str, Any]) -> Any:
    body = dict(case["body"])
    if case["endpoint"] == "responses":
        body.setdefault("max_output_tokens", 1)  # the count is the prompt's; one token of answer is enough
    return sim.client.post(PATHS[case["endpoint"]], json=body)


def _tokens(answer: dict[str, Any], endpoint: str) -> int:
    if endpoint == "count_tokens":
        return int(answer["input_tokens"])
    return int(answer["usage"]["input_tokens"])


COUNTED = [(c, p) for c in CASES for p in PROFILES if isinstance(c["vllm"].get(p), int)]
REFUSED = [(c, p) for c in CASES for p in PROFILES
           if isinstance(c["vllm"].get(p), dict) and c["name"] not in SERVER_FLAGS | {UNPROBED}]  # fmt: skip


@pytest.mark.parametrize("case,profile", COUNTED, ids=[f"{c['endpoint']}: {c['name']} ({p})" for c, p in COUNTED])
def test_charged_as_vllm_counts(case: dict[str, Any], profile: str, sims: dict[str, RunningSim]) -> None:
    answer = _send(sims[profile], case)
    assert answer.status_code == 200, answer.text
    assert _tokens(answer.json(), case["endpoint"]) == case["vllm"][profile]


@pytest.mark.parametrize("case,profile", REFUSED, ids=[f"{c['endpoint']}: {c['name']} ({p})" for c, p in REFUSED])
def test_refused_as_vllm_refuses(case: dict[str, Any], profile: str, sims: dict[str, RunningSim]) -> None:
    refused: str = case["vllm"][profile]["refused"]
    answer = _send(sims[profile], case)
    pydantic = " validation error" in refused.split("\n")[0]  # vLLM's text of pydantic's, cut in the corpus
    if pydantic:
        assert answer.status_code == 400, answer.text
    else:
        assert answer.status_code in (400, 500), answer.text
        assert answer.json()["error"]["message"] == refused
