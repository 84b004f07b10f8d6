-- The memories' HNSW graph is built with ef_construction 128 (was 64).
-- At 100K memories, for 200 real dev questions, the index's top 30 held
-- 90.4 % of the exact top 30 (90.0 % of the exact top 5) at ef_search 100
-- with 64, and 94.5 % (94.9 %) with 128, at the same cost per query
-- (docs/benchmarks.md, "Dense recall at this scale"). The rebuild reads
-- every stored vector once: ~30 s per 100K memories on two cores, once,
-- during this migration.
DROP INDEX IF EXISTS memories_embedding_hnsw;
CREATE INDEX memories_embedding_hnsw
    ON memories USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 128);
