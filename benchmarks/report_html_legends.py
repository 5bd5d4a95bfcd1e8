"""Screenshots of the HTML report's plots, before and after, for runs whose configs differ in many keys.

    python benchmarks/report_html_legends.py OUT_PREFIX RUN [RUN ...] [--before-ref main]

Builds the page with a git ref's page builder (``--before-ref``, extracted as in `report_html_time`) and with this
checkout's, opens each in headless Chromium (tests/headless.py; ``apt-get install chromium``) and saves the plots
section as ``OUT_PREFIX-before.png`` and ``OUT_PREFIX-after.png`` (the page's top, with the runs table, as
``…-top.png``); prints each page's run labels and the width
the browser gives each plot.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from report_html_time import REPO, build, extract_ref, payload  # noqa: E402

from tests.headless import Chromium  # noqa: E402

WIDTH, HEIGHT = 1400, 1000


def shoot(page: Path, out: Path) -> list[dict]:
    """The plots section of ``page`` as a PNG at ``out`` (and the top of the page, its runs table and summary,
    at ``out`` with ``-top``); each plot's caption and displayed width."""
    with Chromium(WIDTH, HEIGHT) as br:
        br.goto(page.resolve().as_uri())
        br.screenshot(out.with_name(out.stem + "-top.png"))
        figs = br.eval("[...document.querySelectorAll('.plots figure')].map(f => ({caption: "
                       "f.querySelector('figcaption').innerText, shown: f.querySelector('img').width, "
                       "natural: f.querySelector('img').naturalWidth}))")
        br.eval("document.getElementById('plots').scrollIntoView()")
        br.screenshot(out)
    return figs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_prefix")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--before-ref", default="main")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        trees = {"before": extract_ref(args.before_ref, t / "before"), "after": REPO}
        for side, tree in trees.items():
            page = t / f"{side}.html"
            build(tree, args.runs, page)
            labels = [r["label"] for r in payload(page.read_text(encoding="utf-8"))["runs"]]
            figs = shoot(page, Path(f"{args.out_prefix}-{side}.png"))
            print(f"== {side}: {args.out_prefix}-{side}.png")
            print("labels: " + json.dumps(labels) + f" (longest {max(map(len, labels))} characters)")
            for f in figs:
                print(f"  {f['caption'][:60]!r}: drawn {f['natural']} px wide, shown {f['shown']} px")


if __name__ == "__main__":
    main()
