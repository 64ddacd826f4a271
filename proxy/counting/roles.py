"""The `developer` role as vLLM hands it to a chat template (vLLM 0.31/0.32 `renderers/hf.py`).

When a conversation has a developer message and the template never names the role (neither "developer" nor
'developer' appears in its text), vLLM turns every developer message into a system message and then, when a system
message is not first or there is more than one, merges all system messages into one at the start. Without this,
templates drop the message (a count too low), render it as an extra turn (too high), or raise (a 400 for a request
vLLM serves).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any


@lru_cache(maxsize=64)  # bounded: requests may bring templates of their own
def mentions_developer(template: str) -> bool:
    """vLLM's own test: a plain substring search for the quoted role name."""
    return '"developer"' in template or "'developer'" in template


def has_developer(conversation: list[dict[str, Any]]) -> bool:
    return any(message["role"] == "developer" for message in conversation)


def developer_as_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Developer messages become system messages (their `tools` key dropped), then the system messages are
    consolidated: non-empty contents joined with a blank line into one system message at position 0, when one is
    not first or there are several. Other keys of those messages (a `name`) are lost, as in vLLM."""
    converted = [_as_system(m) if m["role"] == "developer" else m for m in conversation]
    systems = [i for i, m in enumerate(converted) if m["role"] == "system"]
    if not systems or systems == [0]:
        return converted
    contents = [text for i in systems if (text := _text(converted[i].get("content")))]
    rest = [m for m in converted if m["role"] != "system"]
    return [{"role": "system", "content": "\n\n".join(contents)}, *rest]


def _as_system(message: dict[str, Any]) -> dict[str, Any]:
    return {**{k: v for k, v in message.items() if k != "tools"}, "role": "system"}


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""
