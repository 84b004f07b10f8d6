-- Training examples for the learned Stage 4 ranker: every memory an answer
-- returned, when the caller gave feedback on that answer, with the features
-- it was ranked with and whether the feedback marked it used or helpful.
-- Written by search-svc with the feedback in one transaction; read by
-- `engram ranker train`. Bounded: the decay job deletes rows older than
-- `search.ranker_examples_days` (default 90).
CREATE TABLE IF NOT EXISTS ranker_examples (
    id         bigserial PRIMARY KEY,
    tenant_id  text NOT NULL,
    agent_id   text NOT NULL,
    query_id   text NOT NULL,
    memory_id  uuid NOT NULL,
    features   real[] NOT NULL,
    relevant   boolean NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ranker_examples_tenant_time ON ranker_examples (tenant_id, created_at);
