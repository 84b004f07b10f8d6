//! Applying a change to a tenant's [`Parts`] by reading only what it names.
//!
//! A change notification lists the memories written, deleted or at either
//! end of new edges. Their rows, stored mentions, facts and edges are read
//! again from one REPEATABLE READ snapshot. A new entity name can also
//! mention memories the change never touched (the dictionary is matched
//! against every memory's text), so the memories whose title or content
//! holds the name's longest ASCII word are matched again too: ASCII
//! lower-cases the same in Postgres's `lower` (under the "C" collation) and
//! Rust's `to_lowercase`, so this finds every memory the name can match (and some more, which the
//! exact match then leaves as they were). A name with no ASCII word, or a
//! change that reaches too many memories, asks for a full load instead.

use std::collections::HashSet;
use std::sync::Arc;

use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

use engram_common::entities::is_stopword_only;

use super::parts::Parts;
use super::{MemRow, add_edges, add_stored_mentions, add_triples, memory_columns};
use crate::error::Error;
use crate::graph::Dictionary;

/// Why a change was not applied in place: the caller loads in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FullLoad {
    /// A new entity name has no ASCII word to find its memories by.
    NameWithoutAsciiWord,
    /// More memories hold a new name's word than `limit` allows.
    TooManyToRematch,
}

/// Applies the change to `ids` to `parts` in place. On `Err` or
/// `Ok(Err(_))` the parts may be half changed: the caller drops them.
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
    let rows: Vec<MemRow> = sqlx::query_as(concat!(
        "SELECT ",
        memory_columns!(),
        " FROM memories WHERE tenant_id = $1 AND id = ANY($2) ORDER BY id"
    ))
    .bind(tenant)
    .bind(ids)
    .fetch_all(&mut *tx)
    .await?;
    let entities = new_entities(&mut tx, tenant, parts, ids).await?;
    let names = names_new_to(&parts.dict, &entities);
    let rematch = match rematch_rows(&mut tx, tenant, &names, ids, rematch_limit).await? {
        Ok(rows) => rows,
        Err(full) => return Ok(Err(full)),
    };
    replace_rows(parts, ids, entities, rows, rematch).await?;
    let mentions = sqlx::query_as::<_, (Uuid, i64, bool)>(
        "SELECT me.memory_id, me.entity_id, me.is_home FROM memory_entities me \
         JOIN memories m ON m.id = me.memory_id WHERE m.tenant_id = $1 AND m.id = ANY($2)",
    )
    .bind(tenant)
    .bind(ids)
    .fetch(&mut *tx);
    add_stored_mentions(parts, mentions).await?;
    let triples = sqlx::query_as::<_, (Uuid, i64, i64)>(
        "SELECT memory_id, subject_id, object_id FROM triples \
         WHERE tenant_id = $1 AND memory_id = ANY($2)",
    )
    .bind(tenant)
    .bind(ids)
    .fetch(&mut *tx);
    add_triples(parts, triples).await?;
    replace_edges(&mut tx, tenant, parts, ids).await?;
    tx.commit().await?;
    Ok(Ok(()))
}

/// An `entities` row: id, name (normalised), display.
type EntityRow = (i64, String, String);

/// The entities the changed memories refer to that the parts lack, and any
/// written since the parts were read.
async fn new_entities(
    tx: &mut Transaction<'_, Postgres>,
    tenant: &str,
    parts: &Parts,
    ids: &[Uuid],
) -> Result<Vec<EntityRow>, Error> {
    // An entity id below the largest known can still be new: ids are taken
    // at insert and committed in any order.
    let referenced: Vec<i64> = sqlx::query_scalar(
        "SELECT me.entity_id FROM memory_entities me JOIN memories m ON m.id = me.memory_id \
         WHERE m.tenant_id = $1 AND m.id = ANY($2) \
         UNION SELECT unnest(ARRAY[subject_id, object_id]) FROM triples \
         WHERE tenant_id = $1 AND memory_id = ANY($2)",
    )
    .bind(tenant)
    .bind(ids)
    .fetch_all(&mut **tx)
    .await?;
    let unknown: Vec<i64> = referenced
        .into_iter()
        .filter(|e| !parts.by_db.contains_key(e))
        .collect();
    let rows: Vec<EntityRow> = sqlx::query_as(
        "SELECT id, name, display FROM entities \
         WHERE tenant_id = $1 AND (id > $2 OR id = ANY($3)) ORDER BY id",
    )
    .bind(tenant)
    .bind(parts.max_entity_id())
    .bind(&unknown)
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows
        .into_iter()
        .filter(|(id, ..)| !parts.by_db.contains_key(id))
        .collect())
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

/// The longest word of a normalised name made of ASCII alone.
fn ascii_word(name: &str) -> Option<&str> {
    name.split(' ')
        .filter(|w| !w.is_empty() && w.is_ascii())
        .max_by_key(|w| w.len())
}

/// Memories outside the change whose text may hold one of `names`: their
/// id, title and content.
async fn rematch_rows(
    tx: &mut Transaction<'_, Postgres>,
    tenant: &str,
    names: &[String],
    ids: &[Uuid],
    limit: usize,
) -> Result<Result<Vec<(Uuid, String, String)>, FullLoad>, Error> {
    if names.is_empty() {
        return Ok(Ok(Vec::new()));
    }
    let mut words: Vec<String> = Vec::with_capacity(names.len());
    for name in names {
        match ascii_word(name) {
            Some(w) => words.push(w.to_string()),
            None => return Ok(Err(FullLoad::NameWithoutAsciiWord)),
        }
    }
    words.sort_unstable();
    words.dedup();
    let rows: Vec<(Uuid, String, String)> = sqlx::query_as(
        "SELECT m.id, m.title, m.content FROM memories m \
         WHERE m.tenant_id = $1 AND m.id <> ALL($2) AND EXISTS (SELECT 1 FROM unnest($3::text[]) w \
         WHERE strpos(lower((m.title || ' ' || m.content) COLLATE \"C\"), w) > 0) LIMIT $4",
    )
    .bind(tenant)
    .bind(ids)
    .bind(&words)
    .bind(i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1))
    .fetch_all(&mut **tx)
    .await?;
    if rows.len() > limit {
        return Ok(Err(FullLoad::TooManyToRematch));
    }
    Ok(Ok(rows))
}

/// Adds `entities` to a copy of the dictionary, replaces the changed
/// memories (dropping the deleted ones) and matches them and `rematch`
/// against it, all off the async runtime (the dictionary holds hundreds of
/// thousands of names at 100K memories).
async fn replace_rows(
    parts: &mut Parts,
    ids: &[Uuid],
    entities: Vec<EntityRow>,
    rows: Vec<MemRow>,
    rematch: Vec<(Uuid, String, String)>,
) -> Result<(), Error> {
    for id in ids {
        parts.memories.remove(id);
    }
    let old = parts.dict.clone();
    let (dict, added, fresh, texts) = tokio::task::spawn_blocking(move || {
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
        let texts: Vec<(Uuid, Vec<(u32, bool)>)> = rematch
            .into_iter()
            .map(|(id, title, content)| (id, dict.match_text(&title, &content)))
            .collect();
        (dict, added, fresh, texts)
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))?;
    parts.dict = dict;
    parts.by_db.extend(added);
    parts.memories.extend(fresh);
    for (id, mentions) in texts {
        // Memories whose own change has not been applied yet come with it.
        if let Some(row) = parts.memories.get_mut(&id) {
            row.text_mentions = mentions;
        }
    }
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
