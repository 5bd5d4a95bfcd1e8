"""The learned reader's fit (`memlab.answer.learned`), used by ``benchmarks/fit_reader.py --learned``.

Every (question, k) group of the captured contexts is read once (`ExtractiveAnswerer.read`); each
candidate's answer is scored with the official F1 against the gold. Per fold (conversations held out):
the sentence forest is fit on the training conversations' candidates, the span forest on the windows of
their best sentences, the compose and abstain settings chosen on the training conversations by mean
official F1 over categories 1-5; the held-out conversations are then answered exactly as the reader
answers (`memlab.answer.learned.decide`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memlab.answer.base import ABSTAIN
from memlab.answer.extractive import ExtractiveAnswerer
from memlab.answer.learned import (
    ABSTAIN_FEATURES,
    SPAN_NAMES,
    FamilyModel,
    Forest,
    abstain_row,
    compose,
    multi_part_p,
    question_words,
    sentence_rows,
    span_rows,
)
from memlab.answer.reading_features import FEATURE_NAMES, QTYPE_NAMES, SEMANTIC_ABSTAIN
from memlab.answer.semantic import SEMANTIC_FEATURES, shared
from memlab.answer.typed_answers import YES_NO_FORMS, typed_answer, yes_no_question
from memlab.eval.ceiling import gold_parts
from memlab.eval.scoring import score_answer, stemmed_tokens

TOP, LONGEST = 3, 6
KS_PER_QUESTION = 2
FOREST = dict(max_iter=150, learning_rate=0.08, max_leaf_nodes=15, min_samples_leaf=40, l2_regularization=1.0)
COMPOSE_GRID = [(mx, ratio) for mx in (2, 3, 4, 5) for ratio in (0.0, 0.3, 0.5, 0.7, 0.85)]
THRESHOLDS = [round(x, 2) for x in np.arange(0.05, 1.0, 0.05)] + [1.01]
GATES = [0.3, 0.4, 0.5, 0.6, 0.7]
MIN_WORD_COUNT = 5
#: The category-5 (abstention) F1 the abstain threshold keeps on the training questions: today's reader's .583
#: (issue 36's floor) with a margin, since a held-out fold scatters around what training shows.
CAT5_FLOOR = 0.62
#: Fit the forests to each candidate's F1 minus its question's mean candidate F1 (the choice is within a
#: question: the level of F1 a question type reaches is no help in choosing among its candidates).
#: ``fit_reader.py --relative-target``; off in the shipped fit.
RELATIVE = False
#: Composition skips a part whose words repeat a part already said (``fit_reader.py --dedupe``).
DEDUPE = False
#: What the sentence forest learns: ``ceiling`` (the best official F1 any window of the sentence's novel words up to
#: ``LONGEST`` words, or all of them, could score: the forest picks the sentences the span forest then cuts, so
#: it should rank a sentence by the answer it *holds*) or ``f1`` (the F1 of all its novel words, the first fit's
#: target, which favours short sentences). ``fit_reader.py --sentence-target``.
SENTENCE_TARGET = "ceiling"
#: The sentence forest may read `SEMANTIC_FEATURES` (minilm question-sentence similarity); off: those columns are
#: left out of both forests' fits (``fit_reader.py --no-semantic``: the fit before them, for a paired comparison).
SEMANTIC = True
#: The span forest also scores windows of the sentence's own words (``kind_orig``; ``fit_reader.py --no-orig``).
ORIG = True


@dataclass
class Group:
    qi: int
    k: int
    reading: Any
    sents: list[Any]
    sent_f1: np.ndarray
    abstain_f1: float
    fallback: str
    windows: dict[int, list[Any]] = field(default_factory=dict)


def read_groups(store: list[dict[str, Any]], ks: list[int], reader: ExtractiveAnswerer) -> list[Group]:
    """Every (question, k) group read, its sentence rows with `SEMANTIC_FEATURES` (all texts embedded first, in
    large batches, through the machine cache)."""
    readings = [(i, k, reader.read(q["question"], q["contexts"][k], q["speakers"])) for i, q in enumerate(store)
                for k in ks]
    shared().warm([t for _, _, r in readings for t in (r.question, *(c.text for c in r.candidates))])
    out = []
    for i, k, r in readings:
        q = store[i]
        cat = int(q["category"])
        sents = sentence_rows(r, k, semantic=True)
        f1 = np.array([score_answer(s.answer, q["answer"], cat) for s in sents])
        out.append(Group(i, k, r, sents, f1, score_answer(ABSTAIN, q["answer"], cat), r.top_memory or ABSTAIN))
    return out


_TARGET: dict[int, np.ndarray] = {}


def sentence_target(g: Group, store: list[dict[str, Any]]) -> np.ndarray:
    """Each sentence candidate's training target (`SENTENCE_TARGET`), cached per group."""
    if SENTENCE_TARGET == "f1":
        return g.sent_f1
    key = id(g)
    if key not in _TARGET:
        q = store[g.qi]
        cat = int(q["category"])
        parts = [stemmed_tokens(p) for p in gold_parts(q["answer"], cat)] if cat != 5 else []
        out = g.sent_f1.copy()
        for j, s in enumerate(g.sents):
            if s.kind == "novel" and parts:
                toks = [stemmed_tokens(w) for w in g.reading.candidates[s.parent].novel[:24]]
                out[j] = max(out[j], sum(window_ceiling(toks, p, LONGEST) for p in parts) / len(parts))
        _TARGET[key] = out
    return _TARGET[key]


def window_ceiling(words: list[tuple[str, ...]], gold: tuple[str, ...], longest: int) -> float:
    """The best official token F1 against ``gold`` of a run of 1 to ``longest`` of ``words`` (each word's stemmed
    tokens); only runs that start and end on a word holding a gold token can be best, so only those are tried."""
    need = Counter(gold)
    hit = [i for i, w in enumerate(words) if any(t in need for t in w)]
    best = 0.0
    for a in hit:
        for b in hit:
            if b < a or b - a >= longest:
                continue
            toks = [t for w in words[a:b + 1] for t in w]
            same = sum((Counter(toks) & need).values())
            if same:
                best = max(best, 2 * same / (len(toks) + len(gold)))
    return best


def export_forest(est: Any) -> dict[str, Any]:
    """A fitted HistGradientBoostingRegressor as plain arrays (`memlab.answer.learned.Forest`)."""
    trees = []
    for (pred,) in est._predictors:
        n = pred.nodes
        trees.append({"feature": n["feature_idx"].astype(int).tolist(),
                      "threshold": [float(x) for x in n["num_threshold"]],
                      "left": n["left"].astype(int).tolist(), "right": n["right"].astype(int).tolist(),
                      "value": [float(x) for x in n["value"]], "leaf": n["is_leaf"].astype(bool).tolist(),
                      "nan_left": n["missing_go_to_left"].astype(bool).tolist()})
    return {"base": float(np.ravel(est._baseline_prediction)[0]), "trees": trees}


def fit_forest(X: np.ndarray, y: np.ndarray, names: list[str], seed: int = 0,
               drop: tuple[str, ...] = ()) -> tuple[Forest, dict[str, Any], Any]:
    """A forest fit on the columns of ``X`` (named ``names``) but ``drop``; it reads rows of all ``names``."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    keep = [j for j, n in enumerate(names) if n not in drop]
    est = HistGradientBoostingRegressor(random_state=seed, **FOREST).fit(X[:, keep], y)
    spec = dict(export_forest(est), features=[names[j] for j in keep])
    return Forest(spec, names), spec, est


def dropped() -> tuple[str, ...]:
    """The features the forests are fit without (`SEMANTIC` off: the semantic ones)."""
    return () if SEMANTIC else SEMANTIC_FEATURES


def span_table(groups: list[Group], store: list[dict[str, Any]], idx: np.ndarray, forest: Forest,
               top: int = TOP, longest: int = LONGEST,
               orig: bool | None = None) -> tuple[list[list[Any]], np.ndarray, np.ndarray]:
    """Each group's span candidates (sentence-scored by ``forest``), their rows and official F1."""
    allX = [g for g in (groups[i] for i in idx) if g.sents]
    if allX:
        X = np.concatenate([np.stack([s.row for s in g.sents]) for g in allX])
        sc = forest.predict(X)
        a = 0
        for g in allX:
            for s in g.sents:
                s.score = float(sc[a])
                a += 1
    spans, rows, f1 = [], [], []
    for i in idx:
        g = groups[i]
        if not g.sents:
            spans.append([])
            continue
        q = store[g.qi]
        order = np.argsort(-np.array([s.score for s in g.sents]), kind="stable")
        sp = span_rows(g.reading, g.sents, order, top, longest, ORIG if orig is None else orig)
        spans.append(sp)
        for s in sp:
            rows.append(s.row)
            f1.append(_f1(g, q, s.answer))
    return spans, np.array(rows), np.array(f1)


_F1: dict[tuple[int, str], float] = {}


def _f1(g: Group, q: dict[str, Any], answer: str) -> float:
    key = (g.qi, answer)
    if key not in _F1:
        _F1[key] = score_answer(answer, q["answer"], int(q["category"]))
    return _F1[key]


def thin(groups: list[Group], idx: np.ndarray, per_question: int | None = None, seed: int = 0) -> np.ndarray:
    """``per_question`` of each question's k's, drawn at random (the contexts of one question at several k
    overlap, so the fit keeps every question and half the rows: CPU is what limits the fit)."""
    per_question = KS_PER_QUESTION if per_question is None else per_question
    rng = np.random.default_rng(seed)
    by_q: dict[int, list[int]] = {}
    for i in idx:
        by_q.setdefault(groups[i].qi, []).append(int(i))
    keep = [j for q in sorted(by_q) for j in (by_q[q] if len(by_q[q]) <= per_question else
                                              rng.choice(by_q[q], size=per_question, replace=False).tolist())]
    return np.array(sorted(keep), dtype=int)


def fit_family(groups: list[Group], store: list[dict[str, Any]], train: np.ndarray,
               log: Any = None) -> tuple[FamilyModel, dict[str, Any]]:
    """Fit every part of a family's reader on the ``train`` groups; (model, its JSON spec)."""
    t0 = time.perf_counter()
    train = thin(groups, train)
    tr = [i for i in train if groups[i].sents]
    Xs = np.concatenate([np.stack([s.row for s in groups[i].sents]) for i in tr])
    ys = np.concatenate([sentence_target(groups[i], store) for i in tr])
    ys -= np.concatenate([np.full(len(groups[i].sents), sentence_target(groups[i], store).mean() if RELATIVE
                                  else 0.0) for i in tr])
    sent, sent_spec, _ = fit_forest(Xs, ys, list(FEATURE_NAMES), drop=dropped())
    spans, Xp, yp = span_table(groups, store, train, sent)
    if RELATIVE:
        a = 0
        for sp in spans:
            yp[a:a + len(sp)] -= yp[a:a + len(sp)].mean() if sp else 0.0
            a += len(sp)
    rng = np.random.default_rng(0)
    keep = rng.choice(len(Xp), size=min(len(Xp), 400_000), replace=False)
    span, span_spec, _ = fit_forest(Xp[keep], yp[keep], list(SPAN_NAMES), drop=dropped())
    sc = span.predict(Xp)
    a = 0
    for sp in spans:
        for s in sp:
            s.score = float(sc[a])
            a += 1
    t1 = time.perf_counter()
    names = tuple(f"q_{n}" for n in QTYPE_NAMES) + tuple(n for n in ABSTAIN_FEATURES if SEMANTIC or
                                                         n not in SEMANTIC_ABSTAIN)
    m = FamilyModel(sent, span, TOP, LONGEST, 1, 0.0, (), np.zeros(len(names)), 0.0, 1.01, names, compose_dedupe=DEDUPE,
                    semantic=SEMANTIC, orig_windows=ORIG)
    m = choose_compose(groups, store, train, spans, m)
    m = fit_abstain(groups, store, train, spans, m)
    yes_no = fit_yes_no(store, {groups[i].qi for i in train})
    m.yes_no, m.choice = yes_no["answer"], True
    spec = {"sentence": sent_spec, "span": span_spec, "top": TOP, "longest": LONGEST,
            "relative_target": RELATIVE,
            "compose": {"max": m.compose_max, "ratio": m.compose_ratio, "types": list(m.compose_types),
                        "dedupe": m.compose_dedupe,
                        **({"multi": m.multi} if m.multi is not None else {})},
            "abstain": {"features": list(m.abstain_names), "coef": m.abstain_coef.tolist(),
                        "intercept": m.abstain_intercept, "threshold": m.abstain_threshold}, "yes_no": yes_no,
            "choice": True}
    if log:
        print(f"    fit on {len(train)} groups ({len(Xs)} sentences, {len(keep)} spans) in {t1 - t0:.0f} s; "
              f"compose {dict((k, v) for k, v in spec['compose'].items() if k != 'multi')}, gate "
              f"{None if m.multi is None else m.multi['threshold']}, abstain threshold {m.abstain_threshold}",
              file=log, flush=True)
    return m, spec


def _answers(groups: list[Group], store: list[dict[str, Any]], idx: np.ndarray, spans: list[list[Any]],
             m: FamilyModel, with_p: bool = True) -> list[tuple[str, float, float]]:
    """(answer, its F1, the abstain probability: NaN when no person is named or ``with_p`` is off) of each
    group, without the abstain decision."""
    out = []
    for i, sp in zip(idx, spans):
        g = groups[i]
        q = store[g.qi]
        if not sp:
            out.append((g.fallback, _f1(g, q, g.fallback), math.nan))
            continue
        order = np.argsort(-np.array([s.score for s in sp]), kind="stable")
        ans, _ = compose(sp, order, g.reading, m)
        p = math.nan
        if with_p and g.reading.people:
            z = abstain_row(g.reading, sp, m.abstain_names, g.sents) @ m.abstain_coef + m.abstain_intercept
            p = 1.0 / (1.0 + math.exp(-z))
        out.append((ans, _f1(g, q, ans), p))
    return out


def fit_yes_no(store: list[dict[str, Any]], train: set[int]) -> dict[str, Any]:
    """The answer to a yes/no question (`memlab.answer.typed_answers.yes_no_question`; categories 1-4): of
    `YES_NO_FORMS`, the one whose mean official F1 on the ``train`` questions' golds is highest, with each form's
    mean and n (ties: the earlier form)."""
    qs = [store[i] for i in sorted(train) if int(store[i]["category"]) != 5 and yes_no_question(store[i]["question"])]
    means = {a: float(np.mean([score_answer(a, q["answer"], int(q["category"])) for q in qs])) if qs else 0.0
             for a in YES_NO_FORMS}
    return {"answer": max(YES_NO_FORMS, key=lambda a: means[a]), "n": len(qs),
            "mean_f1": {a: round(v, 4) for a, v in means.items()}}


def fit_multi_gate(groups: list[Group], store: list[dict[str, Any]], idx: np.ndarray) -> dict[str, Any]:
    """A logistic over the training questions' words: does the question ask for several things (LoCoMo's
    category 1, multi-hop, whose official F1 credits each gold part's best-matching predicted part)?"""
    from sklearn.linear_model import LogisticRegression

    qis = sorted({groups[i].qi for i in idx})
    docs = [set(question_words(store[q]["question"])) for q in qis]
    counts: dict[str, int] = {}
    for d in docs:
        for w in d:
            counts[w] = counts.get(w, 0) + 1
    vocab = sorted(w for w, c in counts.items() if c >= MIN_WORD_COUNT)
    col = {w: j for j, w in enumerate(vocab)}
    X = np.zeros((len(docs), len(vocab)))
    for i, d in enumerate(docs):
        for w in d:
            if w in col:
                X[i, col[w]] = 1.0
    y = np.array([int(store[q]["category"]) == 1 for q in qis])
    if len(set(y.tolist())) < 2:
        return {"vocab": {}, "intercept": -10.0 if not y.any() else 10.0, "threshold": 0.5}
    lr = LogisticRegression(C=0.5, max_iter=3000).fit(X, y)
    return {"vocab": {w: round(float(c), 5) for w, c in zip(vocab, lr.coef_[0]) if abs(c) > 1e-4},
            "intercept": round(float(lr.intercept_[0]), 5), "threshold": 0.5}


def choose_compose(groups, store, idx, spans, m: FamilyModel) -> FamilyModel:
    """The compose settings (multi-part gate threshold, most parts, score ratio) of the grid with the best mean
    F1 on the training groups; only questions the gate can open are re-answered, the rest keep one span."""
    gate = fit_multi_gate(groups, store, idx)
    p = {i: multi_part_p(groups[i].reading.question, gate) for i in idx}
    touch = [j for j, i in enumerate(idx) if spans[j] and p[i] > min(GATES)]
    sub_idx, sub_spans = [idx[j] for j in touch], [spans[j] for j in touch]
    m.multi, m.compose_max = None, 1
    best = float(np.sum([f for _, f, _ in _answers(groups, store, sub_idx, sub_spans, m, with_p=False)]))
    arg: tuple[int, float, float | None] = (1, 0.0, None)
    for t in GATES:
        for mx, ratio in COMPOSE_GRID:
            if mx == 1:
                continue
            m.compose_max, m.compose_ratio, m.multi = mx, ratio, dict(gate, threshold=t)
            v = float(np.sum([f for _, f, _ in _answers(groups, store, sub_idx, sub_spans, m, with_p=False)]))
            if v > best + 1e-9:
                best, arg = v, (mx, ratio, t)
    m.compose_max, m.compose_ratio = arg[0], arg[1]
    m.multi = None if arg[2] is None else dict(gate, threshold=arg[2])
    m.compose_types = ()
    return m


def fit_abstain(groups, store, idx, spans, m: FamilyModel) -> FamilyModel:
    """The abstain rule: a logistic for "saying Not mentioned scores more than the answer", its threshold the
    one with the best mean F1 over categories 1-4 among those keeping category 5's F1 at or above
    ``CAT5_FLOOR`` on the training groups (the highest category-5 F1 when none does)."""
    from sklearn.linear_model import LogisticRegression

    ans = _answers(groups, store, idx, spans, m)
    named = [j for j, i in enumerate(idx) if groups[i].reading.people and spans[j]]
    X = np.stack([abstain_row(groups[idx[j]].reading, spans[j], m.abstain_names, groups[idx[j]].sents)
                  for j in named])
    y = np.array([groups[idx[j]].abstain_f1 > ans[j][1] for j in named])
    if len(set(y.tolist())) < 2:  # one class only (a tiny fit): never abstain, or abstain whenever a person is named
        m.abstain_coef, m.abstain_intercept = np.zeros(X.shape[1]), 10.0 if y.all() else -10.0
        m.abstain_threshold = 0.5
        return m
    lr = LogisticRegression(C=1.0, max_iter=2000).fit(X, y)
    m.abstain_coef, m.abstain_intercept = lr.coef_[0].astype(float), float(lr.intercept_[0])
    p = np.full(len(idx), np.nan)
    p[named] = lr.predict_proba(X)[:, 1]
    cat5 = np.array([int(store[groups[i].qi]["category"]) == 5 for i in idx])
    f_ans = np.array([a[1] for a in ans])
    f_abs = np.array([groups[i].abstain_f1 for i in idx])
    best, arg, best5, arg5 = -1.0, 1.01, -1.0, 1.01
    for t in THRESHOLDS:
        f = np.where(np.nan_to_num(p, nan=-1.0) > t, f_abs, f_ans)
        f14, f5 = float(f[~cat5].mean()) if (~cat5).any() else 0.0, float(f[cat5].mean()) if cat5.any() else 1.0
        if f5 >= CAT5_FLOOR and f14 > best + 1e-9:
            best, arg = f14, t
        if f5 > best5 + 1e-9:
            best5, arg5 = f5, t
    m.abstain_threshold = float(arg if best >= 0 else arg5)
    return m


def predict_family(groups, store, idx: np.ndarray, m: FamilyModel) -> list[tuple[str, str, float]]:
    """(kind, prediction, official F1) of each group in ``idx``, as `memlab.answer.learned.decide` answers."""
    spans, _, _ = span_table(groups, store, idx, m.sentence, m.top, m.longest, m.orig_windows)
    Xp = [s.row for sp in spans for s in sp]
    if Xp:
        sc = m.span.predict(np.stack(Xp))
        a = 0
        for sp in spans:
            for s in sp:
                s.score = float(sc[a])
                a += 1
    out = []
    for i, (ans, f, p) in zip(idx, _answers(groups, store, idx, spans, m)):
        g = groups[i]
        if not g.sents:
            out.append(("fallback", ans, f))
        elif not math.isnan(p) and p > m.abstain_threshold:
            out.append(("abstain", ABSTAIN, g.abstain_f1))
        elif (typed := typed_answer(g.reading, m.yes_no, m.choice)) is not None:
            out.append(("typed", typed[0], _f1(g, store[g.qi], typed[0])))
        else:
            out.append(("span", ans, f))
    return out


FAMILY_CAPTURE: dict[str, tuple[str, dict[str, Any]]] = {
    "offline": ("offline", {}),
    "observations": ("offline", {"extraction.name": "observations"}),
    "turns": ("offline", {"extraction.name": "turns"}),
    "retrieval-best": ("retrieval-best", {}),
}
"""The config (and overrides) whose contexts each reader family is fit on."""


def cross_validate(groups: list[Group], store: list[dict[str, Any]], folds: list[list[str]],
                   log: Any = None) -> Any:
    """Held-out predictions of every group (each fold answered by the reader fit on the other folds)."""
    import pandas as pd

    conv_of = np.array([store[g.qi]["conversation_id"] for g in groups])
    res: dict[int, tuple[str, str, float]] = {}
    for fi, test in enumerate(folds):
        if log:
            print(f"fold {fi + 1}/{len(folds)}: held out {', '.join(test)}", file=log, flush=True)
        train = np.flatnonzero(~np.isin(conv_of, test))
        held = np.flatnonzero(np.isin(conv_of, test))
        m, _ = fit_family(groups, store, train, log=log)
        for i, out in zip(held, predict_family(groups, store, held, m)):
            res[int(i)] = out
        if log:
            f = np.array([res[int(i)][2] for i in held])
            c = np.array([int(store[groups[i].qi]["category"]) for i in held])
            print(f"    held out: F1 1-4 {f[c != 5].mean():.3f}, multi-hop {f[c == 1].mean():.3f}, "
                  f"category 5 {f[c == 5].mean():.3f} (n {len(f)})", file=log, flush=True)
    return pd.DataFrame([{"qid": store[g.qi]["qid"], "conversation_id": store[g.qi]["conversation_id"],
                          "category": store[g.qi]["category"], "k": g.k, "kind": res[i][0],
                          "prediction": res[i][1], "f1": res[i][2]} for i, g in enumerate(groups)])


from reader_summaries import held_out_summary, importances  # noqa: E402,F401  (fit_reader reads them here)
