"""A second tokenizer family, trained on the spot: byte-level BPE with the GPT-2 pre-tokenizer regex and a ChatML
template that loops over list content (so vLLM's "openai" content format is exercised too)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tests.corpus import LONG_TEXT

CHATML_TEMPLATE = """
{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\\n' -}}
{%- if message['content'] is string -%}
{{- message['content'] -}}
{%- else -%}
{%- for part in message['content'] -%}{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- if message.get('tool_calls') -%}
{%- for call in message['tool_calls'] -%}
{{- '\\n<tool_call>' + (call['function'] | tojson) + '</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if tools -%}{{- '<|im_start|>tools\\n' + (tools | tojson) + '<|im_end|>\\n' -}}{%- endif -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
""".strip()

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

TRAINING_TEXT = [
    LONG_TEXT,
    "Hello world! How are you today? I am fine, thanks.\n\n  Indented line\n\tTabbed line",
    "def main():\n    print('hi')\n    return 0\n",
    "The weather in Paris is 21 degrees. 東京 大阪 こんにちは 🎉",
] * 50


def write_trained_tokenizer_dir(dest: Path, vocab_size: int = 2000) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TRAINING_TEXT, trainer=trainer)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "chat_template.jinja").write_text(CHATML_TEMPLATE)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 4096,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return dest
