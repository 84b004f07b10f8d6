//! What gateway replicas share (issue 48): which replicas are alive, so
//! each takes its share of every tenant's limits, and each turn's first
//! answer, so the same `turn_id` sent to another replica gets the same
//! answer. Both live in Postgres (migrations/0013_gateway_state.sql); the
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
/// ones; sweeps a batch of expired rows of both tables.
pub async fn heartbeat(pool: &PgPool, h: &Heartbeat) -> Result<u32> {
    let mut tx = bounds::begin(pool, TIMEOUT_MS).await?;
    if h.leaving {
        sqlx::query("DELETE FROM gateway_members WHERE member_id = $1")
            .bind(&h.member_id)
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
    for table in ["gateway_members", "turn_answers"] {
        let sql = format!(
            "DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} \
             WHERE expires_at < now() LIMIT {SWEEP_BATCH}))"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
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
    Ok(u32::try_from(live).unwrap_or(u32::MAX).max(1))
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
        let _slot = self.inner.admission.admit()?;
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
