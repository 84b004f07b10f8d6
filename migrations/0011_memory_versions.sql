-- Edits are versions (issue 46, item 4). An upsert that changes a memory's
-- content used to overwrite it: a read as of an ingestion time before the
-- edit returned text that did not exist then. Now the content an edit
-- replaces is kept here, with when it was recorded and when it was
-- replaced (recorded time, the second axis beside the memory's own valid
-- time), by a trigger, so no write path can forget to. search-svc reads it
-- back for `as_of_ingestion` reads (rows.rs `as_recorded_at`).
--
-- A version goes with its memory: deleting a memory deletes its history.
CREATE TABLE memory_versions (
    memory_id   uuid        NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    tenant_id   text        NOT NULL,
    version     integer     NOT NULL,
    title       text        NOT NULL,
    content     text        NOT NULL,
    event_time  timestamptz NOT NULL,
    valid_from  timestamptz NOT NULL,
    valid_to    timestamptz,
    -- When this content was recorded: the memory's first recording, or the
    -- edit that wrote it.
    recorded_at timestamptz NOT NULL,
    -- When the next edit replaced it.
    replaced_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (memory_id, version)
);

CREATE FUNCTION keep_memory_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO memory_versions (memory_id, tenant_id, version, title, content,
                                 event_time, valid_from, valid_to, recorded_at)
    VALUES (OLD.id, OLD.tenant_id, OLD.version, OLD.title, OLD.content,
            OLD.event_time, OLD.valid_from, OLD.valid_to,
            coalesce((SELECT max(v.replaced_at) FROM memory_versions v
                      WHERE v.memory_id = OLD.id), OLD.recorded_at))
    ON CONFLICT (memory_id, version) DO NOTHING;
    RETURN NEW;
END
$$;

CREATE TRIGGER memories_keep_version
    BEFORE UPDATE OF content ON memories
    FOR EACH ROW
    WHEN (OLD.content_hash IS DISTINCT FROM NEW.content_hash)
    EXECUTE FUNCTION keep_memory_version();
