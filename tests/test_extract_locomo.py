"""The whole worker path offline on the real LoCoMo file (two conversations to stay fast)."""

from __future__ import annotations

from memlab.extract import ObservationsExtractor, TurnsExtractor, locomo_messages
from memlab.extract.pipeline import conversation_key, extract_dataset
from memlab.index import open_service


def test_locomo_messages_roles_and_order(locomo):
    conv = locomo["conv-26"]
    ms = locomo_messages(conv)
    assert len(ms) == len(conv.turns)
    assert {m.role for m in ms if m.speaker == conv.speakers[0]} == {"user"}
    assert {m.role for m in ms if m.speaker == conv.speakers[1]} == {"assistant"}
    assert all(a.timestamp < b.timestamp for a, b in zip(ms, ms[1:]))


def test_offline_extractors_end_to_end_into_sqlite(locomo, tmp_path):
    picks = ["conv-26", "conv-30"]
    for name, expected in (("turns", {"conv-26": 419, "conv-30": 369}), ("observations", None)):
        db = tmp_path / f"{name}.db"
        svc = open_service("sqlite", path=db)
        table, results = extract_dataset(svc, locomo, name, conversations=picks)
        svc.close()
        assert list(table.index) == picks and (table.jobs_failed == 0).all()
        assert (table.jobs_run == [19, 19]).all()
        if expected:
            assert table.memories.to_dict() == expected  # every turn one memory
        else:
            n_obs = {c: len(locomo[c].observations) for c in picks}
            assert (table.ops_proposed == [n_obs[c] for c in picks]).all()
            assert (table.memories <= table.ops_proposed).all() and (table.memories > 0.8 * table.ops_proposed).all()
        svc = open_service("sqlite", path=db)  # restart: everything from disk
        again, _ = extract_dataset(svc, locomo, name, conversations=picks)  # cursors saved in the store
        assert again.memories_added.sum() == 0 and again.ops_proposed.sum() == 0
        key = conversation_key(locomo["conv-26"])
        e = svc.list(key)[0]
        assert e.source_ids and all(s.startswith("D") for s in e.source_ids)
        hits = svc.search(key, "LGBTQ support group")
        assert any("D1:3" in h.entry.source_ids for h in hits.hits[:5]) or name == "observations"
        svc.close()
    assert isinstance(TurnsExtractor().cache_id(), str) and ObservationsExtractor.name == "observations"
