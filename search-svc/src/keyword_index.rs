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
//!   index is current while no change of its tenant ticked after that;
//! - while the feed is not listening (before its first LISTEN, after a lost
//!   connection until LISTEN holds again) no index is current: changes made
//!   elsewhere would go unheard.
//!
//! A write through another search-svc replica reaches this one's index when
//! its notification arrives (milliseconds after the commit); until then a
//! keyword search through this replica may not rank it (dense search does).
//!
//! A query that finds its tenant's index missing or behind is answered by
//! SQL (as before the index existed) and schedules a rebuild in the
//! background: one build at a time in the process, each tenant at most once
//! per `search.keyword_index_rebuild_ms` and four times its last build's
//! duration, so a tenant writing without pause costs at most a fifth of a
//! core and never slows another tenant's queries (they keep their index or
//! SQL). A tenant with more text than half of
//! `search.keyword_index_max_text_bytes` is never indexed; the indexes
//! together are bounded by it (least recently used tenants dropped).

mod tenant;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use engram_common::Identity;
use engram_common::settings::SearchSettings;
use futures::StreamExt;
use parking_lot::Mutex;
use sqlx::PgPool;
use uuid::Uuid;

pub use tenant::{Builder, Found, Searchable, TenantIndex, analyzer};

use crate::changes::{ChangeStream, DISCONNECTED};

/// Rows read from Postgres per statement while building (at most 64 KiB of
/// content each).
const PAGE: i64 = 1000;
/// One page's read may take this long before the build gives up.
const PAGE_TIMEOUT: Duration = Duration::from_secs(30);
/// A build waits at least this multiple of the previous one's duration.
const BUILD_SPACING: u32 = 4;
/// A tenant found too large is not read again for this long.
const TOO_LARGE_RETRY: Duration = Duration::from_secs(600);
/// What one indexed memory costs beyond its text, in the cache's weight
/// (KiB): its id, fast fields and norms.
const DOCS_PER_KIB: u64 = 16;

/// What a query gets from the index.
#[derive(Debug)]
pub enum Lookup {
    Found(Found),
    /// No current index for the tenant (disabled, building, behind its
    /// writes, too large, the feed not listening): answer from SQL.
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
    max_text_bytes: u64,
    rebuild_every: Duration,
    changes: Mutex<Changes>,
    /// False until the change feed listens, and again while it does not.
    listening: AtomicBool,
    tenants: moka::sync::Cache<String, Arc<Built>>,
    builds: Mutex<HashMap<String, BuildState>>,
    /// One build at a time in the process.
    permit: tokio::sync::Semaphore,
}

/// The logical clock and the ticks of the last changes, under one lock so a
/// tenant's tick never goes backwards.
#[derive(Debug, Default)]
struct Changes {
    clock: u64,
    last: HashMap<String, u64>,
    resync_at: u64,
}

impl Changes {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }
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
    /// How long until the next build may start, counted from `started`.
    wait: Duration,
}

/// How a build ended.
enum Outcome {
    Built { docs: usize, took: Duration },
    TooLarge,
}

impl KeywordIndex {
    pub fn new(settings: &SearchSettings, pool: PgPool) -> Self {
        if !settings.keyword_index {
            return Self::disabled();
        }
        // Weighed in KiB (moka weights are u32), never 0 so every tenant
        // counts.
        let tenants = moka::sync::Cache::builder()
            .max_capacity(settings.keyword_index_max_text_bytes / 1024)
            .weigher(|_: &String, b: &Arc<Built>| {
                let kib = 1 + b.index.text_bytes() / 1024 + b.index.docs() as u64 / DOCS_PER_KIB;
                u32::try_from(kib).unwrap_or(u32::MAX)
            })
            .build();
        let shared = Shared {
            pool,
            max_text_bytes: settings.keyword_index_max_text_bytes,
            rebuild_every: Duration::from_millis(settings.keyword_index_rebuild_ms),
            changes: Mutex::default(),
            listening: AtomicBool::new(false),
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
            let mut changes = s.changes.lock();
            let tick = changes.tick();
            changes.last.insert(tenant.to_string(), tick);
        }
    }

    /// Every tenant may have changed (notifications were lost); `listening`
    /// says whether changes are heard from now on.
    pub fn resync(&self, listening: bool) {
        if let Some(s) = &self.shared_opt {
            let mut changes = s.changes.lock();
            changes.resync_at = changes.tick();
            s.listening.store(listening, Ordering::SeqCst);
        }
    }

    /// Follows the change feed until it ends (server shutdown).
    pub async fn follow(self, mut events: ChangeStream) {
        while let Some(event) = events.next().await {
            match event {
                Ok(e) if e.resync => self.resync(e.op != DISCONNECTED),
                Ok(e) => self.changed(&e.tenant),
                Err(_) => self.resync(false),
            }
        }
        self.resync(false);
    }

    /// The caller's best `limit` memories by BM25, from a current index, or
    /// Unavailable (and a rebuild scheduled when one is due). The index is
    /// searched on a blocking thread.
    pub async fn search(&self, identity: &Identity, text: &str, limit: usize) -> Lookup {
        let Some(s) = &self.shared_opt else {
            return Lookup::Unavailable;
        };
        let tenant = &identity.tenant;
        let built = match s.tenants.get(tenant) {
            Some(built) if s.is_current(tenant, built.as_of) => built,
            _ => {
                Shared::schedule(s, tenant);
                return Lookup::Unavailable;
            }
        };
        let (trust, text) = (identity.trust.as_i16(), text.to_string());
        let found = tokio::task::spawn_blocking(move || built.index.search(trust, &text, limit));
        match found.await {
            Ok(Ok(found)) => Lookup::Found(found),
            Ok(Err(e)) => {
                tracing::warn!(tenant = %tenant, error = %e, "keyword index search failed");
                Lookup::Unavailable
            }
            Err(e) => {
                tracing::warn!(tenant = %tenant, error = %e, "keyword index search panicked");
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
        self.listening.load(Ordering::SeqCst)
            && as_of >= changes.resync_at
            && changes.last.get(tenant).is_none_or(|&t| as_of >= t)
    }

    /// Starts a build of `tenant` unless one runs or the last was too
    /// recent.
    fn schedule(this: &Arc<Self>, tenant: &str) {
        let now = Instant::now();
        {
            let mut builds = this.builds.lock();
            if let Some(b) = builds.get(tenant)
                && (b.running || now.saturating_duration_since(b.started) < b.wait)
            {
                return;
            }
            let state = BuildState {
                running: true,
                started: now,
                wait: Duration::ZERO,
            };
            builds.insert(tenant.to_string(), state);
        }
        let (shared, tenant) = (this.clone(), tenant.to_string());
        tokio::spawn(async move {
            // Its own task, so a panic still ends in the bookkeeping below.
            let build = tokio::spawn({
                let (shared, tenant) = (shared.clone(), tenant.clone());
                async move { shared.build(&tenant).await }
            });
            let wait = match build.await {
                Ok(Ok(Outcome::Built { docs, took })) => {
                    let ms = took.as_millis() as u64;
                    tracing::info!(tenant = %tenant, docs, ms, "keyword index built");
                    shared.rebuild_every.max(took * BUILD_SPACING)
                }
                Ok(Ok(Outcome::TooLarge)) => {
                    let max_text_bytes = shared.max_text_bytes / 2;
                    tracing::info!(tenant = %tenant, max_text_bytes, "keyword index not built: tenant too large");
                    TOO_LARGE_RETRY
                }
                Ok(Err(e)) => {
                    tracing::warn!(tenant = %tenant, error = %e, "keyword index build failed");
                    shared.rebuild_every
                }
                Err(e) => {
                    tracing::warn!(tenant = %tenant, error = %e, "keyword index build panicked");
                    shared.rebuild_every
                }
            };
            let state = BuildState {
                running: false,
                started: now,
                wait: now.elapsed() + wait,
            };
            shared.builds.lock().insert(tenant, state);
        });
    }

    /// Builds and installs `tenant`'s index.
    async fn build(&self, tenant: &str) -> anyhow::Result<Outcome> {
        let _permit = self.permit.acquire().await?;
        let started = Instant::now();
        let as_of = self.changes.lock().clock;
        let Some(index) = read_tenant(&self.pool, tenant, self.max_text_bytes / 2).await? else {
            return Ok(Outcome::TooLarge);
        };
        let docs = index.docs();
        self.tenants
            .insert(tenant.to_string(), Arc::new(Built { as_of, index }));
        let took = started.elapsed();
        Ok(Outcome::Built { docs, took })
    }
}

type Row = (Uuid, i16, String, String, String);

/// Reads every row of `tenant` in id order, page by page, into a new
/// index; None when its text passes `limit` bytes. A builder given up on is
/// dropped on a blocking thread (dropping it joins tantivy's indexing
/// thread).
async fn read_tenant(
    pool: &PgPool,
    tenant: &str,
    limit: u64,
) -> anyhow::Result<Option<TenantIndex>> {
    let mut builder = tokio::task::spawn_blocking(Builder::new).await??;
    let mut after_opt: Option<Uuid> = None;
    loop {
        let page =
            match tokio::time::timeout(PAGE_TIMEOUT, read_page(pool, tenant, after_opt)).await {
                Ok(Ok(page)) => page,
                Ok(Err(e)) => {
                    tokio::task::spawn_blocking(move || drop(builder));
                    return Err(e.into());
                }
                Err(elapsed) => {
                    tokio::task::spawn_blocking(move || drop(builder));
                    return Err(elapsed.into());
                }
            };
        let Some(last) = page.last() else {
            break;
        };
        after_opt = Some(last.0);
        builder = tokio::task::spawn_blocking(move || add_page(builder, page)).await??;
        if builder.text_bytes() > limit {
            tokio::task::spawn_blocking(move || drop(builder));
            return Ok(None);
        }
    }
    Ok(Some(
        tokio::task::spawn_blocking(move || builder.finish()).await??,
    ))
}

/// The columns of the tenant's `tsv` (migrations/0005_conversation_turns.sql).
async fn read_page(pool: &PgPool, tenant: &str, after_opt: Option<Uuid>) -> sqlx::Result<Vec<Row>> {
    sqlx::query_as(
        "SELECT id, access_level, coalesce(title, ''), speaker || ' ' || content || ' ' || caption, context \
         FROM memories WHERE tenant_id = $1 AND ($2::uuid IS NULL OR id > $2) ORDER BY id LIMIT $3",
    )
    .bind(tenant)
    .bind(after_opt)
    .bind(PAGE)
    .fetch_all(pool)
    .await
}

fn add_page(mut builder: Builder, page: Vec<Row>) -> tantivy::Result<Builder> {
    for (id, level, title, body, context) in page {
        let text = Searchable {
            title,
            body,
            context,
        };
        builder.add(id, level, &text)?;
    }
    Ok(builder)
}
