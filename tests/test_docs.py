"""The documentation: README.md stays a front page (at most 250 lines, the two commands verbatim, every link into
the repository resolving, anchors included), every docs page's relative links resolve, and the MkDocs site builds
with --strict (a broken link, a page missing from the nav or an unresolved API reference fails it)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 250
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor as MkDocs writes it (Python-Markdown's toc slugify)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(re.sub(r"`", "", m)) for m in re.findall(r"^#{1,6} +(.+?) *$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    """Relative links of a markdown page whose file (or heading anchor) does not exist."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http(s):, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    return bad


def test_readme_is_a_front_page_with_the_two_commands_and_links_into_the_docs():
    text = README.read_text(encoding="utf-8")
    n = len(text.splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; a front page has at most {MAX_README_LINES}"
    assert re.search(r"^make demo\b", text, re.M) and re.search(r"^make test\b", text, re.M)  # .ci/run: make test
    links = [t for t in LINK.findall(text) if t.startswith("docs/")]
    assert len(links) >= 10, "the front page links into the docs site"
    assert not broken_links(README), broken_links(README)


def test_every_docs_page_links_only_to_what_exists():
    pages = sorted((ROOT / "docs").rglob("*.md"))
    assert len(pages) >= 20
    bad = {str(p.relative_to(ROOT)): b for p in pages if (b := broken_links(p))}
    assert not bad, bad


def test_the_link_check_catches_a_missing_page_and_a_missing_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "b.md").write_text("# Title\n\n## Grids and `grid:` keys\n", encoding="utf-8")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#grids-and-grid-keys) [gone](c.md) [no anchor](b.md#nope) [web](https://x.invalid/y)\n"
                    "```\n[in code](nowhere.md)\n```\n", encoding="utf-8")
    assert broken_links(page) == ["c.md (no file c.md)", "b.md#nope (no heading #nope in b.md)"]


def test_the_site_builds_with_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        if os.environ.get("CI"):
            pytest.fail("mkdocs is not installed in CI: the Makefile's EXTRAS must include docs")
        pytest.skip("mkdocs absent: install the docs extra (pip install -e '.[docs]'; make test installs it)")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"mkdocs build --strict failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    api = (site / "reference" / "run" / "index.html").read_text(encoding="utf-8")
    assert "run_experiment" in api and "load_run" in api  # the API reference was generated from the docstrings
    guide = (site / "guides" / "components" / "index.html").read_text(encoding="utf-8")
    assert "WindowedBM25" in guide  # the examples' code is pulled into the guide
    assert (site / "benchmarks" / "retrieval" / "index.html").is_file()
