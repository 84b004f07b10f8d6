//! Dense search: pgvector HNSW over cosine distance with every filter inside
//! the SQL. The pool's connections carry `hnsw.ef_search` and iterative scans
//! (relaxed order) as startup options (`engram_common::db::connect_with`), so
//! this is one round trip; relaxed order means the rows are re-sorted by
//! distance afterwards. The query is bounded by
//! `search.statement_timeout_dense_ms` (`bounds::Readers`).

use engram_common::Identity;
use pgvector::Vector;
use sqlx::{Postgres, QueryBuilder};

use crate::bounds;
use crate::error::Result;
use crate::filters::push_where;
use crate::rows::{MEMORY_COLUMNS, MemoryRow, ScoredRow, for_reader};
use crate::validate::SearchFilters;

pub async fn search(
    readers: &bounds::Readers,
    identity: &Identity,
    embedding: &[f32],
    filters: &SearchFilters,
    k: u32,
    default_decay_floor: f32,
    timeout_ms: u64,
) -> Result<Vec<(MemoryRow, f32)>> {
    let nearest = Nearest {
        select: MEMORY_COLUMNS,
        column: "m.embedding",
        from: "memories m WHERE m.embedding IS NOT NULL AND ",
    };
    let qb = nearest.query(embedding, identity, filters, default_decay_floor, k);

    let mut read = readers.read(timeout_ms).await?;
    let mut found = ScoredRow::fetch_all(qb, &mut read).await?;
    let at = filters.as_of_ingestion_opt;
    let unreadable = for_reader(
        &mut read,
        identity,
        at,
        found.iter_mut().map(|r| &mut r.memory),
    )
    .await?;
    read.finish().await?;
    found.retain(|r| !unreadable.contains(&r.memory.id));
    let mut rows: Vec<(MemoryRow, f32)> = found
        .into_iter()
        .map(|r| (r.memory, (1.0 - r.score) as f32))
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(rows)
}

/// [`HALF`] as a literal, for statements written with `concat!`.
macro_rules! half_cast {
    () => {
        "::halfvec(384)"
    };
}
pub(crate) use half_cast;

/// The cast the HNSW indexes of memories and sentences are built on
/// (migration 0010): the index holds half-precision copies, so a reader
/// orders by `<column>::halfvec(384) <=> q::halfvec(384)` or Postgres
/// cannot use it and scans the tenant. Scores still come from the stored
/// full-precision vectors.
pub const HALF: &str = half_cast!();

/// One nearest-neighbour statement over a vector column, with dense
/// search's whole access predicate on the memory row `m` inside it:
/// `SELECT <select>, (<column> <=> q)::float8 AS score FROM <from> <predicate>
/// ORDER BY <column>::halfvec(384) <=> q::halfvec(384) LIMIT k` ([`HALF`]:
/// both indexes it reads are built on that expression). Dense search and
/// the fact index (facts.rs) both read through it, so their access rules
/// cannot drift.
pub(crate) struct Nearest {
    pub select: &'static str,
    /// The full-precision vector column the score is computed from.
    pub column: &'static str,
    /// The FROM clause up to the predicate (ends in `WHERE ` or `AND `).
    pub from: &'static str,
}

impl Nearest {
    pub(crate) fn query(
        &self,
        embedding: &[f32],
        identity: &Identity,
        filters: &SearchFilters,
        default_decay_floor: f32,
        k: u32,
    ) -> QueryBuilder<Postgres> {
        let q = Vector::from(embedding.to_vec());
        let mut qb = QueryBuilder::<Postgres>::new("SELECT ");
        qb.push(self.select)
            .push(", (")
            .push(self.column)
            .push(" <=> ")
            .push_bind(q.clone())
            .push(")::float8 AS score FROM ")
            .push(self.from);
        push_where(&mut qb, identity, filters, default_decay_floor);
        qb.push(" ORDER BY ")
            .push(self.column)
            .push(HALF)
            .push(" <=> ")
            .push_bind(q)
            .push(HALF)
            .push(" LIMIT ")
            .push_bind(i64::from(k));
        qb
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cast_has_the_embedding_dimension() {
        let dim = crate::validate::EMBEDDING_DIM;
        assert_eq!(super::HALF, format!("::halfvec({dim})"));
    }
}
