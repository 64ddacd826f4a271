"""The chat template a model's AutoProcessor holds, read from the model directory the way transformers' AutoProcessor
and ProcessorMixin find it, without loading the processor (its image or audio parts want libraries the guard does
not have). vLLM renders a request that sends no tools with this template before the tokenizer's.

A directory has a processor when one of its configs names a `processor_class` (processor_config.json,
preprocessor_config.json, video_preprocessor_config.json, tokenizer_config.json, config.json, in that order) or its
config.json's `model_type` has one in transformers; the processor keeps a template only when its class takes a
`chat_template` argument. The template comes from processor_config.json's `chat_template`, else chat_template.json
(legacy), else chat_template.jinja with additional_chat_templates/*.jinja (a dict of them, keyed by name).
"""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("token_guard.tokenizer")

CLASS_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
               "tokenizer_config.json", "config.json")  # fmt: skip
# A processor template stored as a dict, which vLLM 0.31 to 0.33 hand on as it is (0.34 reads its "default" entry):
# the template-variable lookup hashes it, and the TypeError is the request's 400.
UNHASHABLE = "unhashable type: 'dict'"

Stored = str | dict[str, Any] | None


def processor_template(directory: Path | None) -> Stored:
    """The template the directory's processor holds: a string, a dict of named templates, or None (no processor,
    one that keeps no template, or none stored)."""
    if directory is None:
        return None
    name = _processor_class(directory)
    if name is None or not _takes_template(name):
        return None
    try:
        stored = _stored(directory)
    except (OSError, ValueError, KeyError) as exc:  # transformers fails to load such a processor: vLLM moves on
        log.warning("model directory %s: its processor's chat template cannot be read (%s); the tokenizer's is used",
                    directory, exc)  # fmt: skip
        return None
    return stored if isinstance(stored, str | dict) else None  # anything else is no template the guard can render


def _read(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _processor_class(directory: Path) -> str | None:
    for name in CLASS_FILES:
        found = _read(directory / name).get("processor_class")
        if isinstance(found, str):
            return found
    model_type = _read(directory / "config.json").get("model_type")
    if not isinstance(model_type, str):
        return None
    from transformers.models.auto import processing_auto

    mapped = getattr(processing_auto, "PROCESSOR_MAPPING_NAMES", {}).get(model_type)
    return mapped if isinstance(mapped, str) else None


def _takes_template(name: str) -> bool:
    """ProcessorMixin.from_dict passes only the arguments the class's __init__ names: a class without a
    `chat_template` argument drops the template. A class transformers does not have (vLLM's own, remote code) is
    taken to keep it, as the multimodal processors do."""
    import transformers

    try:
        cls = getattr(transformers, name)
    except (AttributeError, ImportError):
        return True
    named = inspect.signature(cls.__init__).parameters.values()
    return any(p.name == "chat_template" and p.kind is not p.KEYWORD_ONLY for p in named)


def _stored(directory: Path) -> Stored:
    configured = _read(directory / "processor_config.json").get("chat_template")
    if configured is not None:
        return configured  # type: ignore[no-any-return]
    extra = {p.stem: p.read_text(encoding="utf-8") for p in sorted((directory / "additional_chat_templates").glob(
        "*.jinja"))}  # fmt: skip
    legacy = directory / "chat_template.json"
    if legacy.is_file():
        if extra:
            raise ValueError("a legacy chat_template.json beside additional_chat_templates/")
        templates: dict[str, Any] = {"default": json.loads(legacy.read_text(encoding="utf-8"))["chat_template"]}
    else:
        templates = extra
        if (directory / "chat_template.jinja").is_file():
            templates["default"] = (directory / "chat_template.jinja").read_text(encoding="utf-8")
    if list(templates) == ["default"]:
        return templates["default"]  # type: ignore[no-any-return]
    return templates or None
