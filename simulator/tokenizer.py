"""The simulator's reference tokenizer: a transformers tokenizer used exactly the way vLLM uses it.

Deliberately independent of the guard's own fast counting path, so that the two can be checked against each
other. Library errors (template failures) are translated into ApiError here, at one boundary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from cachetools import LRUCache

from simulator.content_format import detect_content_format
from simulator.conversation import ContentFormat
from simulator.errors import ApiError
from simulator.processor import UNHASHABLE, processor_template

NO_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat template "
    "if the tokenizer does not define one."
)
# Common words that most vocabularies hold as single tokens; the generated "text" cycles through them.
_GIBBERISH = " the of and to in is that for it as with was on be by at this from or have an are not we you"


class SimTokenizer:
    def __init__(
        self,
        hf: Any,
        chat_template: str | dict[str, str] | None,
        namespaces: bool = False,
        processor: tuple[Path, bool] | None = None,
    ) -> None:
        self._hf = hf
        self._templates = chat_template
        # the model's path and whether the release reads a dict's "default" entry; None when the server's
        # --chat-template is set: vLLM never asks the processor then
        self._processor = processor
        self._namespaces = namespaces  # the release's content-format detection follows namespace aliases (0.33+)
        vocab: dict[str, int] = hf.get_vocab()
        # vLLM's max_chars_per_token: the longest string in the vocabulary, as stored (byte-level pieces).
        self.max_chars_per_token = max(len(token) for token in vocab)
        self.max_token_id = max(max(vocab.values()), int(getattr(hf, "vocab_size", 0)) - 1)
        self._encodings: LRUCache[tuple[str, bool], list[int]] = LRUCache(maxsize=64)
        self.pieces = self._generation_pieces()
        # What ends forced output (guided decoding): the tokenizer's EOS, else a token id the vocabulary has.
        eos = getattr(hf, "eos_token_id", None)
        self.eos_token_id = eos if isinstance(eos, int) else self.max_token_id

    @classmethod
    def load(
        cls, path: Path, chat_template: Path | None = None, namespaces: bool = False, processor_default: bool = False
    ) -> SimTokenizer:
        """`processor_default`: the release reads a processor template stored as a dict by its "default" entry."""
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(path))
        if chat_template is not None:
            return cls(hf, chat_template.read_text(), namespaces)
        return cls(hf, hf.chat_template, namespaces, (path, processor_default))

    def template_for(self, tools: list[Any] | None) -> str | dict[str, Any]:
        """vLLM's resolution (`resolve_chat_template`): the server template; else, when no tools are sent, the
        processor's; else the tokenizer's (its tool-use variant when tools are sent). A dict is a processor template
        0.31-0.33 hand on whole (`render_chat` refuses it)."""
        found = processor_template(*self._processor) if tools is None and self._processor is not None else None
        if found is not None:
            return found
        templates = self._templates
        if isinstance(templates, dict):
            name = "tool_use" if tools is not None and "tool_use" in templates else "default"
            templates = templates.get(name)
        if not templates:
            raise ApiError(NO_TEMPLATE)
        return templates

    def content_format(self, template: str | dict[str, Any]) -> ContentFormat:
        if isinstance(template, dict):  # vLLM finds no Jinja text to walk: its default
            return "string"
        return detect_content_format(template, self._namespaces)

    def render_chat(
        self,
        conversation: list[dict[str, Any]],
        template: str | dict[str, Any],
        tools: list[Any] | None,
        kwargs: dict[str, Any],
    ) -> str:
        if isinstance(template, dict):
            raise ApiError(UNHASHABLE)
        try:
            text = self._hf.apply_chat_template(
                conversation, tools=tools, chat_template=template, tokenize=False, **kwargs
            )
        except Exception as exc:  # templates reject input by raising; vLLM answers 400 with the reason
            raise ApiError(_template_error_reason(exc)) from exc
        return str(text)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        key = (text, add_special_tokens)
        ids = self._encodings.get(key)
        if ids is None:
            ids = list(self._hf(text, add_special_tokens=add_special_tokens)["input_ids"])
            self._encodings[key] = ids
        return list(ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._hf.decode(ids))

    def token_strs(self, ids: list[int]) -> list[str]:
        return list(self._hf.convert_ids_to_tokens(ids))

    def _generation_pieces(self) -> list[tuple[int, str]]:
        """Token ids whose text round-trips alone, so concatenated pieces decode to the same text."""
        pieces: list[tuple[int, str]] = []
        for token_id in dict.fromkeys(self.encode(_GIBBERISH, add_special_tokens=False)):
            text = self.decode([token_id])
            if text.strip() and self.encode(text, add_special_tokens=False) == [token_id]:
                pieces.append((token_id, text))
        if not pieces:
            raise ValueError("the tokenizer has no single-token words to generate from")
        return pieces


def _template_error_reason(exc: BaseException) -> str:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, jinja2.TemplateError):
            return str(current)
        current = current.__cause__ or current.__context__
    return str(exc)
