"""The simulator's gpt-oss Responses on its 0.33 and 0.34 profiles, held to vLLM's own reading of the same histories
(tests/support/harmony_history.py): each is refused where the release refuses it, and otherwise charged the tokens
of the harmony messages vLLM's functions build from the release's source (tests/support/vllm_harmony_input.py),
after the preamble of a request without instructions or tools."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai_harmony as oh
import pytest

from proxy.counting.harmony import HarmonyChat
from tests.support import vllm_harmony_input, zoo
from tests.support.harmony_history import HISTORIES, REFUSED, HarmonyHistory
from tests.support.servers import MODEL, InMemorySim, simulator_in_memory


@pytest.fixture(scope="module", params=["0.33", "0.34"])
def sim(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, InMemorySim]]:
    gpt_oss = zoo.gpt_oss_dir(tmp_path_factory.mktemp("gpt-oss"))
    with simulator_in_memory(gpt_oss, profile=request.param) as sim:
        yield request.param, sim


def vllm_tokens(items: list[dict[str, Any]], release: str) -> int | str:
    if not vllm_harmony_input.source(release).is_dir():
        pytest.skip(f"vLLM {release}'s source is not on this machine")
    read = vllm_harmony_input.reader(release)(items)
    if isinstance(read, str):
        return REFUSED
    native = HarmonyChat()
    preamble = [oh.Message.from_dict(m) for m in native.preamble_dicts(None, None, None)]
    return len(native.render_messages([*preamble, *read]))


@pytest.mark.parametrize("history", HISTORIES, ids=[h.name for h in HISTORIES])
def test_charged_as_vllm_renders_or_refused(history: HarmonyHistory, sim: tuple[str, InMemorySim]) -> None:
    release, app = sim
    answer = app.client.post("/v1/responses", json={"model": MODEL, "input": history.items, "max_output_tokens": 4})
    expected = vllm_tokens(history.items, release)
    if expected == REFUSED:
        assert answer.status_code == 400
    else:
        assert answer.status_code == 200 and answer.json()["usage"]["input_tokens"] == expected
