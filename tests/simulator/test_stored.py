"""The simulator's Responses store, as vLLM 0.31/0.32 keep theirs (VLLM_ENABLE_RESPONSES_API_STORE=1): off unless
enabled, each replica's own, a continuation rendered with the stored conversation (construct_input_messages), and
one store for stored and background responses alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.polling import eventually
from tests.support.processes import simulator_process
from tests.support.servers import MODEL, simulator_in_memory


def create(sim: Any, **body: Any) -> Any:
    return sim.client.post("/v1/responses", json={"model": MODEL, "max_output_tokens": 8, **body})


def test_without_the_store_a_previous_response_id_is_not_found(deepseek_dir: Path) -> None:
    with simulator_in_memory(deepseek_dir) as sim:
        first = create(sim, input="Hi")
        assert first.status_code == 200
        again = create(sim, input="More", previous_response_id=first.json()["id"])
        assert again.status_code == 404
        message = f"Response with id '{first.json()['id']}' not found."
        error = {"message": message, "type": "invalid_request_error", "param": "response_id", "code": 404}
        assert again.json()["error"] == error
        assert sim.client.get(f"/v1/responses/{first.json()['id']}").status_code == 404


def test_a_continuation_renders_the_stored_conversation_without_its_instructions(deepseek_dir: Path) -> None:
    with simulator_in_memory(deepseek_dir, responses_store=True) as sim:
        first = create(sim, input="Hi", instructions="Be brief.").json()
        text = first["output"][0]["content"][0]["text"]
        second = create(sim, input="More", previous_response_id=first["id"]).json()
        alone = create(sim, input=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": text},
                                   {"role": "user", "content": "More"}], store=False).json()  # fmt: skip
        assert second["usage"]["input_tokens"] == alone["usage"]["input_tokens"]
        assert sim.client.get(f"/v1/responses/{first['id']}").json()["id"] == first["id"]
        assert sim.client.get(f"/v1/responses/{alone['id']}").status_code == 404  # store false: not kept


def test_each_replica_keeps_its_own(deepseek_dir: Path) -> None:
    with (
        simulator_in_memory(deepseek_dir, responses_store=True) as one,
        simulator_in_memory(deepseek_dir, responses_store=True) as other,
    ):
        made = create(one, input="Hi").json()
        assert create(other, input="More", previous_response_id=made["id"]).status_code == 404
        assert other.client.get(f"/v1/responses/{made['id']}").status_code == 404


def test_a_client_chosen_id_replaces_what_was_stored_under_it_and_a_completed_one_cannot_be_cancelled(
    deepseek_dir: Path,
) -> None:
    with simulator_in_memory(deepseek_dir, responses_store=True) as sim:
        create(sim, input="First", request_id="resp_mine")
        create(sim, input="Second, longer than the first", request_id="resp_mine")
        kept = sim.client.get("/v1/responses/resp_mine").json()
        assert kept["usage"]["input_tokens"] > 5
        cancel = sim.client.post("/v1/responses/resp_mine/cancel")
        assert (
            cancel.status_code == 400 and cancel.json()["error"]["message"] == "Cannot cancel a synchronous response."
        )


@pytest.mark.parametrize(
    ("flags", "env"),
    [
        ((), {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}),
        (("--responses-store",), {"VLLM_ENABLE_RESPONSES_API_STORE": "0"}),
    ],
    ids=["vllm-variable", "flag"],
)
def test_one_store_keeps_background_responses_and_their_conversation_turned_on_either_way(
    deepseek_dir: Path, tmp_path: Path, flags: tuple[str, ...], env: dict[str, str]
) -> None:
    with simulator_process(deepseek_dir, tmp_path / "simulator.log", flags, env) as url:
        body = {"model": MODEL, "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 8, "background": True}
        queued = httpx.post(f"{url}/v1/responses", json=body).json()
        assert (queued["status"], queued["output"], queued["background"]) == ("queued", [], True)
        rid = queued["id"]
        assert eventually(lambda: httpx.get(f"{url}/v1/responses/{rid}").json()["status"] == "incomplete")
        first = httpx.get(f"{url}/v1/responses/{rid}").json()
        text = first["output"][0]["content"][0]["text"]
        more = {"model": MODEL, "input": "More", "max_output_tokens": 8, "previous_response_id": rid}
        second = httpx.post(f"{url}/v1/responses", json=more).json()
        alone = {
            "model": MODEL,
            "max_output_tokens": 8,
            "store": False,
            "input": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": text},
                {"role": "user", "content": "More"},
            ],
        }
        assert (
            second["usage"]["input_tokens"]
            == httpx.post(f"{url}/v1/responses", json=alone).json()["usage"]["input_tokens"]
        )
        cancelled = httpx.post(f"{url}/v1/responses/{rid}/cancel")
        assert cancelled.status_code == 400  # it ended: vLLM's "Cannot cancel a synchronous response."


def test_without_the_variable_or_the_flag_there_is_no_store(deepseek_dir: Path, tmp_path: Path) -> None:
    env = {"VLLM_ENABLE_RESPONSES_API_STORE": "0"}
    with simulator_process(deepseek_dir, tmp_path / "simulator.log", (), env) as url:
        body = {"model": MODEL, "input": "Hi", "max_output_tokens": 8, "background": True}
        refused = httpx.post(f"{url}/v1/responses", json=body)
        assert refused.status_code == 400 and "VLLM_ENABLE_RESPONSES_API_STORE" in refused.json()["error"]["message"]
