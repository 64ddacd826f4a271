"""Run by a vLLM virtual environment's python (never imported by the test suite): reads request bodies exactly as that
vLLM's API server reads them, without an engine, a model or a socket. vLLM's own routers are mounted on a FastAPI app
whose serving objects are stand-ins: FastAPI reads the body (JSON, or the form), the route's dependencies check it
(`validate_json_request`), pydantic builds vLLM's request model with its validators, and the stand-in is handed the
request object the serving code would get, which is what this prints. Nothing is served.

Two servers are stood in: one of a generative model and one of an embedding model, which differ in what `/invocations`
(SageMaker's route, mounted as vLLM mounts it: its router, then model_hosting_container_standards' bootstrap)
dispatches a body to. What the serving code then runs of the request before its engine, for the fields the guard
counts, is vllm_stages.py's.

stdin: one JSON object per line, {"path", "headers": [[name, value], ...], "body": base64, "served": "generate" or
"embed"}
stdout: one JSON object per line, {"status", "request", "runs"}: the request model's fields as vLLM holds them
(model_dump, the audio file as its size) and what vllm_stages.py runs of it, or a null request when vLLM refused the
body before its engine (then "error")
`--fields`: instead, the field names (aliases) of the request models, by class name
"""

from __future__ import annotations

import asyncio
import base64
import importlib
import json
import logging
import sys
from types import SimpleNamespace
from typing import Any

import vllm_stages  # beside this file, on sys.path when run

ROUTERS = [  # the modules whose `router` holds the routes read here
    "vllm.entrypoints.openai.chat_completion.api_router",
    "vllm.entrypoints.openai.completion.api_router",
    "vllm.entrypoints.openai.responses.api_router",
    "vllm.entrypoints.anthropic.api_router",
    "vllm.entrypoints.pooling.embed.api_router",
    "vllm.entrypoints.pooling.pooling.api_router",
    "vllm.entrypoints.pooling.classify.api_router",
    "vllm.entrypoints.pooling.scoring.api_router",
    "vllm.entrypoints.speech_to_text.transcription.api_router",
    "vllm.entrypoints.speech_to_text.translation.api_router",
    "vllm.entrypoints.scale_out.token_in_token_out.api_router",
]
MODELS = [  # --fields
    ("vllm.entrypoints.speech_to_text.transcription.protocol", "TranscriptionRequest"),
    ("vllm.entrypoints.speech_to_text.translation.protocol", "TranslationRequest"),
]


class Read(Exception):
    """Raised by the stand-in with the request object the serving code was handed."""

    def __init__(self, request: Any, audio: bytes | None) -> None:
        self.request, self.audio = request, audio


class StandIn:
    """Every serving object: whatever it is asked to do, it hands back what it was given (an error response it
    writes as vLLM's do: /invocations' answer to a body it dispatches nowhere)."""

    def __getattr__(self, name: str) -> Any:
        if name == "create_error_response":
            from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

            return create_error_response
        return self.__call__

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from pydantic import BaseModel

        request = next(a for a in [*args, *kwargs.values()] if isinstance(a, BaseModel))
        audio = next((a for a in args if isinstance(a, bytes)), None)
        raise Read(request, audio)


def app(tasks: tuple[str, ...]) -> Any:
    """The routes of a server whose model supports `tasks`."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from starlette.datastructures import State
    from vllm.entrypoints.serve.exception_handling.register import init_exception_handler
    from vllm.entrypoints.serve.sagemaker.api_router import attach_router, sagemaker_standards_bootstrap

    class Stood(State):
        def __getattr__(self, name: str) -> Any:
            if name.startswith(("openai_serving", "serving_", "anthropic_serving")):
                return StandIn()
            return super().__getattr__(name)

    served = FastAPI()
    served.state = Stood()
    served.state.args = SimpleNamespace(log_error_stack=False, sse_keep_alive_interval=0, tokens_only=False)
    init_exception_handler(served)
    for module in ROUTERS:
        served.include_router(importlib.import_module(module).router)
    attach_router(served, tasks, vllm_stages.Model())

    async def read(_: Any, exc: Exception) -> Any:
        assert isinstance(exc, Read)
        fields = exc.request.model_dump(mode="json", exclude={"file"}, by_alias=True, fallback=repr)
        if exc.audio is not None:
            fields["file"] = {"bytes": len(exc.audio)}
        try:
            runs = await vllm_stages.stages(exc.request)
        except Exception as refused:  # ValueError, or vLLM's own VLLMValidationError (not a ValueError)
            return JSONResponse({"error": repr(refused)}, status_code=400)
        return JSONResponse({"request": fields, "runs": runs}, status_code=299)

    served.add_exception_handler(Read, read)
    return sagemaker_standards_bootstrap(served)  # last, as `vllm serve` sets its app up (its /invocations stays)


async def call(served: Any, case: dict[str, Any]) -> dict[str, Any]:
    """One request through the app, in process: the ASGI messages a server would send it."""
    body = base64.b64decode(case["body"])
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in case["headers"]]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": case["path"], "raw_path": case["path"].encode(), "query_string": b"", "root_path": "",
             "headers": [*headers, (b"content-length", str(len(body)).encode())], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 8000)}  # fmt: skip
    sent, answered = [False], asyncio.Event()
    out: dict[str, Any] = {"status": 0, "body": b""}

    async def receive() -> dict[str, Any]:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        elif message["type"] == "http.response.body":
            out["body"] += message.get("body", b"")
            if not message.get("more_body", False):
                answered.set()

    await served(scope, receive, send)
    answer = json.loads(out["body"] or b"null")
    if out["status"] == 299:
        return {"status": 299, "request": answer["request"], "runs": answer["runs"]}
    return {"status": out["status"], "request": None, "error": answer}


def fields() -> dict[str, list[str]]:
    found = {}
    for module, name in MODELS:
        model = getattr(importlib.import_module(module), name)
        found[name] = sorted(field.alias or key for key, field in model.model_fields.items())
    return found


def main() -> None:
    logging.disable(logging.WARNING)
    out, sys.stdout = sys.stdout, sys.stderr  # model_hosting_container_standards logs its errors to stdout
    if sys.argv[1:] == ["--fields"]:
        print(json.dumps(fields()), file=out)
        return
    served = {kind: app((kind,)) for kind in ("generate", "embed")}  # one after the other: SageMaker's registry
    for line in sys.stdin:
        case = json.loads(line)
        print(json.dumps(asyncio.run(call(served[case.get("served", "generate")], case))), file=out, flush=True)


if __name__ == "__main__":
    main()
