"""The learned reader's decisions: score candidates with a fitted model, compose, abstain.

The model is data, not code: ``reader_model.json`` (written by ``benchmarks/fit_reader.py``) holds, per
*family* of context (``offline``: turns with observations; ``observations``; ``retrieval-best``), two
gradient-boosted regression forests that predict the official F1 of a candidate answer and a logistic
abstain rule, each as plain numbers. Evaluating them needs numpy only; the file is read on first use.

1. ``sentence`` forest: every candidate of `ExtractiveAnswerer.read` (a sentence's novel words; a
   temporal candidate's date at day, month and year grain) gets a predicted F1; a family fit with
   `SEMANTIC_FEATURES` also reads the question's and the sentence's minilm similarity (`memlab.answer.semantic`).
2. ``span`` forest: the best ``top`` sentences are cut into windows of their novel words (shorter
   spans) and, for a family fit with ``kind_orig``, windows of their own words (function words kept inside),
   each scored with the sentence forest's prediction as a feature; the best scoring span wins. Forests read
   their features by name (`memlab.answer.forest`), so a family fit before a feature existed still loads.
3. Composition: a multi-part question (a list question, or the family's ``compose_types``) joins the
   best spans of up to ``compose_max`` different memories whose score is within ``compose_ratio`` of
   the best (the official multi-hop F1 credits each gold part's best-matching part).
4. Abstain: the logistic rule over the question's features and the gap between the named person's best
   span and the best overall says "Not mentioned" when its probability exceeds ``abstain_threshold``.
5. Typed answers (`memlab.answer.typed_answers`): a question answered by yes or no that the reader does not
   abstain on gets the family's ``yes_no`` answer, the form ("Yes", "Likely no", ...) that scored best on the
   training golds (the trace keeps the best span's rank as its support); a choice question ("a beach or the
   mountains?") gets the option the context supports more (a family fit with ``choice``). An extractive span
   can say neither.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from memlab.answer.base import ABSTAIN
from memlab.answer.forest import Forest
from memlab.answer.reading_features import (
    CONTEXT_ABSTAIN,
    FEATURE_NAMES,
    INDEX,
    SEMANTIC_ABSTAIN,
    context_abstain,
    date_grains,
    idf_table,
    original_windows,
    question_row,
    question_type,
    stack,
    type_match,
    windows,
    word_types,
)
from memlab.answer.semantic import SEMANTIC_FEATURES, semantic_features
from memlab.answer.typed_answers import typed_answer
from memlab.index.text import analyze

MODEL_PATH = Path(__file__).with_name("reader_model.json")
#: The context families a model may be fit for (``reader_family``; the model file says which it holds).
FAMILIES = ("offline", "observations", "turns", "retrieval-best")
#: The question-level features the abstain rule reads (besides the ``q_*`` features). The ``ov_*`` / ``*_you`` /
#: ``*_name*`` ones read the whole context's sentences, not the spans: LoCoMo's adversarial questions move a fact
#: to the other person, so the sentence that matches the question best is the *other* person's, or the named
#: person's own words about it speak to the other ("Wow, Caroline! Your necklace ...").
ABSTAIN_FEATURES = ("best", "best_owned", "gap", "owned_none", "owned_share", "q_people", "ov_own", "ov_other",
                    "ov_gap", "top_own_share", "own_you", "own_names_other", "other_names_asked", "sem_own",
                    "sem_other", "sem_gap")


@dataclass
class FamilyModel:
    """One context family's fitted reader (see the module docstring)."""

    sentence: Forest
    span: Forest
    top: int
    longest: int
    compose_max: int
    compose_ratio: float
    compose_types: tuple[str, ...]
    abstain_coef: np.ndarray
    abstain_intercept: float
    abstain_threshold: float
    abstain_names: tuple[str, ...]
    compose_dedupe: bool = False
    """Skip a part whose words are (a subset of) a part already composed, or hold all of one."""
    multi: dict[str, Any] | None = None
    """The multi-part gate: {"vocab": {word: coef}, "intercept", "threshold"} over the question's words; a
    question whose probability of asking for several things exceeds the threshold is composed (None: the
    ``compose_types`` rule alone)."""
    semantic: bool = False
    """The sentence forest reads `SEMANTIC_FEATURES` (so the question and its sentences are embedded)."""
    orig_windows: bool = False
    """The span forest scores windows of the sentence's own words too (``kind_orig``)."""
    yes_no: str | None = None
    """The answer to a yes/no question (`memlab.answer.typed_answers.yes_no_question`; None: a family fit without it
    answers with a span)."""
    choice: bool = False
    """A choice question gets one of its options (`memlab.answer.typed_answers.choose_option`)."""


@lru_cache(maxsize=1)
def load_models(path: str = str(MODEL_PATH)) -> dict[str, Any]:
    """The shipped model file: {"families": {name: spec}, "fit": {...}} (read once)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: the learned reader's model file is missing (benchmarks/fit_reader.py "
                                f"--write-model writes it)") from None
    if not isinstance(data, dict) or not isinstance(data.get("families"), dict) or not data["families"]:
        raise ValueError(f"{p}: expected a JSON object with a non-empty 'families' object")
    return data


def families() -> tuple[str, ...]:
    return tuple(load_models()["families"])


@lru_cache(maxsize=8)
def family_model(name: str) -> FamilyModel:
    data = load_models()["families"]
    if name not in data:
        raise ValueError(f"reader_family: expected one of {sorted(data)} (fitted in {MODEL_PATH.name}), got {name!r}")
    return family_from_spec(data[name])


def family_from_spec(spec: dict[str, Any]) -> FamilyModel:
    for k in ("sentence", "span", "top", "longest", "compose", "abstain"):
        if k not in spec:
            raise ValueError(f"{MODEL_PATH.name}: a family lacks {k!r}")
    # forests read their features by name (a family fit before a feature existed reads without it)
    sentence, span = Forest(spec["sentence"], FEATURE_NAMES), Forest(spec["span"], SPAN_NAMES)
    c, a = spec["compose"], spec["abstain"]
    reads = [*sentence.features, *span.features, *a["features"]]
    return FamilyModel(sentence, span, int(spec["top"]), int(spec["longest"]),
                       int(c["max"]), float(c["ratio"]), tuple(c["types"]), np.asarray(a["coef"], float),
                       float(a["intercept"]), float(a["threshold"]), tuple(a["features"]), bool(c.get("dedupe", False)),
                       c.get("multi"), semantic=any(n in SEMANTIC_FEATURES + SEMANTIC_ABSTAIN for n in reads),
                       orig_windows="kind_orig" in span.features, yes_no=(spec.get("yes_no") or {}).get("answer"),
                       choice=bool(spec.get("choice", False)))


def multi_part_p(question: str, gate: dict[str, Any]) -> float:
    """The gate's probability that a question asks for several things (a logistic over its words)."""
    vocab = gate["vocab"]
    z = float(gate["intercept"]) + math.fsum(vocab.get(w, 0.0) for w in set(question_words(question)))
    return 1.0 / (1.0 + math.exp(-z))


def question_words(question: str) -> list[str]:
    """The lower-cased words of a question (the multi-part gate's vocabulary)."""
    return re.findall(r"[a-z]+", question.lower())


@dataclass
class Scored:
    """One candidate answer of the learned reader."""

    answer: str
    kind: str
    parent: int
    """Index into `Reading.candidates` of the sentence it came from."""
    row: np.ndarray
    score: float = math.nan


@lru_cache(maxsize=200_000)
def _stems(text: str) -> frozenset[str]:
    """The `analyze` stems of a sentence or word (the same memories are read for many questions)."""
    return frozenset(analyze(text))


@lru_cache(maxsize=8)
def _idf(texts: tuple[str, ...]) -> dict[str, float]:
    """`idf_table` of a context's candidate texts (read by both forests' rows of one question: worked out once)."""
    return idf_table(texts)


def sentence_rows(r: Any, k: int, semantic: bool = False) -> list[Scored]:
    """Every `Reading` candidate (and a temporal one's month / year grains) with its feature row (``semantic``:
    with `SEMANTIC_FEATURES`, else those are 0)."""
    cands = r.candidates
    if not cands:
        return []
    qstems = set(analyze(r.question))
    idf = _idf(tuple(c.text for c in cands))
    q_idf = math.fsum(idf.get(s, 1.0) for s in qstems) or 1.0  # fsum: a set's order is the hash seed's
    ov = np.array([c.features[0] for c in cands])
    idf_ov = np.array([math.fsum(idf.get(s, 1.0) for s in qstems & _stems(c.text)) / q_idf for c in cands])
    qrow = question_row(r.question, r.list_question, len(r.people))
    qt = question_type(r.question)
    out: list[Scored] = []
    max_ov, max_idf = max(ov.max(), 1.0), max(idf_ov.max(), 1e-9)
    sem = semantic_features(r.question, [c.text for c in cands]) if semantic else None
    for i, c in enumerate(cands):
        named = dict(zip(FEATURE_NAMES[:9], map(float, c.features)))
        named.update(qrow, overlap_frac=ov[i] / max(len(qstems), 1), overlap_rel=ov[i] / max_ov,
                    idf_overlap=idf_ov[i], idf_rel=idf_ov[i] / max_idf, rank_recip=1.0 / max(c.rank, 1),
                    context_size=math.log2(1 + k), sentence_pos=float(c.position), quoted=float(c.segment > 0),
                    observation=float(c.memory_kind != "episode"), n_owners=float(len(c.owners)),
                    **(dict(zip(SEMANTIC_FEATURES, map(float, sem[i]))) if sem is not None else {}))
        base = stack([named])[0]
        if c.kind == "temporal" and c.when is not None:
            for kind, ans in date_grains(c.answer, c.phrase, c.when):
                out.append(Scored(ans, kind, i, _row(base, kind, ans.split(), qt, c.text, 0, 1, 1)))
        else:
            out.append(Scored(c.answer, "novel", i, _row(base, "novel", c.novel, qt, c.text, 0, len(c.novel),
                                                          len(c.novel))))
    return out


_KIND_AT = {n: INDEX[f"kind_{n}"] for n in ("novel", "window", "date", "month", "year", "orig")}
_PLACE_WORDS = ("in", "at", "to", "from", "near", "visited")


def _row(base: np.ndarray, kind: str, span: Sequence[str], qtype: str, text: str, start: int, end: int,
         n: int) -> np.ndarray:
    """``base`` (the sentence's and the question's features) with the span's own features set."""
    num, cap, cap_frac, month = word_types(span)
    place = float(kind in ("novel", "window", "orig") and bool(span) and any(
        f" {p} {span[0]}" in f" {text}" for p in _PLACE_WORDS))
    row = base.copy()
    for i in _KIND_AT.values():
        row[i] = 0.0
    row[_KIND_AT[kind]] = 1.0
    for name, v in (("words", math.log2(1 + len(span))), ("window_start", float(start == 0)),
                    ("window_end", float(end == n)), ("window_frac", len(span) / max(n, 1)), ("has_number", num),
                    ("has_cap", cap), ("has_place", place), ("has_month", month), ("cap_frac", cap_frac),
                    ("type_match", type_match(qtype, num, cap, place, month, kind))):
        row[INDEX[name]] = v
    return row


#: Span features beyond the sentence's (appended after ``parent``): where the span sits against the question's
#: words in its sentence (an answer tends to follow the words the question repeats: "raise awareness for" ->
#: "mental health"), and how rare its words are in the context.
SPAN_FEATURES = ("q_before", "q_after", "q_gap", "span_idf", "span_idf_max")
SPAN_NAMES = (*FEATURE_NAMES, "parent", *SPAN_FEATURES)


def _clean(w: str) -> str:
    return w.strip(".,!?;:\"'()")


def _positions(words_all: Sequence[str], novel: Sequence[str]) -> list[int]:
    """Where each novel word sits in its sentence's words (novel words are a subsequence of them)."""
    out, j = [], 0
    for w in novel:
        while j < len(words_all) and words_all[j] != w:
            j += 1
        out.append(j if j < len(words_all) else len(words_all) - 1)
        j += 1
    return out


def _span_extra(qpos: Sequence[int], pos: Sequence[int], a: int, b: int, idf: Sequence[float]) -> list[float]:
    """`SPAN_FEATURES` of the novel words ``a:b`` (``pos``: their places in the sentence; ``qpos``: the places of
    the words the question holds; ``idf``: each novel word's IDF over the context)."""
    lo, hi = pos[a], pos[b - 1]
    before = [lo - q for q in qpos if q < lo]
    after = [q - hi for q in qpos if q > hi]
    gap = min(before + after, default=64)
    vals = idf[a:b]
    return [float(bool(before) and min(before) <= 3), float(bool(after) and min(after) <= 3), math.log2(1 + gap),
            sum(vals) / len(vals) if vals else 0.0, float(max(vals)) if vals else 0.0]


def span_rows(r: Any, sents: list[Scored], order: Sequence[int], top: int, longest: int,
              orig: bool = False) -> list[Scored]:
    """The best ``top`` sentence candidates (``order``: best first) and the windows of their novel words (with
    ``orig``, also of their own words: `original_windows`), each row extended by its parent's sentence score
    (the ``parent`` feature) and `SPAN_FEATURES`."""
    out: list[Scored] = []
    qt = question_type(r.question)
    qstems = set(analyze(r.question))
    idf = _idf(tuple(c.text for c in r.candidates))
    seen: set[int] = set()
    for j in order:
        s = sents[j]
        if len(seen) >= top and s.parent not in seen:
            continue
        seen.add(s.parent)
        if s.kind != "novel":
            out.append(Scored(s.answer, s.kind, s.parent, np.concatenate([s.row, [s.score, 0.0, 0.0, 6.0, 0.0, 0.0]])))
            continue
        c = r.candidates[s.parent]
        novel = c.novel[:24]
        words_all = c.text.split()
        hits = [bool(_stems(w) & qstems) for w in words_all]
        qpos = [i for i, h in enumerate(hits) if h]
        near = {_clean(w) for i, (a, b) in enumerate(zip(hits, hits[1:])) if a or b
                for w in words_all[i:i + 2]}
        pos = _positions(words_all, novel)
        nidf = [max((idf.get(st, 1.0) for st in _stems(w)), default=0.0) for w in novel]
        extra = _span_extra(qpos, pos, 0, len(novel), nidf) if novel else [0.0, 0.0, 6.0, 0.0, 0.0]
        out.append(Scored(s.answer, s.kind, s.parent, np.concatenate([s.row, [s.score], extra])))
        base = s.row
        for a, b in windows(novel, longest):
            span = novel[a:b]
            row = _row(base, "window", span, qt, c.text, a, b, len(novel))
            row[INDEX["next_to_question"]] = float(_clean(span[0]) in near)
            out.append(Scored(" ".join(span), "window", s.parent,
                              np.concatenate([row, [s.score], _span_extra(qpos, pos, a, b, nidf)])))
        if orig:
            out += _orig_rows(s, words_all[:48], qpos, pos, near, idf, qt, longest)
    return out


def _orig_rows(s: Scored, words_all: list[str], qpos: list[int], novel_pos: list[int], near: set[str],
               idf: dict[str, float], qt: str, longest: int) -> list[Scored]:
    """The ``orig`` span candidates of one sentence (`original_windows` of its own words, edges trimmed)."""
    out: list[Scored] = []
    widf = [max((idf.get(st, 1.0) for st in _stems(w)), default=0.0) for w in words_all]
    every = list(range(len(words_all)))
    for a, b in original_windows(words_all, novel_pos, qpos, longest):
        span = [_clean(w) for w in words_all[a:b]]
        row = _row(s.row, "orig", span, qt, " ".join(words_all), a, b, len(words_all))
        row[INDEX["next_to_question"]] = float(span[0] in near)
        out.append(Scored(" ".join(span), "orig", s.parent,
                          np.concatenate([row, [s.score], _span_extra(qpos, every, a, b, widf)])))
    return out


def abstain_row(r: Any, spans: list[Scored], names: Sequence[str], sents: list[Scored] | None = None) -> np.ndarray:
    """The question-level features of the abstain rule, in ``names`` order (``sents``: the context's sentence
    candidates, which the ``ov_*`` features read; needed only when ``names`` holds them)."""
    scores = np.array([s.score for s in spans]) if spans else np.zeros(0)
    best = float(scores.max()) if len(scores) else 0.0
    owned = [s.score for s in spans if r.people & r.candidates[s.parent].owners]
    best_owned = max(owned) if owned else 0.0
    vals = dict(question_row(r.question, r.list_question, len(r.people)), best=best, best_owned=best_owned,
                gap=(best - best_owned) if owned else 1.0, owned_none=float(bool(r.people) and not owned),
                owned_share=len(owned) / max(len(spans), 1) if r.people else 1.0)
    if any(n in CONTEXT_ABSTAIN for n in names):
        if sents is None:
            raise ValueError("abstain_row: the context features (ov_*) need the sentence candidates")
        vals.update(context_abstain(r, sents))
    return np.array([vals[n] for n in names])


def compose(spans: list[Scored], order: np.ndarray, r: Any, m: FamilyModel) -> tuple[str, list[int]]:
    """The best span, joined by the best spans of other memories when the question asks for several things."""
    best = spans[int(order[0])]
    qt = question_type(r.question)
    wanted = r.list_question or qt in m.compose_types
    if m.multi is not None:
        wanted = multi_part_p(r.question, m.multi) > float(m.multi["threshold"])
    if not wanted or m.compose_max < 2 or best.kind not in ("novel", "window", "orig"):
        return best.answer, [int(order[0])]
    floor = best.score * m.compose_ratio
    picked, ranks = [int(order[0])], {r.candidates[best.parent].rank}
    said = [frozenset(analyze(best.answer))]
    for j in order[1:]:
        s = spans[int(j)]
        rank = r.candidates[s.parent].rank
        if s.score < floor or rank in ranks or s.kind not in ("novel", "window", "orig"):
            continue
        if m.compose_dedupe:
            words = frozenset(analyze(s.answer))
            if not words or any(words <= w or w <= words for w in said):
                continue
            said.append(words)
        picked.append(int(j))
        ranks.add(rank)
        if len(picked) == m.compose_max:
            break
    return ", ".join(spans[j].answer for j in picked), picked


def decide(r: Any, k: int, m: FamilyModel, abstain: bool = True) -> dict[str, Any]:
    """The learned reader's answer to a `Reading`: {answer, kind, spans, order, abstain_p, composed}."""
    sents = sentence_rows(r, k, m.semantic)
    if not sents:
        return {"answer": None, "spans": [], "order": np.zeros(0, int), "abstain_p": None, "composed": []}
    sc = m.sentence.predict(np.stack([s.row for s in sents]))
    for s, v in zip(sents, sc):
        s.score = float(v)
    spans = span_rows(r, sents, np.argsort(-sc, kind="stable"), m.top, m.longest, m.orig_windows)
    ss = m.span.predict(np.stack([s.row for s in spans]))
    for s, v in zip(spans, ss):
        s.score = float(v)
    order = np.argsort(-ss, kind="stable")
    p = None
    if abstain and r.people:
        z = abstain_row(r, spans, m.abstain_names, sents) @ m.abstain_coef + m.abstain_intercept
        p = 1.0 / (1.0 + math.exp(-z))
    answer, picked = compose(spans, order, r, m)
    return {"answer": answer, "spans": spans, "order": order, "abstain_p": p, "composed": picked}


def choose_learned(r: Any, k: int, m: FamilyModel, abstain: bool,
                   info: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(prediction, rule, info) of the learned reader for a `Reading` with candidates (see `decide`);
    ``info["scores"]`` is each `Reading` candidate's best span score (for `reading_trace`)."""
    d = decide(r, k, m, abstain)
    spans, order = d["spans"], d["order"]
    best: dict[int, float] = {}
    for s in spans:
        best[s.parent] = max(best.get(s.parent, -math.inf), s.score)
    info["scores"] = [best.get(i, -1.0) for i in range(len(r.candidates))]
    top = spans[int(order[0])]
    info["chosen"] = top.parent
    if d["abstain_p"] is not None:
        info["abstain_rule"] = {"p": round(d["abstain_p"], 4), "threshold": m.abstain_threshold}
        if d["abstain_p"] > m.abstain_threshold:
            return (ABSTAIN, f"abstain: learned rule p={d['abstain_p']:.2f} > {m.abstain_threshold:.2f}", info)
    typed = typed_answer(r, m.yes_no, m.choice)
    if typed is not None:
        answer, rule, decided = typed
        info.update(decided, support=r.candidates[top.parent].rank)  # the best span: what the reader read
        return answer, rule, info
    ranks = [r.candidates[spans[j].parent].rank for j in d["composed"]]
    if len(ranks) > 1:
        info["composed"] = ranks
        return d["answer"], f"learned: {len(ranks)} spans composed (ranks {', '.join(map(str, ranks))})", info
    what = {"novel": "novel words", "window": "a window of the novel words", "date": "date", "month": "month",
            "year": "year", "orig": "a window of the sentence's words"}[top.kind]
    c = r.candidates[top.parent]
    how = f" ('{c.phrase}')" if c.kind == "temporal" and c.phrase else ""
    return d["answer"], f"learned: {what}{how} of rank {c.rank}, score {top.score:.2f}", info
