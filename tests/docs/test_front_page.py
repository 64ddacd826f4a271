"""The manual's front page (docs/index.md) says what token-guard does with the README's own words: it includes the
README's summary (pymdownx.snippets in mkdocs.yml, resolved by the strict build of `make check`), so the two cannot
drift apart as they had by 6cc5eca, where the page kept an older copy of the README's bullets."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README, INDEX = ROOT / "README.md", ROOT / "docs" / "index.md"
SUMMARY = re.compile(r"<!-- --8<-- \[start:summary\] -->\n(.*?)<!-- --8<-- \[end:summary\] -->", re.S)
INCLUDED = '--8<-- "README.md:summary"'


def summary() -> str:
    found = SUMMARY.search(README.read_text(encoding="utf-8"))
    assert found is not None, "README.md has no summary section"
    return found.group(1)


def test_the_front_page_includes_the_readme_summary() -> None:
    assert [line for line in INDEX.read_text(encoding="utf-8").splitlines() if line == INCLUDED] == [INCLUDED]
    bullets = [line for line in summary().splitlines() if line.startswith("- ")]
    assert len(bullets) >= 5 and any("**clamped**" in line for line in bullets)


def test_the_front_page_writes_none_of_the_summary_again() -> None:
    page = INDEX.read_text(encoding="utf-8")
    again = [line for line in summary().splitlines() if len(line) > 40 and line.strip() in page]
    assert not again, "docs/index.md repeats the README's summary instead of including it:\n" + "\n".join(again)
