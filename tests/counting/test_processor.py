"""The guard reads a model's AutoProcessor chat template from its files (proxy/counting/processor.py): it must find
what transformers' own AutoProcessor.from_pretrained holds in `chat_template` (None where the processor fails to load,
as vLLM then moves on to the tokenizer's template), for each way transformers stores one. And it picks the template
vLLM would: the processor's without tools, the tokenizer's with tools or under a configured --chat-template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoProcessor, ProcessorMixin

from proxy.assets import write_demo_tokenizer_dir
from proxy.counting.processor import processor_template
from proxy.counting.tokenizer import load_tokenizer

LLAVA = {"processor_config.json": {"processor_class": "LlavaProcessor"}}
IMAGES = {"preprocessor_config.json": {"image_processor_type": "CLIPImageProcessor"}}
LEGACY = {"chat_template.json": {"chat_template": "A{{ messages }}"}}
EXTRA = {"additional_chat_templates/rag.jinja": "R{{ messages }}"}

VARIANTS: dict[str, dict[str, Any]] = {
    "chat_template.json, a string": LLAVA | IMAGES | LEGACY,
    "chat_template.json, a dict": LLAVA | IMAGES | {"chat_template.json": {"chat_template": {"default": "A",
                                                                                            "tool_use": "B"}}},
    "chat_template.json, a dict without default": LLAVA | IMAGES | {"chat_template.json": {"chat_template": {
        "x": "A"}}},
    "chat_template.json without its key": LLAVA | IMAGES | {"chat_template.json": {"template": "A"}},
    "chat_template.json beside additional templates": LLAVA | IMAGES | LEGACY | EXTRA,
    "chat_template.jinja alone": LLAVA | IMAGES,
    "chat_template.jinja and additional templates": LLAVA | IMAGES | EXTRA,
    "processor_config.json's own chat_template": IMAGES | LEGACY | {"processor_config.json": {
        "processor_class": "LlavaProcessor", "chat_template": "P{{ messages }}"}},
    "the class named in tokenizer_config.json": IMAGES | LEGACY,
    "the class of config.json's model_type": IMAGES | LEGACY | {"config.json": {"model_type": "llava"}},
    "a class that takes no chat_template": IMAGES | LEGACY | {"processor_config.json": {
        "processor_class": "CLIPProcessor"}},
    "no processor": IMAGES | LEGACY,
}  # fmt: skip


def model_dir(dest: Path, files: dict[str, Any]) -> Path:
    write_demo_tokenizer_dir(dest)  # its chat_template.jinja is the tokenizer's template, and a processor's too
    for name, content in files.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return dest


def transformers_reading(directory: Path) -> Any:
    try:
        processor = AutoProcessor.from_pretrained(str(directory), local_files_only=True)  # type: ignore[no-untyped-call]
    except Exception:
        return None
    return processor.chat_template if isinstance(processor, ProcessorMixin) else None


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_guard_reads_what_transformers_loads(variant: str, tmp_path: Path) -> None:
    directory = model_dir(tmp_path, VARIANTS[variant])
    if variant == "the class named in tokenizer_config.json":
        config = json.loads((directory / "tokenizer_config.json").read_text())
        (directory / "tokenizer_config.json").write_text(json.dumps({**config, "processor_class": "LlavaProcessor"}))
    expected = transformers_reading(directory)
    assert processor_template(directory) == expected
    if variant in ("no processor", "a class that takes no chat_template"):
        assert expected is None
    elif variant not in ("chat_template.json without its key", "chat_template.json beside additional templates"):
        assert expected is not None  # the variant does give a processor template


def test_tools_or_a_configured_template_leave_the_processor_out(tmp_path: Path) -> None:
    directory = model_dir(tmp_path / "model", VARIANTS["chat_template.json, a string"])
    tok = load_tokenizer(str(directory))
    own = (directory / "chat_template.jinja").read_text()
    assert tok.template_for(None) == "A{{ messages }}"
    assert tok.template_for([]) == tok.template_for([{"type": "function"}]) == own
    configured = tmp_path / "server.jinja"
    configured.write_text("S{{ messages }}")
    assert load_tokenizer(str(directory), configured).template_for(None) == "S{{ messages }}"


def test_a_dict_by_release(tmp_path: Path) -> None:
    """0.34 reads a dict's "default" entry (without one, the tokenizer's template); 0.31-0.33 render none."""
    stored = {"default": "A{{ messages }}", "tool_use": "B{{ messages }}"}
    tok = load_tokenizer(str(model_dir(tmp_path, LLAVA | IMAGES | {"chat_template.json": {"chat_template": stored}})))
    assert tok.template_for(None) == "A{{ messages }}" and not tok.processor_refuses(None)
    older = type(tok)(**{**tok.__dict__, "processor_dict_refused": True})
    assert older.template_for(None) is None and older.processor_refuses(None)
    assert older.template_for([]) == tok.template_for([]) == (tmp_path / "chat_template.jinja").read_text()
