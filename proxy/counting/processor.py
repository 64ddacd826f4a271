"""The chat template a model's AutoProcessor holds, read from the model directory the way transformers' AutoProcessor
and ProcessorMixin find it, without loading the processor (its image or audio parts want libraries the guard does
not have). vLLM renders a request that sends no tools with this template before the tokenizer's.

A directory has a processor when one of its configs names a `processor_class` (processor_config.json,
preprocessor_config.json, video_preprocessor_config.json, tokenizer_config.json, config.json, in that order) or its
config.json's `model_type` has one in transformers; the processor keeps a template only when its class takes a
`chat_template` argument. The template comes from processor_config.json's `chat_template`, else chat_template.json
(legacy), else chat_template.jinja with additional_chat_templates/*.jinja (a dict of them, keyed by name).

A model given as a hub id is read from its snapshot in the local Hugging Face cache (`hub_snapshot`), where vLLM loads
its processor from. A processor class the repository brings as code (`auto_map`'s AutoProcessor naming a
processing_*.py class transformers does not ship) is never run: its `__init__` is read from the file's syntax tree, and
its template from the files the mixin reads. vLLM runs that class only under --trust-remote-code, which the guard
cannot see (`remote_notice`).
"""

from __future__ import annotations

import ast
import inspect
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("token_guard.tokenizer")

CLASS_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
               "tokenizer_config.json", "config.json")  # fmt: skip
# A processor template stored as a dict, which vLLM 0.31 to 0.33 hand on as it is (0.34 reads its "default" entry):
# the template-variable lookup hashes it, and the TypeError is the request's 400.
UNHASHABLE = "unhashable type: 'dict'"

Stored = str | dict[str, Any] | None

# The processor classes vLLM 0.31 to 0.34 bring themselves (vllm/transformers_utils/processors): where
# processor_config.json, preprocessor_config.json or tokenizer_config.json names one, vLLM loads its own class in
# place of AutoProcessor, so no repository code runs, whatever --trust-remote-code says
VLLM_PROCESSORS = frozenset(
    "BagelProcessor CohereASRProcessor Cosmos3EdgeProcessor DeepseekVLV2Processor FireRedASR2Processor FunASRProcessor "
    "GLM4VProcessor Glm5NextProcessor Granite4VisionProcessor H2OVLProcessor InklingAudioFeatureExtractor "
    "InklingImageProcessor InklingProcessor InternVLProcessor IsaacProcessor KimiAudioProcessor KimiK25Processor "
    "KimiK3Processor Lfm3AudioProcessor Lfm3VlProcessor LlamaNemotronVLEmbedProcessor MiMoOmniProcessor "
    "MingASRFeatureExtractor MiniCPMOProcessor MiniCPMVProcessor MiniMaxM3VLImageProcessor MiniMaxM3VLVideoProcessor "
    "MiniMaxVLProcessor MistralCommonPixtralProcessor MistralCommonVoxtralProcessor Moondream3Processor NVLMProcessor "
    "NanoNemotronVLProcessor NemotronVLProcessor OpenVLAProcessor Ovis2_5Processor OvisProcessor Qwen3ASRProcessor "
    "Step3VLProcessor".split()
)


@dataclass(frozen=True)
class Declared:
    """The processor a model's files declare: the `processor_class` name, and the AutoProcessor class of an `auto_map`
    ("processing_x.XProcessor", or "org/repo--processing_x.XProcessor" for code kept in another repository)."""

    name: str | None
    remote: str | None = None

    @property
    def runs_code(self) -> bool:
        """vLLM has transformers load the repository's class: one `auto_map` names, that neither transformers nor
        vLLM ships."""
        return self.remote is not None and self.name not in VLLM_PROCESSORS and not _shipped(self.name)


def processor_template(directory: Path | None) -> Stored:
    """The template the directory's processor holds: a string, a dict of named templates, or None (no processor,
    one that keeps no template, or none stored). A repository's own class is read as if it runs (--trust-remote-code:
    `remote_notice`)."""
    if directory is None:
        return None
    declared = _declared(directory)
    if not _keeps_template(directory, declared):
        return None
    try:
        stored = _stored(directory)
    except (OSError, ValueError, KeyError) as exc:  # transformers fails to load such a processor: vLLM moves on
        log.warning("model directory %s: its processor's chat template cannot be read (%s); the tokenizer's is used",
                    directory, exc)  # fmt: skip
        return None
    return stored if isinstance(stored, str | dict) else None  # anything else is no template the guard can render


def remote_notice(directory: Path | None) -> str | None:
    """What the guard cannot know about the processor template it reads: None when vLLM's choice does not hang on
    --trust-remote-code (no repository code, or a class that keeps no template)."""
    if directory is None:
        return None
    declared = _declared(directory)
    if not declared.runs_code or not _keeps_template(directory, declared):
        return None
    return (f"the processor class is the repository's own code ({declared.remote}), which vLLM runs only under "
            "--trust-remote-code, a flag the guard cannot see: requests without tools are counted with the processor's "
            "chat template, as vLLM renders them with the flag (without it, vLLM renders with the tokenizer's); under "
            "counting.source auto the start-up check finds out which")  # fmt: skip


def hub_snapshot(repo_id: str) -> Path | None:
    """Where vLLM reads a hub id's processor from: the snapshot of its main revision in the local Hugging Face cache
    (HF_HUB_CACHE, HF_HOME), found offline as vLLM's get_non_weight_snapshot_path finds it; None when not cached."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (OSError, ValueError):  # not in the cache, or not a repository id
        return None


def _read(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _declared(directory: Path) -> Declared:
    """As AutoProcessor looks: the first file naming a `processor_class`, with the `auto_map` seen on the way there;
    else config.json's `model_type` mapped in transformers."""
    remote = None
    for name in CLASS_FILES:
        config = _read(directory / name)
        mapped = config.get("auto_map")
        if isinstance(mapped, dict) and isinstance(mapped.get("AutoProcessor"), str):
            remote = mapped["AutoProcessor"]
        found = config.get("processor_class")
        if isinstance(found, str):
            return Declared(found, remote)
    model_type = _read(directory / "config.json").get("model_type")
    if not isinstance(model_type, str):
        return Declared(None, remote)
    from transformers.models.auto import processing_auto

    mapped = getattr(processing_auto, "PROCESSOR_MAPPING_NAMES", {}).get(model_type)
    return Declared(mapped if isinstance(mapped, str) else None, remote)


def _keeps_template(directory: Path, declared: Declared) -> bool:
    if declared.runs_code:
        return _remote_takes_template(directory, str(declared.remote)) is not False
    return declared.name is not None and _takes_template(declared.name)


def _shipped(name: str | None) -> bool:
    import transformers

    try:
        return name is not None and isinstance(getattr(transformers, name), type)
    except (AttributeError, ImportError):
        return False


def _takes_template(name: str) -> bool:
    """ProcessorMixin.from_dict passes only the arguments the class's __init__ names: a class without a
    `chat_template` argument drops the template. A class transformers does not have (vLLM's own) is taken to keep
    it, as the multimodal processors do."""
    import transformers

    try:
        cls = getattr(transformers, name)
    except (AttributeError, ImportError):
        return True
    named = inspect.signature(cls.__init__).parameters.values()
    return any(p.name == "chat_template" and p.kind is not p.KEYWORD_ONLY for p in named)


def _remote_takes_template(directory: Path, reference: str) -> bool | None:
    """Whether the repository's class keeps a template, read from its file without running it (the positional
    arguments of the first `__init__` up its bases, as from_args_and_dict reads `__code__.co_varnames`); None when
    the file does not tell (code in another repository, a base class from elsewhere)."""
    module, _, name = reference.rpartition(".")
    if "--" in reference or not module:
        return None
    try:
        tree = ast.parse((directory / f"{module.replace('.', '/')}.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    seen: set[str] = set()
    while name in classes and name not in seen:
        seen.add(name)
        node = classes[name]
        init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        if init is not None:
            return "chat_template" in [a.arg for a in (*init.args.posonlyargs, *init.args.args)]
        if not node.bases:
            return False  # object's __init__
        base = node.bases[0]
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
    return _takes_template(name) if _shipped(name) else None


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
