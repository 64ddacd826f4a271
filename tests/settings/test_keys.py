"""[[keys]] tables: named keys with quotas, given as the key or its SHA-256, checked once; errors name the entry and
the field, and never show a secret."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from proxy.settings import SettingsError, load_settings
from proxy.settings.sections import KeySettings


def load(tmp_path: Path, text: str) -> tuple[KeySettings, ...]:
    path = tmp_path / "guard.toml"
    path.write_text(text)
    return load_settings(environ={}, config_file=path).keys


def test_keys_by_value_and_by_digest(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"sk-b").hexdigest()
    keys = load(
        tmp_path,
        f"""
[[keys]]
name = "team-a"
key = "sk-a"
tokens_per_minute = 100000
requests_per_minute = 60
max_output_tokens = 512
models = ["tiny", "other"]

[[keys]]
name = "team-b"
key_sha256 = "{digest.upper()}"
prompt_embeds = false
""",
    )
    assert keys == (
        KeySettings("team-a", hashlib.sha256(b"sk-a").hexdigest(), 100000, 60, 512, ("tiny", "other")),
        KeySettings("team-b", digest, prompt_embeds=False),
    )
    assert keys[0].limited and not keys[1].limited


def test_no_keys_by_default() -> None:
    assert load_settings(environ={}).keys == ()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('key = "s"', "keys[0].name: required"),
        ('name = "a"', "keys[0] (a).key: expected exactly one of key or key_sha256"),
        ('name = "a"\nkey = "s"\nkey_sha256 = "' + "0" * 64 + '"', "keys[0] (a).key: expected exactly one"),
        ('name = "a"\nkey_sha256 = "abc"', "keys[0] (a).key_sha256: expected 64 hex digits"),
        ('name = "a"\nkey = "s"\ntokens_per_minute = 0', "keys[0] (a).tokens_per_minute: expected an integer >= 1"),
        ('name = "a"\nkey = "s"\nrequests_per_minute = "x"', "keys[0] (a).requests_per_minute"),
        ('name = "a"\nkey = "s"\nmodels = []', "keys[0] (a).models: expected a non-empty list"),
        ('name = "a"\nkey = "s"\nmodel = ["x"]', "keys[0] (a).model: unknown key"),
        ('name = "a"\nkey = ""', "keys[0] (a).key: expected a non-empty string, got (hidden)"),
        ('name = "a"\nkey = "s"\nprompt_embeds = "maybe"', "keys[0] (a).prompt_embeds: expected"),
    ],
)
def test_bad_entries_name_the_entry_and_the_field(tmp_path: Path, table: str, message: str) -> None:
    with pytest.raises(SettingsError, match=r"^" + re.escape(message)) as raised:
        load(tmp_path, "[[keys]]\n" + table + "\n")
    assert "guard.toml" in str(raised.value)


def test_names_and_keys_are_unique(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"keys\[1\]\.name: expected each key's name to be unique"):
        load(tmp_path, '[[keys]]\nname = "a"\nkey = "s1"\n[[keys]]\nname = "a"\nkey = "s2"\n')
    digest = hashlib.sha256(b"s1").hexdigest()
    with pytest.raises(SettingsError, match=r"keys\[1\]\.key: expected each key's key to be unique"):
        load(tmp_path, f'[[keys]]\nname = "a"\nkey = "s1"\n[[keys]]\nname = "b"\nkey_sha256 = "{digest}"\n')


def test_keys_must_be_tables(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"keys: expected a list of \[\[keys\]\] tables"):
        load(tmp_path, 'keys = ["sk-a"]\n')


def test_a_secret_never_shows_in_an_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as raised:
        load(tmp_path, '[[keys]]\nname = "a"\nkey = "sk-very-secret"\ntokens_per_minute = -1\n')
    assert "sk-very-secret" not in str(raised.value)
