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

#[tokio::test]
async fn readers_bound_every_read_and_leave_the_services_pool_unbounded() {
    let url = test_database_url().await.expect("url");
    let pool = connect(&url, 2).await.expect("pool");
    let readers = bounds::Readers::new(&pool, 40);
    let show = "SHOW statement_timeout";
    // The readers' own bound: a plain connection carrying it from startup,
    // with the HNSW settings of the pool it was made from.
    let mut read = readers.read(40).await.expect("read");
    assert!(matches!(read, bounds::Read::Bounded(_)));
    let bound: String = sqlx::query_scalar(show)
        .fetch_one(&mut *read)
        .await
        .expect("show");
    assert_eq!(bound, "40ms");
    let ef: String = sqlx::query_scalar("SHOW hnsw.ef_search")
        .fetch_one(&mut *read)
        .await
        .expect("show ef");
    assert_eq!(
        ef,
        engram_common::settings::SearchSettings::default()
            .hnsw_ef_search
            .to_string()
    );
    let e = sqlx::query("SELECT pg_sleep(0.5)")
        .execute(&mut *read)
        .await
        .expect_err("the 40 ms bound cancels a 500 ms sleep");
    assert_eq!(
        tonic::Status::from(Error::from(e)).code(),
        tonic::Code::DeadlineExceeded
    );
    read.finish().await.expect("finish");
    // Any other bound: a transaction with SET LOCAL on the service's pool.
    let mut read = readers.read(1234).await.expect("read");
    assert!(matches!(read, bounds::Read::Tx(_)));
    let inside: String = sqlx::query_scalar(show)
        .fetch_one(&mut *read)
        .await
        .expect("show");
    assert_eq!(inside, "1234ms");
    read.finish().await.expect("finish");
    // The service's pool itself never carries the readers' bound.
    let plain: String = sqlx::query_scalar(show)
        .fetch_one(&pool)
        .await
        .expect("show");
    assert_eq!(plain, "0");
    readers.close().await;
}
