-- A version keeps the access level it was written at (issue 46 item 4,
-- a hostile reader's view). An edit may lower a memory's level: a
-- sensitive note rewritten as a public one. Read as of an ingestion time
-- before that edit, the memory's current (public) row passed the reader's
-- trust filter and then took the sensitive text of then from
-- memory_versions: a public key read what only a sensitive one could.
-- Now every version carries its own level and search-svc shows it only to
-- a reader of that level (rows.rs `as_recorded_at`, get.rs history).
--
-- Versions kept before this migration recorded no level: they get the
-- highest (4, sensitive), so none of them can leak; a lower-trust
-- reader's as-of read simply leaves such a memory out.
ALTER TABLE memory_versions ADD COLUMN access_level smallint NOT NULL DEFAULT 4;

CREATE OR REPLACE FUNCTION keep_memory_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO memory_versions (memory_id, tenant_id, version, title, content,
                                 event_time, valid_from, valid_to, recorded_at,
                                 access_level)
    VALUES (OLD.id, OLD.tenant_id, OLD.version, OLD.title, OLD.content,
            OLD.event_time, OLD.valid_from, OLD.valid_to,
            coalesce((SELECT max(v.replaced_at) FROM memory_versions v
                      WHERE v.memory_id = OLD.id), OLD.recorded_at),
            OLD.access_level)
    ON CONFLICT (memory_id, version) DO NOTHING;
    RETURN NEW;
END
$$;
