"""The guard reads a model's AutoProcessor chat template from its files (proxy/counting/processor.py): it must find
what transformers' own AutoProcessor.from_pretrained holds in `chat_template` (None where the processor fails to load,
as vLLM then moves on to the tokenizer's template), for each way transformers stores one. And it picks the template
vLLM would: the processor's without tools, the tokenizer's with tools or under a configured --chat-template."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoProcessor, ProcessorMixin

from proxy.assets import write_demo_tokenizer_dir
from proxy.counting.processor import VLLM_PROCESSORS, processor_template, remote_notice
from proxy.counting.registry import ModelRegistry
from proxy.counting.tokenizer import load_tokenizer
from proxy.doctor.report import ModelInfo
from proxy.settings import ModelSettings

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


def hub_cache(root: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, Any]) -> Path:
    """A Hugging Face cache holding `org/model` at one revision (models--org--model/refs/main and snapshots/<hash>/),
    the only cache transformers and the guard see, offline."""
    import huggingface_hub.constants

    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = root / "models--org--model"
    snapshot = model_dir(repo / "snapshots" / revision, {"config.json": {"model_type": "llama"}} | files)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    for name, value in (("HF_HUB_CACHE", str(root)), ("HF_HUB_OFFLINE", True)):
        monkeypatch.setenv(name, str(int(value)) if value is True else str(value))
        monkeypatch.setattr(huggingface_hub.constants, name, value)
    return snapshot


@pytest.mark.parametrize("variant", ["chat_template.json, a string", "chat_template.jinja and additional templates",
                                     "a class that takes no chat_template", "no processor"])  # fmt: skip
def test_a_hub_id_is_read_from_the_local_cache(variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM loads a hub id's processor from its snapshot in the cache: the guard counts with what transformers'
    AutoProcessor holds there."""
    hub_cache(tmp_path, monkeypatch, VARIANTS[variant])
    expected = transformers_reading(Path("org/model"))
    tok = load_tokenizer("org/model")
    assert tok.processor_template == expected
    if variant in ("no processor", "a class that takes no chat_template"):
        assert expected is None and tok.template_for(None) == tok.chat_template
    else:
        assert expected is not None and tok.template_for(None) == (expected if isinstance(expected, str) else
                                                                   expected["default"])  # fmt: skip
    if variant == "chat_template.json, a string":  # a template the tokenizer does not have: the processor's
        assert tok.template_for(None) == "A{{ messages }}" != tok.template_for([])


def test_a_hub_id_outside_the_cache_has_no_processor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.counting.processor import hub_snapshot

    hub_cache(tmp_path, monkeypatch, LLAVA | IMAGES | LEGACY)
    assert hub_snapshot("org/model") is not None
    assert hub_snapshot("org/elsewhere") is None and hub_snapshot("not a hub id") is None


AUTO_MAP = {"auto_map": {"AutoProcessor": "processing_own.OwnProcessor"}}
# The repository's own processing_own.py: a ProcessorMixin subclass transformers does not ship
REMOTE: dict[str, str] = {
    "takes chat_template": "class OwnProcessor(ProcessorMixin):\n"
                           "    def __init__(self, tokenizer=None, chat_template=None, **kwargs):\n"
                           "        super().__init__(tokenizer, chat_template=chat_template)\n",
    "takes no chat_template": "class OwnProcessor(ProcessorMixin):\n"
                              "    def __init__(self, tokenizer=None, **kwargs):\n"
                              "        super().__init__(tokenizer)\n",
    "keyword-only chat_template": "class OwnProcessor(ProcessorMixin):\n"
                                  "    def __init__(self, tokenizer=None, *, chat_template=None):\n"
                                  "        super().__init__(tokenizer, chat_template=chat_template)\n",
    "ProcessorMixin's __init__": "class OwnProcessor(ProcessorMixin):\n"
                                 "    tokenizer_class = 'AutoTokenizer'\n",
    "its base in the file takes it": "class Base(ProcessorMixin):\n"
                                     "    def __init__(self, tokenizer=None, chat_template=None):\n"
                                     "        super().__init__(tokenizer, chat_template=chat_template)\n\n\n"
                                     "class OwnProcessor(Base):\n"
                                     "    pass\n",
    "a transformers base that takes it": "class OwnProcessor(LlavaProcessor):\n"
                                         "    pass\n",
}  # fmt: skip


def remote_dir(directory: Path, source: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    import transformers.dynamic_module_utils as dynamic

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(directory.parent / "modules"))  # where transformers copies it
    monkeypatch.setattr(sys, "path", list(sys.path))
    header = "from transformers import LlavaProcessor, ProcessorMixin\n\n\n"
    files = {"processing_own.py": header + source, "processor_config.json": {"processor_class": "OwnProcessor",
                                                                              **AUTO_MAP}}  # fmt: skip
    return model_dir(directory, IMAGES | LEGACY | files)


@pytest.mark.parametrize("variant", list(REMOTE))
def test_a_remote_processor_is_read_as_transformers_runs_it(
    variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard reads, without running it, the template the repository's class holds when transformers runs it
    (vLLM's --trust-remote-code); without the flag transformers refuses the class, and vLLM uses the tokenizer's."""
    directory = remote_dir(tmp_path / variant.replace(" ", "_").replace("'", ""), REMOTE[variant], monkeypatch)
    ran = AutoProcessor.from_pretrained(str(directory), local_files_only=True, trust_remote_code=True)  # type: ignore[no-untyped-call]
    assert type(ran).__name__ == "OwnProcessor"
    assert processor_template(directory) == ran.chat_template
    keeps = variant in ("takes chat_template", "its base in the file takes it", "a transformers base that takes it")
    assert (ran.chat_template == "A{{ messages }}") is keeps
    assert (remote_notice(directory) is not None) is keeps  # the flag decides only where a template is kept
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoProcessor.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)  # type: ignore[no-untyped-call]


def test_code_kept_elsewhere_is_taken_to_keep_the_template(tmp_path: Path) -> None:
    """A class in another repository ("org/repo--processing_x.X") cannot be read: the guard takes it to keep the
    template, as a multimodal processor does, and says it cannot know."""
    elsewhere = {"AutoProcessor": "org/code--processing_own.OwnProcessor"}
    files = {"processor_config.json": {"processor_class": "OwnProcessor", "auto_map": elsewhere}}
    directory = model_dir(tmp_path, IMAGES | LEGACY | files)
    assert processor_template(directory) == "A{{ messages }}" and remote_notice(directory) is not None


def test_the_doctor_and_the_start_up_log_say_what_the_guard_cannot_know(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    directory = remote_dir(tmp_path / "own", REMOTE["takes chat_template"], monkeypatch)
    with caplog.at_level(logging.WARNING, logger="token_guard.tokenizer"):
        registry = ModelRegistry.from_settings((ModelSettings("own", str(directory)),))
    tok = registry.resolve("own").tokenizer
    assert tok.template_for(None) == "A{{ messages }}" and tok.processor_notice is not None
    assert "--trust-remote-code" in tok.processor_notice and tok.processor_notice in caplog.text
    lines = ModelInfo.of(registry.resolve("own")).lines()
    assert f"  own: {tok.processor_notice}" in lines
    plain = ModelRegistry.from_settings((ModelSettings("llava", str(model_dir(tmp_path / "llava", LLAVA | IMAGES))),))
    assert plain.resolve("llava").tokenizer.processor_notice is None
    assert not any("trust-remote-code" in line for line in ModelInfo.of(plain.resolve("llava")).lines())


def test_a_class_vllm_brings_runs_no_repository_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MiniCPM-V's repository maps AutoProcessor to its own processing file, but vLLM loads its own MiniCPMVProcessor
    in its place: the upstream's --trust-remote-code does not decide, and the guard says nothing of it."""
    directory = remote_dir(tmp_path / "minicpmv", REMOTE["takes chat_template"], monkeypatch)
    config = json.loads((directory / "processor_config.json").read_text())
    (directory / "processor_config.json").write_text(json.dumps({**config, "processor_class": "MiniCPMVProcessor"}))
    assert remote_notice(directory) is None


VLLM_SOURCES = [Path.home() / ".cache/token-guard" / path for path in (
    "vllm-0.31.0/lib/python3.11/site-packages/vllm", "vllm-0.32.0/lib/python3.11/site-packages/vllm",
    "wheels/src-0.33.0/vllm", "wheels/src-0.34.0/vllm")]  # fmt: skip


def test_the_classes_vllm_brings_are_those_its_releases_register() -> None:
    """VLLM_PROCESSORS is the union of the classes vLLM 0.31 to 0.34 register in transformers_utils/processors."""
    registries = [source / "transformers_utils/processors/__init__.py" for source in VLLM_SOURCES]
    if not all(registry.is_file() for registry in registries):
        pytest.skip("vLLM 0.31 to 0.34's source is not on this machine")
    entry = re.compile(r'"(\w+)": "vllm\.transformers_utils\.processors\.')
    assert VLLM_PROCESSORS == {name for registry in registries for name in entry.findall(registry.read_text())}
