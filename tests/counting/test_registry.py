"""Which model a request is for: one that names none is the upstream's default (its first card, as vLLM serves it),
whatever order the guard's own [[models]] come in."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.api.models import ModelCard
from proxy.counting.registry import ModelRegistry
from proxy.errors import ModelNotFound, NotReady
from proxy.settings import load_settings


def registry(tokenizer: Path, *names: str) -> ModelRegistry:
    toml = "".join(f'[[models]]\nname = "{n}"\ntokenizer = "{tokenizer}"\nmax_model_len = 2048\n' for n in names)
    path = tokenizer.parent / "models.toml"
    path.write_text(toml)
    settings = load_settings({}, environ={}, config_file=path)
    return ModelRegistry.from_settings(settings.models, settings.counting)


def card(name: str) -> ModelCard:
    return ModelCard(name, 2048, None, None)


def test_a_request_without_a_model_is_for_the_upstreams_default(deepseek_dir: Path) -> None:
    models = registry(deepseek_dir, "first-configured", "served-by-default")
    with pytest.raises(NotReady):  # not known before discovery: never a guess at the first configured model
        models.resolve(None)
    models.apply_discovery([card("served-by-default"), card("first-configured")])
    assert models.resolve(None).name == "served-by-default"
    assert models.resolve("first-configured").name == "first-configured"


def test_a_default_the_guard_does_not_serve_is_not_found(deepseek_dir: Path) -> None:
    models = registry(deepseek_dir, "mine")
    models.apply_discovery([card("someone-elses"), card("mine")])
    with pytest.raises(ModelNotFound, match="someone-elses"):
        models.resolve(None)
    models.apply_discovery([])
    with pytest.raises(ModelNotFound, match="lists none"):
        models.resolve(None)


def test_a_key_held_to_some_models_hears_of_no_other(deepseek_dir: Path) -> None:
    """A model that does not exist and one the key may not use get the same words, naming only the models it may use
    (none: nothing); a default it may not use goes unnamed. A key without a list hears of every model."""
    models = registry(deepseek_dir, "served-by-default", "public", "secret")
    models.apply_discovery([card("served-by-default"), card("public"), card("secret")])
    said = []
    for name in ("zzz", "secret"):
        with pytest.raises(ModelNotFound) as refused:
            models.resolve(name, ("public", "elsewhere"))
        said.append(refused.value.message.replace(name, "x"))
    words = "The model `x` does not exist or you do not have access to it. Models you have access to: public."
    assert said == [words, words]
    with pytest.raises(ModelNotFound) as refused:
        models.resolve("zzz", ("elsewhere",))
    assert refused.value.message == "The model `zzz` does not exist or you do not have access to it."
    with pytest.raises(ModelNotFound) as refused:
        models.resolve(None, ("public",))
    assert "served-by-default" not in refused.value.message and refused.value.message.endswith("to: public.")
    assert models.resolve("public", ("public",)).name == "public"
    with pytest.raises(ModelNotFound, match="served-by-default, public, secret"):
        models.resolve("zzz")


def test_what_the_check_learned_is_forgotten_to_be_learned_again(deepseek_dir: Path) -> None:
    """An upstream back from being out may have restarted with other flags: its learned defaults and the count source
    the check chose go back to what they were before the check, the configured ones stay."""
    models = registry(deepseek_dir, "a", "b")
    models.apply_discovery([card("a"), card("b")])
    before = models.resolve("a")
    models.set_default_kwargs("a", {"enable_thinking": False})
    models.set_count_source("a", "upstream", "auto: disagreed")
    models.checked = True
    models.forget_learned()
    again = models.resolve("a")
    assert dict(again.tokenizer.default_kwargs) == {} and again.count_source == before.count_source == "auto"
    assert again.source_reason == before.source_reason and not models.checked
    models.set_count_source("b", "upstream", "auto: disagreed")  # learned after the forgetting: kept till the next
    assert models.resolve("b").count_source == "upstream"
