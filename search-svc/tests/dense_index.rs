//! The HNSW indexes hold half-precision copies of the vectors (migration
//! 0010), so a reader must order by `<column>::halfvec(384) <=>
//! q::halfvec(384)`: any other expression still answers, but by a scan of
//! the tenant. These pin `dense::HALF` to the indexes' expressions.

use engram_common::db::test_database;
use pgvector::Vector;
use search_svc::dense::HALF;

async fn plan(sql: &str) -> Vec<String> {
    let pool = test_database().await.expect("test database");
    let mut tx = pool.begin().await.expect("begin");
    // Without this a near-empty test table is cheaper to scan; with it a
    // scan is still chosen when no index matches the ORDER BY.
    sqlx::query("SET LOCAL enable_seqscan = off")
        .execute(&mut *tx)
        .await
        .expect("set");
    // The statements are this file's constants and `HALF`: no input.
    let lines: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
        .persistent(false)
        .bind(Vector::from(vec![0.05_f32; 384]))
        .fetch_all(&mut *tx)
        .await
        .expect("explain");
    tx.rollback().await.expect("rollback");
    lines
}

#[tokio::test]
async fn ordering_by_the_half_cast_walks_the_hnsw_indexes() {
    for (table, index) in [
        ("memories", "memories_embedding_hnsw"),
        ("memory_sentences", "memory_sentences_embedding_hnsw"),
    ] {
        let sql = format!("SELECT 1 FROM {table} ORDER BY embedding{HALF} <=> $1{HALF} LIMIT 5");
        let lines = plan(&sql).await;
        assert!(
            lines.iter().any(|l| l.contains(index)),
            "{table}: the half-precision order must use {index}: {lines:#?}"
        );
    }
}

#[tokio::test]
async fn the_full_precision_order_has_no_index_to_use() {
    // The reason the cast matters: the same order on the stored vectors
    // finds no index and sorts the table.
    let sql = "SELECT 1 FROM memories ORDER BY embedding <=> $1 LIMIT 5";
    let lines = plan(sql).await;
    assert!(
        !lines.iter().any(|l| l.contains("memories_embedding_hnsw")),
        "{lines:#?}"
    );
}
