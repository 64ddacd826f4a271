"""Real tokenizers and chat templates of five model families, built from registry packages only (nothing from the
model hub), cached, for the family tests: Llama 3.1, Qwen3, Mistral Nemo, gpt-oss and Gemma 4.

    family_dir(family) -> Path      tokenizer.json + tokenizer_config.json (chat template inside) + tekken.json (Nemo)
    model_dir(family) -> Path       the same plus config.json and random bf16 weights: a tiny model vLLM serves

Sources: the `test` extra's packages (llama-models: Llama 3's tiktoken ranks; mistral-common: tekken.json; litellm:
the o200k_base ranks, named by the SHA-1 of their download URL) and llama-cpp-python's source distribution, fetched
once with pip (the Qwen2 and Gemma 4 vocab-only GGUF files, and the 71 official chat templates llama.cpp tests with).
Everything lands under TOKEN_GUARD_E2E_CACHE (default ~/.cache/token-guard)/zoo, each entry complete only once its
`.ok` marker is written.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from tests.support import zoo_models

FAMILIES = ("llama3.1", "qwen3", "mistral-nemo", "gpt-oss", "gemma")
LLAMA_CPP = "llama_cpp_python-0.3.36"
O200K_SHA1 = "fb374d419588a4632f3f557e76b4b70aebbca790"  # sha1 of the o200k_base.tiktoken URL: tiktoken's cache name
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_PATTERN = QWEN2_PATTERN.replace(r"|\p{N}|", r"|\p{N}{1,3}|")  # Llama 3 groups up to three digits
TEMPLATES = {
    "llama3.1": "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "qwen3": "Qwen-Qwen3-0.6B.jinja",
    "mistral-nemo": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "gpt-oss": "openai-gpt-oss-120b.jinja",
    "gemma": "google-gemma-4-31B-it.jinja",
}


def cache_root() -> Path:
    configured = os.environ.get("TOKEN_GUARD_E2E_CACHE")
    return (Path(configured) if configured else Path.home() / ".cache" / "token-guard") / "zoo"


def llama_cpp_models() -> Path:
    """llama.cpp's models/ folder (vocab GGUFs and templates) from the llama-cpp-python sdist, fetched once."""
    root = cache_root() / LLAMA_CPP
    models = root / LLAMA_CPP / "vendor" / "llama.cpp" / "models"
    if (root / ".ok").exists():
        return models
    download = root / "download"
    shutil.rmtree(root, ignore_errors=True)
    download.mkdir(parents=True)
    version = LLAMA_CPP.rsplit("-", 1)[1]
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(download)]
    subprocess.run([*pip, f"llama-cpp-python=={version}"], check=True, capture_output=True)
    (archive,) = download.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        wanted = [m for m in tar.getmembers() if "/vendor/llama.cpp/models/" in m.name and m.isfile()]
        tar.extractall(root, wanted, filter="data")
    archive.unlink()
    (root / ".ok").write_text("ok\n")
    return models


def package_file(package: str, *parts: str) -> Path:
    """A file inside an installed package, found without importing it (importing litellm reaches the network)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the {package} package is needed (the project's `test` extra)")
    return Path(next(iter(spec.submodule_search_locations)), *parts)


def o200k_file() -> Path:
    return package_file("litellm", "litellm_core_utils", "tokenizers", O200K_SHA1)


def tekken_file() -> Path:
    return package_file("mistral_common", "data", "tekken_240718.json")


def mistral_v15_dir(into: Path, json_schema: bool = True, efforts: list[str] | None = None) -> Path:
    """Mistral Nemo's directory with its tekken.json raised to a v15 tokenizer (the version that writes model settings
    into the prompt) in `into`: the same vocabulary, every special token mistral_common names, and a
    `model_settings_builder` that takes a `json_schema` setting (when `json_schema`) and a `reasoning_effort` among
    `efforts` (the first its default). No v15 file ships in a package; this is the shape mistral_common 1.13 reads
    (`Tekkenizer.from_file`)."""
    from mistral_common.tokens.tokenizers.base import SpecialTokens

    shutil.copytree(family_dir("mistral-nemo"), into, dirs_exist_ok=True)
    tekken = json.loads(tekken_file().read_text())
    tekken["config"]["version"] = "v15"
    names = [t.value for t in SpecialTokens]
    count = tekken["config"]["default_num_special_tokens"]
    tekken["special_tokens"] = [
        {"rank": i, "token_str": names[i] if i < len(names) else f"<SPECIAL_{i}>", "is_control": True}
        for i in range(count)
    ]
    tekken["model_settings_builder"] = {"json_schema": {}} if json_schema else {}
    if efforts:
        tekken["model_settings_builder"]["reasoning_effort"] = {"values": efforts, "default": efforts[0]}
    (into / "tekken.json").write_text(json.dumps(tekken))
    return into


def family_dir(family: str) -> Path:
    """The family's tokenizer directory, built once (a few seconds to a minute) and cached."""
    return _cached(f"tokenizer-{family}", lambda dest: _BUILDERS[family](dest))


def gpt_oss_dir(into: Path) -> Path:
    """gpt-oss's tokenizer with its config.json (`model_type: gpt_oss`), without weights, in `into`: what makes vLLM
    (and the guard, and the simulator) render with openai_harmony."""
    shutil.copytree(family_dir("gpt-oss"), into, dirs_exist_ok=True)
    (into / "config.json").write_text(json.dumps(zoo_models.gpt_oss_config()))
    return into


def model_dir(family: str) -> Path:
    """The family's tokenizer with config.json and random weights: a tiny model vLLM serves on the CPU."""

    def build(dest: Path) -> None:
        shutil.copytree(family_dir(family), dest, dirs_exist_ok=True)
        zoo_models.write_model(family, dest)

    return _cached(f"model-{family}", build)


def _cached(name: str, build: Any) -> Path:
    key = hashlib.sha256(Path(__file__).read_bytes() + Path(zoo_models.__file__).read_bytes()).hexdigest()[:12]
    target = cache_root() / f"{name}-{key}"
    if not (target / ".ok").exists():
        # built aside and moved in whole: test processes running side by side (pytest-xdist's workers) never see,
        # or remove, another's half-built directory
        building = target.with_name(f"{target.name}.{os.getpid()}.building")
        shutil.rmtree(building, ignore_errors=True)
        build(building)
        (building / ".ok").write_text("")
        for _ in range(2):
            try:
                building.rename(target)
                break
            except OSError:  # another process moved its own in first (the same files), or a stale one is there
                if (target / ".ok").exists():
                    break
                stale = target.with_name(f"{target.name}.{os.getpid()}.stale")  # half-built in an older checkout
                with contextlib.suppress(OSError):
                    target.rename(stale)
                shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(building, ignore_errors=True)
    return target


# --- building blocks ---


def read_tiktoken(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _bytes_to_unicode() -> dict[int, str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def tiktoken_to_bpe(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocab and merges from tiktoken ranks (the algorithm of transformers' TikTokenConverter)."""
    table = _bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(table[x] for x in b)

    vocab: dict[str, int] = {}
    merges: list[tuple[bytes, bytes, int]] = []
    for token, rank in ranks.items():
        vocab[text(token)] = rank
        if len(token) > 1:
            local = [
                (token[:i], token[i:], rank) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks
            ]
            local.sort(key=lambda m: (ranks[m[0]], ranks[m[1]]))
            merges.extend(local)
    merges.sort(key=lambda m: m[2])
    return vocab, [(text(a), text(b)) for a, b, _ in merges]


def byte_level(vocab: dict[str, int], merges: list[tuple[str, str]], pattern: str, ignore_merges: bool,
               nfc: bool = False) -> Any:  # fmt: skip
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])  # fmt: skip
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)  # type: ignore[call-arg]
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def add_tokens(tok: Any, specs: list[tuple[int, str, bool]]) -> None:
    """Added tokens at their exact ids (they must follow the vocab without gaps; checked)."""
    from tokenizers import AddedToken

    for token_id, content, special in sorted(specs):
        added = AddedToken(content, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
        if tok.token_to_id(content) != token_id:
            raise RuntimeError(f"added token {content!r} got id {tok.token_to_id(content)}, wanted {token_id}")


def bos_post_processor(tok: Any, bos: str, byte_level: bool = True) -> None:
    from tokenizers import processors

    template = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    tok.post_processor = (
        processors.Sequence([processors.ByteLevel(trim_offsets=False), template]) if byte_level else template
    )


def gguf_vocab(path: Path) -> dict[str, list[Any]]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    out: dict[str, list[Any]] = {}
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"):
        field = reader.fields[key]
        out[key] = [field.contents(i) for i in range(len(field.data))]
    return out


def template(family: str) -> str:
    return (llama_cpp_models() / "templates" / TEMPLATES[family]).read_text(encoding="utf-8")


def write(dest: Path, tok: Any, config: dict[str, Any], chat_template: str) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest / "tokenizer.json"))
    added = {
        str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
                 "single_word": t.single_word, "special": t.special}
        for i, t in sorted(tok.get_added_tokens_decoder().items())
    }  # fmt: skip
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
           "model_max_length": 131072, "added_tokens_decoder": added, **config,
           "chat_template": chat_template}  # fmt: skip
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False), encoding="utf-8")
    specials = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if cfg.get(k)}
    (dest / "special_tokens_map.json").write_text(json.dumps(specials, indent=2, ensure_ascii=False), encoding="utf-8")


# --- the families ---

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", "<|image|>"]  # fmt: skip


def _llama31(dest: Path) -> None:
    ranks = read_tiktoken(package_file("llama_models", "llama3", "tokenizer.model"))
    tok = byte_level(*tiktoken_to_bpe(ranks), LLAMA3_PATTERN, ignore_merges=True)
    names = LLAMA3_SPECIALS + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(LLAMA3_SPECIALS))]
    add_tokens(tok, [(128000 + i, n, True) for i, n in enumerate(names)])
    bos_post_processor(tok, "<|begin_of_text|>")
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "add_bos_token": True,
              "add_eos_token": False, "model_input_names": ["input_ids", "attention_mask"]}  # fmt: skip
    write(dest, tok, config, template("llama3.1"))


QWEN3_ADDED = [
    (151643, "<|endoftext|>", True), (151644, "<|im_start|>", True), (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True), (151647, "<|object_ref_end|>", True), (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True), (151650, "<|quad_start|>", True), (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True), (151653, "<|vision_end|>", True), (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True), (151656, "<|video_pad|>", True), (151657, "<tool_call>", False),
    (151658, "</tool_call>", False), (151659, "<|fim_prefix|>", False), (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False), (151662, "<|fim_pad|>", False), (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False), (151665, "<tool_response>", False), (151666, "</tool_response>", False),
    (151667, "<think>", False), (151668, "</think>", False),
]  # fmt: skip


def _qwen3(dest: Path) -> None:
    # Qwen1.5's vocab GGUF: tokens and merges of the first 151,643 ids; Qwen3's 26 added tokens follow them.
    vocab_file = gguf_vocab(llama_cpp_models() / "ggml-vocab-qwen2.gguf")
    tokens = vocab_file["tokenizer.ggml.tokens"]
    vocab = {t: i for i, t in enumerate(tokens[:151643])}
    merges = [tuple(m.split(" ", 1)) for m in vocab_file["tokenizer.ggml.merges"]]
    tok = byte_level(vocab, merges, QWEN2_PATTERN, ignore_merges=False, nfc=True)
    add_tokens(tok, QWEN3_ADDED)
    config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
              "add_bos_token": False, "errors": "replace", "split_special_tokens": False}  # fmt: skip
    write(dest, tok, config, template("qwen3"))


def _mistral_nemo(dest: Path) -> None:
    from transformers.integrations.mistral.tokenizer import MistralConverter

    tok = MistralConverter(vocab_file=str(tekken_file()), add_prefix_space=False).converted()
    bos_post_processor(tok, "<s>")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tekken_file(), dest / "tekken.json")
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
              "add_eos_token": False}  # fmt: skip
    write(dest, tok, config, template("mistral-nemo"))


GPT_OSS_ADDED = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
                 200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>",
                 200012: "<|call|>", 200018: "<|endofprompt|>"}  # fmt: skip


def o200k_pattern() -> str:
    import inspect

    import tiktoken_ext.openai_public as public

    source = inspect.getsource(public.o200k_base)
    return "|".join(part.split('"""')[0] for part in source.split('r"""')[1:])


def _gpt_oss(dest: Path) -> None:
    tok = byte_level(*tiktoken_to_bpe(read_tiktoken(o200k_file())), o200k_pattern(), ignore_merges=True)
    added = {i: GPT_OSS_ADDED.get(i, f"<|reserved_{i}|>") for i in range(199998, 200019)}
    add_tokens(tok, [(i, content, True) for i, content in added.items()])
    config = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>",
              "model_input_names": ["input_ids", "attention_mask"]}  # fmt: skip
    write(dest, tok, config, template("gpt-oss"))


def _gemma(dest: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    vocab_file = gguf_vocab(llama_cpp_models() / "ggml-vocab-gemma-4.gguf")
    tokens, types = vocab_file["tokenizer.ggml.tokens"], vocab_file["tokenizer.ggml.token_type"]
    # llama.cpp's rule for merges: the separator is the first space after position 0 (pieces may start with one)
    merges = [(m[: m.find(" ", 1)], m[m.find(" ", 1) + 1 :]) for m in vocab_file["tokenizer.ggml.merges"]]
    tok = Tokenizer(BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=True, unk_token="<unk>",
                        byte_fallback=True))  # fmt: skip
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    # control (3) and user-defined (4) tokens are added tokens, as are the <unusedN> and [multimodal] fillers
    added = [AddedToken(t, special=True, normalized=False) for i, t in enumerate(tokens)
             if types[i] in (3, 4) or (t.startswith("<unused") and t.endswith(">")) or t == "[multimodal]"]  # fmt: skip
    tok.add_special_tokens(added)
    bos_post_processor(tok, "<bos>", byte_level=False)
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
              "mask_token": "<mask>", "add_bos_token": True, "add_eos_token": False,
              "padding_side": "left"}  # fmt: skip
    write(dest, tok, config, template("gemma"))


_BUILDERS = {"llama3.1": _llama31, "qwen3": _qwen3, "mistral-nemo": _mistral_nemo, "gpt-oss": _gpt_oss,
             "gemma": _gemma}  # fmt: skip
