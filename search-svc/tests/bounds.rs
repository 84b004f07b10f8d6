//! statement_timeout per query kind (issue 16, item 4): a statement that
//! outlives its bound is cancelled by Postgres and reaches the caller as
//! DEADLINE_EXCEEDED, never INTERNAL; the bound ends with its transaction.

use engram_common::db::{connect, test_database, test_database_url};
use search_svc::{Error, bounds};

#[tokio::test]
async fn a_statement_past_its_timeout_is_deadline_exceeded_not_internal() {
    let pool = test_database().await.expect("test database");
    let mut tx = bounds::begin(&pool, 1).await.expect("begin");
    let e = sqlx::query("SELECT pg_sleep(0.5)")
        .execute(&mut *tx)
        .await
        .expect_err("the 1 ms bound cancels a 500 ms sleep");
    let status = tonic::Status::from(Error::from(e));
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
}

#[tokio::test]
async fn the_bound_holds_inside_its_transaction_and_ends_with_it() {
    // One connection, so every transaction below runs on the same session.
    let url = test_database_url().await.expect("url");
    let pool = connect(&url, 1).await.expect("pool");
    let show = "SHOW statement_timeout";
    let before: String = sqlx::query_scalar(show)
        .fetch_one(&pool)
        .await
        .expect("show");
    let mut tx = bounds::begin(&pool, 1234).await.expect("begin");
    let inside: String = sqlx::query_scalar(show)
        .fetch_one(&mut *tx)
        .await
        .expect("show");
    tx.commit().await.expect("commit");
    let after: String = sqlx::query_scalar(show)
        .fetch_one(&pool)
        .await
        .expect("show");
    assert_eq!(inside, "1234ms");
    assert_eq!(after, before, "SET LOCAL leaked into the pooled session");
}
