"""The offline reader's shipped weights, written by ``benchmarks/fit_reader.py`` (do not edit by hand).

Placeholder until the first fit: the previous reader's hand-set values (rank 3, temporal rank 1,
phrase 4), the new features off.
"""

WEIGHTS: dict[str, float] = {
    "rank_weight": 3.0,
    "memory_weight": 0.0,
    "agreement_weight": 0.0,
    "speaker_weight": 0.0,
    "date_weight": 0.0,
    "length_weight": 0.0,
    "phrase_bonus": 4.0,
    "temporal_rank_weight": 1.0,
    "abstain_margin": 0.0,
}

FIT: dict[str, object] = {}
