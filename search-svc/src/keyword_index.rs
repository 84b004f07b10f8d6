//! Keyword search outside Postgres: one in-memory tantivy index per tenant
//! (`tenant.rs`), so BM25, the largest CPU cost of a query at 100K memories
//! when it ran in SQL (docs/benchmarks.md), no longer runs in Postgres.
//!
//! Postgres stays the source of truth. The index only proposes memory ids;
//! `keyword.rs` reads them back through the same access predicate as every
//! other read, so trust level, namespace, validity and every request filter
//! are exactly SQL's. An index is used only while it holds every write of
//! its tenant:
//!
//! - a logical clock ticks at every change this process makes (after its
//!   commit) or hears of on the change feed (`changes.rs`: other search-svc
//!   processes, SQL), and each tenant keeps the tick of its last change; a
//!   feed resync (listener reconnected, notifications possibly lost) marks
//!   every tenant changed;
//! - a build reads the clock before it reads the tenant's rows, and its
//!   index is current while no change of its tenant ticked after that.
//!
//! A query that finds its tenant's index missing or behind is answered by
//! SQL (as before the index existed) and schedules a rebuild in the
//! background: one build at a time in the process, each tenant at most once
//! per `search.keyword_index_rebuild_ms` and four times its last build's
//! duration, so a tenant writing without pause costs at most a fifth of a
//! core and never slows another tenant's queries (they keep their index or
//! SQL). A tenant larger than half of `search.keyword_index_max_docs` is
//! never indexed; the indexes together are bounded by it (least recently
//! used tenants dropped).

mod tenant;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use engram_common::Identity;
use engram_common::settings::SearchSettings;
use futures::StreamExt;
use parking_lot::Mutex;
use sqlx::PgPool;
use uuid::Uuid;

pub use tenant::{Builder, Found, TenantIndex, analyzer};

use crate::changes::ChangeStream;

/// Rows read from Postgres per statement while building.
const PAGE: i64 = 5000;
/// One page's read may take this long before the build gives up.
const PAGE_TIMEOUT: Duration = Duration::from_secs(30);
/// A build waits at least this multiple of the previous one's duration.
const BUILD_SPACING: u32 = 4;

/// What a query gets from the index.
#[derive(Debug)]
pub enum Lookup {
    Found(Found),
    /// No current index for the tenant (disabled, building, behind its
    /// writes, too large): answer from SQL.
    Unavailable,
}

/// Cheap to clone; disabled when `search.keyword_index` is off.
#[derive(Clone, Debug)]
pub struct KeywordIndex {
    shared_opt: Option<Arc<Shared>>,
}

#[derive(Debug)]
struct Shared {
    pool: PgPool,
    max_docs: u64,
    rebuild_every: Duration,
    clock: AtomicU64,
    changes: Mutex<Changes>,
    tenants: moka::sync::Cache<String, Arc<Built>>,
    builds: Mutex<HashMap<String, BuildState>>,
    /// One build at a time in the process.
    permit: tokio::sync::Semaphore,
}

#[derive(Debug, Default)]
struct Changes {
    last: HashMap<String, u64>,
    resync_at: u64,
}

#[derive(Debug)]
struct Built {
    /// The clock when the build began reading.
    as_of: u64,
    index: TenantIndex,
}

#[derive(Debug, Clone, Copy)]
struct BuildState {
    running: bool,
    started: Instant,
    took: Duration,
}

impl KeywordIndex {
    pub fn new(settings: &SearchSettings, pool: PgPool) -> Self {
        if !settings.keyword_index {
            return Self::disabled();
        }
        let tenants = moka::sync::Cache::builder()
            .max_capacity(settings.keyword_index_max_docs)
            .weigher(|_: &String, b: &Arc<Built>| u32::try_from(b.index.docs()).unwrap_or(u32::MAX))
            .build();
        let shared = Shared {
            pool,
            max_docs: settings.keyword_index_max_docs,
            rebuild_every: Duration::from_millis(settings.keyword_index_rebuild_ms),
            clock: AtomicU64::new(0),
            changes: Mutex::default(),
            tenants,
            builds: Mutex::default(),
            permit: tokio::sync::Semaphore::new(1),
        };
        Self {
            shared_opt: Some(Arc::new(shared)),
        }
    }

    pub fn disabled() -> Self {
        Self { shared_opt: None }
    }

    pub fn is_enabled(&self) -> bool {
        self.shared_opt.is_some()
    }

    /// `tenant` changed (call after the change committed).
    pub fn changed(&self, tenant: &str) {
        if let Some(s) = &self.shared_opt {
            let tick = s.clock.fetch_add(1, Ordering::SeqCst) + 1;
            s.changes.lock().last.insert(tenant.to_string(), tick);
        }
    }

    /// Every tenant may have changed (notifications were lost).
    pub fn resync(&self) {
        if let Some(s) = &self.shared_opt {
            let tick = s.clock.fetch_add(1, Ordering::SeqCst) + 1;
            s.changes.lock().resync_at = tick;
        }
    }

    /// Follows the change feed until it ends (server shutdown).
    pub async fn follow(self, mut events: ChangeStream) {
        while let Some(event) = events.next().await {
            match event {
                Ok(e) if e.resync => self.resync(),
                Ok(e) => self.changed(&e.tenant),
                Err(_) => self.resync(),
            }
        }
    }

    /// The caller's best `limit` memories by BM25, from a current index, or
    /// Unavailable (and a rebuild scheduled when one is due).
    pub fn search(&self, identity: &Identity, text: &str, limit: usize) -> Lookup {
        let Some(s) = &self.shared_opt else {
            return Lookup::Unavailable;
        };
        let tenant = &identity.tenant;
        match s.tenants.get(tenant) {
            Some(built) if s.is_current(tenant, built.as_of) => {
                match built.index.search(identity.trust.as_i16(), text, limit) {
                    Ok(found) => Lookup::Found(found),
                    Err(e) => {
                        tracing::warn!(tenant = %tenant, error = %e, "keyword index search failed");
                        Lookup::Unavailable
                    }
                }
            }
            _ => {
                Shared::schedule(s, tenant);
                Lookup::Unavailable
            }
        }
    }

    /// True when `tenant` has a current index (tests and the bench wait on
    /// it).
    pub fn is_current(&self, tenant: &str) -> bool {
        self.shared_opt
            .as_ref()
            .is_some_and(|s| (s.tenants.get(tenant)).is_some_and(|b| s.is_current(tenant, b.as_of)))
    }
}

impl Shared {
    fn is_current(&self, tenant: &str, as_of: u64) -> bool {
        let changes = self.changes.lock();
        as_of >= changes.resync_at && changes.last.get(tenant).is_none_or(|&t| as_of >= t)
    }

    /// Starts a build of `tenant` unless one runs or the last was too
    /// recent.
    fn schedule(this: &Arc<Self>, tenant: &str) {
        let now = Instant::now();
        {
            let mut builds = this.builds.lock();
            if let Some(b) = builds.get(tenant) {
                let wait = this.rebuild_every.max(b.took * BUILD_SPACING);
                if b.running || now < b.started + wait {
                    return;
                }
            }
            let state = BuildState {
                running: true,
                started: now,
                took: Duration::ZERO,
            };
            builds.insert(tenant.to_string(), state);
        }
        let (shared, tenant) = (this.clone(), tenant.to_string());
        tokio::spawn(async move {
            let result = shared.build(&tenant).await;
            let took = now.elapsed();
            match result {
                Ok(Some(docs)) => {
                    tracing::info!(tenant = %tenant, docs, ms = took.as_millis() as u64, "keyword index built")
                }
                Ok(None) => {
                    tracing::info!(tenant = %tenant, max_docs = shared.max_docs / 2, "keyword index not built: tenant too large")
                }
                Err(e) => {
                    tracing::warn!(tenant = %tenant, error = %e, "keyword index build failed")
                }
            }
            let mut builds = shared.builds.lock();
            let state = BuildState {
                running: false,
                started: now,
                took,
            };
            builds.insert(tenant, state);
        });
    }

    /// Builds and installs `tenant`'s index; Ok(None) when it is too large.
    async fn build(&self, tenant: &str) -> anyhow::Result<Option<usize>> {
        let _permit = self.permit.acquire().await?;
        let as_of = self.clock.load(Ordering::SeqCst);
        let limit = usize::try_from(self.max_docs / 2).unwrap_or(usize::MAX);
        let Some(index) = read_tenant(&self.pool, tenant, limit).await? else {
            return Ok(None);
        };
        let docs = index.docs();
        self.tenants
            .insert(tenant.to_string(), Arc::new(Built { as_of, index }));
        Ok(Some(docs))
    }
}

type Row = (Uuid, i16, String, String);

/// Reads every row of `tenant` in id order, page by page, into a new
/// index; None when it holds more than `limit` memories.
async fn read_tenant(
    pool: &PgPool,
    tenant: &str,
    limit: usize,
) -> anyhow::Result<Option<TenantIndex>> {
    let mut builder = tokio::task::spawn_blocking(Builder::new).await??;
    let mut after_opt: Option<Uuid> = None;
    loop {
        let page = tokio::time::timeout(PAGE_TIMEOUT, read_page(pool, tenant, after_opt)).await??;
        let Some(last) = page.last() else {
            break;
        };
        after_opt = Some(last.0);
        if builder.docs() + page.len() > limit {
            return Ok(None);
        }
        builder = tokio::task::spawn_blocking(move || add_page(builder, page)).await??;
    }
    Ok(Some(
        tokio::task::spawn_blocking(move || builder.finish()).await??,
    ))
}

async fn read_page(pool: &PgPool, tenant: &str, after_opt: Option<Uuid>) -> sqlx::Result<Vec<Row>> {
    sqlx::query_as(
        "SELECT id, access_level, coalesce(title, ''), content FROM memories \
         WHERE tenant_id = $1 AND ($2::uuid IS NULL OR id > $2) ORDER BY id LIMIT $3",
    )
    .bind(tenant)
    .bind(after_opt)
    .bind(PAGE)
    .fetch_all(pool)
    .await
}

fn add_page(mut builder: Builder, page: Vec<Row>) -> tantivy::Result<Builder> {
    for (id, level, title, content) in page {
        builder.add(id, level, &title, &content)?;
    }
    Ok(builder)
}
