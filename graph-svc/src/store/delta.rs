//! Applying a change to a tenant's [`Parts`] by reading only what it names.
//!
//! A change notification lists the memories written, deleted, closed by a
//! write, or at either end of new edges. Their rows, stored mentions, facts
//! and edges are read again from one REPEATABLE READ snapshot. A new entity
//! name can also mention memories the change never touched (the dictionary
//! is matched against every memory's text), so the memories whose title or
//! content holds the name's longest ASCII word are read again too, whole,
//! as if they had changed: ASCII lower-cases the same in Postgres's `lower`
//! under the "C" collation and in Rust's `to_lowercase` (the Kelvin sign,
//! which Rust lower-cases to `k`, is mapped in SQL), so the scan finds
//! every memory the name can match, and the exact match then keeps only
//! true mentions. One gap is known: a home (title) match across brackets
//! with no space ("Foo(x)bar" is the name "foobar") is not found until the
//! next full load.
//!
//! Anything the parts cannot follow asks for a full load instead: entity
//! rows committed out of id order (the dictionary would be numbered
//! differently than a full load numbers it), a name with no ASCII word,
//! too many new names or too many memories to re-read.

use std::collections::HashSet;
use std::sync::Arc;

use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

use engram_common::entities::is_stopword_only;

use super::parts::Parts;
use super::{MemRow, add_edges, add_stored_mentions, add_triples, memory_columns};
use crate::error::Error;
use crate::graph::Dictionary;

/// New names one rebuild in place scans for; more read in full (the scan
/// is one regular expression over the tenant's texts).
const MAX_NEW_NAMES: usize = 32;

/// Why a change was not applied in place: the caller loads in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FullLoad {
    /// Entity rows appeared below the largest id the parts hold.
    EntitiesOutOfOrder,
    /// A new entity name has no ASCII word to find its memories by.
    NameWithoutAsciiWord,
    /// More new names than [`MAX_NEW_NAMES`].
    TooManyNewNames,
    /// More memories hold a new name's word than `limit` allows.
    TooManyToRematch,
}

impl FullLoad {
    /// For the log.
    pub fn reason(self) -> &'static str {
        match self {
            FullLoad::EntitiesOutOfOrder => "entity rows committed out of id order",
            FullLoad::NameWithoutAsciiWord => "a new name without an ASCII word",
            FullLoad::TooManyNewNames => "too many new names",
            FullLoad::TooManyToRematch => "a new name in too many memories",
        }
    }
}

/// Applies the change to `ids` to `parts` in place, re-reading at most
/// `rematch_limit` memories for new names. On `Err` or `Ok(Err(_))` the
/// parts may be half changed: the caller drops them.
pub async fn apply(
    pool: &PgPool,
    tenant: &str,
    parts: &mut Parts,
    ids: &[Uuid],
    rematch_limit: usize,
) -> Result<Result<(), FullLoad>, Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    // Bounds every statement, so no tenant's texts can hold the rebuild
    // slot for long; past it the rebuild reads in full.
    sqlx::query("SET LOCAL statement_timeout = 5000")
        .execute(&mut *tx)
        .await?;
    let Some(entities) = new_entities(&mut tx, tenant, parts).await? else {
        return Ok(Err(FullLoad::EntitiesOutOfOrder));
    };
    let names = names_new_to(&parts.dict, &entities);
    let rematch = match rematch_ids(&mut tx, tenant, &names, ids, rematch_limit).await? {
        Ok(rematch) => rematch,
        Err(full) => return Ok(Err(full)),
    };
    let mut all: Vec<Uuid> = ids.iter().chain(&rematch).copied().collect();
    all.sort_unstable();
    all.dedup();
    let rows: Vec<MemRow> = sqlx::query_as(concat!(
        "SELECT ",
        memory_columns!(),
        " FROM memories WHERE tenant_id = $1 AND id = ANY($2) ORDER BY id"
    ))
    .bind(tenant)
    .bind(&all)
    .fetch_all(&mut *tx)
    .await?;
    replace_rows(parts, &all, entities, rows).await?;
    let mentions = sqlx::query_as::<_, (Uuid, i64, bool)>(
        "SELECT me.memory_id, me.entity_id, me.is_home FROM memory_entities me \
         JOIN memories m ON m.id = me.memory_id WHERE m.tenant_id = $1 AND m.id = ANY($2)",
    )
    .bind(tenant)
    .bind(&all)
    .fetch(&mut *tx);
    add_stored_mentions(parts, mentions).await?;
    let triples = sqlx::query_as::<_, (Uuid, i64, i64)>(
        "SELECT memory_id, subject_id, object_id FROM triples \
         WHERE tenant_id = $1 AND memory_id = ANY($2)",
    )
    .bind(tenant)
    .bind(&all)
    .fetch(&mut *tx);
    add_triples(parts, triples).await?;
    replace_edges(&mut tx, tenant, parts, &all).await?;
    tx.commit().await?;
    Ok(Ok(()))
}

/// An `entities` row: id, name (normalised), display.
type EntityRow = (i64, String, String);

/// The entity rows written since the parts were read, in id order; None
/// when some appeared below the largest id read (ids are taken at insert
/// and committed in any order), which only a full load numbers as a full
/// load does. Entities are never deleted one by one, so the tenant's row
/// count tells.
async fn new_entities(
    tx: &mut Transaction<'_, Postgres>,
    tenant: &str,
    parts: &Parts,
) -> Result<Option<Vec<EntityRow>>, Error> {
    let rows: Vec<EntityRow> = sqlx::query_as(
        "SELECT id, name, display FROM entities WHERE tenant_id = $1 AND id > $2 ORDER BY id",
    )
    .bind(tenant)
    .bind(parts.max_entity_id)
    .fetch_all(&mut **tx)
    .await?;
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM entities WHERE tenant_id = $1")
        .bind(tenant)
        .fetch_one(&mut **tx)
        .await?;
    let expected = parts.entity_rows + rows.len();
    Ok((usize::try_from(total).ok() == Some(expected)).then_some(rows))
}

/// The names the dictionary would gain from `entities`
/// ([`Dictionary::add_normalized`] refuses the rest).
fn names_new_to(dict: &Dictionary, entities: &[EntityRow]) -> Vec<String> {
    let mut names: Vec<String> = entities
        .iter()
        .map(|(_, name, _)| name)
        .filter(|name| {
            !name.is_empty() && !is_stopword_only(name) && !dict.index.contains_key(*name)
        })
        .cloned()
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The longest word of a normalised name made of ASCII alone (normalised
/// words are alphanumeric, so an ASCII one is `[a-z0-9]+`).
fn ascii_word(name: &str) -> Option<&str> {
    name.split(' ')
        .filter(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric()))
        .max_by_key(|w| w.len())
}

/// Memories outside the change whose text may hold one of `names`.
async fn rematch_ids(
    tx: &mut Transaction<'_, Postgres>,
    tenant: &str,
    names: &[String],
    ids: &[Uuid],
    limit: usize,
) -> Result<Result<Vec<Uuid>, FullLoad>, Error> {
    if names.is_empty() {
        return Ok(Ok(Vec::new()));
    }
    if names.len() > MAX_NEW_NAMES {
        return Ok(Err(FullLoad::TooManyNewNames));
    }
    let mut words: Vec<&str> = Vec::with_capacity(names.len());
    for name in names {
        match ascii_word(name) {
            Some(w) => words.push(w),
            None => return Ok(Err(FullLoad::NameWithoutAsciiWord)),
        }
    }
    words.sort_unstable();
    words.dedup();
    // One pass over each text: the words are [a-z0-9]+, safe as a pattern.
    let pattern = words.join("|");
    let found: Vec<Uuid> = sqlx::query_scalar(
        "SELECT m.id FROM memories m WHERE m.tenant_id = $1 AND m.id <> ALL($2) \
         AND translate(lower((m.title || ' ' || m.content) COLLATE \"C\"), U&'\\212A', 'k') ~ $3 \
         LIMIT $4",
    )
    .bind(tenant)
    .bind(ids)
    .bind(pattern)
    .bind(i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1))
    .fetch_all(&mut **tx)
    .await?;
    if found.len() > limit {
        return Ok(Err(FullLoad::TooManyToRematch));
    }
    Ok(Ok(found))
}

/// Adds `entities` to a copy of the dictionary, replaces the memories
/// `ids` (dropping those without a row: deleted) with `rows` matched
/// against it, all off the async runtime (the dictionary holds hundreds of
/// thousands of names at 100K memories).
async fn replace_rows(
    parts: &mut Parts,
    ids: &[Uuid],
    entities: Vec<EntityRow>,
    rows: Vec<MemRow>,
) -> Result<(), Error> {
    for id in ids {
        parts.memories.remove(id);
    }
    if let Some(&(last, ..)) = entities.last() {
        parts.max_entity_id = parts.max_entity_id.max(last);
    }
    parts.entity_rows += entities.len();
    let old = parts.dict.clone();
    let (dict, added, fresh) = tokio::task::spawn_blocking(move || {
        let mut added: Vec<(i64, u32)> = Vec::new();
        let dict = match entities.is_empty() {
            true => old,
            false => {
                let mut dict = (*old).clone();
                for (id, name, display) in entities {
                    if let Some(e) = dict.add_normalized(name, &display) {
                        added.push((id, e));
                    }
                }
                Arc::new(dict)
            }
        };
        let fresh = super::match_page(&dict, rows);
        (dict, added, fresh)
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))?;
    parts.dict = dict;
    parts.by_db.extend(added);
    parts.memories.extend(fresh);
    Ok(())
}

/// Replaces every typed edge at a changed memory with what Postgres holds.
async fn replace_edges(
    tx: &mut Transaction<'_, Postgres>,
    tenant: &str,
    parts: &mut Parts,
    ids: &[Uuid],
) -> Result<(), Error> {
    let changed: HashSet<Uuid> = ids.iter().copied().collect();
    parts
        .edges
        .retain(|e| !changed.contains(&e.src) && !changed.contains(&e.dst));
    let rows = sqlx::query_as::<_, (Uuid, Uuid, String, f32)>(
        "SELECT src_id, dst_id, edge_type, weight FROM edges \
         WHERE tenant_id = $1 AND (src_id = ANY($2) OR dst_id = ANY($2))",
    )
    .bind(tenant)
    .bind(ids)
    .fetch(&mut **tx);
    add_edges(parts, rows).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_ascii_word_finds_a_name() {
        assert_eq!(ascii_word("project falcon"), Some("project"));
        assert_eq!(ascii_word("łódź 2024"), Some("2024"));
        assert_eq!(ascii_word("łódź"), None);
        assert_eq!(ascii_word(""), None);
    }
}
