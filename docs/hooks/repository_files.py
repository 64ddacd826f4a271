"""A MkDocs hook: the repository files the manual links to from outside docs/ (`../config.example.toml`,
`../deploy/...`, `../bench/results/...`) are copied into the site under `repository/`, so that such links work on
GitHub and in the built site alike, and a strict build still fails on a link whose file does not exist."""

from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files, InclusionLevel

LINK = re.compile(r"\]\((\.\./[^)#\s]+)")


class RepositoryFile(File):
    """A file from outside docs/, copied as it is: a Markdown one is shown as its text, not rendered as a page."""

    def is_documentation_page(self) -> bool:
        return False

    def is_static_page(self) -> bool:
        return False


def on_files(files: Files, config: MkDocsConfig) -> Files:
    docs = Path(config.docs_dir).resolve()
    root = docs.parent
    for page in docs.rglob("*.md"):
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            path = (page.parent / target).resolve()
            if root not in path.parents or docs in path.parents or not path.is_file():
                continue  # not a repository file: MkDocs's own link check reports it
            src_uri = Path(os.path.relpath(path, docs)).as_posix()
            if files.get_file_from_path(src_uri) is None:
                dest_uri = "repository/" + path.relative_to(root).as_posix()
                file = RepositoryFile(
                    src_uri, str(docs), config.site_dir, False, dest_uri=dest_uri, inclusion=InclusionLevel.INCLUDED
                )
                files.append(file)
    return files
