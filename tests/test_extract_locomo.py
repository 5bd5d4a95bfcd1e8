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
    sessions = [sum(1 for s in locomo[c].sessions if s.turns) for c in picks]  # one extraction job per session
    for name in ("turns", "observations"):
        db = tmp_path / f"{name}.db"
        svc = open_service("sqlite", path=db)
        table, results = extract_dataset(svc, locomo, name, conversations=picks)
        svc.close()
        assert list(table.index) == picks and (table.jobs_failed == 0).all()
        assert list(table.jobs_run) == sessions
        if name == "turns":
            assert table.memories.to_dict() == {c: len(locomo[c].turns) for c in picks}  # every turn one memory
        else:
            n_obs = {c: len(locomo[c].observations) for c in picks}
            assert (table.ops_proposed == [n_obs[c] for c in picks]).all()
            assert (table.memories <= table.ops_proposed).all() and (table.memories > 0.8 * table.ops_proposed).all()
        svc = open_service("sqlite", path=db)  # restart: everything from disk
        again, _ = extract_dataset(svc, locomo, name, conversations=picks)  # cursors saved in the store
        assert again.memories_added.sum() == 0 and again.ops_proposed.sum() == 0
        conv = locomo["conv-26"]
        key = conversation_key(conv)
        e = svc.list(key)[0]
        assert e.source_ids and set(e.source_ids) <= set(conv.turn_index)  # provenance: real dia ids
        # a memory's own wording finds it again (what it was built from comes back among the top hits)
        probe = conv.turns[2] if name == "turns" else conv.observations[0]
        text = probe.text
        want = {probe.dia_id} if name == "turns" else set(probe.dia_ids)
        hits = svc.search(key, text)
        assert any(want <= set(h.entry.source_ids) for h in hits.hits[:5]), (name, text)
        svc.close()
    assert TurnsExtractor().cache_id() != TurnsExtractor(style="plain").cache_id()  # the style keys the cache
    assert TurnsExtractor().cache_id() != ObservationsExtractor().cache_id()
