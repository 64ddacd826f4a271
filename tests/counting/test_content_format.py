"""Which content format vLLM decides for a template that reaches its messages through a namespace: 0.31 and 0.32 do
not follow `namespace(rest=messages)` or `{% set ns.rest = messages %}` (the template is taken to want strings),
0.33 does (`renderers/hf.py` `_iter_nodes_assign_var_or_elems`: a loop over `ns.rest` whose items' content is
walked wants OpenAI's list of parts). The guard's detection and the simulator's, written apart, agree on each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.counting.conversation import detect_content_format
from proxy.server.running import ServerThread
from simulator import SimulatorSettings
from simulator import create_app as create_simulator
from simulator.content_format import detect_content_format as simulated
from tests.support.servers import MODEL, guard

PARTS = "{% for part in message.content %}[{{ part.text }}]{% endfor %}"
CALLED = "{% set ns = namespace(rest=messages) %}{% for message in ns.rest %}" + PARTS + "{% endfor %}"
SET = (
    "{% set ns = namespace(rest=[]) %}{% set ns.rest = messages %}{% for message in ns.rest %}" + PARTS + "{% endfor %}"
)
SLICED = "{% set ns = namespace(rest=messages[1:]) %}{% for message in ns.rest %}" + PARTS + "{% endfor %}"
CHAINED = ("{% set ns = namespace(rest=messages) %}{% set later = ns.rest %}{% for message in later %}" + PARTS
           + "{% endfor %}")  # fmt: skip
PLAIN = "{% set rest = messages %}{% for message in rest %}" + PARTS + "{% endfor %}"
UNRELATED = "{% set ns = namespace(rest=tools) %}{% for message in ns.rest %}" + PARTS + "{% endfor %}"


@pytest.mark.parametrize(
    ("template", "before", "since_033"),
    [
        (CALLED, "string", "openai"),
        (SET, "string", "openai"),
        (SLICED, "string", "openai"),
        (CHAINED, "string", "openai"),
        (PLAIN, "openai", "openai"),  # a plain alias: every release follows it
        (UNRELATED, "string", "string"),
    ],
)
def test_namespace_aliases_count_from_0_33(template: str, before: str, since_033: str) -> None:
    assert detect_content_format(template, namespaces=False) == simulated(template, False) == before
    assert detect_content_format(template, namespaces=True) == simulated(template, True) == since_033


def test_a_namespace_that_holds_itself_ends() -> None:
    looping = (
        "{% set ns = namespace(rest=messages) %}{% set ns.rest = ns.rest %}{% for m in ns.rest %}{{ m }}{% endfor %}"
    )
    assert detect_content_format(looping, namespaces=True) == simulated(looping, True) == "string"


TEMPLATE = ("{% set ns = namespace(rest=messages) %}{% for message in ns.rest %}<|{{ message.role }}|>"
            "{% if message.content is string %}{{ message.content }}{% else %}" + PARTS + "{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")  # fmt: skip


@pytest.mark.parametrize("profile", ["0.32", "0.33"])
def test_the_guard_counts_parts_as_the_release_behind_it_renders_them(
    deepseek_dir: Path, tmp_path: Path, profile: str
) -> None:
    template = tmp_path / "namespaced.jinja"
    template.write_text(TEMPLATE)
    served = SimulatorSettings(tokenizer=deepseek_dir, model=MODEL, profile=profile, chat_template=template)
    parts: Any = [{"type": "text", "text": "Name a river."}, {"type": "text", "text": "And a sea."}]
    flags = {"model.chat_template": str(template), "counting.source": "local"}
    with ServerThread(create_simulator(served)) as sim, guard(sim.url, deepseek_dir, **flags) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        answer = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": parts}],
            max_tokens=5,
        )
        usage = answer.parse().usage
    assert usage is not None and int(answer.headers["x-token-guard-prompt-tokens"]) == usage.prompt_tokens
