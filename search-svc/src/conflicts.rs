//! `ConflictService`: review of the updates engram detected at write time
//! (`updates.rs`, issue 21). A detector that reads only words will be wrong
//! about some pairs (docs/benchmarks.md), so a person or an agent can list
//! what it flagged and settle each pair:
//!
//! - **confirm**: the newer memory does replace the older one. The edge
//!   stays, marked `confirmed_at`, and the old memory's validity ends at the
//!   new one's event time, as `supersedes` would end it.
//! - **reject**: not an update. The edge is deleted, an auto-supersede that
//!   this pair caused is undone, and the pair goes into `rejected_updates`
//!   so the detector never flags it again (migration 0007).
//!
//! Both ends of a pair must be readable by the caller (its tenant, access
//! level at most its trust): a pair the caller cannot see is listed as
//! absent and reviewed as NOT_FOUND, so a lower-trust key can neither learn
//! of a higher-trust memory nor close it.

use chrono::{DateTime, Utc};
use engram_common::Identity;
use engram_common::convert::chrono_to_ts;
use engram_common::text::MAX_NAMESPACE_CHARS;
use engram_proto as pb;
use engram_proto::conflict_service_server::ConflictService;
use sqlx::{PgPool, Postgres, Transaction};
use tonic::{Request, Response, Status};
use uuid::Uuid;

use crate::bounds;
use crate::error::{Error, Result};
use crate::validate::parse_uuid;

pub const SERVICE_NAME: &str = "engram.v1.ConflictService";
pub const DEFAULT_PAGE_SIZE: u32 = 50;
pub const MAX_PAGE_SIZE: u32 = 200;
const TOKEN_PREFIX: &str = "c1.";
/// How much of each memory's text a listed pair carries.
const CONTENT_CHARS: i32 = 200;

/// A checked `ListConflictsRequest`.
#[derive(Debug, Clone, PartialEq)]
pub struct ConflictQuery {
    pub page_size: u32,
    /// Edge ids below this one (the previous page's last).
    pub before_opt: Option<i64>,
    pub namespace_opt: Option<String>,
    pub include_confirmed: bool,
}

impl TryFrom<pb::ListConflictsRequest> for ConflictQuery {
    type Error = Error;

    fn try_from(r: pb::ListConflictsRequest) -> Result<Self> {
        let pb::ListConflictsRequest {
            page_size,
            page_token,
            namespace,
            include_confirmed,
        } = r;
        let page_size = crate::validate::page_size(page_size, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)?;
        let before_opt = match page_token.as_str() {
            "" => None,
            t => Some(
                (t.strip_prefix(TOKEN_PREFIX))
                    .and_then(|id| id.parse::<i64>().ok())
                    .filter(|id| *id > 0)
                    .ok_or_else(|| {
                        Error::invalid("page_token", "is not a token ListConflicts issued")
                    })?,
            ),
        };
        engram_common::text::check_text(&namespace)
            .map_err(|rule| Error::invalid("namespace", rule))?;
        if namespace.chars().count() > MAX_NAMESPACE_CHARS {
            return Err(Error::invalid(
                "namespace",
                format!("must be at most {MAX_NAMESPACE_CHARS} characters"),
            ));
        }
        Ok(Self {
            page_size,
            before_opt,
            namespace_opt: (!namespace.is_empty()).then_some(namespace),
            include_confirmed,
        })
    }
}

/// What a review decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Confirm,
    Reject,
}

/// A checked `ReviewConflictRequest`.
#[derive(Debug, Clone, PartialEq)]
pub struct Review {
    pub new_id: Uuid,
    pub old_id: Uuid,
    pub decision: Decision,
}

impl TryFrom<pb::ReviewConflictRequest> for Review {
    type Error = Error;

    fn try_from(r: pb::ReviewConflictRequest) -> Result<Self> {
        let pb::ReviewConflictRequest {
            new_id,
            old_id,
            decision,
        } = r;
        let new_id = parse_uuid("new_id", &new_id)?;
        let old_id = parse_uuid("old_id", &old_id)?;
        if new_id == old_id {
            return Err(Error::invalid("old_id", "must differ from new_id"));
        }
        let decision = match pb::ConflictDecision::try_from(decision) {
            Ok(pb::ConflictDecision::Confirm) => Decision::Confirm,
            Ok(pb::ConflictDecision::Reject) => Decision::Reject,
            _ => {
                return Err(Error::invalid(
                    "decision",
                    "must be CONFLICT_DECISION_CONFIRM or CONFLICT_DECISION_REJECT",
                ));
            }
        };
        Ok(Self {
            new_id,
            old_id,
            decision,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
struct ConflictRow {
    edge_id: i64,
    new_id: Uuid,
    old_id: Uuid,
    score: f32,
    reason: String,
    new_content: String,
    old_content: String,
    new_event_time: DateTime<Utc>,
    old_event_time: DateTime<Utc>,
    detected_at: DateTime<Utc>,
    confirmed_at: Option<DateTime<Utc>>,
    old_closed: bool,
}

impl ConflictRow {
    fn into_proto(self) -> pb::DetectedConflict {
        pb::DetectedConflict {
            new_id: self.new_id.to_string(),
            old_id: self.old_id.to_string(),
            score: self.score,
            reason: self.reason,
            new_content: self.new_content,
            old_content: self.old_content,
            new_event_time: Some(chrono_to_ts(self.new_event_time)),
            old_event_time: Some(chrono_to_ts(self.old_event_time)),
            detected_at: Some(chrono_to_ts(self.detected_at)),
            confirmed_at: self.confirmed_at.map(chrono_to_ts),
            old_closed: self.old_closed,
        }
    }
}

/// The detected pairs `$1` (tenant) may see at trust `$2`: both memories
/// in the tenant and at most that access level.
const VISIBLE_SQL: &str = "
SELECT e.id AS edge_id, e.src_id AS new_id, e.dst_id AS old_id, e.weight AS score,
       coalesce(e.reason, '') AS reason,
       left(n.content, $3) AS new_content, left(o.content, $3) AS old_content,
       n.event_time AS new_event_time, o.event_time AS old_event_time,
       e.created_at AS detected_at, e.confirmed_at, (o.valid_to IS NOT NULL) AS old_closed
FROM edges e
JOIN memories n ON n.id = e.src_id AND n.tenant_id = $1 AND n.access_level <= $2
JOIN memories o ON o.id = e.dst_id AND o.tenant_id = $1 AND o.access_level <= $2
WHERE e.tenant_id = $1 AND e.origin = 'detected' AND e.edge_type = 'contradicts'";

/// One page, newest detection first, and the next page's token.
pub async fn list(
    pool: &PgPool,
    identity: &Identity,
    q: &ConflictQuery,
    timeout_ms: u64,
) -> Result<(Vec<pb::DetectedConflict>, Option<String>)> {
    let sql = format!(
        "{VISIBLE_SQL}
           AND ($4::text IS NULL OR n.namespace = $4)
           AND ($5 OR e.confirmed_at IS NULL)
           AND ($6::bigint IS NULL OR e.id < $6)
         ORDER BY e.id DESC LIMIT $7"
    );
    let mut tx = bounds::begin(pool, timeout_ms).await?;
    let mut rows: Vec<ConflictRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(&identity.tenant)
        .bind(identity.trust.as_i16())
        .bind(CONTENT_CHARS)
        .bind(&q.namespace_opt)
        .bind(q.include_confirmed)
        .bind(q.before_opt)
        // One row more than the page tells whether another page follows.
        .bind(i64::from(q.page_size) + 1)
        .fetch_all(&mut *tx)
        .await?;
    crate::bounds::commit(tx).await?;
    let more = rows.len() > q.page_size as usize;
    rows.truncate(q.page_size as usize);
    let next_opt = match (more, rows.last()) {
        (true, Some(last)) => Some(format!("{TOKEN_PREFIX}{}", last.edge_id)),
        _ => None,
    };
    Ok((
        rows.into_iter().map(ConflictRow::into_proto).collect(),
        next_opt,
    ))
}

/// The pair as the caller may see it, locked for the review.
async fn visible_pair(
    tx: &mut Transaction<'_, Postgres>,
    identity: &Identity,
    r: &Review,
) -> Result<Option<ConflictRow>> {
    let sql = format!("{VISIBLE_SQL} AND e.src_id = $4 AND e.dst_id = $5 FOR UPDATE OF e");
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(&identity.tenant)
        .bind(identity.trust.as_i16())
        .bind(CONTENT_CHARS)
        .bind(r.new_id)
        .bind(r.old_id)
        .fetch_optional(&mut **tx)
        .await?)
}

/// Applies a review in one transaction and tells the change feed (graph-svc
/// rebuilds the tenant's graph, gateways drop cached answers). Returns the
/// pair after a confirm, None after a reject.
pub async fn review(
    pool: &PgPool,
    identity: &Identity,
    r: &Review,
    timeout_ms: u64,
) -> Result<Option<pb::DetectedConflict>> {
    let mut tx = bounds::begin_write(pool, timeout_ms, bounds::WRITE_ACQUIRE).await?;
    let Some(pair) = visible_pair(&mut tx, identity, r).await? else {
        return Err(Error::NotFound(format!(
            "no detected conflict from {} to {} that this key may see",
            r.new_id, r.old_id
        )));
    };
    let reviewed = match r.decision {
        Decision::Confirm => Some(confirm(&mut tx, identity, r).await?),
        Decision::Reject => {
            reject(&mut tx, identity, &pair).await?;
            None
        }
    };
    let ends = [r.new_id, r.old_id];
    crate::writes::notify(&mut tx, (&identity.tenant, ""), "edges", &ends).await?;
    crate::writes::notify(&mut tx, (&identity.tenant, ""), "upsert", &[r.old_id]).await?;
    crate::bounds::commit(tx).await?;
    tracing::info!(tenant = %identity.tenant, new = %r.new_id, old = %r.old_id, decision = ?r.decision, "detected conflict reviewed");
    Ok(reviewed.map(ConflictRow::into_proto))
}

async fn confirm(
    tx: &mut Transaction<'_, Postgres>,
    identity: &Identity,
    r: &Review,
) -> Result<ConflictRow> {
    sqlx::query(
        "UPDATE edges SET confirmed_at = coalesce(confirmed_at, now()) \
         WHERE src_id = $1 AND dst_id = $2 AND edge_type = 'contradicts'",
    )
    .bind(r.new_id)
    .bind(r.old_id)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "UPDATE memories o SET valid_to = n.event_time FROM memories n \
         WHERE o.id = $2 AND n.id = $1 AND o.valid_to IS NULL",
    )
    .bind(r.new_id)
    .bind(r.old_id)
    .execute(&mut **tx)
    .await?;
    visible_pair(tx, identity, r)
        .await?
        .ok_or_else(|| Error::Internal("a confirmed conflict vanished".into()))
}

async fn reject(
    tx: &mut Transaction<'_, Postgres>,
    identity: &Identity,
    pair: &ConflictRow,
) -> Result<()> {
    sqlx::query("DELETE FROM edges WHERE id = $1")
        .bind(pair.edge_id)
        .execute(&mut **tx)
        .await?;
    sqlx::query(
        "INSERT INTO rejected_updates (tenant_id, new_id, old_id) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING",
    )
    .bind(&identity.tenant)
    .bind(pair.new_id)
    .bind(pair.old_id)
    .execute(&mut **tx)
    .await?;
    // Undo what this pair closed (auto-supersede ends the old memory at the
    // new one's event time), unless a declared `supersedes` closed it too.
    sqlx::query(
        "UPDATE memories o SET valid_to = NULL \
         WHERE o.id = $1 AND o.valid_to = $2 \
           AND NOT EXISTS (SELECT 1 FROM memories s WHERE s.supersedes = o.id)",
    )
    .bind(pair.old_id)
    .bind(pair.new_event_time)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[tonic::async_trait]
impl ConflictService for crate::SearchSvc {
    async fn list_conflicts(
        &self,
        req: Request<pb::ListConflictsRequest>,
    ) -> std::result::Result<Response<pb::ListConflictsResponse>, Status> {
        let (_slot, identity, q) = self.open::<_, ConflictQuery>(req)?;
        let timeout_ms = self.inner.timeouts.get_ms;
        let (conflicts, next_opt) = list(&self.inner.pool, &identity, &q, timeout_ms).await?;
        Ok(Response::new(pb::ListConflictsResponse {
            conflicts,
            next_page_token: next_opt.unwrap_or_default(),
        }))
    }

    async fn review_conflict(
        &self,
        req: Request<pb::ReviewConflictRequest>,
    ) -> std::result::Result<Response<pb::ReviewConflictResponse>, Status> {
        let (_slot, identity, r) = self.open::<_, Review>(req)?;
        self.writable().await?;
        let timeout_ms = self.inner.timeouts.write_ms;
        let conflict = review(&self.inner.pool, &identity, &r, timeout_ms)
            .await
            .map_err(|e| self.noted(e))?;
        Ok(Response::new(pb::ReviewConflictResponse { conflict }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of<T, U>(r: T) -> String
    where
        U: TryFrom<T, Error = Error> + std::fmt::Debug,
    {
        match U::try_from(r) {
            Err(Error::InvalidArgument(m)) => m.split(':').next().unwrap_or_default().to_string(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn a_listing_is_checked_field_by_field() {
        let ok = ConflictQuery::try_from(pb::ListConflictsRequest::default()).expect("defaults");
        assert_eq!(
            (ok.page_size, ok.before_opt, ok.namespace_opt),
            (50, None, None)
        );
        for size in [0, MAX_PAGE_SIZE + 1] {
            let r = pb::ListConflictsRequest {
                page_size: Some(size),
                ..Default::default()
            };
            assert_eq!(field_of::<_, ConflictQuery>(r), "page_size");
        }
        for token in ["x", "c1.", "c1.-4", "c1.9x", "v1.a.1.2"] {
            let r = pb::ListConflictsRequest {
                page_token: token.into(),
                ..Default::default()
            };
            assert_eq!(field_of::<_, ConflictQuery>(r), "page_token", "{token}");
        }
        let r = pb::ListConflictsRequest {
            page_token: "c1.42".into(),
            namespace: "work".into(),
            ..Default::default()
        };
        let q = ConflictQuery::try_from(r).expect("valid");
        assert_eq!(
            (q.before_opt, q.namespace_opt.as_deref()),
            (Some(42), Some("work"))
        );
        for namespace in ["a\0b".to_string(), "n".repeat(MAX_NAMESPACE_CHARS + 1)] {
            let r = pb::ListConflictsRequest {
                namespace,
                ..Default::default()
            };
            assert_eq!(field_of::<_, ConflictQuery>(r), "namespace");
        }
    }

    #[test]
    fn a_review_names_the_field_it_cannot_accept() {
        let id = Uuid::new_v4().to_string();
        let other = Uuid::new_v4().to_string();
        let req = |new_id: &str, old_id: &str, decision: i32| pb::ReviewConflictRequest {
            new_id: new_id.into(),
            old_id: old_id.into(),
            decision,
        };
        let confirm = pb::ConflictDecision::Confirm as i32;
        assert_eq!(field_of::<_, Review>(req("nope", &id, confirm)), "new_id");
        assert_eq!(field_of::<_, Review>(req(&id, "", confirm)), "old_id");
        assert_eq!(field_of::<_, Review>(req(&id, &id, confirm)), "old_id");
        assert_eq!(field_of::<_, Review>(req(&id, &other, 0)), "decision");
        assert_eq!(field_of::<_, Review>(req(&id, &other, 7)), "decision");
        let r =
            Review::try_from(req(&id, &other, pb::ConflictDecision::Reject as i32)).expect("valid");
        assert_eq!(r.decision, Decision::Reject);
    }
}
