-- The HNSW indexes hold half-precision copies of the vectors
-- (`halfvec(384)`, pgvector >= 0.7; engram already needs 0.8 for
-- iterative scans). The stored vectors stay full precision: the index
-- only chooses the candidates, and every score is computed from the row's
-- own `vector`. At 100K memories the memories' index is 112 MB instead of
-- 300 MB (so it stays in shared_buffers beside the table) and a nearest-30
-- statement takes ~0.27 ms less; the candidates found were the same to
-- within the near-ties an int8 query embedding already reorders
-- (docs/benchmarks.md, "Half-precision HNSW"). Readers must order by the
-- same expression for the index to be used: search-svc/src/dense.rs
-- `HALF`. The rebuild reads every stored vector once (~30 s per 100K
-- memories on two cores).
DROP INDEX IF EXISTS memories_embedding_hnsw;
CREATE INDEX memories_embedding_hnsw
    ON memories USING hnsw ((embedding::halfvec(384)) halfvec_cosine_ops)
    WITH (m = 16, ef_construction = 128);

DROP INDEX IF EXISTS memory_sentences_embedding_hnsw;
CREATE INDEX memory_sentences_embedding_hnsw
    ON memory_sentences USING hnsw ((embedding::halfvec(384)) halfvec_cosine_ops)
    WITH (m = 16, ef_construction = 64);
