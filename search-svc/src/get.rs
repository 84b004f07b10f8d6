//! Get by id: only the caller's tenant and trust level, with entity names
//! (unless the caller omits them), the embedding, the earlier contents of
//! an edited memory, or the memory as recorded at a time, on request.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use engram_common::Identity;
use engram_common::convert::chrono_to_ts;
use engram_proto as pb;
use pgvector::Vector;
use uuid::Uuid;

use crate::bounds;
use crate::error::Result;
use crate::rows::{MEMORY_COLUMNS, MemoryRow};
use crate::validate::GetQuery;

#[derive(sqlx::FromRow)]
struct GetRow {
    #[sqlx(flatten)]
    memory: MemoryRow,
    entities: Vec<String>,
    embedding: Option<Vector>,
}

/// Every statement runs under `timeout_ms` (`search.statement_timeout_get_ms`).
pub async fn get(
    readers: &bounds::Readers,
    identity: &Identity,
    q: GetQuery,
    timeout_ms: u64,
) -> Result<Vec<pb::Memory>> {
    if q.vectors_only {
        return vectors(readers, identity, &q.ids, timeout_ms).await;
    }
    // Two fixed statements (not a CASE on a parameter): a prepared plan
    // cannot skip the per-row entity join and sort at run time.
    let entities = if q.omit_entities {
        "ARRAY[]::text[]"
    } else {
        "ARRAY(SELECT e.display FROM memory_entities me JOIN entities e ON e.id = me.entity_id \
           WHERE me.memory_id = m.id ORDER BY me.is_home DESC, e.name)"
    };
    let sql = format!(
        "SELECT {MEMORY_COLUMNS}, {entities} AS entities, \
           CASE WHEN $4 THEN m.embedding END AS embedding \
         FROM memories m WHERE m.tenant_id = $1 AND m.access_level <= $2 AND m.id = ANY($3) \
           AND ($5::timestamptz IS NULL OR (m.recorded_at <= $5 \
                AND (m.retracted_at IS NULL OR m.retracted_at > $5)))"
    );
    let mut read = readers.read(timeout_ms).await?;
    let mut rows: Vec<GetRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(&identity.tenant)
        .bind(identity.trust.as_i16())
        .bind(&q.ids)
        .bind(q.include_embedding)
        .bind(q.as_of_ingestion_opt)
        .fetch_all(&mut *read)
        .await?;
    let memories = rows.iter_mut().map(|r| &mut r.memory);
    let at = q.as_of_ingestion_opt;
    let unreadable = crate::rows::for_reader(&mut read, identity, at, memories).await?;
    rows.retain(|r| !unreadable.contains(&r.memory.id));
    let mut history = match q.include_history {
        true => versions(&mut read, identity, &rows).await?,
        false => HashMap::new(),
    };
    read.finish().await?;
    let mut by_id: HashMap<Uuid, pb::Memory> = rows
        .into_iter()
        .map(|r| {
            let id = r.memory.id;
            let mut m = r.memory.into_proto();
            m.entities = r.entities;
            if let Some(v) = r.embedding {
                m.embedding = v.to_vec();
            }
            // Only the versions before the one returned (an as-of read
            // returns an earlier one).
            m.history = (history.remove(&id).unwrap_or_default().into_iter())
                .filter(|v| v.version < m.version)
                .collect();
            (id, m)
        })
        .collect();
    // Request order; ids the caller cannot see are simply absent.
    Ok(q.ids.iter().filter_map(|id| by_id.remove(id)).collect())
}

#[derive(sqlx::FromRow)]
struct VersionRow {
    memory_id: Uuid,
    version: i32,
    title: String,
    content: String,
    event_time: DateTime<Utc>,
    recorded_at: DateTime<Utc>,
    replaced_at: DateTime<Utc>,
}

/// The earlier contents of the edited memories among `rows` (version > 1),
/// oldest first, each only at or under the caller's trust (migration 0012:
/// a version keeps the level it was written at).
async fn versions(
    conn: &mut sqlx::PgConnection,
    identity: &Identity,
    rows: &[GetRow],
) -> Result<HashMap<Uuid, Vec<pb::MemoryVersion>>> {
    let edited: Vec<Uuid> = (rows.iter())
        .filter(|r| r.memory.version > 1)
        .map(|r| r.memory.id)
        .collect();
    let mut out: HashMap<Uuid, Vec<pb::MemoryVersion>> = HashMap::new();
    if edited.is_empty() {
        return Ok(out);
    }
    let found: Vec<VersionRow> = sqlx::query_as(
        "SELECT memory_id, version, title, content, event_time, recorded_at, replaced_at \
         FROM memory_versions \
         WHERE tenant_id = $1 AND memory_id = ANY($2) AND access_level <= $3 \
         ORDER BY memory_id, version",
    )
    .bind(&identity.tenant)
    .bind(&edited)
    .bind(identity.trust.as_i16())
    .fetch_all(conn)
    .await?;
    for v in found {
        out.entry(v.memory_id).or_default().push(pb::MemoryVersion {
            version: v.version,
            title: v.title,
            content: v.content,
            event_time: Some(chrono_to_ts(v.event_time)),
            recorded_at: Some(chrono_to_ts(v.recorded_at)),
            replaced_at: Some(chrono_to_ts(v.replaced_at)),
        });
    }
    Ok(out)
}

/// Stage 4b's read: each visible memory's id and stored vector, nothing
/// else, so no columns to decode and no supersedes to hide. Same scope as
/// every read: the caller's tenant and trust level.
async fn vectors(
    readers: &bounds::Readers,
    identity: &Identity,
    ids: &[Uuid],
    timeout_ms: u64,
) -> Result<Vec<pb::Memory>> {
    let mut read = readers.read(timeout_ms).await?;
    let rows: Vec<(Uuid, Option<Vector>)> = sqlx::query_as(
        "SELECT id, embedding FROM memories \
         WHERE tenant_id = $1 AND access_level <= $2 AND id = ANY($3)",
    )
    .bind(&identity.tenant)
    .bind(identity.trust.as_i16())
    .bind(ids)
    .fetch_all(&mut *read)
    .await?;
    read.finish().await?;
    let memory = |(id, v): (Uuid, Option<Vector>)| pb::Memory {
        id: id.to_string(),
        tenant_id: identity.tenant.clone(),
        embedding: v.map(|v| v.to_vec()).unwrap_or_default(),
        ..Default::default()
    };
    Ok(rows.into_iter().map(memory).collect())
}
