"""Which benchmark a file holds, told by its fields (no flag), and the one loader call for either.

LoCoMo items carry ``sample_id`` / ``conversation`` / ``qa``; LongMemEval items carry ``question_id`` /
``haystack_sessions``. Only the file's first megabyte is read to tell them apart (a LongMemEval-M file
is gigabytes); the chosen loader then validates the whole file, so a file that only looks like one
format still fails with that format's named error.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from memlab.data.fetch import resolve_locomo_path
from memlab.data.locomo import Dataset, LoCoMoFormatError, load_locomo

FORMATS = ("locomo", "longmemeval")
_KEY = re.compile(r'"(sample_id|conversation|qa|question_id|haystack_sessions|question_type)"\s*:')
_LOCOMO_KEYS = {"sample_id", "conversation", "qa"}


def detect_format(path: str | os.PathLike[str] | None = None, sniff_bytes: int = 1 << 20) -> str:
    """``"locomo"`` or ``"longmemeval"``: the first of the telling keys met in the file's first megabyte
    decides; neither found is a `LoCoMoFormatError` naming the keys looked for."""
    p = resolve_locomo_path(path)
    with open(p, "rb") as f:
        head = f.read(sniff_bytes).decode("utf-8", errors="ignore")
    m = _KEY.search(head)
    if m is None:
        raise LoCoMoFormatError(f"{p}: neither a LoCoMo file (items with 'sample_id', 'conversation', 'qa') nor a "
                                f"LongMemEval file (items with 'question_id', 'haystack_sessions') in its first "
                                f"{sniff_bytes:,} bytes")
    return "locomo" if m.group(1) in _LOCOMO_KEYS else "longmemeval"


def load_dataset(path: str | os.PathLike[str] | None = None) -> Dataset:
    """Load and validate either format (``path`` resolved like `load_locomo`'s): a `LoCoMo` or a
    `LongMemEval`, both `Dataset`s."""
    p: Path = resolve_locomo_path(path)
    if detect_format(p) == "longmemeval":
        from memlab.data.longmemeval import load_longmemeval

        return load_longmemeval(p)
    return load_locomo(p)


def dataset_name(data: Dataset) -> str:
    """The benchmark a loaded dataset came from."""
    return data.name


def dataset_sha256(data: Dataset) -> str:
    """The sha256 of the file a dataset was loaded from: the one its loading pass computed (LongMemEval), else
    read now."""
    from memlab.data.fetch import sha256_file

    return data.sha256 or sha256_file(data.report.path)
