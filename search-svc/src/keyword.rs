//! Keyword search with Postgres full-text search. The query's lexemes are
//! OR-ed (an AND tsquery finds nothing for natural-language questions); the
//! lexemes come from `to_tsvector('english', q)` so stemming and stopwords
//! match the stored `tsv`, and are quoted before the `::tsquery` cast so no
//! user text is ever parsed as tsquery syntax.
//!
//! Two scorings: `ts_rank_cd` (cover density; title weighted through the A
//! weight of the generated tsv) and `bm25` (Okapi BM25, k1 = 1.5, b = 0.75,
//! idf = ln(1 + (N - df + 0.5) / (df + 0.5))).
//!
//! BM25's N, df and average length come from `term_stats` / `doc_stats`
//! (kept by the write path, `migrations/0002_term_stats.sql`), summed over
//! the caller's tenant and the access levels it may see, so hidden records
//! do not even influence ranks. Counting them per query over the rows cost
//! 60-130 ms at 6K memories and grew with the tenant.
//!
//! Candidates are bounded before scoring: an OR query over a question's
//! terms matches most of a large tenant through words like "film" or
//! "born", and scoring every match is what made keyword search slow. So the
//! GIN index is asked only for the rarest terms, taken by ascending df while
//! their summed df stays within the candidate budget
//! (`search.keyword_candidates`, at least the rarest one), at most that many
//! rows; every query term still scores them. A document that matches only
//! the common terms can only reach a low score (their idf is small), which
//! is why this keeps the recall of exact BM25 (2Wiki dev keyword R@2/R@5
//! measured in docs/benchmarks.md).
//!
//! With `search.keyword_index` (the default) a BM25 query is first asked of
//! the tenant's in-memory index (`keyword_index.rs`) and only the hits are
//! read from Postgres; the SQL BM25 below answers when that index is not
//! current.

use std::collections::HashMap;

use engram_common::Identity;
use sqlx::{Postgres, QueryBuilder};
use uuid::Uuid;

use crate::bounds;
use crate::error::Result;
use crate::filters::push_where;
use crate::keyword_index::{KeywordIndex, Lookup};
use crate::rows::{MEMORY_COLUMNS, MemoryRow, ScoredRow, for_reader};
use crate::validate::SearchFilters;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scoring {
    TsRankCd,
    Bm25,
}

impl Scoring {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ts_rank_cd" => Some(Self::TsRankCd),
            "bm25" => Some(Self::Bm25),
            _ => None,
        }
    }
}

/// SQL producing a quoted tsquery lexeme from the column `lexeme`.
const QUOTED_LEXEME: &str = "'''' || replace(replace(lexeme, '\\', '\\\\'), '''', '''''') || ''''";

const K1: f64 = 1.5;
const B: f64 = 0.75;

/// Term frequency of `df.query`'s one lexeme in `c.tsv`, without expanding
/// the tsvector (unnest of every candidate's lexemes was most of the cost).
/// With all weights 1, `ts_rank` of a one-lexeme query is
/// H(tf) / 1.64493406685 where H(n) = sum of 1/j^2 for j = 1..n (Postgres'
/// calc_rank_or), and 1 / (pi^2/6 - H(n)) = n + 1/2 + O(1/n), so rounding
/// recovers tf exactly (checked for tf = 1..300 by a test; Postgres keeps at
/// most 256 positions per lexeme anyway).
pub const TERM_FREQUENCY: &str = "greatest(round(1 / (1.64493406685 - ts_rank('{1,1,1,1}', c.tsv, df.query)::float8 * 1.64493406685) - 0.5), 1)";

/// A keyword search's rows, best first, and whether the keyword index
/// ranked them (false: SQL).
#[derive(Debug)]
pub struct Hits {
    pub rows: Vec<(MemoryRow, f32)>,
    pub from_index: bool,
}

/// How keyword hits are scored: the scoring, BM25's candidate budget, the
/// decay floor applied when the request sets none, and the query's
/// statement_timeout (`bounds.rs`).
#[derive(Debug, Clone, Copy)]
pub struct Ranking {
    pub scoring: Scoring,
    pub candidates: u32,
    pub default_decay_floor: f32,
    pub timeout_ms: u64,
}

pub async fn search(
    readers: &bounds::Readers,
    index: &KeywordIndex,
    identity: &Identity,
    text: &str,
    filters: &SearchFilters,
    k: u32,
    ranking: Ranking,
) -> Result<Hits> {
    if ranking.scoring == Scoring::Bm25 {
        let query = Indexed {
            identity,
            text,
            filters,
            k: k as usize,
        };
        if let Some(rows) = query.search(readers, index, ranking).await? {
            return Ok(Hits {
                rows,
                from_index: true,
            });
        }
    }
    let Ranking {
        scoring,
        candidates,
        default_decay_floor,
        timeout_ms,
    } = ranking;
    let qb = match scoring {
        Scoring::TsRankCd => ts_rank_cd_query(identity, text, filters, k, default_decay_floor),
        Scoring::Bm25 => bm25_query(
            identity,
            text,
            filters,
            k,
            i64::from(candidates),
            default_decay_floor,
        ),
    };
    let mut read = readers.read(timeout_ms).await?;
    let mut rows = ScoredRow::fetch_all(qb, &mut read).await?;
    let at = filters.as_of_ingestion_opt;
    let unreadable = for_reader(
        &mut read,
        identity,
        at,
        rows.iter_mut().map(|r| &mut r.memory),
    )
    .await?;
    read.finish().await?;
    rows.retain(|r| !unreadable.contains(&r.memory.id));
    Ok(Hits {
        rows: (rows.into_iter())
            .map(|r| (r.memory, r.score as f32))
            .collect(),
        from_index: false,
    })
}

/// A BM25 query answered from the tenant's keyword index
/// (`keyword_index.rs`): the index proposes ids in score order, and the
/// rows are read back through [`push_where`], so what the caller may see
/// and every filter are decided by the same SQL as every other read.
struct Indexed<'a> {
    identity: &'a Identity,
    text: &'a str,
    filters: &'a SearchFilters,
    k: usize,
}

impl Indexed<'_> {
    /// The top k, or None when the index cannot answer (no current index,
    /// or too many of its hits filtered out twice): then SQL answers.
    async fn search(
        &self,
        readers: &bounds::Readers,
        index: &KeywordIndex,
        ranking: Ranking,
    ) -> Result<Option<Vec<(MemoryRow, f32)>>> {
        // Room for hits the filters drop (superseded, decayed, another
        // namespace); a second, wider ask before giving up.
        let mut limit = self.k + self.k / 2 + 10;
        for _ in 0..2 {
            let Lookup::Found(found) = index.search(self.identity, self.text, limit).await else {
                return Ok(None);
            };
            let rows = self.read_back(readers, &found.hits, ranking).await?;
            if rows.len() >= self.k || found.exhausted {
                return Ok(Some(rows));
            }
            limit *= 8;
        }
        Ok(None)
    }

    /// The hits the caller may see under the request's filters, in the
    /// index's order, at most k.
    async fn read_back(
        &self,
        readers: &bounds::Readers,
        hits: &[(Uuid, f32)],
        ranking: Ranking,
    ) -> Result<Vec<(MemoryRow, f32)>> {
        if hits.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = hits.iter().map(|h| h.0).collect();
        let mut qb = QueryBuilder::<Postgres>::new("SELECT ");
        qb.push(MEMORY_COLUMNS)
            .push(" FROM memories m WHERE m.id = ANY(")
            .push_bind(ids)
            .push(") AND ");
        push_where(
            &mut qb,
            self.identity,
            self.filters,
            ranking.default_decay_floor,
        );
        let mut read = readers.read(ranking.timeout_ms).await?;
        // A prepared statement (unlike the searches in rows.rs): every plan
        // of this one, generic or custom, is a primary-key lookup of the
        // listed ids, so re-planning it per call (~0.2 ms of Postgres CPU at
        // 100K) bought nothing.
        let mut rows: Vec<MemoryRow> = qb.build_query_as().fetch_all(&mut *read).await?;
        let at = self.filters.as_of_ingestion_opt;
        let unreadable = for_reader(&mut read, self.identity, at, rows.iter_mut()).await?;
        read.finish().await?;
        rows.retain(|r| !unreadable.contains(&r.id));
        let mut by_id: HashMap<Uuid, MemoryRow> = rows.into_iter().map(|r| (r.id, r)).collect();
        Ok(hits
            .iter()
            .filter_map(|(id, score)| by_id.remove(id).map(|row| (row, *score)))
            .take(self.k)
            .collect())
    }
}

fn ts_rank_cd_query(
    identity: &Identity,
    text: &str,
    filters: &SearchFilters,
    k: u32,
    default_decay_floor: f32,
) -> QueryBuilder<Postgres> {
    let mut qb = QueryBuilder::<Postgres>::new(
        "WITH qt AS (SELECT DISTINCT lexeme FROM unnest(to_tsvector('english', ",
    );
    qb.push_bind(text.to_string())
        .push("))), q AS (SELECT string_agg(");
    qb.push(QUOTED_LEXEME)
        .push(", ' | ')::tsquery AS query FROM qt) SELECT ")
        .push(MEMORY_COLUMNS)
        .push(", ts_rank_cd(m.tsv, q.query)::float8 AS score FROM memories m, q WHERE m.tsv @@ q.query AND ");
    push_where(&mut qb, identity, filters, default_decay_floor);
    qb.push(" ORDER BY score DESC, m.id LIMIT ")
        .push_bind(i64::from(k));
    qb
}

fn bm25_query(
    identity: &Identity,
    text: &str,
    filters: &SearchFilters,
    k: u32,
    budget: i64,
    default_decay_floor: f32,
) -> QueryBuilder<Postgres> {
    let tenant = identity.tenant.clone();
    let trust = identity.trust.as_i16();
    let mut qb = QueryBuilder::<Postgres>::new(
        "WITH qt AS (SELECT DISTINCT lexeme FROM unnest(to_tsvector('english', ",
    );
    qb.push_bind(text.to_string()).push(")))");
    // Collection statistics over the caller's visible levels.
    qb.push(
        ", stats AS (SELECT coalesce(sum(s.docs), 0)::float8 AS n, \
         coalesce(sum(s.total_len)::float8 / nullif(sum(s.docs), 0), 1)::float8 AS avgdl \
         FROM doc_stats s WHERE s.tenant_id = ",
    )
    .push_bind(tenant.clone())
    .push(" AND s.access_level <= ")
    .push_bind(trust)
    .push(")");
    // Per query term: df and idf (terms no visible document has are dropped).
    qb.push(", df AS MATERIALIZED (SELECT qt.lexeme, c.df, ln(1 + (stats.n - c.df + 0.5) / (c.df + 0.5)) AS idf, (")
        .push(QUOTED_LEXEME.replace("lexeme", "qt.lexeme"))
        .push(
            ")::tsquery AS query FROM qt, stats, LATERAL (SELECT coalesce(sum(s.df), 0)::float8 AS df \
             FROM term_stats s WHERE s.tenant_id = ",
        )
    .push_bind(tenant)
    .push(" AND s.lexeme = qt.lexeme AND s.access_level <= ")
    .push_bind(trust)
    .push(") c WHERE c.df > 0)");
    // Candidate terms: the rarest, while their summed df fits the budget.
    qb.push(
        ", ranked AS (SELECT lexeme, df, sum(df) OVER (ORDER BY df, lexeme) AS cum, \
         row_number() OVER (ORDER BY df, lexeme) AS rn FROM df)",
    );
    qb.push(", cq AS (SELECT string_agg(")
        .push(QUOTED_LEXEME)
        .push(", ' | ')::tsquery AS query FROM ranked WHERE rn = 1 OR cum <= ")
        .push_bind(budget)
        .push(")");
    qb.push(", cand AS MATERIALIZED (SELECT m.id, m.tsv, m.tsv_len FROM memories m, cq WHERE m.tsv @@ cq.query AND ");
    push_where(&mut qb, identity, filters, default_decay_floor);
    qb.push(" LIMIT ").push_bind(budget).push(")");
    // Score with every query term; fetch full rows only for the top k.
    qb.push(", scored AS (SELECT c.id, sum(df.idf * tf.tf * ")
        .push(K1 + 1.0)
        .push(" / (tf.tf + ")
        .push(K1)
        .push(" * (1 - ")
        .push(B)
        .push(" + ")
        .push(B)
        .push(" * c.tsv_len / greatest(stats.avgdl, 1))))::float8 AS score FROM cand c CROSS JOIN stats CROSS JOIN df, LATERAL (SELECT ")
        .push(TERM_FREQUENCY)
        .push(
            " AS tf) tf WHERE c.tsv @@ df.query \
             GROUP BY c.id ORDER BY score DESC, c.id LIMIT ",
        )
        .push_bind(i64::from(k))
        .push(") SELECT ")
        .push(MEMORY_COLUMNS)
        .push(", sc.score FROM scored sc JOIN memories m ON m.id = sc.id ORDER BY sc.score DESC, m.id");
    qb
}
