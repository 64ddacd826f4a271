"""The guard and vLLM 0.31.0 / 0.32.0 read the same hostile bodies (tests/e2e/reading.py: vLLM's own routers, FastAPI
and request models, run in the e2e suite's vLLM environments; no vLLM server): whatever the guard forwards, vLLM
reads as the guard read it, field by field of what the guard checks, or one of them refuses it. That takes in what
vLLM's serving code runs of it: each tensor of `prompt_embeds` as torch.load reads it, the ids of
`kv_transfer_params` a chat runs in place of its messages, and the endpoint and model /invocations runs. Also what
vLLM makes of the client's own bytes, where it reads them otherwise than the guard."""

from __future__ import annotations

import base64
import json
import warnings
from collections.abc import Iterator

import httpx
import pytest

from proxy.api.audio import FIELDS
from simulator.audio import FIELDS as SIMULATED
from tests.e2e.reading import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    INVOCATIONS,
    JSON,
    MESSAGES,
    RESPONSES,
    TRANSCRIPTIONS,
    TRANSLATIONS,
    Body,
    VllmRead,
    guard_reads,
    vllm_checked,
    vllm_fields,
    vllm_reads,
    with_tensors,
)
from tests.e2e.runtime import VERSIONS
from tests.e2e.tensors import Tensor
from tests.support.torch_save import archive, embeds, members, saved, tensor_pickle

pytestmark = pytest.mark.e2e

HI = [{"role": "user", "content": "hi"}]
BASE = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]'


def chat(text: str) -> bytes:
    """A chat body with `text` (JSON members, raw) after its model and messages."""
    return BASE + (b", " + text.encode() if text else b"") + b"}"


JSON_BODIES = [
    Body("plain", CHAT, chat('"max_tokens": 5')),
    Body("a key twice", CHAT, chat('"max_tokens": 5, "n": 1, "max_tokens": 9000, "n": 3')),
    Body("escaped keys", CHAT, chat('"max\\u005ftokens": 9000, "\\u006e": 2, "str\\u0065am": true')),
    Body("an escaped model", CHAT, b'{"\\u006dodel": "t\\u0069ny", "messages": [], "model": "other"}'),
    Body("an integer of 30 digits", CHAT, chat('"max_tokens": 100000000000000000000000000000')),
    Body("NaN", CHAT, chat('"max_tokens": NaN')),
    Body("Infinity n", CHAT, chat('"n": Infinity')),
    Body("-Infinity", CHAT, chat('"max_completion_tokens": -Infinity')),
    Body("integral floats", CHAT, chat('"max_tokens": 5.0, "n": 2e0, "min_tokens": 0.0')),
    Body("a fraction", CHAT, chat('"max_tokens": 5.5')),
    Body("an exponent", CHAT, chat('"max_tokens": 1e3')),
    Body("negative zero", CHAT, chat('"max_tokens": -0.0')),
    Body("booleans as counts", CHAT, chat('"max_tokens": true, "n": false')),
    Body("strings as counts", CHAT, chat('"max_tokens": "9000", "n": "2"')),
    Body("a string as a flag", CHAT, chat('"stream": "true"')),
    Body("a number as a flag", CHAT, chat('"stream": 1')),
    Body("nulls", CHAT, chat('"max_tokens": null, "n": null, "stream": null, "model": null')),
    Body("an empty model", CHAT, chat('"model": ""')),
    Body("a model in capitals", CHAT, chat('"model": "TINY"')),
    Body("both limits", CHAT, chat('"max_tokens": 9000, "max_completion_tokens": 5')),
    Body("keys in other cases", CHAT, chat('"Max_Tokens": 9000, "N": 3, "STREAM": true')),
    Body("content parts", CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", '
                                b'"text": "a"}, {"type": "text", "text": "b"}]}], "max_tokens": 3}'),
    Body("null content", CHAT, b'{"model": "tiny", "messages": [{"role": "assistant", "content": null}, '
                               b'{"role": "user", "content": "hi"}]}'),
    Body("a message's unknown keys", CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "hi", '
                                           b'"max_tokens": 9000}]}'),
    Body("white space around", CHAT, b" \r\n\t" + chat('"max_tokens": 5') + b"\n "),
    Body("data after the object", CHAT, chat('"max_tokens": 5') + b' {"max_tokens": 9000}'),
    Body("a UTF-8 byte order mark", CHAT, b"\xef\xbb\xbf" + chat('"max_tokens": 5')),
    Body("UTF-16", CHAT, chat('"max_tokens": 5').decode().encode("utf-16")),
    Body("UTF-16-LE behind a quote byte", CHAT, chat('"h": "\u2200", "max_tokens": 5').decode().encode("utf-16-le")),
    Body("UTF-32-BE", CHAT, chat('"max_tokens": 5').decode().encode("utf-32-be")),
    Body("an escaped lone surrogate", CHAT, chat('"user": "\\ud800"')),
    Body("a lone surrogate's bytes", CHAT, chat('"user": "X"').replace(b"X", b"\xed\xa0\x80")),
    Body("a surrogate pair escaped", CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": '
                                           b'"\\ud83d\\ude00"}], "max_tokens": 2}'),
    Body("invalid UTF-8", CHAT, chat('"user": "X"').replace(b"X", b"\xff")),
    Body("a charset of UTF-16 on UTF-8", CHAT, chat('"max_tokens": 5'), "application/json; charset=utf-16"),
    Body("text/plain", CHAT, chat('"max_tokens": 9000'), "text/plain"),
    Body("JSON in capitals", CHAT, chat('"max_tokens": 9000'), "APPLICATION/JSON"),
    Body("a +json type", CHAT, chat('"max_tokens": 9000'), "application/vnd.api+json"),
    Body("two content types", CHAT, chat('"max_tokens": 5'), "text/plain", (("content-type", JSON),)),
    Body("deep nesting", CHAT, chat('"unused": ' + "[" * 60 + "]" * 60)),
    Body("completion: a key twice", COMPLETIONS, b'{"model": "tiny", "prompt": "a", "prompt": [1, 2], '
                                                 b'"max_tokens": 3, "max_tokens": 9000}'),
    Body("completion: ids as floats", COMPLETIONS, b'{"model": "tiny", "prompt": [1.0, 2.0], "max_tokens": 3}'),
    Body("completion: a batch", COMPLETIONS, b'{"model": "tiny", "prompt": ["a", "b"], "n": 2, "stream": false}'),
    Body("completion: booleans as ids", COMPLETIONS, b'{"model": "tiny", "prompt": [true, false]}'),
    Body("completion: nested ids", COMPLETIONS, b'{"model": "tiny", "prompt": [[1, 2], [3]], "max_tokens": 1e1}'),
    Body("responses: a key twice", RESPONSES, b'{"model": "tiny", "input": "a", "max_output_tokens": 5, '
                                              b'"max_output_tokens": 9000, "input": "bb"}'),
    Body("responses: escaped", RESPONSES, b'{"model": "tiny", "\\u0069nput": "hi", "instructions": "\\u0062e"}'),
    Body("messages: a key twice", MESSAGES, b'{"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", '
                                            b'"content": "hi"}], "max_tokens": 90000}'),
    Body("messages: a float limit", MESSAGES, b'{"model": "tiny", "max_tokens": 5.0, "messages": [{"role": "user", '
                                              b'"content": "hi"}], "system": "be"}'),
    Body("embeddings: a key twice", EMBEDDINGS, b'{"model": "tiny", "input": "a", "input": ["b", "c"]}'),
    Body("embeddings: truncation as a float", EMBEDDINGS, b'{"model": "tiny", "input": "a", '
                                                          b'"truncate_prompt_tokens": 3.0}'),
    Body("embeddings: ids", EMBEDDINGS, b'{"model": "tiny", "input": [1, 2, 3], "add_special_tokens": false}'),
]  # fmt: skip


def transferred(ids: str, more: str = "") -> bytes:
    """A chat body whose kv_transfer_params.prompt_token_ids is `ids` (raw JSON), vLLM's ids run in place of the
    messages; `more` members after it."""
    return chat(f'"kv_transfer_params": {{"prompt_token_ids": {ids}}}' + (", " + more if more else ""))


IMAGE = ('[{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": '
         '{"url": "data:image/png;base64,iVBORw0KGgo="}}]}]')  # fmt: skip
TRANSFERRED_BODIES = [
    Body("transferred ids", CHAT, transferred("[1, 2, 3]")),
    Body("transferred ids empty", CHAT, transferred("[]")),
    Body("transferred ids as an empty string", CHAT, transferred('""')),
    Body("transferred ids as a string", CHAT, transferred('"123"')),
    Body("transferred ids as 0", CHAT, transferred("0")),
    Body("transferred ids as true", CHAT, transferred("true")),
    Body("transferred ids, booleans", CHAT, transferred("[true, 1]")),
    Body("transferred ids, a negative", CHAT, transferred("[-1, 2]")),
    Body("transferred ids, floats", CHAT, transferred("[1.0, 2.0]")),
    Body("transferred ids, nested", CHAT, transferred("[[1, 2]]")),
    Body("transferred ids, out of the vocabulary", CHAT, transferred("[1, 129280]")),
    Body("transferred ids, the last of the vocabulary", CHAT, transferred("[129279]")),
    Body("transferred ids with echo", CHAT, transferred("[1, 2, 3]", '"echo": true')),
    Body("transferred ids as a string with echo", CHAT, transferred('"x"', '"echo": true')),
    Body("transferred ids with an image", CHAT, transferred("[1, 2, 3]", f'"messages": {IMAGE}')),
    Body("transferred ids twice", CHAT, transferred("[1], \"prompt_token_ids\": [1, 2, 3, 4]")),
    Body("transfer params a list", CHAT, chat('"kv_transfer_params": [1, 2]')),
]  # fmt: skip

H = 128  # the hidden size of vllm_stages.py's stand-in for the tiny Llama: vLLM refuses another
E, T = embeds((3, H)), Tensor.MARK.format(0)


def completion(name: str, text: str, tensor: Tensor | None = None) -> Body:
    """A completions body of `text` (raw JSON members); `tensor`: one torch.save writes, its base64 text where `T`
    is."""
    return Body(name, COMPLETIONS, b'{"model": "tiny", ' + text.encode() + b"}", tensors=(tensor,) if tensor else ())


def by_torch(name: str, expression: str, legacy: bool = False, zip64: bool = True) -> Body:
    """A completions body whose prompt_embeds torch.save writes of `expression` (tests/e2e/tensors.py)."""
    return completion(name, f'"prompt_embeds": "{T}"', Tensor(expression, legacy, zip64))


def embedded(name: str, raw: bytes, more: str = "") -> Body:
    """A completions body whose prompt_embeds is `raw` as base64 text, `more` members after it."""
    return completion(name, f'"prompt_embeds": "{base64.b64encode(raw).decode()}"' + (", " + more if more else ""))


def padded() -> str:
    """A tensor whose base64 text ends in padding."""
    return next(t for t in (embeds((n, H)) for n in range(1, 9)) if t.endswith("="))


with warnings.catch_warnings():  # zipfile's "Duplicate name": the point here
    warnings.simplefilter("ignore", UserWarning)
    PICKLE_TWICE = archive([*members((3, H))[:1], ("archive/data.pkl", tensor_pickle((300, H))),
                            *members((300, H))[1:]])  # fmt: skip
PLUS = base64.b64encode(saved((3, H), fill=0xFB)).decode()  # its values' bytes make + and / in the text
LINES = "\\n".join(E[i : i + 76] for i in range(0, len(E), 76))  # JSON's escape of a line feed, as MIME writes it
EMBEDS_BODIES = [
    completion("embeds: no prompt", f'"prompt_embeds": "{E}"'),
    completion("embeds: an empty prompt", f'"prompt_embeds": "{E}", "prompt": ""'),
    completion("embeds: a prompt of []", f'"prompt_embeds": ["{E}"], "prompt": []'),
    completion("embeds: a prompt of [[]]", f'"prompt_embeds": ["{E}"], "prompt": [[]]'),
    completion("embeds: two, and prompts", f'"prompt_embeds": ["{E}", "{embeds((1, 5, H))}"], "prompt": ["a", "b"]'),
    completion("embeds: an empty string", '"prompt_embeds": "", "prompt": "a"'),
    completion("embeds: []", '"prompt_embeds": [], "prompt": "a"'),
    completion("embeds: [] alone", '"prompt_embeds": []'),
    completion("embeds: a number in the list", f'"prompt_embeds": ["{E}", 5]'),
    completion("embeds: null in the list", f'"prompt_embeds": ["{E}", null]'),
    completion("embeds: 1,025", '"prompt_embeds": [' + ", ".join([f'"{embeds((1, H))}"'] * 1025) + "]"),
    *(embedded(f"embeds: shape {shape}", saved(shape)) for shape in [(1, 5, H), (2, 5, H), (H,), (), (1, 1, 5, H),
                                                                     (0, H), (1, 0, H), (3, 64)]),
    embedded("embeds: bfloat16", saved((3, H), "BFloat16")),
    by_torch("embeds: torch's own", "torch.zeros(3, 128)"),
    by_torch("embeds: torch's own without zip64", "torch.zeros(3, 128)", zip64=False),
    by_torch("embeds: torch's own int64", "torch.zeros(3, 128, dtype=torch.int64)"),
    by_torch("embeds: a view inside a larger storage", "torch.zeros(10, 128)[2:5]"),
    by_torch("embeds: transposed", "torch.zeros(128, 3).t()"),
    by_torch("embeds: sparse", "torch.zeros(3, 128).to_sparse()"),
    by_torch("embeds: a Parameter", "torch.nn.Parameter(torch.zeros(3, 128))"),
    by_torch("embeds: the legacy format", "torch.zeros(3, 128)", legacy=True),
    embedded("embeds: a zip comment", archive(members((3, H)), comment=b"a comment")),
    embedded("embeds: data.pkl twice", PICKLE_TWICE),
    embedded("embeds: a folder of its own", archive(members((3, H), folder="tensor"))),
    embedded("embeds: data.pkl deflated", archive(members((3, H)), deflated=("archive/data.pkl",))),
    embedded("embeds: two archives, one after the other", saved((3, H)) + saved((300, H))),
    completion("embeds: base64 in lines", f'"prompt_embeds": "{LINES}"'),
    completion("embeds: base64 unpadded", f'"prompt_embeds": "{padded().rstrip("=")}"'),
    completion("embeds: base64 URL-safe", f'"prompt_embeds": "{PLUS.replace("+", "-").replace("/", "_")}"'),
    completion("embeds: base64 with + and /", f'"prompt_embeds": "{PLUS}"'),
    completion("embeds: base64 with a non-ASCII letter", f'"prompt_embeds": "{E[:40]}é{E[41:]}"'),
    embedded("embeds: echo", saved((3, H)), '"echo": true'),
    embedded("embeds: prompt_logprobs", saved((3, H)), '"prompt_logprobs": 1'),
    embedded("embeds: a suffix", saved((3, H)), '"suffix": "x"'),
]  # fmt: skip

ADAPTER, SESSION = "X-Amzn-SageMaker-Adapter-Identifier", "X-Amzn-SageMaker-Session-Id"
TO_CHAT = chat('"max_tokens": 5')


def invoked(name: str, text: str, headers: tuple[tuple[str, str], ...] = (), served: str = "generate") -> Body:
    """An /invocations body of `text` (raw JSON members), sent to a server of a generative or an embedding model."""
    return Body(name, INVOCATIONS, b"{" + text.encode() + b"}", headers=headers, served=served)


INVOCATION_BODIES = [
    Body("invoked: chat, no adapter header", INVOCATIONS, TO_CHAT),
    Body("invoked: the adapter header", INVOCATIONS, TO_CHAT, headers=((ADAPTER, "other"),)),
    Body("invoked: the adapter header empty", INVOCATIONS, TO_CHAT, headers=((ADAPTER, ""),)),
    Body("invoked: the adapter header twice", INVOCATIONS, TO_CHAT, headers=((ADAPTER, "other"), (ADAPTER, "tiny"))),
    Body("invoked: the adapter header in capitals", INVOCATIONS, TO_CHAT, headers=((ADAPTER.upper(), "other"),)),
    Body("invoked: the adapter header as the model", INVOCATIONS, TO_CHAT, headers=((ADAPTER, "tiny"),)),
    Body("invoked: a session", INVOCATIONS, TO_CHAT, headers=((SESSION, "s-1"),)),
    Body("invoked: chat as text/plain", INVOCATIONS, TO_CHAT, "text/plain"),
    invoked("invoked: transferred ids", '"messages": [{"role": "user", "content": "hi"}], '
                                        '"kv_transfer_params": {"prompt_token_ids": [1, 2, 3]}'),
    invoked("invoked: completion", '"model": "x", "prompt": "hi", "max_tokens": 3', ((ADAPTER, "tiny"),)),
    invoked("invoked: completion of ids", '"prompt": [1, 2, 3]'),
    invoked("invoked: embeds", f'"prompt_embeds": ["{E}"], "prompt": ""'),
    invoked("invoked: an empty prompt", '"prompt": ""'),
    invoked("invoked: embeddings, a generative model", '"input": "hi"'),
    invoked("invoked: rerank, a generative model", '"query": "q", "documents": ["a", "b"]'),
    invoked("invoked: embeddings", '"input": ["a", "b"]', ((ADAPTER, "tiny"),), "embed"),
    invoked("invoked: embeddings of ids", '"input": [1, 2]', served="embed"),
    invoked("invoked: embeddings of messages", '"messages": [{"role": "user", "content": "hi"}]', served="embed"),
    invoked("invoked: embeddings of a conversation", '"input": [{"role": "user", "content": "hi"}]', served="embed"),
    invoked("invoked: rerank", '"query": "q", "documents": ["a", "b"]', served="embed"),
    invoked("invoked: score", '"text_1": "q", "text_2": ["a", "b"]', served="embed"),
    invoked("invoked: score of queries and documents", '"queries": "q", "documents": ["a"]', served="embed"),
    invoked("invoked: score of two pairs", '"data_1": "q", "data_2": "a", "text_1": "b c", "text_2": "d e"',
            served="embed"),
    invoked("invoked: a new session", '"requestType": "NEW_SESSION"'),
    invoked("invoked: a session closed", '"requestType": "CLOSE"'),
    invoked("invoked: a new session and a prompt", '"requestType": "NEW_SESSION", "prompt": "hi"'),
    invoked("invoked: messages and a prompt", '"messages": [{"role": "user", "content": "hi"}], "prompt": "a b c"'),
    invoked("invoked: messages and a prompt, chat refused", '"messages": [{"role": "user", "content": "hi"}], '
                                                           '"prompt": "a b c", "logprobs": 5'),
    invoked("invoked: a prompt and an input", '"prompt": "p", "input": "a b c"', served="embed"),
    invoked("invoked: an input and a query, embeddings refused", '"input": "i", "query": "q", "documents": ["a b c"], '
                                                                 '"dimensions": "x"', served="embed"),
]  # fmt: skip

WAV = b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x80\x3e\x00\x00\x00\x7d\x00\x00\x02\x00\x10\x00"
FORM = "multipart/form-data; boundary=b"


def part(name: bytes, value: bytes, head: bytes = b"", tail: bytes = b"", filename: bytes | None = None) -> bytes:
    """A part: `head` header lines before its Content-Disposition, `tail` after it."""
    extra = b'; filename="%s"' % filename if filename is not None else b""
    return b'--b\r\n%sContent-Disposition: form-data; name="%s"%s\r\n%s\r\n%s\r\n' % (head, name, extra, tail, value)


def form(*parts: bytes, end: bytes = b"--b--\r\n") -> bytes:
    return b"".join([*parts, part(b"file", WAV, filename=b"a.wav"), end])


def sdk_form(data: dict[str, str | list[str]]) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x/", data=data, files={"file": ("speech.wav", WAV, "audio/wav")})
    return request.read(), request.headers["content-type"]


TWICE = b'Content-Disposition: form-data; name="temperature"\r\n'
FORM_BODIES = [
    Body("as the SDK sends it", TRANSCRIPTIONS, *sdk_form({"model": "tiny", "max_completion_tokens": "50",
                                                           "timestamp_granularities[]": ["word", "segment"]})),
    Body("two dispositions, the last a limit", TRANSCRIPTIONS, form(part(b"max_completion_tokens", b"50"),
                                                                    part(b"max_completion_tokens", b"100000", TWICE)),
         FORM),
    Body("two dispositions, the last beams", TRANSCRIPTIONS, form(part(b"use_beam_search", b"true", TWICE),
                                                                  part(b"n", b"8", TWICE)), FORM),
    Body("two dispositions, the last a model", TRANSLATIONS, form(part(b"model", b"other", TWICE)), FORM),
    Body("a limit twice", TRANSCRIPTIONS, form(part(b"max_completion_tokens", b"50"),
                                               part(b"max_completion_tokens", b"100000")), FORM),
    Body("a field vLLM does not know", TRANSCRIPTIONS, form(part(b"max_tokens", b"100000")), FORM),
    Body("a name unquoted, headers in capitals", TRANSCRIPTIONS,
         form(b"--b\r\nCONTENT-DISPOSITION: FORM-DATA; NAME=max_completion_tokens\r\n\r\n100000\r\n"), FORM),
    Body("an escape in a quoted name", TRANSCRIPTIONS, form(part(b"max_completion\\_tokens", b"100000")), FORM),
    Body("a quote in a quoted name", TRANSCRIPTIONS, form(part(b'n\\"', b"8"), part(b"use_beam_search", b"1")),
         FORM),
    Body("name*", TRANSCRIPTIONS, form(b"--b\r\nContent-Disposition: form-data; name=\"n\"; name*=UTF-8''model"
                                       b"\r\n\r\n8\r\n"), FORM),
    Body("a part's own content type", TRANSCRIPTIONS,
         form(part(b"max_completion_tokens", b"7", b"Content-Type: text/plain; charset=utf-16\r\n")), FORM),
    Body("a charset in the content type", TRANSCRIPTIONS, form(part(b"prompt", "é".encode()),
                                                               part(b"max_completion_tokens", b"7")),
         FORM + "; charset=latin-1"),
    Body("a preamble and an epilogue", TRANSCRIPTIONS, b"preamble\r\n" + form(part(b"max_completion_tokens", b"7"))
         + part(b"max_completion_tokens", b"100000") + b"--b--\r\n", FORM),
    Body("line ends without CR", TRANSCRIPTIONS, form(part(b"max_completion_tokens", b"7")).replace(b"\r\n", b"\n"),
         FORM),
    Body("a folded header", TRANSCRIPTIONS, form(part(b"max_completion_tokens", b"7", tail=b' ;name="n"\r\n')),
         FORM),
    Body("a quoted boundary with a space", TRANSCRIPTIONS, form(part(b"max_completion_tokens", b"7")).replace(
        b"--b", b"--b c"), 'multipart/form-data; boundary="b c"'),
    Body("the boundary twice", TRANSCRIPTIONS, form(part(b"max_completion_tokens", b"7")),
         "multipart/form-data; boundary=zz; boundary=b"),
    Body("two content types", TRANSCRIPTIONS, form(part(b"max_completion_tokens", b"7")),
         "multipart/form-data; boundary=zz", (("content-type", FORM),)),
    Body("a limit of pydantic's odd integers", TRANSCRIPTIONS, form(part(b"max_completion_tokens", b"1_000"),
                                                                    part(b"n", b"3.0")), FORM),
    Body("a limit with spaces and a sign", TRANSCRIPTIONS, form(part(b"max_completion_tokens", b" +64 ")), FORM),
    Body("an empty limit", TRANSCRIPTIONS, form(part(b"max_completion_tokens", b"")), FORM),
    Body("flags in their spellings", TRANSCRIPTIONS, form(part(b"stream", b"True"), part(b"use_beam_search", b"on"),
                                                          part(b"n", b"2")), FORM),
    Body("a flag with spaces", TRANSCRIPTIONS, form(part(b"stream", b" true")), FORM),
    Body("an empty model", TRANSLATIONS, form(part(b"model", b"")), FORM),
    Body("the audio as text", TRANSCRIPTIONS, part(b"file", b"RIFF") + b"--b--\r\n", FORM),
    Body("an empty filename", TRANSCRIPTIONS, part(b"max_completion_tokens", b"7")
         + part(b"file", WAV, filename=b"") + b"--b--\r\n", FORM),
    Body("a filename with quotes and a path", TRANSCRIPTIONS, part(b"max_completion_tokens", b"7")
         + part(b"file", WAV, filename=b'C:\\\\dir\\\\a \\"b\\".wav') + b"--b--\r\n", FORM),
]  # fmt: skip

BODIES = JSON_BODIES + TRANSFERRED_BODIES + EMBEDS_BODIES + INVOCATION_BODIES + FORM_BODIES


def asked(bodies: list[Body]) -> list[Body]:
    """What vLLM is asked to read: each body as sent, then each request the guard would forward."""
    return [*bodies, *(forwarded for body in bodies for forwarded in guard_reads(body).forwarded)]


@pytest.fixture(scope="module")
def sent() -> list[Body]:
    """BODIES with their tensors written, by torch.save in the vLLM environment."""
    return with_tensors(BODIES)


@pytest.fixture(scope="module")
def readings(sent: list[Body]) -> Iterator[dict[str, list[VllmRead]]]:
    """Every body read by each vLLM version, all in one process per version."""
    yield {version: vllm_reads(version, asked(sent)) for version in VERSIONS}


def forwarded_readings(readings: list[VllmRead], sent: list[Body], index: int) -> list[VllmRead]:
    start = len(sent) + sum(len(guard_reads(b).forwarded) for b in sent[:index])
    return readings[start : start + len(guard_reads(sent[index]).forwarded)]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("index", range(len(BODIES)), ids=[f"{b.path} {b.name}" for b in BODIES])
def test_what_the_guard_forwards_vllm_reads_as_the_guard_read_it(
    readings: dict[str, list[VllmRead]], sent: list[Body], version: str, index: int
) -> None:
    body = sent[index]
    guard = guard_reads(body)
    for read in forwarded_readings(readings[version], sent, index):
        assert guard.checked is not None
        if read.request is not None:  # else vLLM refuses it: nothing runs
            assert vllm_checked(body.path, read) == guard.checked


def test_the_guard_refuses_where_vllm_reads_the_clients_bytes_otherwise(
    readings: dict[str, list[VllmRead]], sent: list[Body]
) -> None:
    """Of the bodies whose own bytes vLLM reads otherwise than the guard, none is forwarded: the guard refuses it,
    or forwards it written anew (a form; on /invocations with the adapter header it read), which the test above holds
    to the guard's reading."""
    for version in VERSIONS:
        otherwise = {}
        for index, body in enumerate(sent):
            guard, read = guard_reads(body), readings[version][index]
            if guard.checked is not None and read.request is not None:
                theirs = vllm_checked(body.path, read)
                if theirs != guard.checked:
                    otherwise[body.name] = (guard.checked, theirs)
        assert all(BODIES[[b.name for b in BODIES].index(name)].path in (TRANSCRIPTIONS, TRANSLATIONS, INVOCATIONS)
                   for name in otherwise), otherwise  # fmt: skip
        # python-multipart keeps the backslash of `max_completion\_tokens`, a field vLLM does not know: at e63017a,
        # which forwarded the client's bytes with the limit rewritten, vLLM ran to the window. Starlette reads the
        # first of a repeated adapter header, the guard the last, which it sends on alone.
        assert set(otherwise) == {"an escape in a quoted name", "invoked: the adapter header twice"}, otherwise


def read_as(readings: dict[str, list[VllmRead]], version: str, name: str) -> VllmRead:
    """How vLLM `version` read the client's own request `name`."""
    return readings[version][[b.name for b in BODIES].index(name)]


@pytest.mark.parametrize("version", VERSIONS)
def test_what_vllm_runs_of_bodies_the_guard_refuses(
    readings: dict[str, list[VllmRead]], sent: list[Body], version: str
) -> None:
    """What made the guard refuse these: what vLLM would have run of them."""
    ran = {name: read_as(readings, version, name).runs for name in (
        "embeds: data.pkl twice", "invoked: messages and a prompt, chat refused", "invoked: a prompt and an input",
        "invoked: an input and a query, embeddings refused", "transferred ids, booleans")}  # fmt: skip
    for name in ran:
        assert guard_reads(sent[[b.name for b in BODIES].index(name)]).checked is None, name
    # torch reads the last of two data.pkl (miniz), Python's zipfile too; a reader of the first counts 3 rows
    assert ran["embeds: data.pkl twice"]["prompts"] == [{"embeds": 300}]
    # the first request model that takes the whole body runs: a prompt the guard had not counted
    assert ran["invoked: messages and a prompt, chat refused"] == {"endpoint": "CompletionRequest",
                                                                   "prompts": ["a b c"]}  # fmt: skip
    assert ran["invoked: a prompt and an input"] == {"endpoint": "EmbeddingCompletionRequest"}
    assert ran["invoked: an input and a query, embeddings refused"] == {"endpoint": "RerankRequest"}
    # 0.31 runs any ids that are not empty, booleans as 0 and 1; 0.32 refuses them
    booleans = read_as(readings, version, "transferred ids, booleans")
    assert booleans.runs.get("prompt_token_ids") == ([True, 1] if version == "0.31.0" else None)


@pytest.mark.parametrize("version", VERSIONS)
def test_tensors_vllm_loads_which_the_guard_refuses_to_read(readings: dict[str, list[VllmRead]], version: str) -> None:
    """The price of reading torch.save's format strictly: vLLM loads these, the guard asks for torch.save's own."""
    for name in ("embeds: sparse", "embeds: a Parameter", "embeds: the legacy format", "embeds: a zip comment"):
        assert read_as(readings, version, name).runs["prompts"] == [{"embeds": 3}], name


@pytest.mark.parametrize("version", VERSIONS)
def test_vllm_reads_a_parts_last_content_disposition_and_a_fields_last_part(
    readings: dict[str, list[VllmRead]], version: str
) -> None:
    """What made the guard refuse these: vLLM's reading of the client's bytes, python-multipart's and FastAPI's."""
    names = [b.name for b in BODIES]
    last_header = readings[version][names.index("two dispositions, the last a limit")]
    last_part = readings[version][names.index("a limit twice")]
    beams = readings[version][names.index("two dispositions, the last beams")]
    assert last_header.request is not None and last_header.request["max_completion_tokens"] == 100000
    assert last_part.request is not None and last_part.request["max_completion_tokens"] == 100000
    assert beams.request is not None and (beams.request["use_beam_search"], beams.request["n"]) == (True, 8)
    for name in ("two dispositions, the last a limit", "a limit twice", "two dispositions, the last beams"):
        assert guard_reads(BODIES[names.index(name)]).checked is None


@pytest.mark.parametrize("version", VERSIONS)
def test_vllm_reads_utf16_json_which_the_guard_refuses(readings: dict[str, list[VllmRead]], version: str) -> None:
    names = [b.name for b in BODIES]
    for name in ("UTF-16", "UTF-16-LE behind a quote byte", "UTF-32-BE"):
        read = readings[version][names.index(name)]
        assert read.request is not None and read.request["max_tokens"] == 5, name
        refusal = guard_reads(BODIES[names.index(name)]).refusal
        assert refusal is not None and "a JSON request body must be UTF-8" in refusal
    bom = readings[version][names.index("a UTF-8 byte order mark")]
    assert bom.request is not None and guard_reads(BODIES[names.index("a UTF-8 byte order mark")]).checked


@pytest.mark.parametrize("version", VERSIONS)
def test_the_form_fields_the_guard_and_the_simulator_know_are_vllms(version: str) -> None:
    fields = vllm_fields(version)
    transcription, translation = set(fields["TranscriptionRequest"]), set(fields["TranslationRequest"])
    added = {"watermarking"} if version == "0.31.0" else set()  # 0.32's, known to both tables
    assert FIELDS[TRANSCRIPTIONS] == transcription | added and FIELDS[TRANSLATIONS] == translation | added
    assert SIMULATED["transcribe"] | {"file"} == FIELDS[TRANSCRIPTIONS]
    assert SIMULATED["translate"] | {"file"} == FIELDS[TRANSLATIONS]


def test_every_body_is_read_by_the_guard_without_an_error_of_its_own(sent: list[Body]) -> None:
    """The guard reads each, or refuses it with a 400 that says why: never another exception."""
    for body in sent:
        read = guard_reads(body)
        assert (read.checked is None) == (read.refusal is not None), body.name
        json.dumps(read.checked, default=str)
