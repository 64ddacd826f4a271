"""The model list an API key may see: only its models, every other field of the answer kept."""

from __future__ import annotations

import json

from proxy.api.models import only_models

LISTED = {"object": "list", "data": [{"id": "tiny", "max_model_len": 2048}, {"id": "big"}, "odd"]}


def test_only_the_keys_models_are_listed() -> None:
    kept = only_models(json.dumps(LISTED).encode(), ("tiny", "absent"))
    assert kept is not None and json.loads(kept) == {"object": "list", "data": [{"id": "tiny", "max_model_len": 2048}]}
    none = only_models(json.dumps(LISTED).encode(), ("absent",))
    assert none is not None and json.loads(none)["data"] == []


def test_anything_else_is_left_alone() -> None:
    assert only_models(b"not json", ("tiny",)) is None
    assert only_models(b'{"error": "x"}', ("tiny",)) is None
