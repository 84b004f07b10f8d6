-- Review of detected updates (issue 21; search-svc/src/conflicts.rs).
-- A confirmed pair keeps its `contradicts` edge and records when it was
-- confirmed; a rejected pair loses its edge and is remembered here, so the
-- detector (search-svc/src/updates.rs) never flags it again, e.g. when the
-- newer memory is rewritten. Rows go away with either memory.
ALTER TABLE edges ADD COLUMN IF NOT EXISTS confirmed_at timestamptz;
CREATE TABLE IF NOT EXISTS rejected_updates (
    tenant_id   text        NOT NULL,
    new_id      uuid        NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    old_id      uuid        NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    rejected_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (new_id, old_id)
);
CREATE INDEX IF NOT EXISTS rejected_updates_old ON rejected_updates (old_id);
-- ListConflicts pages a tenant's detected edges newest first.
CREATE INDEX IF NOT EXISTS edges_detected
    ON edges (tenant_id, id DESC) WHERE origin = 'detected';
