"""Answers an extractive span cannot give: yes or no, and one of the options a question offers.

A *yes/no question* opens with an auxiliary verb ("Would Caroline ...", "Did Jon ...") and offers no choice; the
learned reader answers it with its family's fitted form ("Yes", "Likely no", ...: `YES_NO_FORMS`). A *choice
question* offers two options ("Does John live close to a beach or the mountains?", "Which pet did Jolene adopt
first - Susie or Seraphim?"); the reader answers with the option the context supports more: the sentences holding
an option's words, each weighted 1/rank, counting only the sentences of the person asked about when the question
names one. No support either way: the first option. Both are plain rules over the `Reading`
(`memlab.answer.extractive`); the learned reader applies them when its family was fit with them
(`memlab.answer.learned`).
"""

from __future__ import annotations

import re
from typing import Any

from memlab.answer.reading_features import question_type
from memlab.index.text import analyze

#: The answers a yes/no question may get (the fit picks one by the training golds' official F1).
YES_NO_FORMS = ("Yes", "No", "Likely yes", "Likely no")
#: The longest option a choice question is read as offering (in words).
MAX_OPTION_WORDS = 5
_ARTICLE = re.compile(r"^(a|an|the)\s+", re.IGNORECASE)
_INITIAL = re.compile(r"^[A-Z]\.$")


def yes_no_question(question: str) -> bool:
    """Whether a question is answered by yes or no: it opens with an auxiliary verb ("Would Caroline ...", "Did
    Jon ...") and offers no choice ("Does John live close to a beach or the mountains?" is answered by one)."""
    return question_type(question) == "yes_no" and not re.search(r"\bor\b", question, re.IGNORECASE)


def choice_options(question: str) -> tuple[str, str] | None:
    """The two options a choice question offers, or None: the words after its last "or" up to the question mark
    (1 to `MAX_OPTION_WORDS`), and as many words before it ("a national park or a theme park"), with any initials
    before those ("C. S. Lewis or John Greene"). Only a question that asks for one of two ("Would ...", "Does ...",
    "Which ..."); "yes or no" is a yes/no question."""
    if question_type(question) not in ("yes_no", "likely", "which"):
        return None
    words = question.strip().rstrip("?.! ").split()
    low = [w.lower() for w in words]
    if "or" not in low[1:]:
        return None
    i = len(low) - 1 - low[::-1].index("or")
    right = words[i + 1:]
    if not 1 <= len(right) <= MAX_OPTION_WORDS:
        return None
    a = max(0, i - len(right))
    while a > 0 and _INITIAL.match(words[a - 1]):  # "C. S. Lewis or John Greene": a name keeps its initials
        a -= 1
    left = " ".join(words[a:i]).strip(" ,-–:")
    opts = (left, " ".join(right).strip(" ,-–:"))
    if not all(opts) or {o.lower() for o in opts} == {"yes", "no"}:
        return None
    return opts


def choose_option(r: Any, options: tuple[str, str]) -> tuple[str, list[float]]:
    """(the option the context supports more, article dropped; each option's support): see the module doc."""
    seen: set[tuple[int, str]] = set()
    support = [0.0, 0.0]
    words = [frozenset(analyze(o)) for o in options]
    for c in r.candidates:
        if (c.rank, c.text) in seen or (r.people and not r.people & c.owners):
            continue
        seen.add((c.rank, c.text))
        said = frozenset(analyze(c.text))
        for j, w in enumerate(words):
            if w & said:
                support[j] += 1.0 / max(c.rank, 1)
    best = 1 if support[1] > support[0] else 0
    return _ARTICLE.sub("", options[best]), [round(s, 4) for s in support]


def typed_answer(r: Any, yes_no: str | None, choice: bool) -> tuple[str, str, dict[str, Any]] | None:
    """(answer, rule, what was decided) for a yes/no question (``yes_no``: the fitted form; None: not answered
    this way) or a choice question (``choice``), else None (the reader's span stands)."""
    if yes_no is not None and yes_no_question(r.question):
        return yes_no, "learned: a yes/no question, the fit's answer", {}
    options = choice_options(r.question) if choice else None
    if options is not None:
        answer, support = choose_option(r, options)
        return answer, f"learned: a choice question, the option the context supports ({support})", {
            "options": list(options), "option_support": support}
    return None
