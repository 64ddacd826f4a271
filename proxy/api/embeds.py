"""`prompt_embeds` as vLLM 0.31 / 0.32 take them on the completions API: base64 text of `torch.save(tensor)`, one or a
list, each tensor a prompt of (num_tokens, hidden_size), or (1, num_tokens, hidden_size) (vLLM squeezes the first
dimension). What the guard needs is each tensor's num_tokens, and the archive's `data.pkl` says it: the pickle that
rebuilds the tensor names its storage and its size.

The guard never unpickles and never imports torch: `data.pkl` is read opcode by opcode (pickletools), by a machine
that knows the dozen opcodes torch.save's pickle of a plain dense tensor uses and builds nothing but numbers, strings,
tuples and names. Any other opcode, callable or shape is refused with a 400 that says why: vLLM could load some of
those (a sparse tensor, a Parameter), but the guard cannot count them, and a prompt it cannot count does not pass.
"""

from __future__ import annotations

import pickletools
from dataclasses import dataclass
from typing import Any

from proxy.api.body import kind_of
from proxy.api.torch_zip import Unreadable, member
from proxy.errors import InvalidRequest

MAX_PROMPTS = 1024  # vLLM's VLLM_MAX_COMPLETION_PROMPTS default: it refuses a longer list
MAX_PICKLE = 4096  # a tensor's data.pkl holds 150 to 300 bytes
MAX_OPCODES = 128  # and about 40 opcodes
REBUILD = ("torch._utils", "_rebuild_tensor_v2")
HOOKS = ("collections", "OrderedDict")


@dataclass(frozen=True)
class Name:
    module: str
    name: str


@dataclass(frozen=True)
class Persistent:
    pid: Any


@dataclass(frozen=True)
class Call:
    func: Any
    args: tuple[Any, ...]


MARK = object()
PUSHED = {"BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG", "BINUNICODE", "SHORT_BINUNICODE",
          "BINUNICODE8", "UNICODE"}  # fmt: skip
CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_TUPLE": ()}
TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}


def embeds_lengths(value: Any) -> list[int]:
    """The number of tokens of each tensor of a request's `prompt_embeds`, in order (vLLM runs them before its text
    prompts); [] when the field is absent, null or an empty list, which vLLM reads as no embeds."""
    if value is None:
        return []
    tensors = value if isinstance(value, list) else [value]
    if len(tensors) > MAX_PROMPTS:
        raise InvalidRequest(f"prompt_embeds list length {len(tensors)} exceeds the maximum allowed count of "
                             f"{MAX_PROMPTS}.", param="prompt_embeds")  # fmt: skip
    lengths = []
    for i, tensor in enumerate(tensors):
        where = "prompt_embeds" if tensors is not value else f"prompt_embeds[{i}]"
        if not isinstance(tensor, str):
            raise InvalidRequest(f"'{where}' must be base64 text of torch.save(tensor), got {kind_of(tensor)}.",
                                 param="prompt_embeds")  # fmt: skip
        try:
            lengths.append(tokens_of(tensor))
        except Unreadable as exc:
            raise InvalidRequest(f"token-guard cannot count '{where}': it {exc.message}.",
                                 param="prompt_embeds") from None  # fmt: skip
    return lengths


def tokens_of(text: str) -> int:
    """num_tokens of one tensor, read from its archive's data.pkl (Unreadable when it is not as torch.save writes
    a plain dense tensor, or not of a shape vLLM accepts)."""
    shape = _shape(_value(member(text, b"data.pkl", MAX_PICKLE)))
    if len(shape) == 3 and shape[0] == 1:  # vLLM squeezes a batch of one
        shape = shape[1:]
    if len(shape) != 2:
        raise Unreadable(f"holds a tensor of shape {tuple(shape)}; vLLM takes (num_tokens, hidden_size)")
    return shape[0]


def _shape(value: Any) -> list[int]:
    """The size a `_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])` call gives."""
    plain = "holds something other than a plain dense tensor as torch.save writes one"
    if not isinstance(value, Call) or value.func != Name(*REBUILD) or len(value.args) not in (6, 7):
        raise Unreadable(plain)
    storage, offset, size, stride, _grad, hooks = value.args[:6]
    if not (isinstance(storage, Persistent) and isinstance(storage.pid, tuple) and storage.pid[:1] == ("storage",)
            and isinstance(offset, int) and hooks == Call(Name(*HOOKS), ())):  # fmt: skip
        raise Unreadable(plain)
    if not (isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in size)):  # fmt: skip
        raise Unreadable(plain)
    return list(size)


def _value(pickled: bytes) -> Any:
    """What the pickle builds, as names and calls: only the opcodes a tensor's pickle uses, nothing run."""
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    try:
        for count, (op, found, _) in enumerate(pickletools.genops(pickled)):
            arg: Any = found
            if count >= MAX_OPCODES:
                raise Unreadable(f"has a data.pkl of more than {MAX_OPCODES} opcodes; a tensor's has about 40")
            name = op.name
            if name in ("PROTO", "FRAME"):
                continue
            if name in PUSHED:
                stack.append(arg)
            elif name in CONSTANTS:
                stack.append(CONSTANTS[name])
            elif name == "MARK":
                stack.append(MARK)
            elif name == "GLOBAL":
                stack.append(Name(*arg.split(" ", 1)))
            elif name == "STACK_GLOBAL":
                module, member_name = _taken(stack[-2:], 2)
                stack[-2:] = [Name(module, member_name)]
            elif name in TUPLES:
                count = TUPLES[name]
                stack[-count:] = [tuple(_taken(stack[-count:], count))]
            elif name == "TUPLE":
                at = max(i for i, v in enumerate(stack) if v is MARK)
                stack[at:] = [tuple(stack[at + 1 :])]
            elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[int(arg)] = _taken(stack[-1:], 1)[0]
            elif name == "MEMOIZE":
                memo[len(memo)] = _taken(stack[-1:], 1)[0]
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                stack.append(memo[int(arg)])
            elif name == "BINPERSID":
                stack.append(Persistent(_taken([stack.pop()], 1)[0]))
            elif name == "REDUCE":
                func, args = _taken(stack[-2:], 2)
                stack[-2:] = [Call(func, args)]
            elif name != "STOP":  # genops stops there, and raises on a pickle that ends before it
                raise Unreadable(f"has a data.pkl with an opcode a tensor's pickle does not use ({name})")
        (value,) = _taken(stack, 1)
    except (ValueError, IndexError, KeyError, TypeError):
        raise Unreadable("has a data.pkl that is not a pickle torch.save writes") from None
    return value


def _taken(values: list[Any], count: int) -> list[Any]:
    """`count` values an opcode takes off the stack: never a mark (a pickle that says otherwise is broken)."""
    if len(values) != count or any(v is MARK for v in values):
        raise ValueError("a mark where a value belongs")
    return values
