"""`background: true` on /v1/responses, as vLLM 0.31 and 0.32 run it (entrypoints/openai/responses/serving.py): only
with the Responses store on (VLLM_ENABLE_RESPONSES_API_STORE=1; `--responses-store` here), else a 400; the answer is
the response `queued`, without output or usage, and the generation runs after it, in a task the server holds (vLLM's
`background_tasks`), whatever the client does; the stored response says `queued` until the generation ends and is then
the finished one (`incomplete` here: the engine always runs to its limit). `GET /v1/responses/{id}` shows it (a 404
for an id never stored); `POST /v1/responses/{id}/cancel` cancels one still queued (its status `cancelled`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from proxy.simulator.api_shapes import responses_object
from proxy.simulator.errors import ApiError
from proxy.simulator.generation import Generation

NO_STORE = (
    "This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable "
    "these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server."
)
TERMINAL = ("completed", "incomplete", "failed", "cancelled")


def not_found(response_id: str) -> ApiError:
    return ApiError(f"Response with id '{response_id}' not found.", status=404, type="invalid_request_error",
                    param="response_id")  # fmt: skip


class BackgroundResponses:
    """The stored responses of background requests, and the tasks that run them."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.stored: dict[str, dict[str, Any]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def check(self, body: dict[str, Any]) -> None:
        """vLLM's checks of a background request, before it renders the prompt."""
        if body.get("background") and body.get("store", True) is not False and not self.enabled:
            raise ApiError(NO_STORE, type="invalid_request_error", param="background")

    def start(self, generation: Generation, run: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """Store the response `queued` and run it in the background; the queued response is the create's answer."""
        rid = generation.response_id
        queued = {**responses_object(generation, None, 0), "status": "queued", "background": True}
        self.stored[rid] = queued
        # a task held in `_tasks` until it ends and cancelled by cancel() or close(), as vLLM holds its own (it runs
        # on whichever loop serves the request: uvicorn's, or a test's in-memory transport)
        task = asyncio.get_running_loop().create_task(self._run(rid, run))
        self._tasks[rid] = task
        task.add_done_callback(lambda _: self._tasks.pop(rid, None))
        return queued

    async def _run(self, rid: str, run: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        try:
            finished = await run()
        except ApiError:
            if self.stored[rid]["status"] not in TERMINAL:
                self.stored[rid] = {**self.stored[rid], "status": "failed"}
            return
        if self.stored[rid]["status"] != "cancelled":
            self.stored[rid] = {**finished, "background": True}

    def retrieve(self, response_id: str) -> dict[str, Any]:
        found = self.stored.get(response_id)
        if found is None:
            raise not_found(response_id)
        return found

    def cancel(self, response_id: str) -> dict[str, Any]:
        found = self.retrieve(response_id)
        if found["status"] not in ("queued", "in_progress"):
            raise ApiError("Cannot cancel a synchronous response.", type="invalid_request_error", param="response_id")
        self.stored[response_id] = cancelled = {**found, "status": "cancelled"}
        task = self._tasks.get(response_id)
        if task is not None:
            task.cancel()
        return cancelled

    @property
    def running(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
