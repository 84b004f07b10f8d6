-- A tenant's working notes by age (issue 47, audit of the shared state):
-- every PutNotes keeps the tenant within its byte and note budgets by
-- deleting its oldest notes at or below the writer's trust, which read the
-- tenant's notes newest first. Without this index each write sorted all of
-- the tenant's notes, and a tenant with many tiny notes made every write
-- hold a connection of the pool all tenants share.
CREATE INDEX IF NOT EXISTS working_notes_tenant_age
    ON working_notes (tenant_id, access_level, written_at DESC, id);
