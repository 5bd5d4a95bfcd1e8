"""The README's measured figures: every marked region has a generator in `benchmarks/readme_figures.py`
(and every generator a region), and regenerating one rewrites that region only."""

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


def test_every_readme_region_has_a_generator_and_back():
    rf = figures_module()
    assert set(rf.regions((ROOT / "README.md").read_text(encoding="utf-8"))) == set(rf.FIGURES)


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
