"""Fit the offline reader's weights by leave-conversations-out cross-validation; write the shipped default.

    python benchmarks/fit_reader.py [--folds 5] [--ks 5 10 20 40] [--cache results/.cache/fit_reader]
                                    [--write memlab/answer/reader_weights.py]

1. Retrieve once: the `offline` config (turns+observations, tfidf-lsa hybrid, participant boost) is
   run with a capturing arm that stores each question's context at every k (cached as a pickle).
2. Read once: each context is read by `ExtractiveAnswerer.read` into candidates with their features
   (weights play no part), and each candidate's answer is scored with the official LoCoMo F1
   (`memlab.eval.scoring.score_answer`) against the gold answer.
3. Fit: coordinate descent over a grid per weight, maximising the mean F1 over all questions
   (categories 1-5, so abstaining is paid for on 1-4 and rewarded on 5) pooled over the k's; the
   choice for a weight vector is `ExtractiveAnswerer.choose`'s, vectorised (checked against it).
4. Cross-validate: conversations in ``--folds`` groups; each group's questions are answered with the
   weights fit on the other groups. Only these held-out figures are reported (per k, per category,
   with clustered bootstrap CIs), with the share of predictions that change between the smallest
   and largest k and the abstain rates. The weights fit on all conversations are written to
   ``--write`` (the reader's default).

``--learned FAMILY`` fits the learned scorer instead (`memlab.answer.learned`; the fit is in
``benchmarks/reader_learning.py``) on that family's contexts (`reader_learning.FAMILY_CAPTURE`), with the
same leave-conversations-out folds; only held-out figures are reported (``--held-out CSV`` keeps every
held-out prediction), then the family fit on all conversations is stored in ``--write-model`` with its FIT:

    python benchmarks/fit_reader.py --learned offline --write-model memlab/answer/reader_model.json \\
        --held-out results/.cache/fit_reader/heldout-offline.csv
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import pprint
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from memlab.answer.base import ABSTAIN
from memlab.answer.extractive import FEATURES, PENALTIES, WEIGHT_OF, ExtractiveAnswerer
from memlab.answer.learned import FAMILIES
from memlab.answer.reader_weights import WEIGHTS
from memlab.eval.scoring import score_answer
from memlab.eval.summary import category_summary

sys.path.insert(0, str(Path(__file__).parent))
from reader_capture import capture, capture_tag  # noqa: E402  (1. retrieve once)

GRID: dict[str, list[float]] = {
    "rank_weight": [0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0],
    "temporal_rank_weight": [0.0, 0.25, 0.5, 1.0, 2.0, 3.0],
    "phrase_bonus": [0.0, 1.0, 2.0, 4.0, 6.0],
    "memory_weight": [-0.5, -0.25, 0.0, 0.25, 0.5, 1.0],
    "agreement_weight": [-1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0],
    "speaker_weight": [0.0, 0.5, 1.0, 2.0, 4.0],
    "date_weight": [0.0, 1.0, 2.0, 4.0],
    "length_weight": [-2.0, -1.0, -0.5, 0.0, 0.5, 1.0],
    "abstain_margin": [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 1e6],
}
PASSES = 4


# ------------------------------------------------------------------------------------ 2. read once
@dataclass
class Table:
    """Every (question, k) group's candidates stacked: features, F1 of each candidate's answer."""

    X: np.ndarray
    f1: np.ndarray
    start: np.ndarray
    count: np.ndarray
    abstain_f1: np.ndarray
    fallback_f1: np.ndarray
    has_people: np.ndarray
    is_list: np.ndarray
    qi: np.ndarray
    k: np.ndarray
    answers: list[list[str]]
    ranks: list[np.ndarray]


def read_all(store: list[dict[str, Any]], ks: list[int], reader: ExtractiveAnswerer) -> Table:
    rows: list[np.ndarray] = []
    f1s: list[float] = []
    meta: dict[str, list[Any]] = {n: [] for n in ("start", "count", "abstain_f1", "fallback_f1", "has_people",
                                                  "is_list", "qi", "k")}
    answers: list[list[str]] = []
    ranks: list[np.ndarray] = []
    cache: dict[tuple[int, str], float] = {}
    n = 0

    def f1(i: int, pred: str) -> float:
        key = (i, pred)
        if key not in cache:
            q = store[i]
            cache[key] = score_answer(pred, q["answer"], int(q["category"]))
        return cache[key]

    for i, q in enumerate(store):
        for k in ks:
            r = reader.read(q["question"], q["contexts"][k], q["speakers"])
            meta["start"].append(n)
            meta["count"].append(len(r.candidates))
            meta["abstain_f1"].append(f1(i, ABSTAIN))
            meta["fallback_f1"].append(f1(i, r.top_memory) if r.top_memory else f1(i, ABSTAIN))
            meta["has_people"].append(bool(r.people))
            meta["is_list"].append(r.list_question and not r.temporal)
            meta["qi"].append(i)
            meta["k"].append(k)
            answers.append([c.answer for c in r.candidates])
            ranks.append(np.array([c.rank for c in r.candidates]))
            for c in r.candidates:
                rows.append(c.features)
                f1s.append(f1(i, c.answer))
            n += len(r.candidates)
    return Table(X=np.array(rows), f1=np.array(f1s), answers=answers, ranks=ranks,
                 **{m: np.array(v) for m, v in meta.items()})


def weight_vector(w: dict[str, float]) -> np.ndarray:
    return ExtractiveAnswerer(**{"scorer": "weights", **w}).weight_vector()


def predict(t: Table, w: dict[str, float], groups: np.ndarray, store: list[dict[str, Any]], list_spans: int,
            list_cache: dict[tuple[int, tuple[int, ...]], float]) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """F1 per group in ``groups`` and (kind, answer) as `ExtractiveAnswerer.choose` would decide (vectorised:
    a group's best candidate is the first one reaching its maximum score, as choose's stable sort)."""
    vec = weight_vector(w)
    spk = FEATURES.index("speaker")
    score = t.X @ vec
    content = score - t.X[:, spk] * vec[spk]
    own = t.X[:, spk] > 0
    out = np.empty(len(groups))
    kinds = np.empty(len(groups), dtype=object)
    full = t.count[groups] > 0
    out[~full] = t.fallback_f1[groups[~full]]
    kinds[~full] = "fallback"
    g = groups[full]
    st = t.start[g]
    seg = np.repeat(np.arange(len(g)), t.count[g])
    idx = np.concatenate([np.arange(a, a + n) for a, n in zip(st, t.count[g])]) if len(g) else np.zeros(0, int)
    sc, co, ow = score[idx], content[idx], own[idx]
    best_c = np.maximum.reduceat(co, np.r_[0, np.cumsum(t.count[g])[:-1]]) if len(g) else np.zeros(0)
    best_own = np.maximum.reduceat(np.where(ow, co, -np.inf), np.r_[0, np.cumsum(t.count[g])[:-1]]) \
        if len(g) else np.zeros(0)
    abstain = t.has_people[g] & ((best_own == -np.inf) | (best_c - best_own > w["abstain_margin"]))
    best_s = np.maximum.reduceat(sc, np.r_[0, np.cumsum(t.count[g])[:-1]]) if len(g) else np.zeros(0)
    hit = np.flatnonzero(sc >= best_s[seg])
    _, first = np.unique(seg[hit], return_index=True)
    chosen = idx[hit[first]]
    res = np.where(abstain, t.abstain_f1[g], t.f1[chosen])
    kind = np.where(abstain, "abstain", "span").astype(object)
    for j in np.flatnonzero(~abstain & t.is_list[g] & (list_spans > 1)):
        gg, a, n = int(g[j]), int(st[j]), int(t.count[g][j])
        order = np.argsort(-score[a:a + n], kind="stable")
        picked, seen = [], set()
        for c in order:
            r = int(t.ranks[gg][c])
            if r in seen:
                continue
            seen.add(r)
            picked.append(int(c))
            if len(picked) == list_spans:
                break
        key = (gg, tuple(picked))
        if key not in list_cache:
            q = store[t.qi[gg]]
            list_cache[key] = score_answer(", ".join(t.answers[gg][c] for c in picked), q["answer"],
                                           int(q["category"]))
        res[j] = list_cache[key]
        kind[j] = ("list", ", ".join(t.answers[gg][c] for c in picked))
    out[full] = res
    kinds[full] = kind
    preds: list[tuple[str, str]] = []
    ci = 0
    for j, gr in enumerate(groups):
        kd = kinds[j]
        if kd == "fallback":
            preds.append(("fallback", ""))
            continue
        if isinstance(kd, tuple):
            preds.append(kd)
        elif kd == "abstain":
            preds.append(("abstain", ABSTAIN))
        else:
            preds.append(("span", t.answers[gr][int(chosen[ci] - t.start[gr])]))
        ci += 1
    return out, preds


def fit(t: Table, groups: np.ndarray, store: list[dict[str, Any]], start: dict[str, float],
        list_spans: int, log: Any = None) -> tuple[dict[str, float], float]:
    w = dict(start)
    lc: dict[tuple[int, tuple[int, ...]], float] = {}
    best = predict(t, w, groups, store, list_spans, lc)[0].mean()
    for p in range(PASSES):
        moved = False
        for name, grid in GRID.items():
            for v in grid:
                if v == w[name]:
                    continue
                trial = dict(w, **{name: v})
                m = predict(t, trial, groups, store, list_spans, lc)[0].mean()
                if m > best + 1e-9:
                    best, w, moved = m, trial, True
        if log:
            print(f"    pass {p + 1}: mean F1 {best:.4f}  {w}", file=log, flush=True)
        if not moved:
            break
    return w, float(best)


# ------------------------------------------------------------------------------------ 4. report
def write_weights(path: Path, w: dict[str, float], fit_info: dict[str, Any]) -> None:
    lines = ['"""The offline reader\'s shipped weights, written by ``benchmarks/fit_reader.py`` (do not edit by hand).',
             "", "Fit on all LoCoMo-10 conversations after leave-conversations-out cross-validation; ``FIT`` holds",
             "the held-out figures of that cross-validation (the weights of each fold were fit without its",
             'conversations) and how the fit was run.', '"""', "", "WEIGHTS: dict[str, float] = {"]
    lines += [f"    {k!r}: {float(v)!r}," for k, v in w.items()] + ["}", ""]
    lines += ["FIT: dict[str, object] = " + pprint.pformat(fit_info, width=100, sort_dicts=False), ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def learned_main(args: argparse.Namespace) -> None:
    """``--learned FAMILY``: cross-validate the learned reader on the family's contexts, then fit it on all
    conversations and (``--write-model``) store it in the model file beside the other families."""
    sys.path.insert(0, str(Path(__file__).parent))
    import reader_learning as rl

    rl.RELATIVE, rl.DEDUPE, rl.CAT5_FLOOR = args.relative_target, args.dedupe, args.cat5_floor
    rl.SENTENCE_TARGET, rl.KS_PER_QUESTION = args.sentence_target, args.ks_per_question
    rl.SEMANTIC, rl.ORIG = not args.no_semantic, not args.no_orig
    config, over = rl.FAMILY_CAPTURE[args.learned]
    over = {**over, **dict(kv.split("=", 1) for kv in args.override)}
    over = {k: {"true": True, "false": False}.get(v, v) if isinstance(v, str) else v for k, v in over.items()}
    ks = sorted(args.ks)
    t0 = time.perf_counter()
    store = capture(ks, Path(args.cache), over or None, config=config)
    tag = capture_tag(over, config)[1]
    # keyed by the reading code too: a changed reader never reuses candidates read by an older one
    src = hashlib.sha256(b"".join((Path(rl.__file__).parents[1] / "memlab" / "answer" / f).read_bytes() for f in (
        "extractive.py", "learned.py", "reading_features.py", "semantic.py"))).hexdigest()[:10]
    read_cache = Path(args.cache) / f"read-{config}-k{'-'.join(map(str, ks))}{'-' + tag if tag else ''}-{src}.pkl"
    if read_cache.is_file():  # the candidates of these contexts, read by this reader before
        with open(read_cache, "rb") as f:
            groups = pickle.load(f)
    else:
        groups = rl.read_groups(store, ks, ExtractiveAnswerer(scorer="weights", list_spans=args.list_spans))
        with open(read_cache, "wb") as f:
            pickle.dump(groups, f)
    print(f"{args.learned}: {len(store)} questions, {len(groups)} (question, k) groups read in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    convs = sorted({q["conversation_id"] for q in store})
    folds = [convs[i::args.folds] for i in range(args.folds)]
    if args.from_held_out:  # the cross-validation of these settings, written before by --held-out
        df = pd.read_csv(args.from_held_out, keep_default_na=False)
        if len(df) != len(groups) or set(df.qid) != {q["qid"] for q in store}:
            sys.exit(f"{args.from_held_out}: {len(df)} rows, not the {len(groups)} (question, k) groups of this "
                     "capture")
    else:
        df = rl.cross_validate(groups, store, folds, log=sys.stdout)
    if args.held_out:
        df.to_csv(args.held_out, index=False)
    summary = rl.held_out_summary(df)
    if args.cv_only:
        print(json.dumps({"command": "python benchmarks/fit_reader.py " + " ".join(sys.argv[1:]), "held_out": summary},
                         indent=1))
        return
    m, spec = rl.fit_family(groups, store, np.arange(len(groups)), log=sys.stdout)
    info = {"command": "python benchmarks/fit_reader.py " + " ".join(sys.argv[1:]), "config": config,
            "overrides": over, "ks": ks, "folds": folds, "objective": "mean official F1 of the chosen answer, "
            "categories 1-5, pooled over ks; conversations held out by fold", "held_out": summary,
            "importances": rl.importances(groups, store, np.arange(len(groups)), m),
            **({"held_out_from": args.from_held_out} if args.from_held_out else {})}
    print(json.dumps(info, indent=1))
    if args.write_model:
        path = Path(args.write_model)
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"families": {}}
        data["families"][args.learned] = dict(spec, fit=info)
        path.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
        print(f"wrote family {args.learned!r} to {path}")


def rl_default(name: str) -> Any:
    """A default of `reader_learning` (the learned fit's settings live there, once)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import reader_learning

    return getattr(reader_learning, name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--learned", choices=FAMILIES, default=None,
                    help="fit the learned reader (memlab.answer.learned) of this family instead of the weights")
    ap.add_argument("--override", nargs="*", default=[], help="config overrides KEY=VALUE for the capture")
    ap.add_argument("--write-model", default=None, help="with --learned: the model file to store the family in")
    ap.add_argument("--relative-target", action="store_true",
                    help="with --learned: fit the forests to F1 minus the question's mean candidate F1")
    ap.add_argument("--sentence-target", choices=("ceiling", "f1"), default="ceiling",
                    help="with --learned: what the sentence forest learns (reader_learning.SENTENCE_TARGET)")
    ap.add_argument("--ks-per-question", type=int, default=rl_default("KS_PER_QUESTION"),
                    help="with --learned: how many of a question's k's the forests are fit on (CPU: the rows)")
    ap.add_argument("--dedupe", action="store_true", help="with --learned: composition skips repeated words")
    ap.add_argument("--no-semantic", action="store_true", help="with --learned: fit without the minilm features")
    ap.add_argument("--no-orig", action="store_true", help="with --learned: no windows of the sentence's own words")
    ap.add_argument("--cat5-floor", type=float, default=0.62,
                    help="with --learned: the category-5 F1 the abstain threshold keeps on the training questions")
    ap.add_argument("--from-held-out", default=None,
                    help="with --learned: take the held-out predictions from this CSV (an earlier --held-out of the "
                         "same settings) instead of cross-validating again")
    ap.add_argument("--cv-only", action="store_true", help="with --learned: report the held-out figures only")
    ap.add_argument("--held-out", default=None, help="with --learned: write each held-out prediction to this CSV")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--ks", type=int, nargs="+", default=[5, 10, 20, 40])
    ap.add_argument("--cache", default="results/.cache/fit_reader")
    ap.add_argument("--write", default=None, help="write the weights fit on all conversations to this module")
    ap.add_argument("--list-spans", type=int, default=3)
    args = ap.parse_args()
    if args.learned:
        return learned_main(args)
    t0 = time.perf_counter()
    store = capture(sorted(args.ks), Path(args.cache))
    t1 = time.perf_counter()
    reader = ExtractiveAnswerer(scorer="weights", list_spans=args.list_spans)
    t = read_all(store, sorted(args.ks), reader)
    t2 = time.perf_counter()
    print(f"contexts {t1 - t0:.1f} s, read {t2 - t1:.1f} s: {len(t.start)} (question, k) groups, "
          f"{len(t.X)} candidates", flush=True)
    _check_against_reader(t, store, sorted(args.ks), dict(WEIGHTS), args.list_spans)
    convs = sorted({q["conversation_id"] for q in store})
    folds = [convs[i::args.folds] for i in range(args.folds)]
    conv_of = np.array([store[i]["conversation_id"] for i in t.qi])
    held: dict[int, tuple[np.ndarray, list[tuple[str, str]]]] = {}
    fold_weights = []
    for fi, test in enumerate(folds):
        train_g = np.flatnonzero(~np.isin(conv_of, test))
        test_g = np.flatnonzero(np.isin(conv_of, test))
        print(f"fold {fi + 1}/{len(folds)}: held out {', '.join(test)}", flush=True)
        w, m = fit(t, train_g, store, dict(WEIGHTS), args.list_spans, log=sys.stdout)
        fold_weights.append(w)
        f, p = predict(t, w, test_g, store, args.list_spans, {})
        for g, fv, pv in zip(test_g, f, p):
            held[int(g)] = (fv, pv)
    rows = []
    for g in range(len(t.start)):
        q = store[t.qi[g]]
        rows.append({"qid": q["qid"], "conversation_id": q["conversation_id"], "category": q["category"],
                     "k": int(t.k[g]), "f1": float(held[g][0]), "kind": held[g][1][0], "prediction": held[g][1][1]})
    df = pd.DataFrame(rows)
    summary = {}
    for k, g in df.groupby("k"):
        s = category_summary(g, metrics=("f1",))
        summary[int(k)] = {grp: [round(float(s.loc[grp, c]), 4) for c in ("f1", "f1_lo", "f1_hi")]
                           for grp in ("1", "overall 1-4", "overall 1-5")}
        ab = g.assign(abst=g.kind == "abstain")
        summary[int(k)]["abstain_rate_cat5"] = round(float(ab[ab.category == 5].abst.mean()), 4)
        summary[int(k)]["abstain_rate_cat1_4"] = round(float(ab[ab.category != 5].abst.mean()), 4)
    kmin, kmax = min(args.ks), max(args.ks)
    a = df[df.k == kmin].set_index("qid").prediction
    b = df[df.k == kmax].set_index("qid").prediction
    changed = float((a != b.loc[a.index]).mean())
    print("\nheld-out (cross-validated) F1 [95% CI] by k:  multi-hop | overall 1-4 | overall 1-5 | abstain 5 / 1-4")
    for k, s in summary.items():
        print(f"  k={k:<3d} {s['1']}  {s['overall 1-4']}  {s['overall 1-5']}  "
              f"{s['abstain_rate_cat5']:.3f} / {s['abstain_rate_cat1_4']:.3f}")
    print(f"predictions that change between k={kmin} and k={kmax}: {changed:.1%}")
    print("fold weights:")
    for w in fold_weights:
        print("  ", w)
    all_g = np.arange(len(t.start))
    w_all, m_all = fit(t, all_g, store, dict(WEIGHTS), args.list_spans, log=sys.stdout)
    print(f"weights fit on all conversations (in-sample mean F1 1-5 over k: {m_all:.4f}): {w_all}")
    info = {"command": "python benchmarks/fit_reader.py " + " ".join(sys.argv[1:]), "config": "offline",
            "ks": sorted(args.ks), "folds": [list(f) for f in folds], "objective": "mean official F1, categories 1-5, "
            "pooled over ks", "held_out": summary, f"changed_k{kmin}_k{kmax}": round(changed, 4)}
    if args.write:
        write_weights(Path(args.write), w_all, info)
        print(f"wrote {args.write}")
    print(json.dumps(info, indent=1))


def _check_against_reader(t: Table, store: list[dict[str, Any]], ks: list[int], w: dict[str, float],
                          list_spans: int) -> None:
    """The vectorised choice equals `ExtractiveAnswerer.choose` on a sample (else it fits another reader)."""
    reader = ExtractiveAnswerer(**{"scorer": "weights", "list_spans": list_spans, **w})
    sample = np.arange(0, len(t.start), max(1, len(t.start) // 300))
    _, preds = predict(t, w, sample, store, list_spans, {})
    for g, (kind, ans) in zip(sample, preds):
        q = store[t.qi[g]]
        r = reader.read(q["question"], q["contexts"][int(t.k[g])], q["speakers"])
        pred, _, _ = reader.choose(r)
        if kind != "fallback" and pred != ans:
            raise AssertionError(f"{q['qid']} k={t.k[g]}: vectorised {ans!r} != reader {pred!r}")


assert set(WEIGHT_OF.values()) | {"abstain_margin"} == set(WEIGHTS) and set(PENALTIES) <= set(WEIGHT_OF)

if __name__ == "__main__":
    main()
