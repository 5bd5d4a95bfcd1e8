"""Every file under examples/ runs as a user runs it (`python examples/NAME.py` from the repository root):
offline, in seconds, on the tiny LoCoMo-format file beside them, printing its run's F1 over the 13 questions."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
#: What each example adds, by the config key that names it: the docs' component guide links each file.
EXPECTED = {"my_extractor.py": "my-long-sentences", "my_arm.py": "my-best-sentence", "my_embedder.py": "my-trigrams",
            "my_memory_system.py": "my-windowed-bm25"}


def test_the_examples_are_the_documented_four():
    assert {p.name for p in EXAMPLES} == set(EXPECTED)
    guide = (ROOT / "docs" / "guides" / "components.md").read_text(encoding="utf-8")
    for name in EXPECTED:
        assert f"examples/{name}" in guide, f"docs/guides/components.md does not point to examples/{name}"


def test_every_example_runs_offline_in_seconds(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "MEMLAB_STATE": str(tmp_path / "state")}
    env.pop("MEMLAB_LOCOMO", None)  # they must not need the LoCoMo file
    t0 = time.monotonic()
    procs = {p.name: subprocess.Popen([sys.executable, str(p)], cwd=ROOT, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE) for p in EXAMPLES}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"examples/{name} exited {proc.returncode}:\n{err[-3000:]}"
        assert out.startswith(EXPECTED[name]), out
        m = re.search(r"F1 (\d\.\d{3}) \[(\d\.\d{3}), (\d\.\d{3})\].* n 13\b", out)
        assert m, f"examples/{name} printed no F1 with its interval over the 13 questions: {out!r}"
        f1, lo, hi = map(float, m.groups())
        assert 0 < f1 < 1 and lo <= f1 <= hi, out  # every example answers some questions right, not all
    assert time.monotonic() - t0 < 180  # seconds each; together on a loaded 2-core machine well under this
