"""The model's AutoProcessor chat template, found as vLLM finds it (`renderers/hf.py`
`_try_get_processor_chat_template`, `transformers_utils/processor.py` `get_processor`): transformers'
AutoProcessor.from_pretrained on the tokenizer's path, kept when it is a ProcessorMixin whose `chat_template` is
set; any failure to load means no processor template. Each path's answer is kept for the process, failures
included, as vLLM keeps it."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

# vLLM 0.31-0.33 hand a template stored as a dict on as it is; the template-variable lookup's lru_cache then raises
# this TypeError, which vLLM answers as a 400
UNHASHABLE = "unhashable type: 'dict'"

Found = str | dict[str, Any] | None


def processor_template(path: Path, reads_default: bool) -> Found:
    """What `_try_get_processor_chat_template` returns: None lets the tokenizer's template serve. `reads_default`
    (0.34): a dict gives its "default" entry, and one without it (or a value that is no string) gives None, vLLM's
    TypeError caught; before 0.34 a dict comes back whole, which the renderer then fails on."""
    found = _loaded(str(path))
    if found is None or not reads_default:
        return found
    if isinstance(found, dict) and "default" in found:
        found = found["default"]
    return found if isinstance(found, str) else None


@lru_cache(maxsize=16)
def _loaded(path: str) -> Found:
    from transformers import AutoProcessor, ProcessorMixin

    try:
        processor = AutoProcessor.from_pretrained(path)  # type: ignore[no-untyped-call]
    except Exception:  # vLLM logs it at debug level and moves on
        return None
    found: Found = getattr(processor, "chat_template", None) if isinstance(processor, ProcessorMixin) else None
    return found
