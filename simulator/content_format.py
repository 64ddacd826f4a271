"""Whether a chat template takes a message's content as a string or as OpenAI's list of parts: vLLM's "auto" content
format (0.31 to 0.33 `renderers/hf.py`, `_detect_content_format`; 0.33 also follows namespace aliases), a walk of
the template's syntax tree as parsed by transformers' own Jinja environment, written for the simulator from vLLM's
source apart from the guard's."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import jinja2.nodes as nodes

from simulator.conversation import ContentFormat


@lru_cache(maxsize=32)
def detect_content_format(template: str, namespaces: bool = False) -> ContentFormat:
    """ "openai" when some loop walks a message's content; "string" when none does, or the template does not parse
    (vLLM logs it and takes its default, "string")."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        root = _compile_jinja_template(template).environment.parse(template)
        return "openai" if next(content_loops(root, namespaces), None) is not None else "string"
    except Exception:  # vLLM: a template it cannot walk gets the default
        return "string"


def _loads(node: nodes.Node, name: str) -> bool:
    """`name`, or for a dotted alias "ns.rest" (0.33) the attribute `ns.rest`."""
    if isinstance(node, nodes.Getattr) and "." in name:
        base, _, attr = name.rpartition(".")
        return node.attr == attr and _loads(node.node, base)
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name


def _item_of(node: nodes.Node, name: str, key: str) -> bool:
    """`name[key]` or `name.key`."""
    if isinstance(node, nodes.Getitem):
        return _loads(node.node, name) and isinstance(node.arg, nodes.Const) and node.arg.value == key
    return isinstance(node, nodes.Getattr) and _loads(node.node, name) and node.attr == key


def _reads(node: Any, name: str, key: str | None = None) -> bool:
    """`name` (or its `key`), through filters, tests and slices."""
    if isinstance(node, nodes.Filter | nodes.Test):
        return node.node is not None and _reads(node.node, name, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _reads(node.node, name, key)
    return _item_of(node, name, key) if key else _loads(node, name)


def _names_of(root: nodes.Template, name: str, namespaces: bool) -> list[str]:
    """`name` and every variable assigned from it, breadth first; with `namespaces` (0.33) also the namespace
    attributes it is given to: `namespace(rest=name)` as "ns.rest", `ns.rest = name` likewise."""
    found, pending, seen = [name], deque([name]), {name}
    while pending:
        current = pending.popleft()
        for assign in root.find_all(nodes.Assign):
            for alias in _aliases_in(assign, current, namespaces):
                found.append(alias)
                if alias != current and (not namespaces or alias not in seen):
                    seen.add(alias)
                    pending.append(alias)
    return found


def _aliases_in(assign: nodes.Assign, name: str, namespaces: bool) -> list[str]:
    target, value = assign.target, assign.node
    if isinstance(target, nodes.Name) and _reads(value, name):
        return [target.name]
    if not namespaces:
        return []
    if isinstance(target, nodes.Name) and isinstance(value, nodes.Call) and isinstance(value.node, nodes.Name) \
            and value.node.name == "namespace":  # fmt: skip
        return [f"{target.name}.{kw.key}" for kw in value.kwargs if _reads(kw.value, name)]
    if isinstance(target, nodes.NSRef) and _reads(value, name):
        return [f"{target.name}.{target.attr}"]
    return []


def _message_names(root: nodes.Template, namespaces: bool) -> list[str]:
    """The targets of loops over `messages` (or a variable holding them)."""
    lists = _names_of(root, "messages", namespaces)
    return [loop.target.name for loop in root.find_all(nodes.For)
            if isinstance(loop.target, nodes.Name) and any(_reads(loop.iter, n) for n in lists)]  # fmt: skip


def content_loops(root: nodes.Template, namespaces: bool = False) -> Iterator[nodes.For]:
    """Loops over `message.content`, over a macro parameter some call binds to it, or (outside macros) over a
    variable named `content`."""
    messages = _message_names(root, namespaces)
    bound_in: dict[int, set[str]] = {}
    in_macro: set[int] = set()
    for macro in root.find_all(nodes.Macro):
        params = _content_params(root, macro, messages)
        for loop in macro.find_all(nodes.For):
            in_macro.add(id(loop))
            if params:
                bound_in[id(loop)] = params
    for loop in root.find_all(nodes.For):
        name = loop.iter.name if isinstance(loop.iter, nodes.Name) else None
        if any(_reads(loop.iter, m, "content") for m in messages):
            yield loop
        elif name is not None and name in bound_in.get(id(loop), set()):
            yield loop
        elif name == "content" and id(loop) not in in_macro:
            yield loop


def _content_params(root: nodes.Template, macro: nodes.Macro, messages: list[str]) -> set[str]:
    names = [arg.name for arg in macro.args]
    params: set[str] = set()
    for call in root.find_all(nodes.Call):
        if not (isinstance(call.node, nodes.Name) and call.node.name == macro.name):
            continue
        positional = zip(names, call.args, strict=False)
        keywords = ((kw.key, kw.value) for kw in call.kwargs if kw.key in names)
        params |= {param for param, value in (*positional, *keywords)
                   if any(_reads(value, m, "content") for m in messages)}  # fmt: skip
    return params
