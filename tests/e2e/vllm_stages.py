"""Run by a vLLM virtual environment's python, imported by vllm_reader.py (never by the test suite): what vLLM's
serving code makes of a request model before its engine, for the fields the guard counts, in vLLM's own functions.

The model they ask about is a stand-in for the e2e suite's tiny Llama (build_tiny_model.py, runtime.py's `vllm serve`
flags): hidden size 128, bfloat16, a vocabulary of 129,280, `--enable-prompt-embeds`. Where vLLM's acceptance depends
on the model (a tensor's hidden size and dtype, an id's range), the harness takes that one's answer.

- completions: `OnlineRenderer.render_completion` (suffix, echo and prompt_logprobs beside embeds), the prompt list
  `preprocess_completion` builds (embeds first), each prompt parsed (`parse_model_prompt`) and `BaseRenderer`'s
  `render_prompts`, which loads each tensor with `safe_load_prompt_embeds` (torch.load); what runs is each prompt's
  text, token ids, or the rows of its tensor. `preprocess_cmpl`'s tokenization and truncation are not run.
- chat: `_reused_prompt_token_ids`, the ids of `kv_transfer_params` the chat renderer runs instead of the messages
"""

from __future__ import annotations

import copy
import inspect
from types import SimpleNamespace
from typing import Any

HIDDEN_SIZE, VOCABULARY = 128, 129280


class Model:
    """The stand-in ModelConfig: only what the functions run here, and /invocations' dispatch, ask of it."""

    enable_prompt_embeds = True
    is_encoder_decoder = False
    hf_text_config = SimpleNamespace()  # 0.34 asks a tensor's width of it first (a Llama's names none)
    served_model_name = "tiny"  # 0.34 times each render under it

    @property
    def dtype(self) -> Any:
        import torch

        return torch.bfloat16

    def get_hidden_size(self) -> int:
        return HIDDEN_SIZE

    def get_vocab_size(self) -> int:
        return VOCABULARY

    def get_pooling_task(self, supported_tasks: tuple[str, ...]) -> str | None:
        return "embed" if "embed" in supported_tasks else None


def renderer() -> Any:
    from vllm.renderers.base import BaseRenderer

    methods = ("render_prompt", "render_prompts", "validate_token_ids")
    fields = {name: getattr(BaseRenderer, name) for name in methods if hasattr(BaseRenderer, name)}
    stood = type("Renderer", (), fields)()
    stood.model_config, stood.tokenizer = Model(), SimpleNamespace(max_token_id=VOCABULARY - 1)
    stood.render_completion_suffix = lambda prompt, suffix: None  # no FIM template, as the tiny Llama's
    return stood


async def completion(request: Any) -> dict[str, Any]:
    """The prompts vLLM runs for a CompletionRequest, in order: text, token ids, or {"embeds": rows}."""
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse
    from vllm.renderers.inputs.preprocess import parse_model_prompt
    from vllm.renderers.online_renderer import OnlineRenderer

    class Stage:
        create_error_response = OnlineRenderer.create_error_response
        preprocess_completion = OnlineRenderer.preprocess_completion

        def __init__(self) -> None:
            self.renderer, self.model_config = renderer(), Model()

        async def preprocess_cmpl(self, request: Any, prompts: list[Any], **_: Any) -> list[Any]:
            parsed = [p if isinstance(p, bytes) else parse_model_prompt(self.model_config, p) for p in prompts]
            return list(self.renderer.render_prompts(parsed))

    ran = await OnlineRenderer.render_completion(Stage(), request)
    if isinstance(ran, ErrorResponse):
        raise ValueError(ran.error.message)
    return {"prompts": [_prompt(p) for p in ran]}


def _prompt(prompt: dict[str, Any]) -> Any:
    if "prompt_embeds" in prompt:
        return {"embeds": int(prompt["prompt_embeds"].shape[0])}
    return prompt.get("prompt", prompt.get("prompt_token_ids"))


def chat(request: Any) -> dict[str, Any]:
    """The ids the chat renderer runs in place of the messages (None: it renders the messages)."""
    from vllm.renderers import online_renderer

    reused = online_renderer._reused_prompt_token_ids
    held = SimpleNamespace(**vars(request))  # it pops the ids from the request's own dict
    held.kv_transfer_params = copy.deepcopy(request.kv_transfer_params)
    takes = len(inspect.signature(reused).parameters)  # 0.31: the request alone
    ids = reused(*(held, renderer(), request.messages)[:takes])
    return {"prompt_token_ids": ids if ids is None or isinstance(ids, list) else repr(ids)}


async def stages(request: Any) -> dict[str, Any]:
    """What the serving code runs of `request` (ValueError or vLLM's own error when it refuses it there)."""
    name = type(request).__name__
    runs: dict[str, Any] = {"endpoint": name}
    if name == "CompletionRequest":
        runs |= await completion(request)
    elif name == "ChatCompletionRequest":
        runs |= chat(request)
    return runs
