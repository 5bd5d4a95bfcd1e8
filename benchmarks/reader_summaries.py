"""The learned reader's held-out summary and importances (``benchmarks/fit_reader.py --learned``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from memlab.answer.reading_features import FEATURE_NAMES

#: Permutation importances are measured on every n-th group (the forest walks every row once per feature).
IMPORTANCE_EVERY = 4


def held_out_summary(df: Any) -> dict[str, Any]:
    """Per k: F1 [95% CI] per category and overall, abstain rates, n; and the predictions changed between the
    smallest and the largest k."""
    from memlab.eval.summary import category_summary

    out: dict[str, Any] = {}
    for k, g in df.groupby("k"):
        s = category_summary(g, metrics=("f1",))
        row = {grp: [round(float(s.loc[grp, c]), 4) for c in ("f1", "f1_lo", "f1_hi")] for grp in s.index}
        ab = g.kind == "abstain"
        row["abstain_rate_cat5"] = round(float(ab[g.category == 5].mean()), 4)
        row["abstain_rate_cat1_4"] = round(float(ab[g.category != 5].mean()), 4)
        row["n"] = int(len(g))
        out[int(k)] = row
    ks = sorted(out)
    a = df[df.k == ks[0]].set_index("qid").prediction
    b = df[df.k == ks[-1]].set_index("qid").prediction
    out[f"changed_k{ks[0]}_k{ks[-1]}"] = int((a != b.loc[a.index]).sum())
    return out


def importances(groups: list[Any], store: list[dict[str, Any]], idx: np.ndarray, m: Any,
                seed: int = 0) -> dict[str, float]:
    """Permutation importance of each sentence-forest feature: the drop in the mean official F1 of the
    best-scored sentence candidate per group when that feature's column is shuffled."""
    rng = np.random.default_rng(seed)
    live = [i for i in idx if groups[i].sents][::IMPORTANCE_EVERY]
    X = np.concatenate([np.stack([s.row for s in groups[i].sents]) for i in live])
    y = np.concatenate([groups[i].sent_f1 for i in live])
    starts = np.cumsum([0] + [len(groups[i].sents) for i in live])[:-1]

    def picked(sc: np.ndarray) -> float:
        return float(np.mean([y[a + int(np.argmax(sc[a:a + len(groups[i].sents)]))]
                              for a, i in zip(starts, live)]))

    base = picked(m.sentence.predict(X))
    out = {}
    for j, name in enumerate(FEATURE_NAMES):
        if np.ptp(X[:, j]) == 0:
            continue
        Xs = X.copy()
        Xs[:, j] = rng.permutation(Xs[:, j])
        out[name] = round(base - picked(m.sentence.predict(Xs)), 4)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
