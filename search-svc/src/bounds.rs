//! What one request may cost search-svc: a statement_timeout per kind of
//! query, and a cap on requests in flight.
//!
//! Timeouts: every statement runs under a `statement_timeout` for its kind,
//! so Postgres itself cancels a statement that runs too long
//! (SQLSTATE 57014, DEADLINE_EXCEEDED in `error.rs`). Without it a slow plan
//! went on holding a pool connection long after the gateway had given up on
//! the call. Writes and other kinds run in a transaction opened with
//! `BEGIN; SET LOCAL statement_timeout = N` (one simple-query round trip,
//! see [`begin`]); `SET LOCAL` ends with the transaction, so pooled
//! connections keep no setting and each kind gets its own bound.
//!
//! The query path's reads (dense, keyword read-back and its SQL fallback,
//! get, the speaker probe) skip that transaction when their bound is the
//! readers' one, `search.statement_timeout_dense_ms` ([`Readers`]):
//! a second pool whose connections start with `statement_timeout` set, so
//! each read is its one statement. BEGIN + SET LOCAL and COMMIT were two
//! more round trips per read, four reads a query (~0.1 ms of wall time
//! each pair in pgbench, both processes' CPU).
//!
//! In-flight cap: a tokio semaphore taken with `try_acquire` at the top of
//! every handler ([`Admission`]). tower's `ConcurrencyLimitLayer` +
//! `LoadShedLayer` would do the same around the whole server, but tonic's
//! router takes only infallible services, so the shed error would need an
//! adapter to become a gRPC status, and the limit would also cover health
//! checks and reflection, which must answer while search is saturated. The
//! semaphore refuses with RESOURCE_EXHAUSTED before any work, never queues,
//! and counts exactly the search RPCs.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use engram_common::settings::SearchSettings;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};

/// statement_timeout per kind of query, in milliseconds (0 = none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub dense_ms: u64,
    pub keyword_ms: u64,
    pub get_ms: u64,
    pub write_ms: u64,
    pub decay_ms: u64,
}

impl Timeouts {
    pub fn from_settings(s: &SearchSettings) -> Self {
        Self {
            dense_ms: s.statement_timeout_dense_ms,
            keyword_ms: s.statement_timeout_keyword_ms,
            get_ms: s.statement_timeout_get_ms,
            write_ms: s.statement_timeout_write_ms,
            decay_ms: s.statement_timeout_decay_ms,
        }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Self::from_settings(&SearchSettings::default())
    }
}

/// A transaction whose every statement Postgres cancels after `timeout_ms`
/// (0 = no bound). BEGIN and SET LOCAL travel as one simple query, so the
/// bound costs one round trip more than a bare statement plus the COMMIT.
pub async fn begin(pool: &PgPool, timeout_ms: u64) -> Result<Transaction<'static, Postgres>> {
    let sql = format!("BEGIN; SET LOCAL statement_timeout = {timeout_ms}");
    Ok(pool.begin_with(sqlx::AssertSqlSafe(sql)).await?)
}

/// Commits a write begun with [`begin`], with no statement timeout on the
/// COMMIT itself: with a synchronous standby, COMMIT waits for it, and a
/// wait cancelled by the timeout keeps the commit on the primary alone
/// (Postgres only warns) while engram would acknowledge it; losing the
/// primary then would lose an acknowledged write. The caller's deadline
/// still bounds the call, and a write that ends on it is not acknowledged.
pub async fn commit(mut tx: Transaction<'static, Postgres>) -> Result<()> {
    sqlx::query("SET LOCAL statement_timeout = 0")
        .execute(&mut *tx)
        .await?;
    Ok(tx.commit().await?)
}

/// Where the query path reads: `bounded`, whose connections carry
/// `statement_timeout = bound_ms` from their startup, for reads bounded by
/// exactly that; any other bound falls back to [`begin`] on the service's
/// pool. Only reads that set no session state may use `bounded`.
#[derive(Debug, Clone)]
pub struct Readers {
    bounded: PgPool,
    bound_ms: u64,
    pool: PgPool,
}

impl Readers {
    /// `bounded` is lazy (no connection until the first read) and as large
    /// as `pool`, with its connect options (the HNSW settings included).
    pub fn new(pool: &PgPool, bound_ms: u64) -> Self {
        let opts = (*pool.connect_options())
            .clone()
            .options([("statement_timeout", bound_ms.to_string())]);
        let bounded = PgPoolOptions::new()
            .max_connections(pool.options().get_max_connections())
            .acquire_timeout(pool.options().get_acquire_timeout())
            .connect_lazy_with(opts);
        Self {
            bounded,
            bound_ms,
            pool: pool.clone(),
        }
    }

    /// A connection whose every statement Postgres cancels after
    /// `timeout_ms` (0 = none); end it with [`Read::finish`].
    pub async fn read(&self, timeout_ms: u64) -> Result<Read> {
        if timeout_ms == self.bound_ms {
            Ok(Read::Bounded(self.bounded.acquire().await?))
        } else {
            Ok(Read::Tx(begin(&self.pool, timeout_ms).await?))
        }
    }

    /// Closes the bounded pool (the service's pool is its owner's).
    pub async fn close(&self) {
        self.bounded.close().await;
    }
}

/// A bounded read: a plain connection from [`Readers`]' own pool, or a
/// transaction with `SET LOCAL statement_timeout`.
#[derive(Debug)]
pub enum Read {
    Bounded(PoolConnection<Postgres>),
    Tx(Transaction<'static, Postgres>),
}

impl Read {
    /// Commits the transaction, if it is one (reads write nothing, but an
    /// open transaction would go back to the pool to be rolled back).
    pub async fn finish(self) -> Result<()> {
        match self {
            Read::Bounded(_) => Ok(()),
            Read::Tx(tx) => Ok(tx.commit().await?),
        }
    }
}

impl std::ops::Deref for Read {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        match self {
            Read::Bounded(c) => c,
            Read::Tx(tx) => tx,
        }
    }
}

impl std::ops::DerefMut for Read {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Read::Bounded(c) => c,
            Read::Tx(tx) => tx,
        }
    }
}

/// How long a write waits for a pool connection before it is refused. The
/// pool's own acquire timeout (10 s, common/src/db.rs) is the readers'; a
/// write that cannot start within this while Postgres is gone (before the
/// database watcher has noticed) is refused UNAVAILABLE, never applied, so
/// its caller retries instead of holding its slots through the outage.
pub const WRITE_ACQUIRE: Duration = Duration::from_secs(2);

/// [`begin`] for a write: refused with [`Error::Unavailable`] when no
/// connection is to be had within `acquire` (or the pool reports the
/// database unreachable). Nothing has been written when it fails.
pub async fn begin_write(
    pool: &PgPool,
    timeout_ms: u64,
    acquire: Duration,
) -> Result<Transaction<'static, Postgres>> {
    within(acquire, begin(pool, timeout_ms)).await
}

/// A pool connection for a write's reads before its transaction, under the
/// same bound as [`begin_write`].
pub async fn write_conn(pool: &PgPool, acquire: Duration) -> Result<PoolConnection<Postgres>> {
    within(acquire, async { Ok(pool.acquire().await?) }).await
}

/// `step` (getting a connection), refused UNAVAILABLE after `acquire` or
/// when the pool cannot reach the database.
async fn within<T>(acquire: Duration, step: impl Future<Output = Result<T>>) -> Result<T> {
    let refused = || {
        Error::Unavailable(format!(
            "no database connection within {} ms: the write was not applied; retry it",
            acquire.as_millis()
        ))
    };
    match tokio::time::timeout(acquire, step).await {
        Err(_) => Err(refused()),
        Ok(Err(Error::Database(sqlx::Error::PoolTimedOut | sqlx::Error::Io(_)))) => Err(refused()),
        Ok(other) => other,
    }
}

/// The in-flight cap; `None` when `search.max_concurrent_requests` is 0.
#[derive(Debug, Clone)]
pub struct Admission {
    limit: u32,
    permits_opt: Option<Arc<Semaphore>>,
}

/// Held for the whole handler; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    _permit_opt: Option<OwnedSemaphorePermit>,
}

impl Admission {
    pub fn new(limit: u32) -> Self {
        let permits_opt = (limit > 0).then(|| Arc::new(Semaphore::new(limit as usize)));
        Self { limit, permits_opt }
    }

    /// A slot, or RESOURCE_EXHAUSTED at once when every slot is taken: a
    /// refusal the caller can retry elsewhere costs less than a queue whose
    /// wait nobody bounds.
    pub fn admit(&self) -> Result<Slot> {
        let Some(permits) = &self.permits_opt else {
            return Ok(Slot { _permit_opt: None });
        };
        match Arc::clone(permits).try_acquire_owned() {
            Ok(p) => Ok(Slot {
                _permit_opt: Some(p),
            }),
            Err(_) => Err(Error::Busy(format!(
                "search-svc is handling its limit of {} requests; retry shortly",
                self.limit
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_write_that_cannot_reach_the_database_is_refused_unavailable() {
        // Nothing listens on a port the OS just gave back.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy(&format!("postgres://engram:x@127.0.0.1:{port}/engram"))
            .expect("lazy pool");
        let e = begin_write(&pool, 1000, Duration::from_millis(200))
            .await
            .expect_err("no database");
        assert!(
            matches!(&e, Error::Unavailable(m) if m.contains("not applied; retry")),
            "{e:?}"
        );
        assert_eq!(tonic::Status::from(e).code(), tonic::Code::Unavailable);
        let e = write_conn(&pool, Duration::from_millis(200))
            .await
            .expect_err("no database");
        assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
    }

    #[test]
    fn a_full_admission_refuses_and_a_dropped_slot_frees_its_place() {
        let a = Admission::new(2);
        let first = a.admit().expect("first");
        let _second = a.admit().expect("second");
        let refused = a.admit().expect_err("third");
        assert_eq!(
            tonic::Status::from(refused).code(),
            tonic::Code::ResourceExhausted
        );
        drop(first);
        assert!(a.admit().is_ok());
    }

    #[test]
    fn zero_means_no_limit() {
        let a = Admission::new(0);
        let slots: Vec<_> = (0..1000).map(|_| a.admit().expect("slot")).collect();
        assert_eq!(slots.len(), 1000);
    }
}
