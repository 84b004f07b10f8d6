-- engram schema v1. Applied by sqlx migrate on every start (idempotent by the
-- migrations table); every statement also tolerates a re-run by hand.
CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE IF NOT EXISTS memories (
    id                uuid PRIMARY KEY,
    tenant_id         text        NOT NULL,
    namespace         text        NOT NULL DEFAULT 'default',
    agent_id          text        NOT NULL,
    memory_type       text        NOT NULL DEFAULT 'episodic',
    title             text        NOT NULL DEFAULT '',
    content           text        NOT NULL,
    content_hash      bytea       NOT NULL,
    embedding         vector(384),
    -- title weighted A, body B: ts_rank_cd favours title matches.
    tsv               tsvector GENERATED ALWAYS AS (
                          setweight(to_tsvector('english'::regconfig, coalesce(title, '')), 'A') ||
                          setweight(to_tsvector('english'::regconfig, content), 'B')) STORED,
    -- token count of tsv (lexeme positions), written by search-svc: the
    -- document length of BM25 keyword scoring.
    tsv_len           integer     NOT NULL DEFAULT 0,
    -- 1 public < 2 internal < 3 confidential < 4 sensitive
    access_level      smallint    NOT NULL DEFAULT 1 CHECK (access_level BETWEEN 1 AND 4),
    source_confidence real        NOT NULL DEFAULT 1 CHECK (source_confidence BETWEEN 0 AND 1),
    decay_score       real        NOT NULL DEFAULT 1 CHECK (decay_score BETWEEN 0 AND 1),
    -- event time (when it happened) and its validity interval
    event_time        timestamptz NOT NULL,
    valid_from        timestamptz NOT NULL,
    valid_to          timestamptz,
    -- transaction time (when engram learned / retracted it)
    ingestion_time    timestamptz NOT NULL DEFAULT now(),
    recorded_at       timestamptz NOT NULL DEFAULT now(),
    retracted_at      timestamptz,
    version           integer     NOT NULL DEFAULT 1,
    supersedes        uuid        REFERENCES memories (id) ON DELETE SET NULL,
    consolidated      boolean     NOT NULL DEFAULT false,
    metadata          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    source            text        NOT NULL DEFAULT ''
);

CREATE INDEX IF NOT EXISTS memories_embedding_hnsw
    ON memories USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64);
CREATE INDEX IF NOT EXISTS memories_tsv_gin ON memories USING gin (tsv);
CREATE INDEX IF NOT EXISTS memories_tenant_ns ON memories (tenant_id, namespace);
CREATE INDEX IF NOT EXISTS memories_tenant_event ON memories (tenant_id, event_time);
CREATE INDEX IF NOT EXISTS memories_supersedes ON memories (supersedes) WHERE supersedes IS NOT NULL;
CREATE INDEX IF NOT EXISTS memories_metadata_gin ON memories USING gin (metadata jsonb_path_ops);

-- Entities are per tenant; `name` is the normalised form used for linking.
CREATE TABLE IF NOT EXISTS entities (
    id        bigserial PRIMARY KEY,
    tenant_id text NOT NULL,
    name      text NOT NULL,
    display   text NOT NULL,
    UNIQUE (tenant_id, name)
);

CREATE TABLE IF NOT EXISTS memory_entities (
    memory_id uuid   NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    entity_id bigint NOT NULL REFERENCES entities (id) ON DELETE CASCADE,
    -- the memory is "about" this entity (its title / subject)
    is_home   boolean NOT NULL DEFAULT false,
    PRIMARY KEY (memory_id, entity_id)
);
CREATE INDEX IF NOT EXISTS memory_entities_entity ON memory_entities (entity_id);

-- OpenIE-style facts: entity -> entity, with the memory they came from.
CREATE TABLE IF NOT EXISTS triples (
    id         bigserial PRIMARY KEY,
    tenant_id  text   NOT NULL,
    memory_id  uuid   NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    subject_id bigint NOT NULL REFERENCES entities (id) ON DELETE CASCADE,
    relation   text   NOT NULL,
    object_id  bigint NOT NULL REFERENCES entities (id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS triples_memory ON triples (memory_id);
CREATE INDEX IF NOT EXISTS triples_tenant ON triples (tenant_id);

-- Typed memory -> memory edges: related | contradicts | supersedes | causes | ...
CREATE TABLE IF NOT EXISTS edges (
    id         bigserial PRIMARY KEY,
    tenant_id  text NOT NULL,
    src_id     uuid NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    dst_id     uuid NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    edge_type  text NOT NULL,
    weight     real NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (src_id, dst_id, edge_type)
);
CREATE INDEX IF NOT EXISTS edges_tenant ON edges (tenant_id);
CREATE INDEX IF NOT EXISTS edges_dst ON edges (dst_id);

-- Stage 6 signals; no FK so feedback outlives a deleted memory.
CREATE TABLE IF NOT EXISTS feedback (
    id         bigserial PRIMARY KEY,
    tenant_id  text NOT NULL,
    agent_id   text NOT NULL,
    query_id   text NOT NULL,
    memory_id  uuid NOT NULL,
    signal     text NOT NULL,
    value      boolean NOT NULL DEFAULT true,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS feedback_tenant_memory ON feedback (tenant_id, memory_id);
