"""The simulator takes prompt_embeds on /v1/completions as vLLM 0.31 / 0.32 do: only with --enable-prompt-embeds,
each tensor its own prompt before the text prompts, n sequences each, the window's rules on its rows, and vLLM's
refusals (echo, prompt_logprobs, suffix, a shape or hidden size it does not take)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from simulator import SimulatorSettings
from tests.support.sim_fixtures import RunningSim, fixture_sim_tokenizer_dir, running_simulator  # noqa: F401
from tests.support.torch_save import embeds

HIDDEN = 64


@pytest.fixture(scope="module", params=["0.31", "0.32"])
def sim(request: pytest.FixtureRequest, sim_tokenizer_dir: Path) -> Iterator[RunningSim]:
    settings = SimulatorSettings(tokenizer=sim_tokenizer_dir, profile=request.param, enable_prompt_embeds=True,
                                 hidden_size=HIDDEN)  # fmt: skip
    with running_simulator(settings) as running:
        yield running


def complete(sim: RunningSim, **body: Any) -> Any:
    return sim.client.post("/v1/completions", json={"model": "tiny", "max_tokens": 2, **body})


def test_each_tensor_is_a_prompt_run_before_the_text_n_times(sim: RunningSim) -> None:
    answer = complete(sim, prompt="x", prompt_embeds=[embeds((30, HIDDEN)), embeds((1, 12, HIDDEN))], n=2).json()
    text_only = complete(sim, prompt="x").json()["usage"]["prompt_tokens"]
    assert answer["usage"]["prompt_tokens"] == 30 + 12 + text_only
    assert len(answer["choices"]) == 3 * 2 and answer["usage"]["completion_tokens"] == 3 * 2 * 2


def test_embeds_alone_and_the_window(sim: RunningSim) -> None:
    assert complete(sim, prompt_embeds=embeds((7, HIDDEN), "BFloat16")).json()["usage"]["prompt_tokens"] == 7
    over = complete(sim, prompt_embeds=embeds((2049, HIDDEN)))
    assert over.status_code == 400 and "maximum context length" in over.json()["error"]["message"]


@pytest.mark.parametrize(
    "extra,message",
    [({"echo": True}, "Echo is unsupported with prompt embeds."),
     ({"prompt_logprobs": 1}, "prompt_logprobs is not compatible with prompt embeds."),
     ({"suffix": "y"}, "suffix is not supported with prompt_embeds"),
     ({"prompt_embeds": embeds((3, HIDDEN + 1))}, f"does not match the model's hidden_size {HIDDEN}"),
     ({"prompt_embeds": embeds((2, 3, HIDDEN))}, "must be a 2D tensor")],
)  # fmt: skip
def test_what_vllm_refuses(sim: RunningSim, extra: dict[str, Any], message: str) -> None:
    response = complete(sim, **{"prompt": "x", "prompt_embeds": embeds((3, HIDDEN)), **extra})
    assert response.status_code == 400 and message in response.json()["error"]["message"]


def test_off_unless_enabled(sim_tokenizer_dir: Path) -> None:
    with running_simulator(SimulatorSettings(tokenizer=sim_tokenizer_dir)) as off:
        response = complete(off, prompt="x", prompt_embeds=embeds((3, HIDDEN)))
    assert response.status_code == 400
    assert "You must set `--enable-prompt-embeds` to input `prompt_embeds`" in response.json()["error"]["message"]
