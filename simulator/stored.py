"""vLLM's store of Responses (VLLM_ENABLE_RESPONSES_API_STORE=1; `--responses-store` here), as vLLM 0.31/0.32 keep
it (responses/serving.py: response_store, msg_store, background_tasks, retrieve_responses, cancel_responses): each
replica keeps the responses it answered with `store` in effect, and the messages it rendered for them, in its own
memory, shared with no other replica and checked against no owner. A `background: true` request is stored `queued`,
answered with that, and generated after the answer in a task the store holds, whatever the client does; the stored
copy is the finished response once the generation ends (`incomplete` here: the engine always runs to its limit),
`failed` if it fails, and stays `cancelled` once cancelled (it never says `in_progress`, as vLLM's)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from simulator.api_shapes import responses_object
from simulator.errors import ApiError
from simulator.generation import Generation

CANNOT_CANCEL = "Cannot cancel a synchronous response."
NO_STORE = (
    "This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable "
    "these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server."
)


def not_found(response_id: str) -> ApiError:
    return ApiError(f"Response with id '{response_id}' not found.", status=404, type="invalid_request_error",
                    param="response_id")  # fmt: skip


@dataclass
class ResponseStore:
    responses: dict[str, dict[str, Any]] = field(default_factory=dict)
    messages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # a gpt-oss model's: the harmony messages rendered for each response (simulator/harmony.py)
    harmony: dict[str, list[Any]] = field(default_factory=dict)
    # the background generations running
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict, init=False, repr=False)

    def history(self, response_id: str) -> list[dict[str, Any]]:
        """What a continuation renders between its instructions and its input (construct_input_messages): the
        stored messages less their system messages, then each text part of the response's output messages."""
        response = self.retrieve(response_id)
        stored = [m for m in self.messages.get(response_id, []) if m.get("role") != "system"]
        for item in response.get("output") or []:
            if item.get("type") == "message":
                stored += [{"role": "assistant", "content": part["text"]} for part in item.get("content") or []]
        return stored

    def rendered(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        """The messages rendered for a response, kept as its create is accepted (vLLM's msg_store, set before the
        generation runs: a continuation of a background response still queued renders them)."""
        self.messages[response_id] = messages

    def keep(self, response: dict[str, Any]) -> None:
        """A response complete: stored, unless it was cancelled meanwhile."""
        if self.responses.get(response["id"], {}).get("status") != "cancelled":
            self.responses[response["id"]] = response

    def start(self, generation: Generation, run: Callable[[], Awaitable[object]]) -> dict[str, Any]:
        """Store a background response `queued` and run it after the answer, which is the queued response."""
        rid = generation.response_id
        self.responses[rid] = queued = {**responses_object(generation, None, 0), "status": "queued"}
        # held in `_tasks` until it ends and cancelled by cancel() or close(), as vLLM holds its own (it runs on
        # whichever loop serves the request: uvicorn's, or a test's in-memory transport)
        task = asyncio.get_running_loop().create_task(self._run(rid, run))
        self._tasks[rid] = task
        task.add_done_callback(lambda _: self._tasks.pop(rid, None))
        return queued

    async def _run(self, rid: str, run: Callable[[], Awaitable[object]]) -> None:
        try:
            await run()  # the finished response reaches the store through keep()
        except ApiError:
            if self.responses[rid]["status"] not in ("completed", "cancelled"):  # _run_background_request
                self.responses[rid] = {**self.responses[rid], "status": "failed"}

    def retrieve(self, response_id: str) -> dict[str, Any]:
        response = self.responses.get(response_id)
        if response is None:
            raise not_found(response_id)
        return response

    def cancel(self, response_id: str) -> dict[str, Any]:
        response = self.retrieve(response_id)
        if response.get("status") not in ("queued", "in_progress"):
            raise ApiError(CANNOT_CANCEL, param="response_id", type="invalid_request_error")
        self.responses[response_id] = cancelled = {**response, "status": "cancelled"}
        task = self._tasks.get(response_id)
        if task is not None:
            task.cancel()
        return cancelled

    async def close(self) -> None:
        """vLLM's shutdown ends the background generations it runs."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
