"""Load a model's tokenizer and chat template the way vLLM finds them, and keep the fast backend for counting.

A tokenizer can be a local directory (what `save_pretrained` writes, or a model directory), a `tokenizer.json`
file, or a Hugging Face id already in the local cache; nothing is downloaded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from proxy.api.chat import ChatRequest
from proxy.counting.conversation import ContentFormat, detect_content_format
from proxy.counting.harmony import HarmonyChat, HarmonyLoadError
from proxy.counting.mistral import MistralChat, MistralLoadError
from proxy.counting.modes import Rendering, resolve_mode
from proxy.counting.processor import Stored, hub_snapshot, processor_template, remote_notice

if TYPE_CHECKING:
    from proxy.counting.isolated import IsolatedRenderer

log = logging.getLogger("token_guard.tokenizer")


class TokenizerLoadError(ValueError):
    pass


class NativeChat(Protocol):
    """A renderer that is not a Jinja template (mistral_common, openai_harmony): it makes a chat request's token ids
    itself, and may encode completion text its own way (None: the Hugging Face tokenizer's ids stand). `request_kwargs`:
    the upstream hands the renderer the request's kwargs as they are (vLLM 0.34+ for mistral_common); `defaults`: the
    server's --default-chat-template-kwargs."""

    def chat_ids(
        self, req: ChatRequest, request_kwargs: bool = False, defaults: Mapping[str, Any] = ...
    ) -> list[int]: ...

    def text_ids(self, text: str, add_special_tokens: bool) -> list[int] | None: ...


HF = Rendering("hf", "a Hugging Face tokenizer and chat template")


@dataclass(frozen=True)
class ModelTokenizer:
    source: str
    renderer: Any  # the transformers tokenizer it was loaded with (the reference the tests compare to)
    backend: Any  # tokenizers.Tokenizer: encodes, releasing the GIL in batch calls
    chat_template: str | dict[str, str] | None
    special_tokens: dict[str, Any] = field(default_factory=dict)  # bos_token, eos_token...: template variables
    rendering: Rendering = HF
    native: NativeChat | None = None  # set for the mistral and harmony renderings
    default_kwargs: Mapping[str, Any] = field(default_factory=dict)  # the server's default_chat_template_kwargs
    effort_map: Mapping[str, str] = field(default_factory=dict)  # the server's --reasoning-effort-map (0.33+)
    # vLLM 0.32+ drops Claude Code's billing-header line from system messages; until the upstream's version is known,
    # the guard keeps it, which counts a few tokens more: the safe side
    strip_billing_header: bool = False
    # vLLM 0.33+ follows namespace aliases of `messages` when it decides a template's content format
    namespace_aliases: bool = False
    # vLLM 0.34+ gives an Anthropic tool result's tool references and text one tool message (0.31-0.33: two)
    tool_references_joined: bool = False
    # vLLM 0.34+ fills in what an OpenResponses assistant or reasoning item leaves out and converts the Responses
    # input items 0.31-0.33 fail on or pass through (counting/responses.py); for gpt-oss it renders a reasoning item
    # without content as an empty assistant message, which 0.31-0.33 skip (counting/harmony_responses.py)
    fills_response_items: bool = False
    # the model's AutoProcessor template (processor.py), which vLLM renders a request without tools with; None when
    # the server's --chat-template is configured (vLLM never asks the processor then)
    processor_template: Stored = None
    # a processor template stored as a dict: vLLM 0.34+ renders its "default" entry (none: the tokenizer's template),
    # 0.31-0.33 refuse every request without tools; until the upstream's version is known, 0.34's reading
    processor_dict_refused: bool = False
    # what the guard cannot know about that template: the processor class is repository code, which vLLM runs only
    # under --trust-remote-code (processor.py's remote_notice); `token-guard doctor` shows it
    processor_notice: str | None = None
    # vLLM 0.34+ hands mistral_common the request's response_format and reasoning_effort (mistral.py), and decides
    # whether Messages merges inline system messages by rendering through mistral_common (anthropic_probes.py)
    mistral_034: bool = False
    # vLLM 0.34+ reads any error of the inline-system probe (anthropic_probes.py) as "merge"; up to 0.33 only a
    # template error, and any other stops its start-up
    probe_catches_any: bool = False
    # the --chat-template counterpart (models[].chat_template): what vLLM up to 0.33 probes for inline system messages
    # of a model it renders with mistral_common, where the tokenizer's own template plays no part
    configured_template: str | None = None
    # where a chat template the request brought renders: a child process, which the core that serves the model owns
    # (exchange/core.py, through the registry); None: nowhere, such a request is refused
    sandbox: IsolatedRenderer | None = None

    def template_for(self, tools: list[Any] | None, override: str | None = None) -> str | None:
        """The template vLLM would use (`resolve_chat_template`): the request's, else the configured one, else without
        tools the processor's, else the tokenizer's (its tool-use variant when tools are sent, even none). None: no
        template (or, for a processor's dict on 0.31-0.33, none vLLM can render: `processor_refuses`)."""
        if override is not None:
            return override
        if tools is None and self.processor_template is not None:
            stored = self.processor_template
            if not isinstance(stored, dict):
                return stored
            if self.processor_dict_refused:
                return None
            if isinstance(stored.get("default"), str):
                return str(stored["default"])
        if isinstance(self.chat_template, dict):
            if tools is not None and "tool_use" in self.chat_template:
                return self.chat_template["tool_use"]
            return self.chat_template.get("default")
        return self.chat_template

    def processor_refuses(self, tools: list[Any] | None) -> bool:
        """True when vLLM 0.31-0.33 refuse this request: no tools, and the processor's template is a dict."""
        return tools is None and isinstance(self.processor_template, dict) and self.processor_dict_refused

    def content_format(self, template: str) -> ContentFormat:
        return detect_content_format(template, self.namespace_aliases)


def load_tokenizer(
    spec: str,
    chat_template: Path | None = None,
    tokenizer_mode: str = "auto",
    default_kwargs: Mapping[str, Any] | None = None,
    effort_map: Mapping[str, str] | None = None,
) -> ModelTokenizer:
    """The tokenizer, template and renderer vLLM would use for the model at `spec`; `tokenizer_mode`,
    `default_kwargs` and `effort_map` mirror vLLM's --tokenizer-mode, --default-chat-template-kwargs and
    --reasoning-effort-map."""
    renderer = _load_renderer(spec)
    backend = getattr(renderer, "backend_tokenizer", None)
    if backend is None:
        raise TokenizerLoadError(f"tokenizer {spec!r}: a fast tokenizer (tokenizer.json) is needed for exact counting")
    backend.no_truncation()
    backend.no_padding()
    template: str | dict[str, str] | None = getattr(renderer, "chat_template", None)
    configured: str | None = None
    if chat_template is not None:
        try:
            template = configured = chat_template.read_text()
        except OSError as exc:
            raise TokenizerLoadError(f"chat template {chat_template}: cannot be read ({exc.strerror})") from exc
    directory = _directory(spec)
    # vLLM loads the processor from the tokenizer's directory, or from a hub id's snapshot in the local cache
    files = None if chat_template is not None else directory or hub_snapshot(spec)
    processor = processor_template(files)
    notice = remote_notice(files) if processor is not None else None
    if template is None and processor is None:
        log.warning("tokenizer %s has no chat template: chat requests will be refused with a 400", spec)
    if notice is not None:
        log.warning("tokenizer %s: %s", spec, notice)
    specials = dict(getattr(renderer, "special_tokens_map", {}) or {})
    rendering = resolve_mode(directory, tokenizer_mode)
    native = _native(rendering, directory, spec)
    return ModelTokenizer(spec, renderer, backend, template, specials, rendering, native, dict(default_kwargs or {}),
                          dict(effort_map or {}), processor_template=processor, processor_notice=notice,
                          configured_template=configured)  # fmt: skip


def _directory(spec: str) -> Path | None:
    path = Path(spec).expanduser()
    return path if path.is_dir() else path.parent if path.is_file() else None


def _native(rendering: Rendering, directory: Path | None, spec: str) -> NativeChat | None:
    try:
        if rendering.mode == "mistral":
            if directory is None:
                raise MistralLoadError("tokenizer_mode mistral needs a model directory")
            return MistralChat(directory)
        if rendering.mode == "harmony":
            return HarmonyChat()
    except (MistralLoadError, HarmonyLoadError) as exc:
        raise TokenizerLoadError(f"tokenizer {spec!r}: {exc}") from exc
    return None


# vLLM loads the Hugging Face tokenizer with mistral_format=False: with mistral_common installed, transformers would
# otherwise hand back its mistral_common backend for a Mistral repository, which has no fast tokenizer to count with
# and ignores the chat template.
HF_OPTIONS: dict[str, Any] = {"local_files_only": True, "mistral_format": False}


def _load_renderer(spec: str) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(spec).expanduser()
    try:
        if path.is_file():
            if path.parent.joinpath("tokenizer_config.json").is_file():
                return AutoTokenizer.from_pretrained(str(path.parent), **HF_OPTIONS)
            return PreTrainedTokenizerFast(tokenizer_file=str(path))  # type: ignore[no-untyped-call]
        if path.is_dir():
            return AutoTokenizer.from_pretrained(str(path), **HF_OPTIONS)
        if spec.startswith(("/", ".", "~")):
            raise TokenizerLoadError(f"tokenizer {spec!r}: no such file or directory")
        return AutoTokenizer.from_pretrained(spec, **HF_OPTIONS)
    except TokenizerLoadError:
        raise
    except Exception as exc:  # transformers raises OSError, ValueError, EnvironmentError ... for bad sources
        raise TokenizerLoadError(
            f"tokenizer {spec!r}: could not be loaded as a local directory, a tokenizer.json file, or a Hugging "
            f"Face id in the local cache ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from exc
