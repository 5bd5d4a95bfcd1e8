"""The offline reader's shipped weights, written by ``benchmarks/fit_reader.py`` (do not edit by hand).

Fit on all LoCoMo-10 conversations after leave-conversations-out cross-validation; ``FIT`` holds
the held-out figures of that cross-validation (the weights of each fold were fit without its
conversations) and how the fit was run.
"""

WEIGHTS: dict[str, float] = {
    'rank_weight': 1.5,
    'memory_weight': 0.5,
    'agreement_weight': 0.0,
    'speaker_weight': 2.0,
    'date_weight': 4.0,
    'length_weight': 1.0,
    'phrase_bonus': 6.0,
    'temporal_rank_weight': 2.0,
    'abstain_margin': 0.0,
}

FIT: dict[str, object] = {'command': 'python benchmarks/fit_reader.py --write memlab/answer/reader_weights.py',
 'config': 'offline',
 'ks': [5, 10, 20, 40],
 'folds': [['conv-26', 'conv-44'],
           ['conv-30', 'conv-47'],
           ['conv-41', 'conv-48'],
           ['conv-42', 'conv-49'],
           ['conv-43', 'conv-50']],
 'objective': 'mean official F1, categories 1-5, pooled over ks',
 'held_out': {5: {'1': [0.0936, 0.0694, 0.1202],
                  'overall 1-4': [0.2599, 0.2394, 0.2862],
                  'overall 1-5': [0.3204, 0.2978, 0.3455],
                  'abstain_rate_cat5': 0.5291,
                  'abstain_rate_cat1_4': 0.0727},
              10: {'1': [0.096, 0.0717, 0.1235],
                   'overall 1-4': [0.2616, 0.2409, 0.2871],
                   'overall 1-5': [0.3237, 0.3009, 0.3484],
                   'abstain_rate_cat5': 0.5381,
                   'abstain_rate_cat1_4': 0.0747},
              20: {'1': [0.0953, 0.071, 0.1227],
                   'overall 1-4': [0.2613, 0.2403, 0.2874],
                   'overall 1-5': [0.3235, 0.3009, 0.348],
                   'abstain_rate_cat5': 0.5381,
                   'abstain_rate_cat1_4': 0.0747},
              40: {'1': [0.0953, 0.071, 0.1227],
                   'overall 1-4': [0.2613, 0.2403, 0.2874],
                   'overall 1-5': [0.3235, 0.3009, 0.348],
                   'abstain_rate_cat5': 0.5381,
                   'abstain_rate_cat1_4': 0.0747}},
 'changed_k5_k40': 0.0292}
