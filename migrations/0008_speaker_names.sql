-- Dense search drops the names of the caller's readable speakers from a
-- query before embedding it (search-svc/src/speakers.rs): one probe per
-- word run of the query, `lower(speaker) = g` within a tenant, stopping at
-- the first readable turn. Only turns have a speaker, so the index holds
-- only them.
CREATE INDEX IF NOT EXISTS memories_speaker
    ON memories (tenant_id, lower(speaker)) WHERE speaker <> '';
