-- What gateway replicas share (issue 48): the gateway holds no state that
-- matters, so a load balancer may send a caller's next request to any
-- replica. search-svc serves both tables (GatewayStateService).

-- Live gateway replicas: each one heartbeats every few seconds and takes
-- 1/live of every tenant's rate and in-flight limits.
CREATE TABLE IF NOT EXISTS gateway_members (
    member_id  text PRIMARY KEY,
    group_name text NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS gateway_members_group ON gateway_members (group_name);

-- A turn's first answer, so the same turn_id sent to another replica gets
-- the same answer. Every write of the tenant deletes its rows (writes.rs
-- `notify`), so an answer is never older than the tenant's last write.
CREATE TABLE IF NOT EXISTS turn_answers (
    tenant_id  text NOT NULL,
    key        bytea NOT NULL,
    answer     bytea NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX IF NOT EXISTS turn_answers_expires ON turn_answers (expires_at);

-- Working-memory notes, written through by the replica that takes the
-- write and read by whichever replica serves the session next. Short-lived
-- (expires_at from the note's TTL), bounded per tenant in bytes and per
-- session in notes (gateway_state.rs).
CREATE TABLE IF NOT EXISTS working_notes (
    tenant_id    text NOT NULL,
    agent_id     text NOT NULL,
    session_id   text NOT NULL,
    id           text NOT NULL,
    access_level smallint NOT NULL,
    body         bytea NOT NULL,
    content_hash bytea NOT NULL,
    version      int NOT NULL,
    written_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, agent_id, session_id, id)
);
CREATE INDEX IF NOT EXISTS working_notes_expires ON working_notes (expires_at);
