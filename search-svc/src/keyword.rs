//! Keyword search with Postgres full-text search. The query's lexemes are
//! OR-ed (an AND tsquery finds nothing for natural-language questions); the
//! lexemes come from `to_tsvector('english', q)` so stemming and stopwords
//! match the stored `tsv`, and are quoted before the `::tsquery` cast so no
//! user text is ever parsed as tsquery syntax.
//!
//! Two scorings: `ts_rank_cd` (cover density; title weighted through the A
//! weight of the generated tsv) and `bm25` (Okapi BM25, k1 = 1.5, b = 0.75,
//! idf = ln(1 + (N - df + 0.5) / (df + 0.5)); N, df and the average length
//! are over the caller's visible part of the tenant, so hidden records do
//! not even influence ranks).

use engram_common::Identity;
use sqlx::{PgPool, Postgres, QueryBuilder};

use crate::error::Result;
use crate::filters::push_where;
use crate::rows::{MEMORY_COLUMNS, MemoryRow, ScoredRow};
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

pub async fn search(
    pool: &PgPool,
    identity: &Identity,
    text: &str,
    filters: &SearchFilters,
    k: u32,
    scoring: Scoring,
    default_decay_floor: f32,
) -> Result<Vec<(MemoryRow, f32)>> {
    let mut qb = QueryBuilder::<Postgres>::new(
        "WITH qt AS (SELECT DISTINCT lexeme FROM unnest(to_tsvector('english', ",
    );
    qb.push_bind(text.to_string())
        .push("))), q AS (SELECT string_agg(");
    qb.push(QUOTED_LEXEME)
        .push(", ' | ')::tsquery AS query FROM qt)");
    match scoring {
        Scoring::TsRankCd => {
            qb.push(" SELECT ")
                .push(MEMORY_COLUMNS)
                .push(", ts_rank_cd(m.tsv, q.query)::float8 AS score FROM memories m, q WHERE m.tsv @@ q.query AND ");
            push_where(&mut qb, identity, filters, default_decay_floor);
        }
        Scoring::Bm25 => {
            qb.push(
                ", stats AS (SELECT count(*)::float8 AS n, coalesce(avg(d.tsv_len), 1)::float8 AS avgdl \
                 FROM memories d WHERE d.tenant_id = ",
            )
            .push_bind(identity.tenant.clone())
            .push(" AND d.access_level <= ")
            .push_bind(identity.trust.as_i16())
            .push("), df AS MATERIALIZED (SELECT qt.lexeme, ln(1 + (stats.n - c.df + 0.5) / (c.df + 0.5)) AS idf FROM qt, stats, LATERAL (SELECT count(*)::float8 AS df FROM memories d WHERE d.tenant_id = ")
            .push_bind(identity.tenant.clone())
            .push(" AND d.access_level <= ")
            .push_bind(identity.trust.as_i16())
            .push(" AND d.tsv @@ (")
            .push(QUOTED_LEXEME.replace("lexeme", "qt.lexeme"))
            .push(")::tsquery) c)");
            qb.push(" SELECT ")
                .push(MEMORY_COLUMNS)
                .push(", sc.score FROM memories m, q, stats, LATERAL (SELECT coalesce(sum(df.idf * tf.tf * ")
                .push(K1 + 1.0)
                .push(" / (tf.tf + ")
                .push(K1)
                .push(" * (1 - ")
                .push(B)
                .push(" + ")
                .push(B)
                .push(" * m.tsv_len / greatest(stats.avgdl, 1)))), 0)::float8 AS score \
                 FROM unnest(m.tsv) u JOIN df ON df.lexeme = u.lexeme, \
                 LATERAL (SELECT coalesce(array_length(u.positions, 1), 1)::float8 AS tf) tf) sc \
                 WHERE m.tsv @@ q.query AND ");
            push_where(&mut qb, identity, filters, default_decay_floor);
        }
    }
    qb.push(" ORDER BY score DESC, m.id LIMIT ")
        .push_bind(i64::from(k));
    let rows: Vec<ScoredRow> = qb.build_query_as().fetch_all(pool).await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.memory, r.score as f32))
        .collect())
}
