"""What a prompt's size alone proves: the texts a chat prompt holds verbatim, whose size gives a floor under its token
count (TokenCounter.floor). A prompt of megabytes is refused from that floor without being rendered or encoded, so
that its answer costs what reading it costs, not the gigabytes a whole encoding takes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

VERBATIM_ROLES = frozenset({"system", "developer", "user"})  # templates keep these contents as they are


def verbatim_texts(messages: list[Any]) -> Iterator[str]:
    """The contents of the system, developer and user messages (strings and text parts): every chat template puts
    them into the prompt unchanged. (Assistant turns are left out: some templates drop their reasoning.)"""
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in VERBATIM_ROLES:
            continue
        content = message.get("content")
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    yield part["text"]
                elif isinstance(part, str):
                    yield part
