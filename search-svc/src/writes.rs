//! Writes: upsert (idempotent by id, version chains), delete, typed edges and
//! feedback. Every committed write emits one change event inside its
//! transaction, so listeners see it exactly when the data is visible:
//!
//! ```text
//! pg_notify('engram_changes', '{"tenant": "<tenant id>", "op": "upsert" | "delete" | "edges", "ids": ["<uuid>", ...], "write": "<write id>"}')
//! ```
//!
//! `write` is the id the gateway gave the call (`x-engram-write-id`), ""
//! for search-svc's own work: the replica that made the write knows its
//! own change when it comes back (retrieval-svc/src/own_writes.rs).
//!
//! `ids` are the memories written, deleted, or at either end of the new
//! edges. When the payload would exceed ~7,000 bytes (Postgres caps a
//! notification at 8,000), `ids` is `[]`, meaning "reload the whole tenant".
//! graph-svc consumes exactly this format.
//!
//! Concurrency: the embedding is computed before the transaction (never
//! holding row locks over inference); inside it the existing rows are locked
//! in id order and re-checked, and if another writer changed the content in
//! between, the batch is retried from the start. Deadlocks and serialization
//! failures are retried too, after a random pause ([`MAX_ATTEMPTS`]), and
//! when they outlast the retries the caller gets ABORTED ("retry"), not
//! INTERNAL.
//!
//! Keyword search's BM25 statistics (`term_stats`, `doc_stats`) change in
//! the same transaction as the rows they count: upsert and delete add the
//! rows' lexemes as they are after the write and subtract them as they were
//! before, so idempotent re-upserts, content edits and access-level changes
//! all net out exactly (see `StatsDelta`).
//!
//! Every write transaction bounds each of its statements with
//! `search.statement_timeout_write_ms` (`bounds.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use engram_common::Identity;
use engram_common::entities::{ExtractedEntity, extract, normalize};
use engram_proto as pb;
use pgvector::Vector;
use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

use crate::bounds;
use crate::embed::Embeddings;
use crate::error::{Error, Result};
use crate::facts::{self, Planned};
use crate::turns;
use crate::validate::{
    DeleteIds, EdgeBatch, EdgeKeys, FeedbackBatch, NewMemory, RankExample, UpsertBatch,
};

pub const CHANNEL: &str = "engram_changes";
const MAX_NOTIFY_BYTES: usize = 7000;
/// Attempts of one upsert. Overlapping batches can deadlock (a batch locks
/// the rows that exist when it starts and inserts the new ones after, so two
/// batches that each saw a different id committed by a third lock in
/// opposite orders); Postgres breaks the cycle and the victim retries after
/// a random pause, by which time more of its ids exist and are locked in
/// order. Four attempts without a pause were not enough for 8 writers over
/// 40 shared ids (search-svc/tests/service.rs
/// `concurrent_overlapping_batches_end_with_exact_rows` failed in CI).
/// Advisory locks per id would order them, but a 1,000-memory batch would
/// hold 1,000 slots of Postgres's shared lock table (64 x connections by
/// default), and per-bucket locks serialized a tenant's large batches
/// (`engram bench` timed out).
const MAX_ATTEMPTS: usize = 8;

/// Longest random pause before a retry: 25 ms times 2^attempt, at most this.
const MAX_BACKOFF: std::time::Duration = std::time::Duration::from_millis(400);

/// Builds the change-event payload (see the module doc).
pub fn change_payload(tenant: &str, op: &str, ids: &[Uuid], write_id: &str) -> String {
    let full =
        serde_json::json!({"tenant": tenant, "op": op, "ids": ids, "write": write_id}).to_string();
    if full.len() <= MAX_NOTIFY_BYTES {
        full
    } else {
        serde_json::json!({"tenant": tenant, "op": op, "ids": [], "write": write_id}).to_string()
    }
}

/// The change event of a write, in its transaction. `write_id` is the
/// gateway's id of the call ("" for search-svc's own writes).
pub(crate) async fn notify(
    tx: &mut Transaction<'_, Postgres>,
    (tenant, write_id): (&str, &str),
    op: &str,
    ids: &[Uuid],
) -> Result<()> {
    // The tenant's kept turn answers go with the same commit: no replica
    // may answer a turn from before this write (gateway_state.rs).
    sqlx::query(
        "WITH dropped AS (DELETE FROM turn_answers WHERE tenant_id = $3) \
         SELECT pg_notify($1, $2)",
    )
    .bind(CHANNEL)
    .bind(change_payload(tenant, op, ids, write_id))
    .bind(tenant)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[derive(Debug, sqlx::FromRow)]
struct Existing {
    id: Uuid,
    tenant_id: String,
    content_hash: Vec<u8>,
    access_level: i16,
    has_embedding: bool,
}

const EXISTING_SQL: &str = "SELECT id, tenant_id, content_hash, access_level, \
     (embedding IS NOT NULL) AS has_embedding FROM memories WHERE id = ANY($1) ORDER BY id";
const EXISTING_LOCK_SQL: &str = "SELECT id, tenant_id, content_hash, access_level, \
     (embedding IS NOT NULL) AS has_embedding FROM memories WHERE id = ANY($1) ORDER BY id FOR UPDATE";

/// Refuses rows owned by another tenant or above the caller's trust level,
/// with one answer for both: the caller learns neither which tenant holds
/// an id nor that a memory above its level exists.
fn check_ownership(
    identity: &Identity,
    existing: &HashMap<Uuid, Existing>,
    batch: &[(usize, NewMemory)],
) -> Result<()> {
    for (idx, m) in batch {
        if existing.get(&m.id).is_some_and(|e| {
            e.tenant_id != identity.tenant || e.access_level > identity.trust.as_i16()
        }) {
            return Err(unavailable_id(*idx, m.id));
        }
    }
    Ok(())
}

fn unavailable_id(idx: usize, id: Uuid) -> Error {
    Error::PermissionDenied(format!(
        "memories[{idx}].id: {id} cannot be written by this caller"
    ))
}

/// True when the stored row can keep its embedding for `m`.
fn keeps_embedding(existing: &HashMap<Uuid, Existing>, m: &NewMemory) -> bool {
    existing
        .get(&m.id)
        .is_some_and(|e| e.has_embedding && e.content_hash == m.content_hash)
}

pub async fn upsert(
    pool: &PgPool,
    embeddings: &Embeddings,
    (identity, write_id): (&Identity, &str),
    batch: UpsertBatch,
    timeout_ms: u64,
    fact_index: bool,
) -> Result<Vec<pb::UpsertResult>> {
    for (idx, m) in batch.0.iter().enumerate() {
        if m.access_level > identity.trust {
            return Err(Error::PermissionDenied(format!(
                "memories[{idx}].access_level: {} is above the caller's trust level {}",
                m.access_level.name(),
                identity.trust.name()
            )));
        }
    }
    // Id order everywhere: concurrent batches lock rows in the same order.
    let mut sorted: Vec<(usize, NewMemory)> = batch.0.into_iter().enumerate().collect();
    sorted.sort_by_key(|(_, m)| m.id);
    let ids: Vec<Uuid> = sorted.iter().map(|(_, m)| m.id).collect();
    let entity_plans: Vec<Vec<ExtractedEntity>> =
        sorted.iter().map(|(_, m)| entities_for(m)).collect();

    let mut last_err = None;
    for attempt in 0..MAX_ATTEMPTS {
        // Bounded like the transaction below: during an outage this is
        // the first statement a write sends.
        let mut conn = bounds::write_conn(pool, bounds::WRITE_ACQUIRE).await?;
        let existing: HashMap<Uuid, Existing> = sqlx::query_as::<_, Existing>(EXISTING_SQL)
            .bind(&ids)
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .map(|e| (e.id, e))
            .collect();
        drop(conn);
        check_ownership(identity, &existing, &sorted)?;
        let to_embed: Vec<usize> = sorted
            .iter()
            .enumerate()
            .filter(|(_, (_, m))| m.embedding_opt.is_none() && !keeps_embedding(&existing, m))
            .map(|(i, _)| i)
            .collect();
        let texts = (to_embed.iter())
            .map(|&i| sorted[i].1.embedding_text())
            .collect();
        let vectors = embeddings.embed_batch(&identity.tenant, texts).await?;
        let mut computed: HashMap<usize, Vec<f32>> = to_embed.into_iter().zip(vectors).collect();
        let planned = match fact_index {
            true => plan_facts(embeddings, identity, &existing, &sorted, &computed).await?,
            false => Planned::default(),
        };
        let plan = (sorted.as_slice(), entity_plans.as_slice());
        let facts_opt = fact_index.then_some(&planned);
        match write_batch(
            pool,
            timeout_ms,
            (identity, write_id),
            plan,
            &mut computed,
            facts_opt,
        )
        .await
        {
            Ok(results) => {
                tracing::debug!(tenant = %identity.tenant, count = results.len(), attempt, "upserted memories");
                return Ok(results);
            }
            Err(e) if e.is_retryable() => {
                tracing::warn!(tenant = %identity.tenant, attempt, error = %e, "upsert conflict, retrying");
                last_err = Some(e);
                tokio::time::sleep(backoff(attempt)).await;
            }
            Err(e) => return Err(e),
        }
    }
    Err(match last_err {
        Some(Error::Conflict(m)) => Error::Conflict(m),
        Some(e) => {
            // The database's own text names other sessions: logged, not sent.
            tracing::warn!(tenant = %identity.tenant, error = %e, "upsert kept conflicting");
            Error::Conflict("upsert kept conflicting with concurrent writes; retry".into())
        }
        None => Error::Conflict("upsert kept conflicting; retry".into()),
    })
}

/// A random pause before retry `attempt + 1`, so deadlocked batches do not
/// meet again in step.
fn backoff(attempt: usize) -> std::time::Duration {
    let cap = (25u64 << attempt.min(8)).min(MAX_BACKOFF.as_millis() as u64);
    // A v4 UUID's bits are random; no RNG crate needed for a jitter.
    let r = (Uuid::new_v4().as_u128() as u64) % (cap + 1);
    std::time::Duration::from_millis(r)
}

/// The fact index's sentences of every memory whose content is new or
/// changed (crate::facts), embedded before the transaction.
async fn plan_facts(
    embeddings: &Embeddings,
    identity: &Identity,
    existing: &HashMap<Uuid, Existing>,
    sorted: &[(usize, NewMemory)],
    computed: &HashMap<usize, Vec<f32>>,
) -> Result<Planned> {
    let memories: Vec<&NewMemory> = sorted.iter().map(|(_, m)| m).collect();
    let positions: Vec<usize> = (0..memories.len())
        .filter(|&p| {
            existing
                .get(&memories[p].id)
                .is_none_or(|e| e.content_hash != memories[p].content_hash)
        })
        .collect();
    let vectors: HashMap<usize, Vec<f32>> = positions
        .iter()
        .filter_map(|&p| {
            let v = memories[p].embedding_opt.as_ref().or(computed.get(&p))?;
            Some((p, v.clone()))
        })
        .collect();
    facts::plan(
        embeddings,
        &identity.tenant,
        &memories,
        &positions,
        &vectors,
    )
    .await
}

#[derive(Debug, sqlx::FromRow)]
struct Written {
    version: i32,
    created: bool,
    has_embedding: bool,
}

const UPSERT_SQL: &str = r#"
INSERT INTO memories AS m (id, tenant_id, namespace, agent_id, memory_type, title, content,
    content_hash, embedding, tsv_len, access_level, source_confidence, event_time, valid_from,
    valid_to, version, supersedes, consolidated, metadata, source,
    session_id, turn_index, speaker, caption, context)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9,
    (SELECT coalesce(sum(coalesce(array_length(positions, 1), 1)), 0)::int
       FROM unnest(to_tsvector('english'::regconfig,
            $6 || ' ' || $22 || ' ' || $7 || ' ' || $23 || ' ' || $24))),
    $10, $11, coalesce($12, now()), coalesce($13, $12, now()), $14,
    coalesce((SELECT s.version + 1 FROM memories s WHERE s.id = $15 AND s.tenant_id = $2), 1),
    $15, $16, $17, $18, $20, $21, $22, $23, $24)
ON CONFLICT (id) DO UPDATE SET
    namespace = excluded.namespace,
    memory_type = excluded.memory_type,
    title = excluded.title,
    content = excluded.content,
    content_hash = excluded.content_hash,
    embedding = CASE WHEN $9::vector IS NOT NULL THEN excluded.embedding
                     WHEN m.content_hash = excluded.content_hash THEN m.embedding
                     ELSE NULL END,
    tsv_len = excluded.tsv_len,
    access_level = excluded.access_level,
    source_confidence = excluded.source_confidence,
    event_time = CASE WHEN $12::timestamptz IS NULL THEN m.event_time ELSE excluded.event_time END,
    valid_from = CASE WHEN $13::timestamptz IS NULL AND $12::timestamptz IS NULL THEN m.valid_from
                      ELSE excluded.valid_from END,
    valid_to = coalesce(excluded.valid_to, m.valid_to),
    version = CASE WHEN m.content_hash = excluded.content_hash THEN m.version ELSE m.version + 1 END,
    supersedes = coalesce(excluded.supersedes, m.supersedes),
    consolidated = excluded.consolidated,
    metadata = excluded.metadata,
    source = excluded.source,
    session_id = excluded.session_id,
    turn_index = excluded.turn_index,
    speaker = excluded.speaker,
    caption = excluded.caption,
    context = excluded.context
WHERE m.tenant_id = excluded.tenant_id AND m.access_level <= $19
RETURNING m.version, (m.xmax = 0) AS created, (m.embedding IS NOT NULL) AS has_embedding
"#;

/// [`UPSERT_SQL`] for an id not seen at lock time: inserts or, when a
/// concurrent batch has committed the id meanwhile, does nothing (None).
static INSERT_ONLY_SQL: LazyLock<String> = LazyLock::new(|| {
    let head = UPSERT_SQL.split("ON CONFLICT").next().unwrap_or(UPSERT_SQL);
    format!(
        "{head}ON CONFLICT (id) DO NOTHING \
         RETURNING m.version, true AS created, (m.embedding IS NOT NULL) AS has_embedding"
    )
});

/// Runs [`UPSERT_SQL`] or [`INSERT_ONLY_SQL`] for one memory; `context` is
/// a turn's keyword context (crate::turns), empty for other memories.
async fn write_row(
    tx: &mut Transaction<'_, Postgres>,
    sql: &'static str,
    identity: &Identity,
    (m, context): (&NewMemory, &str),
    embedding: Option<Vector>,
) -> Result<Option<Written>> {
    let turn_opt = m.turn_opt.as_ref();
    Ok(sqlx::query_as::<_, Written>(sql)
        .bind(m.id)
        .bind(&identity.tenant)
        .bind(&m.namespace)
        .bind(&identity.agent_id)
        .bind(&m.memory_type)
        .bind(&m.title)
        .bind(&m.content)
        .bind(&m.content_hash)
        .bind(embedding)
        .bind(m.access_level.as_i16())
        .bind(m.source_confidence)
        .bind(m.event_time_opt)
        .bind(m.valid_from_opt)
        .bind(m.valid_to_opt)
        .bind(m.supersedes_opt)
        .bind(m.consolidated)
        .bind(&m.metadata)
        .bind(&m.source)
        .bind(identity.trust.as_i16())
        .bind(turn_opt.map(|t| t.session_id.as_str()))
        .bind(turn_opt.map(|t| t.turn_index as i32))
        .bind(turn_opt.map_or("", |t| t.speaker.as_str()))
        .bind(turn_opt.map_or("", |t| t.caption.as_str()))
        .bind(context)
        .fetch_optional(&mut **tx)
        .await?)
}

/// Each memory's keyword context, by position in `sorted`: a turn's from
/// its session (crate::turns), empty for every other memory.
async fn turn_contexts(
    tx: &mut Transaction<'_, Postgres>,
    tenant: &str,
    sorted: &[(usize, NewMemory)],
) -> Result<Vec<String>> {
    let turns: Vec<(usize, turns::Written<'_>)> = (sorted.iter().enumerate())
        .filter_map(|(pos, (_, m))| {
            let turn = m.turn_opt.as_ref()?;
            Some((
                pos,
                turns::Written {
                    id: m.id,
                    namespace: &m.namespace,
                    turn,
                    access: m.access_level,
                    event_time_opt: m.event_time_opt,
                    content: &m.content,
                },
            ))
        })
        .collect();
    let mut out = vec![String::new(); sorted.len()];
    if turns.is_empty() {
        return Ok(out);
    }
    let batch: Vec<turns::Written<'_>> = turns.iter().map(|(_, w)| *w).collect();
    for ((pos, _), context) in turns.iter().zip(turns::contexts(tx, tenant, &batch).await?) {
        out[*pos] = context;
    }
    Ok(out)
}

async fn write_batch(
    pool: &PgPool,
    timeout_ms: u64,
    (identity, write_id): (&Identity, &str),
    (sorted, entity_plans): (&[(usize, NewMemory)], &[Vec<ExtractedEntity>]),
    computed: &mut HashMap<usize, Vec<f32>>,
    facts_opt: Option<&Planned>,
) -> Result<Vec<pb::UpsertResult>> {
    let ids: Vec<Uuid> = sorted.iter().map(|(_, m)| m.id).collect();
    let mut tx = bounds::begin_write(pool, timeout_ms, bounds::WRITE_ACQUIRE).await?;
    let locked: HashMap<Uuid, Existing> = sqlx::query_as::<_, Existing>(EXISTING_LOCK_SQL)
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(|e| (e.id, e))
        .collect();
    check_ownership(identity, &locked, sorted)?;

    // Supersede targets must be visible to the caller in its tenant.
    let targets: Vec<Uuid> = sorted
        .iter()
        .filter_map(|(_, m)| m.supersedes_opt)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let visible_targets: BTreeSet<Uuid> = if targets.is_empty() {
        BTreeSet::new()
    } else {
        sqlx::query_scalar::<_, Uuid>(
            "SELECT id FROM memories WHERE id = ANY($1) AND tenant_id = $2 AND access_level <= $3 ORDER BY id FOR UPDATE",
        )
        .bind(&targets)
        .bind(&identity.tenant)
        .bind(identity.trust.as_i16())
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .collect()
    };

    // BM25 statistics: this batch's rows leave the counts as they were...
    let existing_ids: Vec<Uuid> = ids
        .iter()
        .filter(|id| locked.contains_key(id))
        .copied()
        .collect();
    let mut before = stat_rows(&mut tx, &existing_ids).await?;

    let contexts = turn_contexts(&mut tx, &identity.tenant, sorted).await?;
    let mut results: Vec<(usize, pb::UpsertResult)> = Vec::with_capacity(sorted.len());
    let mut closed: Vec<Uuid> = Vec::new();
    let mut rewrite_entities: Vec<usize> = Vec::new();
    let mut rewrite_facts: Vec<usize> = Vec::new();
    for (pos, (idx, m)) in sorted.iter().enumerate() {
        if let Some(t) = m.supersedes_opt
            && !visible_targets.contains(&t)
        {
            return Err(Error::NotFound(format!(
                "memories[{idx}].supersedes: memory {t} not found"
            )));
        }
        let embedding_opt: Option<Vec<f32>> = match &m.embedding_opt {
            Some(v) => Some(v.clone()),
            None => computed.get(&pos).cloned(),
        };
        if embedding_opt.is_none() && !keeps_embedding(&locked, m) {
            // Content changed under us since the embedding decision.
            return Err(Error::Conflict(format!(
                "memories[{idx}]: changed concurrently; retry"
            )));
        }
        let embedded = m.embedding_opt.is_none() && embedding_opt.is_some();
        let embedding = embedding_opt.map(Vector::from);
        let mut w: Option<Written> = None;
        if !locked.contains_key(&m.id) {
            w = write_row(
                &mut tx,
                INSERT_ONLY_SQL.as_str(),
                identity,
                (m, &contexts[pos]),
                embedding.clone(),
            )
            .await?;
            if w.is_none() {
                // A concurrent batch committed this id after our lock query:
                // lock it now and count what it holds as `before`, so the
                // statistics do not count it twice.
                before.extend(stat_rows_for_update(&mut tx, m.id).await?);
            }
        }
        if w.is_none() {
            w = write_row(
                &mut tx,
                UPSERT_SQL,
                identity,
                (m, &contexts[pos]),
                embedding,
            )
            .await?;
        }
        let Some(w) = w else {
            // The conflicting row appeared after the lock: another tenant's,
            // or one the caller may not see.
            return Err(unavailable_id(*idx, m.id));
        };
        if !w.has_embedding {
            return Err(Error::Conflict(format!(
                "memories[{idx}]: changed concurrently; retry"
            )));
        }
        let changed = match locked.get(&m.id) {
            Some(e) => e.content_hash != m.content_hash,
            None => true,
        };
        if changed || !m.entities.is_empty() || !m.triples.is_empty() {
            rewrite_entities.push(pos);
        }
        if let Some(planned) = facts_opt
            && changed
        {
            if !planned.has(pos) {
                // Content changed under us since the sentences were planned.
                return Err(Error::Conflict(format!(
                    "memories[{idx}]: changed concurrently; retry"
                )));
            }
            rewrite_facts.push(pos);
        }
        if let Some(t) = m.supersedes_opt {
            close_superseded(&mut tx, identity, m, t).await?;
            closed.push(t);
        }
        results.push((
            *idx,
            pb::UpsertResult {
                id: m.id.to_string(),
                version: w.version,
                created: w.created,
                embedded,
            },
        ));
    }
    write_entities(&mut tx, identity, sorted, entity_plans, &rewrite_entities).await?;
    if let Some(planned) = facts_opt {
        facts::write(&mut tx, &ids, &rewrite_facts, planned).await?;
    }
    // ...and come back as they are now (last: these rows are the hot ones).
    let after = stat_rows(&mut tx, &ids).await?;
    let mut delta = StatsDelta::default();
    delta.count(&after, 1);
    delta.count(&before, -1);
    delta.apply(&mut tx, &identity.tenant).await?;
    // The memories this batch closed changed too: graph-svc re-reads only
    // the memories a notification names.
    let changed: Vec<Uuid> = ids.iter().chain(&closed).copied().collect();
    notify(&mut tx, (&identity.tenant, write_id), "upsert", &changed).await?;
    crate::bounds::commit(tx).await?;
    results.sort_by_key(|(idx, _)| *idx);
    Ok(results.into_iter().map(|(_, r)| r).collect())
}

/// Closes the superseded memory's validity instead of deleting it, so
/// as-of queries still find it, and records the chain as an edge.
async fn close_superseded(
    tx: &mut Transaction<'_, Postgres>,
    identity: &Identity,
    m: &NewMemory,
    target: Uuid,
) -> Result<()> {
    let new_from: Option<DateTime<Utc>> = m.valid_from_opt.or(m.event_time_opt);
    sqlx::query(
        "UPDATE memories SET \
           valid_to = coalesce(valid_to, greatest(valid_from, coalesce($3, now()))), \
           retracted_at = coalesce(retracted_at, now()) \
         WHERE id = $1 AND tenant_id = $2",
    )
    .bind(target)
    .bind(&identity.tenant)
    .bind(new_from)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO edges (tenant_id, src_id, dst_id, edge_type) VALUES ($1, $2, $3, 'supersedes') \
         ON CONFLICT (src_id, dst_id, edge_type) DO NOTHING",
    )
    .bind(&identity.tenant)
    .bind(m.id)
    .bind(target)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Entities of one memory: the caller's when given (plus triple ends and the
/// title as home), else the built-in extractor's.
fn entities_for(m: &NewMemory) -> Vec<ExtractedEntity> {
    if m.entities.is_empty() && m.triples.is_empty() {
        return extract(&m.title, &m.content);
    }
    let home = normalize(&m.title);
    let mut out: BTreeMap<String, ExtractedEntity> = BTreeMap::new();
    let mut add = |display: &str, is_home: bool| {
        let name = normalize(display);
        if name.is_empty() {
            return;
        }
        let is_home = is_home || name == home;
        out.entry(name.clone())
            .and_modify(|e| e.is_home |= is_home)
            .or_insert(ExtractedEntity {
                name,
                display: display.trim().to_string(),
                is_home,
            });
    };
    if !m.title.trim().is_empty() {
        add(&m.title, true);
    }
    for e in &m.entities {
        add(e, false);
    }
    for (s, _, o) in &m.triples {
        add(s, false);
        add(o, false);
    }
    out.into_values().collect()
}

async fn write_entities(
    tx: &mut Transaction<'_, Postgres>,
    identity: &Identity,
    sorted: &[(usize, NewMemory)],
    plans: &[Vec<ExtractedEntity>],
    rewrite: &[usize],
) -> Result<()> {
    if rewrite.is_empty() {
        return Ok(());
    }
    let memory_ids: Vec<Uuid> = rewrite.iter().map(|&p| sorted[p].1.id).collect();
    sqlx::query("DELETE FROM memory_entities WHERE memory_id = ANY($1)")
        .bind(&memory_ids)
        .execute(&mut **tx)
        .await?;
    sqlx::query("DELETE FROM triples WHERE memory_id = ANY($1)")
        .bind(&memory_ids)
        .execute(&mut **tx)
        .await?;

    // Sorted names: concurrent batches take entity locks in the same order.
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    for &p in rewrite {
        for e in &plans[p] {
            names
                .entry(e.name.clone())
                .or_insert_with(|| e.display.clone());
        }
    }
    if names.is_empty() {
        return Ok(());
    }
    let (n, d): (Vec<String>, Vec<String>) = names.into_iter().unzip();
    sqlx::query(
        "INSERT INTO entities (tenant_id, name, display) \
         SELECT $1, t.n, t.d FROM unnest($2::text[], $3::text[]) AS t(n, d) ORDER BY t.n \
         ON CONFLICT (tenant_id, name) DO NOTHING",
    )
    .bind(&identity.tenant)
    .bind(&n)
    .bind(&d)
    .execute(&mut **tx)
    .await?;
    let ids: HashMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
        "SELECT name, id FROM entities WHERE tenant_id = $1 AND name = ANY($2)",
    )
    .bind(&identity.tenant)
    .bind(&n)
    .fetch_all(&mut **tx)
    .await?
    .into_iter()
    .collect();

    let mut links: BTreeMap<(Uuid, i64), bool> = BTreeMap::new();
    let (mut t_mem, mut t_sub, mut t_rel, mut t_obj) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for &p in rewrite {
        let m = &sorted[p].1;
        for e in &plans[p] {
            if let Some(&eid) = ids.get(&e.name) {
                *links.entry((m.id, eid)).or_insert(false) |= e.is_home;
            }
        }
        for (s, r, o) in &m.triples {
            if let (Some(&sid), Some(&oid)) = (ids.get(&normalize(s)), ids.get(&normalize(o))) {
                t_mem.push(m.id);
                t_sub.push(sid);
                t_rel.push(r.trim().to_string());
                t_obj.push(oid);
            }
        }
    }
    let (mut l_mem, mut l_ent, mut l_home) = (Vec::new(), Vec::new(), Vec::new());
    for ((mid, eid), home) in links {
        l_mem.push(mid);
        l_ent.push(eid);
        l_home.push(home);
    }
    sqlx::query(
        "INSERT INTO memory_entities (memory_id, entity_id, is_home) \
         SELECT * FROM unnest($1::uuid[], $2::int8[], $3::bool[])",
    )
    .bind(&l_mem)
    .bind(&l_ent)
    .bind(&l_home)
    .execute(&mut **tx)
    .await?;
    if !t_mem.is_empty() {
        sqlx::query(
            "INSERT INTO triples (tenant_id, memory_id, subject_id, relation, object_id) \
             SELECT $1, t.m, t.s, t.r, t.o FROM unnest($2::uuid[], $3::int8[], $4::text[], $5::int8[]) AS t(m, s, r, o)",
        )
        .bind(&identity.tenant)
        .bind(&t_mem)
        .bind(&t_sub)
        .bind(&t_rel)
        .bind(&t_obj)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Hard delete; entity links, triples and edges go with the rows (FK cascade).
/// Ids the caller cannot see are skipped, not reported, so deletes never
/// reveal what exists.
pub async fn delete(
    pool: &PgPool,
    (identity, write_id): (&Identity, &str),
    ids: DeleteIds,
    timeout_ms: u64,
) -> Result<u32> {
    let mut tx = bounds::begin_write(pool, timeout_ms, bounds::WRITE_ACQUIRE).await?;
    let rows: Vec<DeletedRow> = sqlx::query_as(
        "DELETE FROM memories WHERE tenant_id = $1 AND access_level <= $2 AND id = ANY($3) \
         RETURNING id, access_level, tsv_len, tsvector_to_array(tsv) AS lexemes",
    )
    .bind(&identity.tenant)
    .bind(identity.trust.as_i16())
    .bind(&ids.0)
    .fetch_all(&mut *tx)
    .await?;
    let deleted: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    if !deleted.is_empty() {
        let gone: Vec<StatRow> = rows.into_iter().map(|r| r.stats).collect();
        let mut delta = StatsDelta::default();
        delta.count(&gone, -1);
        delta.apply(&mut tx, &identity.tenant).await?;
        notify(&mut tx, (&identity.tenant, write_id), "delete", &deleted).await?;
    }
    crate::bounds::commit(tx).await?;
    tracing::debug!(tenant = %identity.tenant, count = deleted.len(), "deleted memories");
    Ok(u32::try_from(deleted.len()).unwrap_or(u32::MAX))
}

/// One row's share of the BM25 statistics (`migrations/0002_term_stats.sql`).
#[derive(Debug, sqlx::FromRow)]
struct StatRow {
    access_level: i16,
    tsv_len: i32,
    /// Distinct lexemes of the row's tsv: each adds one to its df.
    lexemes: Vec<String>,
}

#[derive(Debug, sqlx::FromRow)]
struct DeletedRow {
    id: Uuid,
    #[sqlx(flatten)]
    stats: StatRow,
}

async fn stat_rows(tx: &mut Transaction<'_, Postgres>, ids: &[Uuid]) -> Result<Vec<StatRow>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_as(
        "SELECT access_level, tsv_len, tsvector_to_array(tsv) AS lexemes FROM memories WHERE id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(&mut **tx)
    .await?)
}

async fn stat_rows_for_update(
    tx: &mut Transaction<'_, Postgres>,
    id: Uuid,
) -> Result<Vec<StatRow>> {
    Ok(sqlx::query_as(
        "SELECT access_level, tsv_len, tsvector_to_array(tsv) AS lexemes FROM memories WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_all(&mut **tx)
    .await?)
}

/// Net change of one transaction to `term_stats` / `doc_stats`, applied in
/// that transaction so keyword ranks always match the committed rows.
///
/// The rows touched are shared by every writer of the tenant (a common
/// lexeme, the per-level doc count), so they are written last, just before
/// commit, to keep the time they are locked short, and always in (lexeme,
/// level) order so concurrent batches queue instead of deadlocking. Memory
/// and entity locks are all taken before, so the order is global.
#[derive(Debug, Default)]
struct StatsDelta {
    terms: BTreeMap<(String, i16), i64>,
    docs: BTreeMap<i16, (i64, i64)>,
}

impl StatsDelta {
    fn count(&mut self, rows: &[StatRow], sign: i64) {
        for r in rows {
            let d = self.docs.entry(r.access_level).or_default();
            d.0 += sign;
            d.1 += sign * i64::from(r.tsv_len);
            for l in &r.lexemes {
                *self.terms.entry((l.clone(), r.access_level)).or_default() += sign;
            }
        }
    }

    async fn apply(self, tx: &mut Transaction<'_, Postgres>, tenant: &str) -> Result<()> {
        let (mut lex, mut lvl, mut df) = (Vec::new(), Vec::new(), Vec::new());
        let mut emptied = false;
        for ((l, a), d) in self.terms {
            if d != 0 {
                emptied |= d < 0;
                lex.push(l);
                lvl.push(a);
                df.push(d);
            }
        }
        if !lex.is_empty() {
            sqlx::query(
                "INSERT INTO term_stats (tenant_id, lexeme, access_level, df) \
                 SELECT $1, t.l, t.a, t.d FROM unnest($2::text[], $3::int2[], $4::int8[]) AS t(l, a, d) \
                 ON CONFLICT (tenant_id, lexeme, access_level) DO UPDATE SET df = term_stats.df + excluded.df",
            )
            .bind(tenant)
            .bind(&lex)
            .bind(&lvl)
            .bind(&df)
            .execute(&mut **tx)
            .await?;
        }
        if emptied {
            sqlx::query(
                "DELETE FROM term_stats WHERE tenant_id = $1 AND lexeme = ANY($2) AND df <= 0",
            )
            .bind(tenant)
            .bind(&lex)
            .execute(&mut **tx)
            .await?;
        }
        let (mut lvl, mut docs, mut len) = (Vec::new(), Vec::new(), Vec::new());
        for (a, (n, l)) in self.docs {
            if n != 0 || l != 0 {
                lvl.push(a);
                docs.push(n);
                len.push(l);
            }
        }
        if !lvl.is_empty() {
            sqlx::query(
                "INSERT INTO doc_stats (tenant_id, access_level, docs, total_len) \
                 SELECT $1, t.a, t.n, t.l FROM unnest($2::int2[], $3::int8[], $4::int8[]) AS t(a, n, l) \
                 ON CONFLICT (tenant_id, access_level) DO UPDATE SET \
                   docs = doc_stats.docs + excluded.docs, total_len = doc_stats.total_len + excluded.total_len",
            )
            .bind(tenant)
            .bind(&lvl)
            .bind(&docs)
            .bind(&len)
            .execute(&mut **tx)
            .await?;
        }
        Ok(())
    }
}

pub async fn add_edges(
    pool: &PgPool,
    (identity, write_id): (&Identity, &str),
    batch: EdgeBatch,
    timeout_ms: u64,
) -> Result<u32> {
    // Last one wins for a repeated (src, dst, type); sorted for lock order.
    let mut edges: BTreeMap<(Uuid, Uuid, String), f32> = BTreeMap::new();
    for e in batch.0 {
        edges.insert((e.src, e.dst, e.edge_type), e.weight);
    }
    let ends: Vec<Uuid> = edges
        .keys()
        .flat_map(|(s, d, _)| [*s, *d])
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut tx = bounds::begin_write(pool, timeout_ms, bounds::WRITE_ACQUIRE).await?;
    let visible: BTreeSet<Uuid> = sqlx::query_scalar::<_, Uuid>(
        "SELECT id FROM memories WHERE tenant_id = $1 AND access_level <= $2 AND id = ANY($3) ORDER BY id FOR KEY SHARE",
    )
    .bind(&identity.tenant)
    .bind(identity.trust.as_i16())
    .bind(&ends)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .collect();
    if let Some(missing) = ends.iter().find(|id| !visible.contains(id)) {
        return Err(Error::NotFound(format!(
            "edges: memory {missing} not found"
        )));
    }
    let (mut src, mut dst, mut ty, mut w) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((s, d, t), weight) in edges {
        src.push(s);
        dst.push(d);
        ty.push(t);
        w.push(weight);
    }
    let added = sqlx::query(
        "INSERT INTO edges (tenant_id, src_id, dst_id, edge_type, weight) \
         SELECT $1, t.s, t.d, t.t, t.w FROM unnest($2::uuid[], $3::uuid[], $4::text[], $5::real[]) AS t(s, d, t, w) \
         ON CONFLICT (src_id, dst_id, edge_type) DO UPDATE SET weight = excluded.weight",
    )
    .bind(&identity.tenant)
    .bind(&src)
    .bind(&dst)
    .bind(&ty)
    .bind(&w)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    notify(&mut tx, (&identity.tenant, write_id), "edges", &ends).await?;
    crate::bounds::commit(tx).await?;
    tracing::debug!(tenant = %identity.tenant, count = added, "added edges");
    Ok(u32::try_from(added).unwrap_or(u32::MAX))
}

/// Removes the caller's own edges among `keys` whose ends it may read (the
/// rest are skipped, like [`delete`], so nothing reveals what exists).
/// Edges engram detected are left to ReviewConflict, which also records
/// the rejection. Both ends of every removed edge are notified: graph-svc
/// re-reads the edges at a changed memory, so the edge leaves the graph.
pub async fn delete_edges(
    pool: &PgPool,
    (identity, write_id): (&Identity, &str),
    keys: EdgeKeys,
    timeout_ms: u64,
) -> Result<u32> {
    let (mut src, mut dst, mut ty) = (Vec::new(), Vec::new(), Vec::new());
    for (s, d, t) in keys.0 {
        src.push(s);
        dst.push(d);
        ty.push(t);
    }
    let mut tx = bounds::begin_write(pool, timeout_ms, bounds::WRITE_ACQUIRE).await?;
    let gone: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "DELETE FROM edges e USING unnest($3::uuid[], $4::uuid[], $5::text[]) AS k(s, d, t) \
         WHERE e.src_id = k.s AND e.dst_id = k.d AND e.edge_type = k.t \
           AND e.tenant_id = $1 AND e.origin = 'caller' \
           AND EXISTS (SELECT 1 FROM memories m WHERE m.id = e.src_id AND m.tenant_id = $1 AND m.access_level <= $2) \
           AND EXISTS (SELECT 1 FROM memories m WHERE m.id = e.dst_id AND m.tenant_id = $1 AND m.access_level <= $2) \
         RETURNING e.src_id, e.dst_id",
    )
    .bind(&identity.tenant)
    .bind(identity.trust.as_i16())
    .bind(&src)
    .bind(&dst)
    .bind(&ty)
    .fetch_all(&mut *tx)
    .await?;
    if !gone.is_empty() {
        let ends: Vec<Uuid> = (gone.iter())
            .flat_map(|(s, d)| [*s, *d])
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        notify(&mut tx, (&identity.tenant, write_id), "edges", &ends).await?;
    }
    crate::bounds::commit(tx).await?;
    tracing::debug!(tenant = %identity.tenant, count = gone.len(), "deleted edges");
    Ok(u32::try_from(gone.len()).unwrap_or(u32::MAX))
}

pub async fn store_feedback(
    pool: &PgPool,
    identity: &Identity,
    batch: FeedbackBatch,
    timeout_ms: u64,
) -> Result<u32> {
    let FeedbackBatch(items, examples) = batch;
    let (mut q, mut m, mut s, mut v) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for it in items {
        q.push(it.query_id);
        m.push(it.memory_id);
        s.push(it.signal);
        v.push(it.value);
    }
    let mut tx = bounds::begin_write(pool, timeout_ms, bounds::WRITE_ACQUIRE).await?;
    // Only feedback on a memory the caller can read is kept: a vote on an
    // id that does not exist, belongs to another tenant or sits above the
    // caller's trust level would otherwise keep that memory from fading
    // (decay.rs joins feedback by tenant and id) and fill the table with
    // rows nothing reads (issue 47, items 4 and 5).
    let stored = sqlx::query(
        "INSERT INTO feedback (tenant_id, agent_id, query_id, memory_id, signal, value) \
         SELECT $1, $2, t.q, t.m, t.s, t.v \
         FROM unnest($3::text[], $4::uuid[], $5::text[], $6::bool[]) AS t(q, m, s, v) \
         JOIN memories mem ON mem.id = t.m AND mem.tenant_id = $1 AND mem.access_level <= $7",
    )
    .bind(&identity.tenant)
    .bind(&identity.agent_id)
    .bind(&q)
    .bind(&m)
    .bind(&s)
    .bind(&v)
    .bind(identity.trust.as_i16())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    store_examples(&mut tx, identity, examples).await?;
    crate::bounds::commit(tx).await?;
    Ok(u32::try_from(stored).unwrap_or(u32::MAX))
}

/// The answer's Stage 4 training examples, beside the feedback that made
/// them: one multi-row INSERT (an answer has up to `limit` of them).
async fn store_examples(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    identity: &Identity,
    examples: Vec<RankExample>,
) -> Result<()> {
    if examples.is_empty() {
        return Ok(());
    }
    let mut q = sqlx::QueryBuilder::<Postgres>::new(
        "INSERT INTO ranker_examples (tenant_id, agent_id, query_id, memory_id, features, relevant) ",
    );
    q.push_values(examples, |mut row, e| {
        row.push_bind(&identity.tenant)
            .push_bind(&identity.agent_id)
            .push_bind(e.query_id)
            .push_bind(e.memory_id)
            .push_bind(e.features)
            .push_bind(e.relevant);
    });
    q.build().execute(&mut **tx).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_payload_means_reload_tenant() {
        let few = change_payload("t", "upsert", &[Uuid::nil()], "w-1");
        assert!(
            few.contains("00000000-0000-0000-0000-000000000000"),
            "{few}"
        );
        let many: Vec<Uuid> = (0..500).map(|_| Uuid::new_v4()).collect();
        let p = change_payload("t", "upsert", &many, "w-1");
        assert_eq!(p, r#"{"ids":[],"op":"upsert","tenant":"t","write":"w-1"}"#);
    }
}
