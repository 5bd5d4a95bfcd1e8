"""A sum of regression trees exported as plain arrays (the learned reader's forests; numpy only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class Forest:
    """A sum of regression trees (scikit-learn's HistGradientBoostingRegressor, exported as arrays).

    All trees are walked at once (one array of nodes, every tree's root offset), so a question's candidates
    cost one gather per tree level, not one per tree. A forest reads its features *by name*: ``layout`` names
    the columns of the rows it will be given (default: its own features), so a forest fit on fewer features
    (an older fit, or one fit without some) reads the same rows as one fit on all of them."""

    def __init__(self, spec: dict[str, Any], layout: Sequence[str] | None = None):
        self.base = float(spec["base"])
        self.features = list(spec["features"])
        layout = list(self.features if layout is None else layout)
        unknown = [n for n in self.features if n not in layout]
        if unknown:
            raise ValueError(f"forest: features {unknown} are not among this reader's features (refit with "
                             f"benchmarks/fit_reader.py)")
        cols = np.array([layout.index(n) for n in self.features] or [0], dtype=np.int64)
        parts = {k: [] for k in ("feature", "threshold", "left", "right", "value", "leaf", "nan_left")}
        roots, offset, depth = [], 0, 0
        for t in spec["trees"]:
            n = len(t["value"])
            roots.append(offset)
            for k in parts:
                v = np.asarray(t[k])
                parts[k].append(v + offset if k in ("left", "right") else v)
            offset += n
            depth = max(depth, _depth(t))
        cat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in parts.items()}
        self.feature = cols[cat["feature"].astype(np.int64)]
        self.threshold = cat["threshold"].astype(float)
        self.left, self.right = cat["left"].astype(np.int64), cat["right"].astype(np.int64)
        self.value = cat["value"].astype(float)
        self.leaf, self.nan_left = cat["leaf"].astype(bool), cat["nan_left"].astype(bool)
        self.roots = np.asarray(roots, dtype=np.int64)
        self.depth = depth

    def predict(self, X: np.ndarray) -> np.ndarray:
        if not len(self.roots):
            return np.full(len(X), self.base)
        node = np.broadcast_to(self.roots, (len(X), len(self.roots))).copy()
        rows = np.arange(len(X))[:, None]
        for _ in range(self.depth):
            x = X[rows, self.feature[node]]
            go_left = np.where(np.isnan(x), self.nan_left[node], x <= self.threshold[node])
            node = np.where(self.leaf[node], node, np.where(go_left, self.left[node], self.right[node]))
        return self.base + self.value[node].sum(axis=1)


def _depth(tree: dict[str, Any]) -> int:
    """The longest root-to-leaf path of one exported tree (in edges)."""
    left, right, leaf = tree["left"], tree["right"], tree["leaf"]
    best, stack = 0, [(0, 0)]
    while stack:
        n, d = stack.pop()
        if leaf[n]:
            best = max(best, d)
        else:
            stack += [(left[n], d + 1), (right[n], d + 1)]
    return best
