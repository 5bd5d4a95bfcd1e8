"""Issue 23 before/after figures: notebooks 03/04/05 plots on conv-26, saved as small PNGs.

Usage: PYTHONPATH=<tree> python issue23_figures.py OUT_DIR SUFFIX RESULTS_DIR
Runs on both 901afdd (before) and current main (after); where the before tree lacks an API it falls back to the
notebook's own inline code of that commit.
"""
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import memlab  # noqa: E402
from memlab import attribution, plots, trace  # noqa: E402
from memlab.run.report import run_labels  # noqa: E402
from memlab.studies import reconcile_sweep  # noqa: E402

out, suffix, results = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
out.mkdir(parents=True, exist_ok=True)
sub = dict(conversations=["conv-26"])


def save(fig, name):
    fig = getattr(fig, "figure", fig)
    fig.savefig(out / f"{name}-{suffix}.png", dpi=100, bbox_inches="tight")  # as memlab saves its plots
    plt.close(fig)


arms = [memlab.subset("offline", **sub),
        memlab.subset("offline", **sub, name="offline-turns", extraction__extractor="turns"),
        memlab.subset("offline", **sub, name="offline-observations", extraction__extractor="observations")]
runs = [memlab.run_experiment(cfg, results=results, progress=False) for cfg in arms]
save(plots.f1_vs_tokens(dict(zip(run_labels(runs), runs))), "nb03-f1-vs-tokens")

run = runs[0]
att = attribution.attribute(trace.load(run.run_dir))
save(plots.attribution_bars({"offline": att}, n={"offline": run.summary["n"].to_dict()}), "nb04-attribution")

settings = [(0.95, 0.90, 0.80, 0.60), (0.80, 0.50, 0.50, 0.30)]
table = reconcile_sweep(arms[2], settings, results=results, policies=["merge-similar"])
if hasattr(plots, "reconcile_thresholds"):
    fig = plots.reconcile_thresholds(table)
else:  # 901afdd: notebook 05's inline plot
    labels = table.policy + " " + table.setting
    ax = table.assign(run=labels).plot(x="run", y=["rewritten", "skipped", "superseded", "near_duplicates"],
                                       kind="bar", figsize=(9, 4), rot=30)
    ax2 = ax.twinx()
    ax2.plot(range(len(table)), table["recall@10"], "ko-")
    ax2.set_ylabel("Recall@10")
    ax2.set_ylim(0, 1)
    fig = ax.figure
save(fig, "nb05-reconcile")
print([str(r.run_dir) for r in runs])
