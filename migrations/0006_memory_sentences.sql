-- The fact index (issue 19): each sentence of a memory with its own
-- embedding, written in the memory's write transaction by search-svc
-- (search-svc/src/facts.rs). Read only through a join on the memory's row,
-- so every access filter of dense search applies to its sentences too.
CREATE TABLE IF NOT EXISTS memory_sentences (
    memory_id uuid        NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    ord       smallint    NOT NULL,
    text      text        NOT NULL,
    embedding vector(384) NOT NULL,
    PRIMARY KEY (memory_id, ord)
);
CREATE INDEX IF NOT EXISTS memory_sentences_embedding_hnsw
    ON memory_sentences USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64);
