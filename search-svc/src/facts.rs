//! The fact index: every sentence of a memory with its own embedding
//! (`memory_sentences`, migration 0006), so a query can be matched against
//! single statements rather than whole passages. The gateway passes the best
//! matches to graph-svc, whose walk is then seeded from the entities those
//! sentences name (HippoRAG 2's query-to-fact linking, worth +12.5 average
//! R@5 over seeding from the query's own names in its ablation; sentences
//! stand in for its LLM-extracted triples).
//!
//! Written in the memory's own write transaction: a sentence never outlives
//! or predates its memory's content, and it is read through the memory's row
//! with every filter of dense search, so it is visible to exactly the
//! callers who may read the memory. A one-sentence memory reuses the
//! memory's embedding (most conversation turns: no extra inference).

use std::collections::HashMap;

use engram_common::Identity;
use engram_common::sentences;
use pgvector::Vector;
use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

use crate::bounds;
use crate::dense::Nearest;
use crate::embed::Embeddings;
use crate::error::Result;
use crate::validate::{NewMemory, SearchFilters, embedding_text};

/// The indexed sentences of one memory: (text as embedded, vector).
pub type Sentences = Vec<(String, Vec<f32>)>;

/// Each written memory's sentences, by position in the sorted batch; a
/// position is present when its content was new or changed when planned
/// (with no sentences when it could not be embedded).
#[derive(Debug, Default)]
pub struct Planned {
    by_pos: HashMap<usize, Sentences>,
}

impl Planned {
    pub fn has(&self, pos: usize) -> bool {
        self.by_pos.contains_key(&pos)
    }
}

/// Splits and embeds the sentences of the memories at `positions` (before
/// the transaction: no row lock is held over inference). `vectors` are the
/// memories' own embeddings where known, reused for one-sentence memories.
/// Without a loaded model only those one-sentence memories are indexed.
pub async fn plan(
    embeddings: &Embeddings,
    tenant: &str,
    memories: &[&NewMemory],
    positions: &[usize],
    vectors: &HashMap<usize, Vec<f32>>,
) -> Result<Planned> {
    let mut planned = Planned::default();
    let mut to_embed: Vec<(usize, String)> = Vec::new();
    for &pos in positions {
        let m = memories[pos];
        let split = sentences::split(&m.content);
        let texts: Vec<String> = split.iter().map(|s| embedding_text(&m.title, s)).collect();
        match (texts.as_slice(), vectors.get(&pos)) {
            ([one], Some(v)) => {
                planned.by_pos.insert(pos, vec![(one.clone(), v.clone())]);
            }
            _ if !embeddings.is_ready() => {
                planned.by_pos.insert(pos, Vec::new());
            }
            _ => {
                planned.by_pos.insert(pos, Vec::new());
                to_embed.extend(texts.into_iter().map(|t| (pos, t)));
            }
        }
    }
    embed_into(embeddings, tenant, to_embed, &mut planned).await?;
    Ok(planned)
}

/// Embeds `(position, sentence text)` pairs in one call and adds each to
/// its position's sentences, in order.
async fn embed_into(
    embeddings: &Embeddings,
    tenant: &str,
    to_embed: Vec<(usize, String)>,
    planned: &mut Planned,
) -> Result<()> {
    let texts: Vec<String> = to_embed.iter().map(|(_, t)| t.clone()).collect();
    let computed = embeddings.embed_batch(tenant, texts).await?;
    for ((pos, text), v) in to_embed.into_iter().zip(computed) {
        planned.by_pos.entry(pos).or_default().push((text, v));
    }
    Ok(())
}

/// Replaces the sentences of the memories at `positions` with the planned
/// ones (none for a position the plan skipped).
pub async fn write(
    tx: &mut Transaction<'_, Postgres>,
    ids: &[Uuid],
    positions: &[usize],
    planned: &Planned,
) -> Result<()> {
    if positions.is_empty() {
        return Ok(());
    }
    let rewritten: Vec<Uuid> = positions.iter().map(|&p| ids[p]).collect();
    sqlx::query("DELETE FROM memory_sentences WHERE memory_id = ANY($1)")
        .bind(&rewritten)
        .execute(&mut **tx)
        .await?;
    let (mut memory_ids, mut ords, mut texts, mut vectors) = (vec![], vec![], vec![], vec![]);
    for &pos in positions {
        for (ord, (text, v)) in planned.by_pos.get(&pos).into_iter().flatten().enumerate() {
            memory_ids.push(ids[pos]);
            ords.push(ord as i16);
            texts.push(text.clone());
            vectors.push(Vector::from(v.clone()));
        }
    }
    if memory_ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO memory_sentences (memory_id, ord, text, embedding) \
         SELECT u.memory_id, u.ord, u.text, u.embedding \
         FROM unnest($1::uuid[], $2::int2[], $3::text[], $4::vector[]) \
              AS u(memory_id, ord, text, embedding)",
    )
    .bind(&memory_ids)
    .bind(&ords)
    .bind(&texts)
    .bind(&vectors)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// One matched sentence.
#[derive(Debug, Clone, PartialEq)]
pub struct Fact {
    pub memory_id: Uuid,
    pub text: String,
    pub score: f32,
}

#[derive(sqlx::FromRow)]
struct FactRow {
    memory_id: Uuid,
    text: String,
    /// Cosine distance.
    score: f64,
}

/// The `k` sentences nearest `embedding` among the memories the caller may
/// read under `filters` (the same predicate as dense search).
pub async fn search(
    pool: &PgPool,
    identity: &Identity,
    embedding: &[f32],
    filters: &SearchFilters,
    k: u32,
    default_decay_floor: f32,
    timeout_ms: u64,
) -> Result<Vec<Fact>> {
    let nearest = Nearest {
        select: "s.memory_id, s.text",
        column: "s.embedding",
        from: "memory_sentences s JOIN memories m ON m.id = s.memory_id WHERE ",
    };
    let mut qb = nearest.query(embedding, identity, filters, default_decay_floor, k);
    let mut tx = bounds::begin(pool, timeout_ms).await?;
    let rows: Vec<FactRow> = qb.build_query_as().fetch_all(&mut *tx).await?;
    crate::bounds::commit(tx).await?;
    let mut facts: Vec<Fact> = rows
        .into_iter()
        .map(|r| Fact {
            memory_id: r.memory_id,
            text: r.text,
            score: (1.0 - r.score) as f32,
        })
        .collect();
    facts.sort_by(|a, b| b.score.total_cmp(&a.score));
    Ok(facts)
}

/// What one [`backfill`] pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BackfillReport {
    /// Memories without sentences that were looked at.
    pub scanned: u64,
    /// Of them, memories that now have their sentences.
    pub indexed: u64,
}

#[derive(sqlx::FromRow)]
struct Unindexed {
    id: Uuid,
    title: String,
    content: String,
    content_hash: Vec<u8>,
}

/// Whom a backfill over every tenant is charged to in the embed gate
/// (a tenant of this name would only share its share).
const BACKFILL_TENANT: &str = "(backfill)";

/// Indexes the sentences of every memory (of one tenant, or all) written
/// before the fact index existed (or while it was off), in id order, `batch` memories per
/// transaction. A memory edited in between is skipped: its own write
/// indexed it. Safe to run beside live traffic and to re-run.
pub async fn backfill(
    pool: &PgPool,
    embeddings: &Embeddings,
    tenant_opt: Option<&str>,
    batch: u32,
    timeout_ms: u64,
) -> Result<BackfillReport> {
    let mut report = BackfillReport::default();
    let mut after = Uuid::nil();
    loop {
        let rows: Vec<Unindexed> = sqlx::query_as(
            "SELECT m.id, m.title, m.content, m.content_hash FROM memories m \
             WHERE m.id > $1 AND ($3::text IS NULL OR m.tenant_id = $3) \
               AND NOT EXISTS (SELECT 1 FROM memory_sentences s WHERE s.memory_id = m.id) \
             ORDER BY m.id LIMIT $2",
        )
        .bind(after)
        .bind(i64::from(batch.max(1)))
        .bind(tenant_opt)
        .fetch_all(pool)
        .await?;
        let Some(last) = rows.last() else {
            return Ok(report);
        };
        after = last.id;
        report.scanned += rows.len() as u64;
        let tenant = tenant_opt.unwrap_or(BACKFILL_TENANT);
        report.indexed += backfill_batch(pool, embeddings, tenant, &rows, timeout_ms).await?;
    }
}

async fn backfill_batch(
    pool: &PgPool,
    embeddings: &Embeddings,
    tenant: &str,
    rows: &[Unindexed],
    timeout_ms: u64,
) -> Result<u64> {
    let planned = plan_stored(embeddings, tenant, rows).await?;
    let mut tx = bounds::begin(pool, timeout_ms).await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let current: HashMap<Uuid, Vec<u8>> = sqlx::query_as::<_, (Uuid, Vec<u8>)>(
        "SELECT id, content_hash FROM memories WHERE id = ANY($1) ORDER BY id FOR UPDATE",
    )
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .collect();
    let positions: Vec<usize> = (0..rows.len())
        .filter(|&p| current.get(&rows[p].id) == Some(&rows[p].content_hash))
        .filter(|&p| planned.by_pos.get(&p).is_some_and(|s| !s.is_empty()))
        .collect();
    write(&mut tx, &ids, &positions, &planned).await?;
    crate::bounds::commit(tx).await?;
    Ok(positions.len() as u64)
}

/// Every stored memory's sentences embedded (the backfill has no memory
/// vectors at hand to reuse; one-sentence memories cost one embedding each).
async fn plan_stored(embeddings: &Embeddings, tenant: &str, rows: &[Unindexed]) -> Result<Planned> {
    let to_embed: Vec<(usize, String)> = (rows.iter().enumerate())
        .flat_map(|(pos, r)| {
            sentences::split(&r.content)
                .into_iter()
                .map(move |s| (pos, embedding_text(&r.title, s)))
        })
        .collect();
    let mut planned = Planned::default();
    embed_into(embeddings, tenant, to_embed, &mut planned).await?;
    Ok(planned)
}
