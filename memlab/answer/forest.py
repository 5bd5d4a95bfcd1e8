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
        left, right = cat["left"].astype(np.int64), cat["right"].astype(np.int64)
        self.value = cat["value"].astype(float)
        self.leaf, self.nan_left = cat["leaf"].astype(bool), cat["nan_left"].astype(bool)
        self.roots = np.asarray(roots, dtype=np.int64)
        self.depth = depth
        # a leaf steps to itself whichever way its (never-met) test goes: the walk needs no leaf test per level
        idx = np.arange(len(self.leaf), dtype=np.int64)
        left[self.leaf], right[self.leaf] = idx[self.leaf], idx[self.leaf]
        self.child = np.column_stack([right, left]).ravel()  # node n's child: child[2n + went left]

    def predict(self, X: np.ndarray) -> np.ndarray:
        if not len(self.roots):
            return np.full(len(X), self.base)
        X = np.ascontiguousarray(X, dtype=float)
        flat, width = X.ravel(), X.shape[1]
        node = np.broadcast_to(self.roots, (len(X), len(self.roots))).copy()
        base = (np.arange(len(X), dtype=np.int64) * width)[:, None]  # row offsets: one flat gather per level
        nans = bool(np.isnan(flat).any())
        for _ in range(self.depth):
            x = flat[base + self.feature[node]]
            go_left = x <= self.threshold[node]
            if nans:  # a missing value goes the way the fit sent missing values at that node
                go_left = np.where(np.isnan(x), self.nan_left[node], go_left)
            node = self.child[2 * node + go_left]
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
