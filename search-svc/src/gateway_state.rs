//! What gateway replicas share (issue 48): which replicas are alive, so
//! each takes its share of every tenant's limits; each turn's first
//! answer, so the same `turn_id` sent to another replica gets the same
//! answer; and working-memory notes, so a session continues on any
//! replica. Both live in Postgres (migrations/0013_gateway_state.sql); the
//! gateways reach them only through this service, with the internal token.
//!
//! Bounds a hostile tenant meets: an answer of at most [`MAX_ANSWER_BYTES`],
//! at most [`TENANT_TURN_BYTES`] of unexpired answers per tenant (over it,
//! `stored = false` and the gateway keeps the answer in its own cache
//! only), keys of exactly 32 bytes, TTLs clamped. Expired rows of every
//! tenant are swept on heartbeats, a bounded batch at a time.

use engram_proto as pb;
use engram_proto::gateway_state_service_server::GatewayStateService;
use sqlx::PgPool;
use tonic::{Request, Response, Status};

use crate::bounds;
use crate::error::{Error, Result};

pub const SERVICE_NAME: &str = "engram.v1.GatewayStateService";

/// One turn answer at most (an encoded RetrieveResponse).
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
/// Unexpired turn answers one tenant may keep, in bytes.
pub const TENANT_TURN_BYTES: i64 = 16 << 20;
/// The gateway's turn key: a SHA-256.
const KEY_BYTES: usize = 32;
const MAX_MEMBER_ID_CHARS: usize = 64;
const MAX_GROUP_CHARS: usize = 128;
const MIN_MEMBER_TTL_MS: u32 = 1_000;
const MAX_MEMBER_TTL_MS: u32 = 60_000;
const MAX_TURN_TTL_MS: u32 = 3_600_000;
/// Unexpired working-memory notes one tenant may keep, in bytes: over it
/// the tenant's oldest notes at or below the writer's trust go first.
pub const TENANT_NOTE_BYTES: i64 = 64 << 20;
/// One note's encoding at most (64 KiB of text, a vector, the rest).
const MAX_NOTE_BYTES: usize = 256 << 10;
/// The longest a note may be kept: a year (working memory's own cap,
/// `working.max_ttl_ms`, is a week by default).
const MAX_NOTE_LIFE_MS: i64 = 366 * 24 * 3_600_000;
const MAX_NOTES: usize = 1_000;
const MAX_SESSION_ID_CHARS: usize = 128;
const MAX_NOTE_ID_CHARS: usize = 64;
const MAX_NOTES_PER_SESSION: u32 = 10_000;
/// Expired rows deleted per heartbeat, per table.
const SWEEP_BATCH: i64 = 1_000;
/// Statement bound of every call here: small rows by primary key.
const TIMEOUT_MS: u64 = 2_000;

/// A checked [`pb::HeartbeatRequest`].
#[derive(Debug)]
pub struct Heartbeat {
    member_id: String,
    group: String,
    ttl_ms: u32,
    leaving: bool,
}

impl TryFrom<pb::HeartbeatRequest> for Heartbeat {
    type Error = Error;

    fn try_from(r: pb::HeartbeatRequest) -> Result<Self> {
        let n = r.member_id.chars().count();
        if n == 0 || n > MAX_MEMBER_ID_CHARS || r.member_id.contains('\0') {
            return Err(Error::InvalidArgument(format!(
                "member_id: must be 1 to {MAX_MEMBER_ID_CHARS} characters, no NUL"
            )));
        }
        let g = r.group.chars().count();
        if g == 0 || g > MAX_GROUP_CHARS || r.group.contains('\0') {
            return Err(Error::InvalidArgument(format!(
                "group: must be 1 to {MAX_GROUP_CHARS} characters, no NUL"
            )));
        }
        if !(MIN_MEMBER_TTL_MS..=MAX_MEMBER_TTL_MS).contains(&r.ttl_ms) {
            return Err(Error::InvalidArgument(format!(
                "ttl_ms: must be {MIN_MEMBER_TTL_MS} to {MAX_MEMBER_TTL_MS}"
            )));
        }
        Ok(Self {
            member_id: r.member_id,
            group: r.group,
            ttl_ms: r.ttl_ms,
            leaving: r.leaving,
        })
    }
}

/// A checked turn key.
#[derive(Debug)]
pub struct TurnKey(Vec<u8>);

fn turn_key(key: Vec<u8>) -> Result<TurnKey> {
    if key.len() != KEY_BYTES {
        return Err(Error::InvalidArgument(format!(
            "key: must be {KEY_BYTES} bytes"
        )));
    }
    Ok(TurnKey(key))
}

impl TryFrom<pb::GetTurnRequest> for TurnKey {
    type Error = Error;

    fn try_from(r: pb::GetTurnRequest) -> Result<Self> {
        turn_key(r.key)
    }
}

/// A checked [`pb::PutTurnRequest`].
#[derive(Debug)]
pub struct PutTurn {
    key: TurnKey,
    answer: Vec<u8>,
    ttl_ms: u32,
}

impl TryFrom<pb::PutTurnRequest> for PutTurn {
    type Error = Error;

    fn try_from(r: pb::PutTurnRequest) -> Result<Self> {
        if r.answer.is_empty() || r.answer.len() > MAX_ANSWER_BYTES {
            return Err(Error::InvalidArgument(format!(
                "answer: must be 1 to {MAX_ANSWER_BYTES} bytes"
            )));
        }
        if r.ttl_ms == 0 || r.ttl_ms > MAX_TURN_TTL_MS {
            return Err(Error::InvalidArgument(format!(
                "ttl_ms: must be 1 to {MAX_TURN_TTL_MS}"
            )));
        }
        Ok(Self {
            key: turn_key(r.key)?,
            answer: r.answer,
            ttl_ms: r.ttl_ms,
        })
    }
}

/// Records (or, when leaving, removes) the member and counts the live
/// ones; then sweeps a batch of expired rows of each table in a
/// transaction of its own, skipping rows another transaction holds (a
/// write deleting its tenant's turn answers), so the membership never
/// waits on, or rolls back with, the sweep.
pub async fn heartbeat(pool: &PgPool, h: &Heartbeat) -> Result<u32> {
    let mut tx = bounds::begin(pool, TIMEOUT_MS).await?;
    if h.leaving {
        sqlx::query("DELETE FROM gateway_members WHERE member_id = $1 AND group_name = $2")
            .bind(&h.member_id)
            .bind(&h.group)
            .execute(&mut *tx)
            .await?;
    } else {
        sqlx::query(
            "INSERT INTO gateway_members (member_id, group_name, expires_at) \
             VALUES ($1, $2, now() + make_interval(secs => $3::float8 / 1000)) \
             ON CONFLICT (member_id) DO UPDATE \
               SET group_name = EXCLUDED.group_name, expires_at = EXCLUDED.expires_at",
        )
        .bind(&h.member_id)
        .bind(&h.group)
        .bind(f64::from(h.ttl_ms))
        .execute(&mut *tx)
        .await?;
    }
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM gateway_members WHERE group_name = $1 AND expires_at >= now()",
    )
    .bind(&h.group)
    .fetch_one(&mut *tx)
    .await?;
    bounds::commit(tx).await?;
    if let Err(e) = sweep(pool).await {
        tracing::warn!(error = %e, "expired shared state not swept this time");
    }
    Ok(u32::try_from(live).unwrap_or(u32::MAX).max(1))
}

/// Deletes a batch of expired rows of each shared-state table, skipping
/// locked ones.
async fn sweep(pool: &PgPool) -> Result<()> {
    let mut tx = bounds::begin(pool, TIMEOUT_MS).await?;
    for table in ["gateway_members", "turn_answers", "working_notes"] {
        let sql = format!(
            "DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} \
             WHERE expires_at < now() LIMIT {SWEEP_BATCH} FOR UPDATE SKIP LOCKED))"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut *tx)
            .await?;
    }
    bounds::commit(tx).await
}

/// The tenant's unexpired answer for `key`, if any.
pub async fn get_turn(pool: &PgPool, tenant: &str, key: &TurnKey) -> Result<Option<Vec<u8>>> {
    let mut tx = bounds::begin(pool, TIMEOUT_MS).await?;
    let answer = sqlx::query_scalar(
        "SELECT answer FROM turn_answers \
         WHERE tenant_id = $1 AND key = $2 AND expires_at >= now()",
    )
    .bind(tenant)
    .bind(&key.0)
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(answer)
}

/// Keeps the first answer for `key` while the tenant's unexpired answers
/// stay within [`TENANT_TURN_BYTES`]; an expired row for the key is
/// replaced. Returns whether it was kept.
pub async fn put_turn(pool: &PgPool, tenant: &str, put: &PutTurn) -> Result<bool> {
    let mut tx = bounds::begin(pool, TIMEOUT_MS).await?;
    let held: Option<i64> = sqlx::query_scalar(
        "SELECT sum(octet_length(answer))::int8 FROM turn_answers \
         WHERE tenant_id = $1 AND expires_at >= now()",
    )
    .bind(tenant)
    .fetch_one(&mut *tx)
    .await?;
    let size = i64::try_from(put.answer.len()).unwrap_or(i64::MAX);
    if held.unwrap_or(0).saturating_add(size) > TENANT_TURN_BYTES {
        tx.commit().await?;
        return Ok(false);
    }
    let stored = sqlx::query(
        "INSERT INTO turn_answers (tenant_id, key, answer, expires_at) \
         VALUES ($1, $2, $3, now() + make_interval(secs => $4::float8 / 1000)) \
         ON CONFLICT (tenant_id, key) DO UPDATE \
           SET answer = EXCLUDED.answer, expires_at = EXCLUDED.expires_at \
           WHERE turn_answers.expires_at < now()",
    )
    .bind(tenant)
    .bind(&put.key.0)
    .bind(&put.answer)
    .bind(f64::from(put.ttl_ms))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    bounds::commit(tx).await?;
    Ok(stored == 1)
}

/// A checked [`pb::SessionNote`] to store.
#[derive(Debug)]
pub struct Note {
    session_id: String,
    id: String,
    access: i16,
    body: Vec<u8>,
    content_hash: Vec<u8>,
    expires_at_ms: i64,
}

fn invalid(field: &str, rule: &str) -> Error {
    Error::InvalidArgument(format!("{field}: {rule}"))
}

fn check_chars(field: &str, v: &str, max: usize) -> Result<()> {
    let n = v.chars().count();
    if n == 0 || n > max || v.contains('\0') {
        return Err(invalid(
            field,
            &format!("must be 1 to {max} characters, no NUL"),
        ));
    }
    Ok(())
}

impl TryFrom<pb::SessionNote> for Note {
    type Error = Error;

    fn try_from(n: pb::SessionNote) -> Result<Self> {
        check_chars("notes.session_id", &n.session_id, MAX_SESSION_ID_CHARS)?;
        check_chars("notes.id", &n.id, MAX_NOTE_ID_CHARS)?;
        let access = engram_common::AccessLevel::from_proto(n.access_level)
            .ok_or_else(|| invalid("notes.access_level", "unknown access level"))?;
        if n.body.is_empty() || n.body.len() > MAX_NOTE_BYTES {
            return Err(invalid(
                "notes.body",
                &format!("must be 1 to {MAX_NOTE_BYTES} bytes"),
            ));
        }
        if n.content_hash.len() != KEY_BYTES {
            return Err(invalid("notes.content_hash", "must be 32 bytes"));
        }
        let latest = chrono::Utc::now().timestamp_millis() + MAX_NOTE_LIFE_MS;
        if n.expires_at_ms <= 0 || n.expires_at_ms > latest {
            return Err(invalid(
                "notes.expires_at_ms",
                "must be a time (ms since the epoch) at most a year from now",
            ));
        }
        Ok(Self {
            session_id: n.session_id,
            id: n.id,
            access: access.as_i16(),
            body: n.body,
            content_hash: n.content_hash,
            expires_at_ms: n.expires_at_ms,
        })
    }
}

/// A checked [`pb::PutNotesRequest`].
#[derive(Debug)]
pub struct PutNotes {
    notes: Vec<Note>,
    max_per_session: u32,
}

impl TryFrom<pb::PutNotesRequest> for PutNotes {
    type Error = Error;

    fn try_from(r: pb::PutNotesRequest) -> Result<Self> {
        if r.notes.is_empty() || r.notes.len() > MAX_NOTES {
            return Err(invalid(
                "notes",
                &format!("must hold 1 to {MAX_NOTES} notes"),
            ));
        }
        if r.max_per_session == 0 || r.max_per_session > MAX_NOTES_PER_SESSION {
            return Err(invalid(
                "max_per_session",
                &format!("must be 1 to {MAX_NOTES_PER_SESSION}"),
            ));
        }
        let notes = r
            .notes
            .into_iter()
            .map(Note::try_from)
            .collect::<Result<_>>()?;
        Ok(Self {
            notes,
            max_per_session: r.max_per_session,
        })
    }
}

/// A checked session id.
#[derive(Debug)]
pub struct SessionId(String);

impl TryFrom<pb::GetNotesRequest> for SessionId {
    type Error = Error;

    fn try_from(r: pb::GetNotesRequest) -> Result<Self> {
        check_chars("session_id", &r.session_id, MAX_SESSION_ID_CHARS)?;
        Ok(Self(r.session_id))
    }
}

/// Checked note ids: those that could name a note. A Delete names
/// memories and notes in one list, so an id no note can have (empty, too
/// long, with a NUL) is not a note to delete, not a bad request.
#[derive(Debug)]
pub struct NoteIds(Vec<String>);

impl TryFrom<pb::DeleteNotesRequest> for NoteIds {
    type Error = Error;

    fn try_from(r: pb::DeleteNotesRequest) -> Result<Self> {
        if r.ids.len() > MAX_NOTES {
            return Err(invalid("ids", &format!("at most {MAX_NOTES}")));
        }
        let ids = (r.ids.into_iter())
            .filter(|id| check_chars("ids", id, MAX_NOTE_ID_CHARS).is_ok())
            .collect();
        Ok(Self(ids))
    }
}

const PUT_NOTE_SQL: &str = "INSERT INTO working_notes AS w \
     (tenant_id, agent_id, session_id, id, access_level, body, content_hash, version, expires_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, 1, to_timestamp($8::float8 / 1000)) \
     ON CONFLICT (tenant_id, agent_id, session_id, id) DO UPDATE SET \
       access_level = EXCLUDED.access_level, body = EXCLUDED.body, \
       content_hash = EXCLUDED.content_hash, expires_at = EXCLUDED.expires_at, \
       written_at = now(), \
       version = CASE WHEN w.expires_at < now() THEN 1 \
                      WHEN w.content_hash = EXCLUDED.content_hash THEN w.version \
                      ELSE w.version + 1 END \
     WHERE w.access_level <= $9 \
     RETURNING version, (xmax = 0) AS created";

/// Makes room in the tenant's byte and note budgets for `incoming` bytes
/// and notes: its oldest notes at or below `trust` go first (a lower-trust
/// writer never pushes out a higher-trust note). Reads the tenant's notes
/// newest first (migration 0014's index) and never more than the note
/// budget past what it keeps.
const TENANT_ROOM_SQL: &str = "DELETE FROM working_notes WHERE (tenant_id, agent_id, session_id, id) IN ( \
     SELECT tenant_id, agent_id, session_id, id FROM ( \
       SELECT tenant_id, agent_id, session_id, id, \
              sum(octet_length(body)) OVER (ORDER BY written_at DESC, id) AS upto, \
              row_number() OVER (ORDER BY written_at DESC, id) AS n \
       FROM working_notes WHERE tenant_id = $1 AND access_level <= $2) kept \
     WHERE upto > $3 OR n > $4)";

/// The most working notes a tenant keeps at or below one trust level.
pub const TENANT_NOTES: i64 = 100_000;

/// The session's notes past its cap, oldest written first; only those at
/// or below the writer's trust go (a lower-trust key of the same agent
/// never pushes out a higher-trust note).
const SESSION_CAP_SQL: &str = "DELETE FROM working_notes WHERE (tenant_id, agent_id, session_id, id) IN ( \
     SELECT tenant_id, agent_id, session_id, id FROM ( \
       SELECT tenant_id, agent_id, session_id, id, access_level FROM working_notes \
       WHERE tenant_id = $1 AND agent_id = $2 AND session_id = $3 \
       ORDER BY written_at DESC, id OFFSET $4) past \
     WHERE access_level <= $5)";

/// Stores the notes of `identity`, all or none: `Err(i)` when note `i` is
/// stored above the caller's trust. Returns each note's version and
/// whether it was created.
pub async fn put_notes(
    pool: &PgPool,
    identity: &engram_common::Identity,
    put: &PutNotes,
) -> Result<std::result::Result<Vec<(i32, bool)>, usize>> {
    let trust = identity.trust.as_i16();
    if let Some(i) = put.notes.iter().position(|n| n.access > trust) {
        return Ok(Err(i));
    }
    let mut tx = bounds::begin(pool, TIMEOUT_MS).await?;
    let incoming: i64 = put.notes.iter().map(|n| n.body.len() as i64).sum();
    sqlx::query(TENANT_ROOM_SQL)
        .bind(&identity.tenant)
        .bind(trust)
        .bind(TENANT_NOTE_BYTES - incoming)
        .bind(TENANT_NOTES - put.notes.len() as i64)
        .execute(&mut *tx)
        .await?;
    // Rows are written in key order, so two batches over the same notes
    // queue instead of deadlocking.
    let mut order: Vec<usize> = (0..put.notes.len()).collect();
    order.sort_by_key(|&i| (&put.notes[i].session_id, &put.notes[i].id));
    let mut out = vec![(0, false); put.notes.len()];
    for i in order {
        let n = &put.notes[i];
        let row: Option<(i32, bool)> = sqlx::query_as(PUT_NOTE_SQL)
            .bind(&identity.tenant)
            .bind(&identity.agent_id)
            .bind(&n.session_id)
            .bind(&n.id)
            .bind(n.access)
            .bind(&n.body)
            .bind(&n.content_hash)
            .bind(n.expires_at_ms as f64)
            .bind(trust)
            .fetch_optional(&mut *tx)
            .await?;
        match row {
            Some(r) => out[i] = r,
            None => {
                tx.rollback().await?;
                return Ok(Err(i));
            }
        }
    }
    let sessions: std::collections::BTreeSet<&str> =
        put.notes.iter().map(|n| n.session_id.as_str()).collect();
    for session in sessions {
        sqlx::query(SESSION_CAP_SQL)
            .bind(&identity.tenant)
            .bind(&identity.agent_id)
            .bind(session)
            .bind(i64::from(put.max_per_session))
            .bind(trust)
            .execute(&mut *tx)
            .await?;
    }
    bounds::commit(tx).await?;
    Ok(Ok(out))
}

/// id, access level, body, content hash, version, expiry (ms).
type NoteRow = (String, i16, Vec<u8>, Vec<u8>, i32, f64);

/// The session's live notes at or below the caller's trust.
pub async fn get_notes(
    pool: &PgPool,
    identity: &engram_common::Identity,
    session: &SessionId,
) -> Result<Vec<pb::SessionNote>> {
    let mut tx = bounds::begin(pool, TIMEOUT_MS).await?;
    let rows: Vec<NoteRow> = sqlx::query_as(
        "SELECT id, access_level, body, content_hash, version, \
                extract(epoch FROM expires_at)::float8 * 1000 \
         FROM working_notes \
         WHERE tenant_id = $1 AND agent_id = $2 AND session_id = $3 \
           AND access_level <= $4 AND expires_at > now() \
         LIMIT 10000",
    )
    .bind(&identity.tenant)
    .bind(&identity.agent_id)
    .bind(&session.0)
    .bind(identity.trust.as_i16())
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows
        .into_iter()
        .map(
            |(id, access, body, content_hash, version, expires)| pb::SessionNote {
                session_id: session.0.clone(),
                id,
                access_level: i32::from(access),
                body,
                content_hash,
                expires_at_ms: expires as i64,
                version,
                created: false,
            },
        )
        .collect())
}

/// Deletes the caller's notes with these ids at or below its trust.
pub async fn delete_notes(
    pool: &PgPool,
    identity: &engram_common::Identity,
    ids: &NoteIds,
) -> Result<u32> {
    if ids.0.is_empty() {
        return Ok(0);
    }
    let mut tx = bounds::begin(pool, TIMEOUT_MS).await?;
    let n = sqlx::query(
        "DELETE FROM working_notes WHERE tenant_id = $1 AND agent_id = $2 \
         AND id = ANY($3) AND access_level <= $4 AND expires_at > now()",
    )
    .bind(&identity.tenant)
    .bind(&identity.agent_id)
    .bind(&ids.0)
    .bind(identity.trust.as_i16())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    bounds::commit(tx).await?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

#[tonic::async_trait]
impl GatewayStateService for crate::SearchSvc {
    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> std::result::Result<Response<pb::HeartbeatResponse>, Status> {
        engram_common::Identity::check_internal_token(
            req.metadata(),
            self.inner.internal_token_opt.as_deref(),
        )?;
        // No request slot: a replica's heartbeat every 2 s is not work a
        // tenant asked for, and a search-svc at its limit must still count
        // the replicas (and sweep what expired).
        let h = Heartbeat::try_from(req.into_inner())?;
        let live = heartbeat(&self.inner.pool, &h).await?;
        Ok(Response::new(pb::HeartbeatResponse { live }))
    }

    async fn get_turn(
        &self,
        req: Request<pb::GetTurnRequest>,
    ) -> std::result::Result<Response<pb::GetTurnResponse>, Status> {
        let (_slot, identity, key) = self.open::<_, TurnKey>(req)?;
        let answer_opt = get_turn(&self.inner.pool, &identity.tenant, &key).await?;
        Ok(Response::new(pb::GetTurnResponse {
            found: answer_opt.is_some(),
            answer: answer_opt.unwrap_or_default(),
        }))
    }

    async fn put_turn(
        &self,
        req: Request<pb::PutTurnRequest>,
    ) -> std::result::Result<Response<pb::PutTurnResponse>, Status> {
        let (_slot, identity, put) = self.open::<_, PutTurn>(req)?;
        let stored = put_turn(&self.inner.pool, &identity.tenant, &put).await?;
        Ok(Response::new(pb::PutTurnResponse { stored }))
    }

    async fn put_notes(
        &self,
        req: Request<pb::PutNotesRequest>,
    ) -> std::result::Result<Response<pb::PutNotesResponse>, Status> {
        let (_slot, identity, put) = self.open::<_, PutNotes>(req)?;
        let stored = put_notes(&self.inner.pool, &identity, &put).await?;
        let resp = match stored {
            Ok(done) => pb::PutNotesResponse {
                notes: (done.into_iter())
                    .map(|(version, created)| pb::SessionNote {
                        version,
                        created,
                        ..Default::default()
                    })
                    .collect(),
                refused: 0,
            },
            Err(i) => pb::PutNotesResponse {
                notes: Vec::new(),
                refused: u32::try_from(i + 1).unwrap_or(u32::MAX),
            },
        };
        Ok(Response::new(resp))
    }

    async fn get_notes(
        &self,
        req: Request<pb::GetNotesRequest>,
    ) -> std::result::Result<Response<pb::GetNotesResponse>, Status> {
        let (_slot, identity, session) = self.open::<_, SessionId>(req)?;
        let notes = get_notes(&self.inner.pool, &identity, &session).await?;
        Ok(Response::new(pb::GetNotesResponse { notes }))
    }

    async fn delete_notes(
        &self,
        req: Request<pb::DeleteNotesRequest>,
    ) -> std::result::Result<Response<pb::DeleteNotesResponse>, Status> {
        let (_slot, identity, ids) = self.open::<_, NoteIds>(req)?;
        let deleted = delete_notes(&self.inner.pool, &identity, &ids).await?;
        Ok(Response::new(pb::DeleteNotesResponse { deleted }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_requests_name_the_field() {
        let e = Heartbeat::try_from(pb::HeartbeatRequest {
            member_id: String::new(),
            ttl_ms: 5_000,
            leaving: false,
            group: "gateway".into(),
        });
        assert!(matches!(e, Err(Error::InvalidArgument(m)) if m.starts_with("member_id")));
        let e = Heartbeat::try_from(pb::HeartbeatRequest {
            member_id: "g".into(),
            ttl_ms: 5_000,
            leaving: false,
            group: String::new(),
        });
        assert!(matches!(e, Err(Error::InvalidArgument(m)) if m.starts_with("group")));
        let e = Heartbeat::try_from(pb::HeartbeatRequest {
            member_id: "g".into(),
            ttl_ms: 10,
            leaving: false,
            group: "gateway".into(),
        });
        assert!(matches!(e, Err(Error::InvalidArgument(m)) if m.starts_with("ttl_ms")));
        let e = TurnKey::try_from(pb::GetTurnRequest { key: vec![1; 31] });
        assert!(matches!(e, Err(Error::InvalidArgument(m)) if m.starts_with("key")));
        let e = PutTurn::try_from(pb::PutTurnRequest {
            key: vec![1; 32],
            answer: vec![0; MAX_ANSWER_BYTES + 1],
            ttl_ms: 1_000,
        });
        assert!(matches!(e, Err(Error::InvalidArgument(m)) if m.starts_with("answer")));
    }
}
