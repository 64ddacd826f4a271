"""A vLLM 0.33+ started with `--reasoning-effort-map` rewrites a request's reasoning effort before the chat template
sees it (chat, and what Responses and Messages become). The guard given the same map (`model.reasoning_effort_map`)
counts what vLLM charges; without it, it counts the effort the client sent, and the answers' usage says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from proxy.server.running import ServerThread
from proxy.settings import SettingsError, load_settings
from simulator import SimulatorSettings
from simulator import create_app as create_simulator
from tests.support import zoo
from tests.support.prometheus import metric
from tests.support.servers import MODEL, guard, simulator

# the server's map: the efforts the template was not written for, to one it spells out at length
EFFORT_MAP = {"minimal": "a very thorough and deliberate effort, considered step by step", "xhigh": "high"}


def template_with_effort(tokenizer_dir: Path, into: Path) -> Path:
    """The tokenizer's own chat template, with the effort it is given written in front of the prompt."""
    template = into / "effort.jinja"
    template.write_text("{{ reasoning_effort or '' }}\n" + (tokenizer_dir / "chat_template.jinja").read_text())
    return template


def chat(client: openai.OpenAI) -> tuple[int, int]:
    answer = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Think about rivers."}], max_tokens=5,
        reasoning_effort="minimal",
    )  # fmt: skip
    usage = answer.parse().usage
    assert usage is not None
    return int(answer.headers["x-token-guard-prompt-tokens"]), usage.prompt_tokens


def responses(client: openai.OpenAI) -> tuple[int, int]:
    answer = client.responses.with_raw_response.create(
        model=MODEL, input="Think about seas.", max_output_tokens=5, reasoning={"effort": "minimal"}
    )
    usage = answer.parse().usage
    assert usage is not None
    return int(answer.headers["x-token-guard-prompt-tokens"]), usage.input_tokens


def messages(url: str) -> tuple[int, int]:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    answer = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Think about lakes."}],
        extra_body={"output_config": {"effort": "xhigh"}},
    )  # fmt: skip
    return int(answer.headers["x-token-guard-prompt-tokens"]), answer.parse().usage.input_tokens


@pytest.mark.parametrize("mapped", [True, False])
def test_the_guard_counts_the_effort_vllm_maps_to(deepseek_dir: Path, tmp_path: Path, mapped: bool) -> None:
    template = template_with_effort(deepseek_dir, tmp_path)
    served = SimulatorSettings(tokenizer=deepseek_dir, model=MODEL, profile="0.33", chat_template=template,
                               reasoning_effort_map=EFFORT_MAP)  # fmt: skip
    flags: dict[str, Any] = {"model.chat_template": str(template), "counting.source": "local"}
    if mapped:
        flags["model.reasoning_effort_map"] = EFFORT_MAP
    with ServerThread(create_simulator(served)) as sim, guard(sim.url, deepseek_dir, **flags) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        seen = [chat(client), responses(client), messages(proxy.url)]
        mismatches = metric(httpx.get(f"{proxy.url}/metrics").text, "token_guard_count_mismatches_total",
                            model=MODEL, source="local")  # fmt: skip
    if mapped:
        assert all(counted == charged for counted, charged in seen), seen
        assert mismatches == 0
    else:  # the client's effort counted: "minimal" is shorter than what it maps to; "xhigh" longer than "high"
        assert [counted < charged for counted, charged in seen] == [True, True, False], seen
        assert mismatches == 3


def test_a_map_with_an_effort_vllm_does_not_know_is_refused_at_start(deepseek_dir: Path) -> None:
    flags = {
        "model.name": MODEL,
        "model.tokenizer": str(deepseek_dir),
        "model.reasoning_effort_map": '{"huge": "high"}',
    }
    with pytest.raises(SettingsError, match="unknown efforts \\['huge'\\]"):
        load_settings(flags, environ={})


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zoo.gpt_oss_dir(tmp_path_factory.mktemp("gpt-oss"))


def test_a_gpt_oss_response_asking_an_effort_harmony_lacks_is_served_as_vllm_maps_it(gpt_oss_dir: Path) -> None:
    """Harmony takes low, medium and high; a server mapping "minimal" to "low" serves a Responses request asking
    "minimal", which the guard without the map would refuse as vLLM without it does."""
    harmony_map = {"minimal": "low"}
    with simulator(gpt_oss_dir, profile="0.33", reasoning_effort_map=harmony_map) as (sim, _, _), guard(
        sim.url, gpt_oss_dir, **{"model.reasoning_effort_map": harmony_map, "counting.source": "local"}
    ) as proxy:  # fmt: skip
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        answer = client.responses.with_raw_response.create(
            model=MODEL, input="Think about seas.", max_output_tokens=5, reasoning={"effort": "minimal"}
        )
        usage = answer.parse().usage
        assert usage is not None and int(answer.headers["x-token-guard-prompt-tokens"]) == usage.input_tokens
    with simulator(gpt_oss_dir, profile="0.33") as (sim, _, _), guard(sim.url, gpt_oss_dir) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="not supported by Harmony"):
            client.responses.create(model=MODEL, input="Think about seas.", reasoning={"effort": "minimal"})


def test_counted_by_the_upstream_the_effort_is_the_mapped_one(deepseek_dir: Path, tmp_path: Path) -> None:
    """Counted upstream: vLLM's /tokenize takes no effort (the guard passes it as a template variable) and never
    applies the map, so the guard hands it the effort the chat path maps to."""
    template = template_with_effort(deepseek_dir, tmp_path)
    served = SimulatorSettings(tokenizer=deepseek_dir, model=MODEL, profile="0.33", chat_template=template,
                               reasoning_effort_map=EFFORT_MAP)  # fmt: skip
    flags: dict[str, Any] = {"model.chat_template": str(template), "counting.source": "upstream",
                             "model.reasoning_effort_map": EFFORT_MAP}  # fmt: skip
    with ServerThread(create_simulator(served)) as sim, guard(sim.url, deepseek_dir, **flags) as proxy:
        counted, charged = chat(openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0))
        source = httpx.get(f"{proxy.url}/metrics").text
    assert 'source="upstream"' in source  # counted through /tokenize, not by the guard itself
    assert counted == charged
