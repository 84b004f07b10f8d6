//! Get by id: only the caller's tenant and trust level, with entity names
//! (unless the caller omits them) and the embedding on request.

use engram_common::Identity;
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

/// Both statements run under `timeout_ms` (`search.statement_timeout_get_ms`).
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
         FROM memories m WHERE m.tenant_id = $1 AND m.access_level <= $2 AND m.id = ANY($3)"
    );
    let mut read = readers.read(timeout_ms).await?;
    let mut rows: Vec<GetRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(&identity.tenant)
        .bind(identity.trust.as_i16())
        .bind(&q.ids)
        .bind(q.include_embedding)
        .fetch_all(&mut *read)
        .await?;
    let memories = rows.iter_mut().map(|r| &mut r.memory);
    crate::rows::hide_unreadable_supersedes(&mut read, identity, memories).await?;
    read.finish().await?;
    let mut by_id: std::collections::HashMap<Uuid, pb::Memory> = rows
        .into_iter()
        .map(|r| {
            let id = r.memory.id;
            let mut m = r.memory.into_proto();
            m.entities = r.entities;
            if let Some(v) = r.embedding {
                m.embedding = v.to_vec();
            }
            (id, m)
        })
        .collect();
    // Request order; ids the caller cannot see are simply absent.
    Ok(q.ids.iter().filter_map(|id| by_id.remove(id)).collect())
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
