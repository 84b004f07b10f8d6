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
