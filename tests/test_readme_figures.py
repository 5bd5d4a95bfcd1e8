"""The documentation's measured figures: every marked region, in README.md or a docs/ page, has a generator in
`benchmarks/readme_figures.py` (and every generator a region), and regenerating one rewrites that region only."""

from __future__ import annotations

import datetime as dt
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def figures_module():
    spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "benchmarks" / "readme_figures.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["readme_figures"] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


def test_every_region_has_a_generator_and_back():
    rf = figures_module()
    found = rf.all_regions()
    assert set(found) == set(rf.FIGURES)
    assert all(p == ROOT / "README.md" or p.is_relative_to(ROOT / "docs") for p in found.values())


def test_regenerating_a_region_touches_nothing_else():
    rf = figures_module()
    text = "a\n<!-- figures:demo -->\nold\n<!-- /figures -->\nb\n<!-- figures:x -->\nkeep\n<!-- /figures -->\n"
    out = rf.replace_region(text, "demo", "new 1.0\n")
    assert out == text.replace("old\n", "new 1.0\n")
    with pytest.raises(KeyError, match="no region <!-- figures:nope -->.*demo, x"):
        rf.replace_region(text, "nope", "")
    with pytest.raises(ValueError, match="each closed"):
        rf.regions("<!-- figures:open -->\nno end\n")
    line = rf.provenance("offline-run", dt.date(2026, 12, 3))
    assert "Regenerated 2026-12-03 by `python benchmarks/readme_figures.py offline-run` (memlab run offline)" in line


def test_find_region_looks_in_the_readme_and_every_docs_page(tmp_path):
    rf = figures_module()
    (tmp_path / "docs" / "guides").mkdir(parents=True)
    (tmp_path / "README.md").write_text("<!-- figures:demo -->\nd\n<!-- /figures -->\n", encoding="utf-8")
    page = tmp_path / "docs" / "guides" / "x.md"
    page.write_text("text\n<!-- figures:topk -->\nt\n<!-- /figures -->\n", encoding="utf-8")
    assert rf.find_region("topk", tmp_path) == page
    assert rf.find_region("demo", tmp_path) == tmp_path / "README.md"
    with pytest.raises(KeyError, match="no page has <!-- figures:nope -->.*demo, topk"):
        rf.find_region("nope", tmp_path)
    (tmp_path / "docs" / "y.md").write_text("<!-- figures:topk -->\nu\n<!-- /figures -->\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'topk' is in docs/guides/x.md and docs/y.md"):
        rf.all_regions(tmp_path)
    (tmp_path / "docs" / "y.md").write_text("<!-- figures:open -->\n", encoding="utf-8")
    with pytest.raises(ValueError, match="docs/y.md: figure regions: opened"):
        rf.all_regions(tmp_path)
