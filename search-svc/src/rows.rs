//! Mapping between `memories` rows and the proto `Memory`.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use engram_common::Identity;
use engram_common::convert::{chrono_to_ts, json_to_struct};
use engram_proto as pb;
use uuid::Uuid;

/// Columns of [`MemoryRow`], qualified with the alias `m`.
pub const MEMORY_COLUMNS: &str = "m.id, m.tenant_id, m.namespace, m.agent_id, m.memory_type, \
     m.title, m.content, m.access_level, m.source_confidence, m.decay_score, m.event_time, \
     m.ingestion_time, m.valid_from, m.valid_to, m.recorded_at, m.retracted_at, m.version, \
     m.supersedes, m.consolidated, m.metadata, m.source, m.session_id, m.turn_index, m.speaker, \
     m.caption";

#[derive(Debug, sqlx::FromRow)]
pub struct MemoryRow {
    pub id: Uuid,
    pub tenant_id: String,
    pub namespace: String,
    pub agent_id: String,
    pub memory_type: String,
    pub title: String,
    pub content: String,
    pub access_level: i16,
    pub source_confidence: f32,
    pub decay_score: f32,
    pub event_time: DateTime<Utc>,
    pub ingestion_time: DateTime<Utc>,
    pub valid_from: DateTime<Utc>,
    pub valid_to: Option<DateTime<Utc>>,
    pub recorded_at: DateTime<Utc>,
    pub retracted_at: Option<DateTime<Utc>>,
    pub version: i32,
    pub supersedes: Option<Uuid>,
    pub consolidated: bool,
    pub metadata: serde_json::Value,
    pub source: String,
    pub session_id: Option<String>,
    pub turn_index: Option<i32>,
    pub speaker: String,
    pub caption: String,
}

/// Blanks `supersedes` where the memory it names is above the reader's
/// trust (or gone): a reader must not learn the id, or the existence, of a
/// memory it cannot read through the one that replaced it. Every read that
/// returns memories (dense, keyword, get) calls it on its rows, inside the
/// read's own bounded transaction. One indexed query, and none when no row
/// supersedes anything.
pub async fn hide_unreadable_supersedes<'a>(
    conn: &mut sqlx::PgConnection,
    identity: &Identity,
    rows: impl IntoIterator<Item = &'a mut MemoryRow>,
) -> Result<(), sqlx::Error> {
    let rows: Vec<&mut MemoryRow> = rows
        .into_iter()
        .filter(|r| r.supersedes.is_some())
        .collect();
    if rows.is_empty() {
        return Ok(());
    }
    let targets: Vec<Uuid> = rows.iter().filter_map(|r| r.supersedes).collect();
    let readable: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM memories WHERE tenant_id = $1 AND access_level <= $2 AND id = ANY($3)",
    )
    .bind(&identity.tenant)
    .bind(identity.trust.as_i16())
    .bind(&targets)
    .fetch_all(conn)
    .await?;
    let readable: HashSet<Uuid> = readable.into_iter().collect();
    for r in rows {
        if r.supersedes.is_some_and(|t| !readable.contains(&t)) {
            r.supersedes = None;
        }
    }
    Ok(())
}

/// Edits are versions (migration 0011): read as of an ingestion time `at`,
/// a memory edited since reads with the title, content and version it had
/// then. Every search read with filters calls it on its rows, inside the
/// read's own transaction; no query without `as_of_ingestion`.
///
/// Returns the memories the reader must not see as of then: the version
/// of then was written at a level above the reader's trust (an edit
/// lowered it since, migration 0012). The caller drops them.
pub async fn as_recorded_at<'a>(
    conn: &mut sqlx::PgConnection,
    identity: &Identity,
    at_opt: Option<DateTime<Utc>>,
    rows: impl IntoIterator<Item = &'a mut MemoryRow>,
) -> Result<HashSet<Uuid>, sqlx::Error> {
    let mut unreadable = HashSet::new();
    let Some(at) = at_opt else {
        return Ok(unreadable);
    };
    let mut rows: Vec<&mut MemoryRow> = rows.into_iter().collect();
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    if ids.is_empty() {
        return Ok(unreadable);
    }
    let then: Vec<(Uuid, i32, String, String, i16)> = sqlx::query_as(
        "SELECT memory_id, version, title, content, access_level FROM memory_versions \
         WHERE tenant_id = $1 AND memory_id = ANY($2) AND recorded_at <= $3 AND replaced_at > $3",
    )
    .bind(&identity.tenant)
    .bind(&ids)
    .bind(at)
    .fetch_all(conn)
    .await?;
    for (id, version, title, content, level) in then {
        if level > identity.trust.as_i16() {
            unreadable.insert(id);
            continue;
        }
        if let Some(r) = rows.iter_mut().find(|r| r.id == id) {
            (r.version, r.title, r.content) = (version, title, content);
        }
    }
    Ok(unreadable)
}

/// What every filtered read does to its rows before they leave its
/// transaction: [`hide_unreadable_supersedes`], then [`as_recorded_at`]
/// for a read as of an ingestion time. Returns the ids to drop (see
/// [`as_recorded_at`]).
pub async fn for_reader<'a>(
    conn: &mut sqlx::PgConnection,
    identity: &Identity,
    as_of_ingestion_opt: Option<DateTime<Utc>>,
    rows: impl IntoIterator<Item = &'a mut MemoryRow>,
) -> Result<HashSet<Uuid>, sqlx::Error> {
    let mut rows: Vec<&mut MemoryRow> = rows.into_iter().collect();
    hide_unreadable_supersedes(&mut *conn, identity, rows.iter_mut().map(|r| &mut **r)).await?;
    as_recorded_at(conn, identity, as_of_ingestion_opt, rows).await
}

/// A search hit: the memory plus the raw score column computed in SQL.
#[derive(Debug, sqlx::FromRow)]
pub struct ScoredRow {
    #[sqlx(flatten)]
    pub memory: MemoryRow,
    pub score: f64,
}

impl ScoredRow {
    /// Runs a search query as an unnamed statement, planned for its
    /// parameters every time. sqlx caches a named prepared statement per
    /// connection, and after five executions Postgres may run it with a
    /// generic plan, which cannot see that one tenant holds most of the table
    /// or how small BM25's candidate budget is: on the 100K bench tenant the
    /// generic BM25 plan took 90-230 ms where the custom one takes 6-22 ms.
    /// The extra parse is well under a millisecond.
    pub async fn fetch_all(
        mut qb: sqlx::QueryBuilder<sqlx::Postgres>,
        conn: &mut sqlx::PgConnection,
    ) -> Result<Vec<Self>, sqlx::Error> {
        qb.build_query_as().persistent(false).fetch_all(conn).await
    }
}

impl MemoryRow {
    pub fn into_proto(self) -> pb::Memory {
        let MemoryRow {
            id,
            tenant_id,
            namespace,
            agent_id,
            memory_type,
            title,
            content,
            access_level,
            source_confidence,
            decay_score,
            event_time,
            ingestion_time,
            valid_from,
            valid_to,
            recorded_at,
            retracted_at,
            version,
            supersedes,
            consolidated,
            metadata,
            source,
            session_id,
            turn_index,
            speaker,
            caption,
        } = self;
        pb::Memory {
            id: id.to_string(),
            namespace,
            agent_id,
            memory_type,
            content,
            title,
            access_level: i32::from(access_level),
            source_confidence: Some(source_confidence),
            decay_score,
            event_time: Some(chrono_to_ts(event_time)),
            ingestion_time: Some(chrono_to_ts(ingestion_time)),
            valid_from: Some(chrono_to_ts(valid_from)),
            valid_to: valid_to.map(chrono_to_ts),
            recorded_at: Some(chrono_to_ts(recorded_at)),
            retracted_at: retracted_at.map(chrono_to_ts),
            version,
            supersedes: supersedes.map(|u| u.to_string()).unwrap_or_default(),
            consolidated,
            metadata: Some(json_to_struct(&metadata)),
            source,
            entities: Vec::new(),
            triples: Vec::new(),
            embedding: Vec::new(),
            tenant_id,
            turn: session_id.map(|session_id| pb::Turn {
                session_id,
                turn_index: turn_index.map_or(0, |i| u32::try_from(i).unwrap_or(0)),
                speaker,
                caption,
            }),
            history: Vec::new(),
        }
    }
}

/// Hits in rank order (1-based).
pub fn hits(rows: Vec<(MemoryRow, f32)>) -> Vec<pb::SearchHit> {
    rows.into_iter()
        .enumerate()
        .map(|(i, (m, score))| pb::SearchHit {
            memory: Some(m.into_proto()),
            score,
            rank: u32::try_from(i + 1).unwrap_or(u32::MAX),
        })
        .collect()
}
