//! `ListingService.ListMemories`: one page of the caller's stored memories,
//! for export and cleanup (`engram memories`). The same WHERE clause as
//! every other read (`filters::push_where`: tenant, access level, then the
//! request's filters), so a listing can never show more than a search could.
//!
//! Paging is keyset on `(ingestion_time, id)`: `ingestion_time` is set once
//! when a row is created and never changes, so a walk through the pages
//! neither skips nor repeats a memory while others are written or deleted,
//! and page N costs what page 1 costs (no OFFSET). The token is the last
//! row's position in plain text; it is opaque to clients but needs no
//! secrecy: a forged one only moves the start within the caller's own rows.

use chrono::{DateTime, Utc};
use engram_common::Identity;
use engram_proto as pb;
use engram_proto::listing_service_server::ListingService;
use sqlx::{PgPool, Postgres, QueryBuilder};
use tonic::{Request, Response, Status};
use uuid::Uuid;

use crate::bounds;
use crate::error::{Error, Result};
use crate::rows::{MEMORY_COLUMNS, MemoryRow};
use crate::validate::SearchFilters;

pub const SERVICE_NAME: &str = "engram.v1.ListingService";
pub const DEFAULT_PAGE_SIZE: u32 = 100;
pub const MAX_PAGE_SIZE: u32 = 1000;
/// A page ends once its memories hold this many bytes of text and
/// metadata (at least one row per page), so a page of 64 KiB memories
/// still fits gRPC's default 4 MiB message.
pub const MAX_PAGE_BYTES: usize = 3 << 20;
const TOKEN_PREFIX: &str = "v1";

/// Where a page starts: strictly after this `(ingestion_time, id)` in the
/// page's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub ingestion_time: DateTime<Utc>,
    pub id: Uuid,
    pub newest_first: bool,
}

impl Position {
    /// `v1.<a|d>.<ingestion micros>.<uuid>`.
    pub fn token(&self) -> String {
        let dir = if self.newest_first { "d" } else { "a" };
        format!(
            "{TOKEN_PREFIX}.{dir}.{}.{}",
            self.ingestion_time.timestamp_micros(),
            self.id
        )
    }

    pub fn parse(token: &str) -> Result<Self> {
        let bad = || Error::invalid("page_token", "is not a token ListMemories issued");
        let mut parts = token.split('.');
        let (Some(TOKEN_PREFIX), Some(dir), Some(micros), Some(id), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(bad());
        };
        let newest_first = match dir {
            "a" => false,
            "d" => true,
            _ => return Err(bad()),
        };
        let micros: i64 = micros.parse().map_err(|_| bad())?;
        Ok(Self {
            ingestion_time: DateTime::from_timestamp_micros(micros).ok_or_else(bad)?,
            id: Uuid::parse_str(id).map_err(|_| bad())?,
            newest_first,
        })
    }
}

/// A checked `ListMemoriesRequest`.
#[derive(Debug, Clone)]
pub struct ListQuery {
    pub page_size: u32,
    pub after_opt: Option<Position>,
    pub filters: SearchFilters,
    pub newest_first: bool,
}

impl TryFrom<pb::ListMemoriesRequest> for ListQuery {
    type Error = Error;

    fn try_from(r: pb::ListMemoriesRequest) -> Result<Self> {
        let pb::ListMemoriesRequest {
            page_size,
            page_token,
            namespace,
            memory_types,
            time_range,
            include_historical,
            include_consolidated,
            newest_first,
        } = r;
        let page_size = crate::validate::page_size(page_size, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)?;
        let after_opt = match page_token.as_str() {
            "" => None,
            t => Some(Position::parse(t)?),
        };
        if let Some(p) = after_opt
            && p.newest_first != newest_first
        {
            return Err(Error::invalid(
                "page_token",
                "was issued for the other order (newest_first)",
            ));
        }
        // The search filters' own checks, reported under this request's
        // field names (they are the same names, without a prefix).
        let filters = pb::Filters {
            memory_types,
            time_range,
            namespace,
            include_consolidated,
            include_historical,
            ..Default::default()
        };
        let filters = SearchFilters::from_proto("", Some(filters)).map_err(|e| match e {
            Error::InvalidArgument(m) => Error::InvalidArgument(m.trim_start_matches('.').into()),
            other => other,
        })?;
        Ok(Self {
            page_size,
            after_opt,
            filters,
            newest_first,
        })
    }
}

#[derive(sqlx::FromRow)]
struct ListRow {
    #[sqlx(flatten)]
    memory: MemoryRow,
    entities: Vec<String>,
}

#[derive(sqlx::FromRow)]
struct TripleRow {
    memory_id: Uuid,
    subject: String,
    relation: String,
    object: String,
}

/// One page and the token of the next (`None` on the last page). Every
/// statement runs under `timeout_ms` (`search.statement_timeout_get_ms`).
pub async fn list(
    pool: &PgPool,
    identity: &Identity,
    q: &ListQuery,
    decay_floor: f32,
    timeout_ms: u64,
) -> Result<(Vec<pb::Memory>, Option<String>)> {
    let (cmp, dir) = match q.newest_first {
        true => ("<", "DESC"),
        false => (">", "ASC"),
    };
    // The page is chosen and limited first, entity names are gathered for
    // its rows only.
    let mut qb: QueryBuilder<Postgres> = QueryBuilder::new(
        "SELECT p.*, ARRAY(SELECT e.display FROM memory_entities me \
           JOIN entities e ON e.id = me.entity_id \
           WHERE me.memory_id = p.id ORDER BY me.is_home DESC, e.name) AS entities \
         FROM (SELECT ",
    );
    qb.push(MEMORY_COLUMNS).push(" FROM memories m WHERE ");
    crate::filters::push_where(&mut qb, identity, &q.filters, decay_floor);
    if let Some(after) = q.after_opt {
        qb.push(format!(" AND (m.ingestion_time, m.id) {cmp} ("))
            .push_bind(after.ingestion_time)
            .push(", ")
            .push_bind(after.id)
            .push(")");
    }
    // One row more than the page tells whether another page follows.
    qb.push(format!(
        " ORDER BY m.ingestion_time {dir}, m.id {dir} LIMIT "
    ))
    .push_bind(i64::from(q.page_size) + 1)
    .push(format!(") p ORDER BY p.ingestion_time {dir}, p.id {dir}"));
    let mut tx = bounds::begin(pool, timeout_ms).await?;
    // Unnamed, planned for its parameters, like the searches (rows.rs): a
    // generic plan cannot see how much of the table one tenant holds.
    let mut rows: Vec<ListRow> = qb
        .build_query_as()
        .persistent(false)
        .fetch_all(&mut *tx)
        .await?;
    let mut more = rows.len() > q.page_size as usize;
    rows.truncate(q.page_size as usize);
    let mut bytes = 0;
    let fits = rows
        .iter()
        .position(|r| {
            bytes += r.memory.content.len()
                + r.memory.title.len()
                + r.memory.source.len()
                + r.memory.metadata.to_string().len();
            bytes > MAX_PAGE_BYTES
        })
        .map_or(rows.len(), |i| i.max(1));
    if fits < rows.len() {
        rows.truncate(fits);
        more = true;
    }
    let memories = rows.iter_mut().map(|r| &mut r.memory);
    crate::rows::hide_unreadable_supersedes(&mut tx, identity, memories).await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.memory.id).collect();
    let triples: Vec<TripleRow> = sqlx::query_as(
        "SELECT t.memory_id, s.display AS subject, t.relation, o.display AS object \
         FROM triples t JOIN entities s ON s.id = t.subject_id JOIN entities o ON o.id = t.object_id \
         WHERE t.tenant_id = $1 AND t.memory_id = ANY($2) ORDER BY t.id",
    )
    .bind(&identity.tenant)
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let next_opt = match (more, rows.last()) {
        (true, Some(last)) => Some(
            Position {
                ingestion_time: last.memory.ingestion_time,
                id: last.memory.id,
                newest_first: q.newest_first,
            }
            .token(),
        ),
        _ => None,
    };
    let mut by_memory: std::collections::HashMap<Uuid, Vec<pb::Triple>> = Default::default();
    for t in triples {
        by_memory.entry(t.memory_id).or_default().push(pb::Triple {
            subject: t.subject,
            relation: t.relation,
            object: t.object,
        });
    }
    let memories = rows
        .into_iter()
        .map(|r| {
            let triples = by_memory.remove(&r.memory.id).unwrap_or_default();
            let mut m = r.memory.into_proto();
            m.entities = r.entities;
            m.triples = triples;
            m
        })
        .collect();
    Ok((memories, next_opt))
}

#[tonic::async_trait]
impl ListingService for crate::SearchSvc {
    async fn list_memories(
        &self,
        req: Request<pb::ListMemoriesRequest>,
    ) -> Result<Response<pb::ListMemoriesResponse>, Status> {
        let (_slot, identity, q) = self.open::<_, ListQuery>(req)?;
        let inner = &self.inner;
        let (memories, next_opt) = list(
            &inner.pool,
            &identity,
            &q,
            inner.decay_floor,
            inner.timeouts.get_ms,
        )
        .await?;
        Ok(Response::new(pb::ListMemoriesResponse {
            memories,
            next_page_token: next_opt.unwrap_or_default(),
            tenant: identity.tenant,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_round_trips_and_a_foreign_one_names_the_field() {
        let p = Position {
            ingestion_time: DateTime::from_timestamp_micros(1_700_000_000_123_456).expect("time"),
            id: Uuid::new_v4(),
            newest_first: true,
        };
        assert_eq!(Position::parse(&p.token()).expect("parse"), p);
        for bad in [
            "",
            "v2.a.1.x",
            "v1.a.1",
            "v1.x.1.00000000-0000-0000-0000-000000000000",
        ] {
            let e = Position::parse(bad).expect_err(bad);
            assert!(e.to_string().starts_with("page_token:"), "{e}");
        }
    }

    #[test]
    fn page_size_and_filters_are_checked_by_name() {
        let req = |page_size| pb::ListMemoriesRequest {
            page_size,
            ..Default::default()
        };
        assert_eq!(
            ListQuery::try_from(req(None)).expect("default").page_size,
            DEFAULT_PAGE_SIZE
        );
        for bad in [Some(0), Some(MAX_PAGE_SIZE + 1)] {
            let e = ListQuery::try_from(req(bad)).expect_err("bad size");
            assert!(e.to_string().starts_with("page_size:"), "{e}");
        }
        let e = ListQuery::try_from(pb::ListMemoriesRequest {
            memory_types: vec!["Not A Label".into()],
            ..Default::default()
        })
        .expect_err("bad type");
        assert!(e.to_string().starts_with("memory_types[0]:"), "{e}");
        let token = Position {
            ingestion_time: Utc::now(),
            id: Uuid::new_v4(),
            newest_first: false,
        }
        .token();
        let e = ListQuery::try_from(pb::ListMemoriesRequest {
            page_token: token,
            newest_first: true,
            ..Default::default()
        })
        .expect_err("other order");
        assert!(e.to_string().starts_with("page_token:"), "{e}");
    }
}
