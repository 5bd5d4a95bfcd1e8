"""Retrieval speed, measured side by side in one run.

    python benchmarks/retrieval_speed.py [--path locomo10.json] [--large 1000000] [--dim 128]

Part 1, LoCoMo size (every turn one memory, one key per conversation, ~600 memories a key):
memlab's hybrid search (tfidf-lsa dense in FAISS Flat + TF-IDF keyword, RRF, dedupe) against a
baseline doing the same work with plain numpy: brute-force dot product over the key's LSA vectors
plus rank-bm25 (BM25Okapi) scores, fused by the same RRF. Prints build time, queries/s, p50/p95.

Part 2, per-key indexes: the same key searched in a store of 10 keys and of 60 keys: latency must
not grow with the other users' memories (each key has its own index, built on its first search).

Part 3, scale: ``--large`` synthetic memories in one key (clustered unit vectors, ``--dim`` wide):
FAISS ``HNSW32`` (memlab's DenseIndex) against ``Flat``: build time, peak memory (RSS), p50/p95
per query and recall@10 of HNSW against the exact Flat results, over a sweep of efSearch.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import numpy as np


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1000.0, q))


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def locomo_part(path: str | None, repeats: int) -> None:
    from rank_bm25 import BM25Okapi

    from memlab.data import load_locomo
    from memlab.extract.memory_sets import turn_memories
    from memlab.extract.pipeline import conversation_key
    from memlab.index import open_service
    from memlab.index.fusion import rrf
    from memlab.index.text import analyze
    from memlab.memory import SearchOptions

    data = load_locomo(path)
    svc = open_service("memory")
    keys, questions = [], []
    for conv in data:
        key = conversation_key(conv)
        for it in turn_memories(conv):
            svc.add(key, **it)
        keys.append(key)
        questions += [(key, q.question) for q in conv.questions]
    t0 = time.perf_counter()
    for key in keys:  # the first search of a key builds its index
        svc.searcher.ensure_built(key, lambda k=key: svc.list(k))
    build_memlab = time.perf_counter() - t0

    # baseline: numpy brute force over the same LSA vectors + rank-bm25, same RRF
    t0 = time.perf_counter()
    base = {}
    for key in keys:
        st = svc.searcher.ensure_built(key, lambda k=key: svc.list(k))  # built above: its state
        mat = np.vstack([st.vectors[e.id][2] for e in st.rows])
        bm = BM25Okapi([list(analyze(e.text)) for e in st.rows])
        base[key] = (st, mat, bm)
    build_base = time.perf_counter() - t0

    opts = {q: SearchOptions(query=q, max_results=10, kind_fallback=False) for _, q in questions}
    lat_m, lat_b = [], []
    for _ in range(repeats):
        for key, q in questions:
            t = time.perf_counter()
            svc.search(key, opts[q])
            lat_m.append(time.perf_counter() - t)
            st, mat, bm = base[key]
            t = time.perf_counter()
            qv = st.embedder.embed([q])[0]
            dense = np.argsort(-(mat @ qv), kind="stable")
            kw = bm.get_scores(list(analyze(q)))
            kwo = [int(i) for i in np.argsort(-kw, kind="stable") if kw[i] > 0]
            fused = rrf([dense.tolist(), kwo], 60)
            sorted(fused, key=fused.get, reverse=True)[:10]
            lat_b.append(time.perf_counter() - t)
    n_mem = sum(len(svc.searcher.entries(k, lambda k=k: svc.list(k))) for k in keys)
    print(f"\n== LoCoMo size: {n_mem:,} memories in {len(keys)} keys "
          f"(~{n_mem // len(keys)} a key), {len(lat_m):,} queries ==")
    print(f"{'':32s}{'build s':>9s}{'q/s':>9s}{'p50 ms':>9s}{'p95 ms':>9s}")
    print(f"{'memlab hybrid (FAISS Flat+TFIDF)':32s}{build_memlab:9.2f}{len(lat_m) / sum(lat_m):9.0f}"
          f"{pct(lat_m, 50):9.3f}{pct(lat_m, 95):9.3f}")
    print(f"{'numpy brute force + rank-bm25':32s}{build_base:9.2f}{len(lat_b) / sum(lat_b):9.0f}"
          f"{pct(lat_b, 50):9.3f}{pct(lat_b, 95):9.3f}")
    print(f"ratio p50 baseline/memlab: {pct(lat_b, 50) / pct(lat_m, 50):.1f}x   "
          f"target memlab p50 <= 1 ms: {'MET' if pct(lat_m, 50) <= 1.0 else 'NOT MET'}")


def key_scaling_part(path: str | None, copies: int, n_queries: int = 400) -> None:
    """Search cost follows the searched key, not the store: the same key searched in a store of 10
    keys and in one of ``10 * copies`` keys (copies of the conversations under other users)."""
    from memlab.data import load_locomo
    from memlab.extract.memory_sets import turn_memories
    from memlab.index import open_service
    from memlab.memory import SearchOptions, UserKey

    data = load_locomo(path)
    conv = data.conversations[0]
    qs = [q.question for q in conv.questions][:n_queries]
    print(f"\n== per-key indexes: one key (~{len(conv.turns)} memories) searched in stores of growing size ==")
    print(f"{'keys in store':>14s}{'memories':>10s}{'first search s':>16s}{'p50 ms':>9s}{'p95 ms':>9s}"
          f"{'keys built':>12s}")
    for n_copies in (1, copies):
        svc = open_service("memory")
        total = 0
        for c in range(n_copies):
            for other in data:
                key = UserKey(f"app{c}", other.sample_id)
                for it in turn_memories(other):
                    svc.add(key, **it)
                    total += 1
        target = UserKey("app0", conv.sample_id)
        t = time.perf_counter()
        svc.search(target, SearchOptions(query=qs[0]))
        first = time.perf_counter() - t
        lat = []
        for q in qs:
            t = time.perf_counter()
            svc.search(target, SearchOptions(query=q, kind_fallback=False))
            lat.append(time.perf_counter() - t)
        print(f"{len(svc.keys()):14d}{total:10,d}{first:16.2f}{pct(lat, 50):9.3f}{pct(lat, 95):9.3f}"
              f"{len(svc.searcher.keys()):12d}")


def rss_now_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def large_part(n: int, dim: int, n_queries: int, ef_values: list[int], ef_construction: int, seed: int = 0) -> None:
    from memlab.index.dense import DenseIndex

    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((max(1, n // 1000), dim)).astype(np.float32)
    x = centers[rng.integers(0, len(centers), n)]
    x += 0.35 * rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    qi = rng.choice(n, n_queries, replace=False)
    q = x[qi] + 0.1 * rng.standard_normal((n_queries, dim), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    print(f"\n== scale: {n:,} synthetic memories in one key (clustered unit vectors), dim {dim}, "
          f"{n_queries} queries, k = 10 ==")
    print(f"{'index':28s}{'build s':>9s}{'index MB':>10s}{'peak RSS MB':>13s}{'p50 ms':>9s}{'p95 ms':>9s}"
          f"{'recall@10':>11s}")

    def measure(idx: DenseIndex) -> tuple[list[float], np.ndarray]:
        lat, ids = [], []
        for i in range(n_queries):
            t = time.perf_counter()
            _, found = idx.search(q[i], 10)
            lat.append(time.perf_counter() - t)
            ids.append(found[0])
        return lat, np.vstack(ids)

    before = rss_now_mb()
    t0 = time.perf_counter()
    flat = DenseIndex("Flat").build(x)
    build = time.perf_counter() - t0
    lat, exact = measure(flat)
    print(f"{'Flat (exact)':28s}{build:9.1f}{rss_now_mb() - before:10.0f}{rss_mb():13.0f}{pct(lat, 50):9.3f}"
          f"{pct(lat, 95):9.3f}{1.0:11.3f}")
    del flat
    before = rss_now_mb()
    t0 = time.perf_counter()
    hnsw = DenseIndex("HNSW32", ef_search=ef_values[0], ef_construction=ef_construction).build(x)
    build = time.perf_counter() - t0
    size = rss_now_mb() - before
    met = None
    for ef in ef_values:
        hnsw.index_.hnsw.efSearch = ef
        lat, got = measure(hnsw)
        rec = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, exact)]))
        print(f"{f'HNSW32 efC {ef_construction} efS {ef}':28s}{build:9.1f}{size:10.0f}{rss_mb():13.0f}"
              f"{pct(lat, 50):9.3f}{pct(lat, 95):9.3f}{rec:11.3f}")
        if met is None and pct(lat, 50) <= 5.0 and rec >= 0.95:
            met = ef
    print("target HNSW32 p50 <= 5 ms with recall@10 >= 0.95: "
          + (f"MET at efSearch {met}" if met else "NOT MET at any efSearch tried"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="memlab retrieval speed benchmark")
    ap.add_argument("--path")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--large", type=int, default=1_000_000, help="0 skips the scale part")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--key-copies", type=int, default=6, help="store size multiplier of the per-key part")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--ef-search", default="256,512,1024,2048")
    ap.add_argument("--ef-construction", type=int, default=128)
    args = ap.parse_args(argv)
    locomo_part(args.path, args.repeats)
    key_scaling_part(args.path, args.key_copies)
    if args.large:
        large_part(args.large, args.dim, args.queries, [int(v) for v in args.ef_search.split(",")],
                   args.ef_construction)
    return 0


if __name__ == "__main__":
    sys.exit(main())
