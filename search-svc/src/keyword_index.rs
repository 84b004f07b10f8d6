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
//! SQL (as before the index existed) and brings the index up to date in the
//! background:
//!
//! - **in place** when every change since the index was built named its
//!   memories (writes name them; a notification too large names none) and
//!   they are at most 1,000: their rows are read again and their documents
//!   replaced, one segment more (milliseconds);
//! - **in full** otherwise, and after 64 in-place updates: one build at a
//!   time in the process, each tenant at most once per
//!   `search.keyword_index_rebuild_ms` and four times its last build's
//!   duration, so a tenant whose changes name no memories costs at most a
//!   fifth of a core and never slows another tenant's queries (they keep
//!   their index or SQL).
//!
//! A tenant with more text than half of
//! `search.keyword_index_max_text_bytes` is never indexed; the indexes
//! together are bounded by it (least recently used tenants dropped).

mod tenant;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use engram_common::Identity;
use engram_common::settings::SearchSettings;
use futures::StreamExt;
use parking_lot::Mutex;
use sqlx::PgPool;
use uuid::Uuid;

pub use tenant::Found;
use tenant::{Builder, Searchable, TenantIndex};

use crate::changes::{ChangeStream, DISCONNECTED};

/// Rows read from Postgres per statement while building (at most 64 KiB of
/// content each).
const PAGE: i64 = 1000;
/// One page's read may take this long before the build gives up.
const PAGE_TIMEOUT: Duration = Duration::from_secs(30);
/// A build waits at least this multiple of the previous one's duration.
const BUILD_SPACING: u32 = 4;
/// Changed memories an in-place update reads at most; more, and the
/// tenant is built in full.
const MAX_UPDATE_IDS: usize = 1000;
/// Changes by id a tenant's log keeps before it stands for "everything".
const MAX_LOG: usize = 4000;
/// In-place updates (one segment each) before the next full build.
const MAX_UPDATES: u32 = 64;
/// Updates of different tenants at once.
const UPDATES_AT_ONCE: usize = 2;
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
    /// One full build at a time in the process.
    permit: tokio::sync::Semaphore,
    /// In-place updates at once.
    update_permit: tokio::sync::Semaphore,
}

/// The logical clock and each tenant's changes, under one lock so a
/// tenant's tick never goes backwards.
#[derive(Debug, Default)]
struct Changes {
    clock: u64,
    tenants: HashMap<String, TenantLog>,
    resync_at: u64,
}

/// One tenant's changes since its installed index was built.
#[derive(Debug, Default)]
struct TenantLog {
    /// The tick of its last change.
    last: u64,
    /// The tick of its last change that named no memories.
    whole_at: u64,
    /// The memories later changes named, with their ticks.
    ids: Vec<(u64, Uuid)>,
}

/// Memories an in-place update reads again, and the clock it brings the
/// index to.
#[derive(Debug)]
struct Update {
    as_of: u64,
    ids: Vec<Uuid>,
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
    /// The next full build may not start before this.
    next_full: Instant,
}

/// How a build or an update ended.
enum Outcome {
    Built {
        docs: usize,
        took: Duration,
    },
    Updated {
        memories: usize,
        took: Duration,
    },
    /// An update passed the size limit: the next build is a full one.
    Outgrown,
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
                let kib =
                    1 + b.index.text_bytes() / 1024 + b.index.documents() as u64 / DOCS_PER_KIB;
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
            update_permit: tokio::sync::Semaphore::new(UPDATES_AT_ONCE),
        };
        Self {
            shared_opt: Some(Arc::new(shared)),
        }
    }

    fn disabled() -> Self {
        Self { shared_opt: None }
    }

    pub fn is_enabled(&self) -> bool {
        self.shared_opt.is_some()
    }

    /// `tenant`'s memories `ids_opt` changed in text or existence, or
    /// (None) any of them may have (call after the change committed).
    pub fn changed(&self, tenant: &str, ids_opt: Option<&[Uuid]>) {
        if let Some(s) = &self.shared_opt {
            // Ids are kept only for a tenant with an index (or one being
            // built) to update; any other is built in full when asked.
            let tracked = s.tenants.contains_key(tenant)
                || (s.builds.lock().get(tenant)).is_some_and(|b| b.running);
            let mut changes = s.changes.lock();
            let tick = changes.tick();
            let log = changes.tenants.entry(tenant.to_string()).or_default();
            log.last = tick;
            match ids_opt {
                Some(ids) if tracked && log.ids.len() + ids.len() <= MAX_LOG => {
                    log.ids.extend(ids.iter().map(|id| (tick, *id)));
                }
                _ => {
                    log.whole_at = tick;
                    log.ids.clear();
                }
            }
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
                // New edges and feedback change no memory's text. (This
                // process's own writes come back too: re-reading them costs
                // one more small update.)
                Ok(e) if e.op == "edges" || e.op == "feedback" => {}
                Ok(e) => {
                    let ids: Option<Vec<Uuid>> = (e.ids.iter()).map(|id| id.parse().ok()).collect();
                    let named = ids.filter(|ids| !ids.is_empty());
                    let upsert_or_delete = e.op == "upsert" || e.op == "delete";
                    self.changed(&e.tenant, named.as_deref().filter(|_| upsert_or_delete));
                }
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

    /// In-place updates of `tenant`'s installed index since its last full
    /// build (tests).
    pub fn updates(&self, tenant: &str) -> Option<u32> {
        let s = self.shared_opt.as_ref()?;
        s.tenants.get(tenant).map(|b| b.index.updates())
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
            && (changes.tenants.get(tenant)).is_none_or(|log| as_of >= log.last)
    }

    /// The update that brings `built` up to date in place, if one can: no
    /// resync since it was built, every change since named its memories,
    /// not too many of them, not too many updates already.
    fn update_for(&self, tenant: &str, built: &Built) -> Option<Update> {
        let changes = self.changes.lock();
        let log = changes.tenants.get(tenant)?;
        if built.as_of < changes.resync_at
            || built.as_of < log.whole_at
            || built.index.updates() >= MAX_UPDATES
        {
            return None;
        }
        let ids: BTreeSet<Uuid> = (log.ids.iter())
            .filter(|(tick, _)| *tick > built.as_of)
            .map(|(_, id)| *id)
            .collect();
        (ids.len() <= MAX_UPDATE_IDS).then(|| Update {
            as_of: changes.clock,
            ids: ids.into_iter().collect(),
        })
    }

    /// Installs a new index for `tenant` and forgets the changes it holds.
    fn install(&self, tenant: &str, built: Built) {
        let as_of = built.as_of;
        self.tenants.insert(tenant.to_string(), Arc::new(built));
        if let Some(log) = self.changes.lock().tenants.get_mut(tenant) {
            log.ids.retain(|(tick, _)| *tick > as_of);
        }
    }

    /// Starts an update in place of the tenant's index, or a full build,
    /// unless one runs, the index is current, or a full build would come
    /// too soon after the last. Decided under the `builds` lock with no job
    /// of the tenant running, so the index an update starts from is the one
    /// installed last (whose changes the log still holds).
    fn schedule(this: &Arc<Self>, tenant: &str) {
        let now = Instant::now();
        let update_opt = {
            let mut builds = this.builds.lock();
            let state_opt = builds.get(tenant).copied();
            if state_opt.is_some_and(|b| b.running) {
                return;
            }
            let installed_opt = this.tenants.get(tenant);
            if (installed_opt.as_ref()).is_some_and(|b| this.is_current(tenant, b.as_of)) {
                return;
            }
            let update_opt = installed_opt.and_then(|b| Some((this.update_for(tenant, &b)?, b)));
            if update_opt.is_none() && state_opt.is_some_and(|b| now < b.next_full) {
                return;
            }
            let state = BuildState {
                running: true,
                next_full: state_opt.map_or(now, |b| b.next_full),
            };
            builds.insert(tenant.to_string(), state);
            update_opt
        };
        let (shared, tenant) = (this.clone(), tenant.to_string());
        tokio::spawn(async move {
            let full = update_opt.is_none();
            // Its own task, so a panic still ends in the bookkeeping below.
            let job = tokio::spawn({
                let (shared, tenant) = (shared.clone(), tenant.clone());
                async move {
                    match update_opt {
                        Some((update, built)) => shared.update(&tenant, &built, update).await,
                        None => shared.build(&tenant).await,
                    }
                }
            });
            let ended = job.await;
            if ended.is_err() {
                // A job that panicked would panic again on the same index.
                shared.tenants.invalidate(&tenant);
            }
            let wait = shared.log_outcome(&tenant, ended);
            let mut builds = shared.builds.lock();
            let next_full = match (full, builds.get(&tenant)) {
                (false, Some(b)) => b.next_full.max(Instant::now() + wait),
                _ => now + wait,
            };
            let state = BuildState {
                running: false,
                next_full,
            };
            builds.insert(tenant, state);
        });
    }

    /// Logs how a job ended; the wait before the next full build.
    fn log_outcome(
        &self,
        tenant: &str,
        ended: Result<anyhow::Result<Outcome>, tokio::task::JoinError>,
    ) -> Duration {
        match ended {
            Ok(Ok(Outcome::Built { docs, took })) => {
                let ms = took.as_millis() as u64;
                tracing::info!(tenant = %tenant, docs, ms, "keyword index built");
                self.rebuild_every.max(took * BUILD_SPACING)
            }
            Ok(Ok(Outcome::Updated { memories, took })) => {
                let ms = took.as_millis() as u64;
                tracing::debug!(tenant = %tenant, memories, ms, "keyword index updated in place");
                Duration::ZERO
            }
            Ok(Ok(Outcome::Outgrown)) => {
                tracing::info!(tenant = %tenant, "keyword index outgrew its share: built in full next");
                Duration::ZERO
            }
            Ok(Ok(Outcome::TooLarge)) => {
                let max_text_bytes = self.max_text_bytes / 2;
                tracing::info!(tenant = %tenant, max_text_bytes, "keyword index not built: tenant too large");
                TOO_LARGE_RETRY
            }
            Ok(Err(e)) => {
                tracing::warn!(tenant = %tenant, error = %e, "keyword index build or update failed");
                self.rebuild_every
            }
            Err(e) => {
                tracing::warn!(tenant = %tenant, error = %e, "keyword index build or update panicked");
                self.rebuild_every
            }
        }
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
        self.install(tenant, Built { as_of, index });
        let took = started.elapsed();
        Ok(Outcome::Built { docs, took })
    }

    /// Re-reads `update.ids` (read after the clock was: `update.as_of`) and
    /// installs `built` with their documents replaced.
    /// A failed update drops the tenant's index, so the next query starts
    /// a full build (paced) instead of the same update again.
    async fn update(
        &self,
        tenant: &str,
        built: &Arc<Built>,
        update: Update,
    ) -> anyhow::Result<Outcome> {
        let result = self.try_update(tenant, built, update).await;
        if result.is_err() {
            self.tenants.invalidate(tenant);
        }
        result
    }

    async fn try_update(
        &self,
        tenant: &str,
        built: &Arc<Built>,
        update: Update,
    ) -> anyhow::Result<Outcome> {
        let started = Instant::now();
        let rows =
            tokio::time::timeout(PAGE_TIMEOUT, read_ids(&self.pool, tenant, &update.ids)).await??;
        let _permit = self.update_permit.acquire().await?;
        let (previous, ids) = (built.clone(), update.ids);
        let memories = ids.len();
        let index = tokio::task::spawn_blocking(move || {
            let mut builder = previous.index.updater()?;
            for id in ids {
                builder.remove(id);
            }
            add_page(builder, rows)?.finish()
        })
        .await??;
        if index.text_bytes() > self.max_text_bytes / 2 {
            // Edits count their old text until a full build recounts.
            self.tenants.invalidate(tenant);
            return Ok(Outcome::Outgrown);
        }
        self.install(
            tenant,
            Built {
                as_of: update.as_of,
                index,
            },
        );
        let took = started.elapsed();
        Ok(Outcome::Updated { memories, took })
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
macro_rules! searchable_columns {
    () => {
        "id, access_level, coalesce(title, ''), speaker || ' ' || content || ' ' || caption, context"
    };
}

const READ_IDS: &str = concat!(
    "SELECT ",
    searchable_columns!(),
    " FROM memories WHERE tenant_id = $1 AND id = ANY($2)"
);

const READ_PAGE: &str = concat!(
    "SELECT ",
    searchable_columns!(),
    " FROM memories WHERE tenant_id = $1 AND ($2::uuid IS NULL OR id > $2) ORDER BY id LIMIT $3"
);

/// The rows of `ids` that still exist (a deleted memory has none).
async fn read_ids(pool: &PgPool, tenant: &str, ids: &[Uuid]) -> sqlx::Result<Vec<Row>> {
    sqlx::query_as(READ_IDS)
        .bind(tenant)
        .bind(ids)
        .fetch_all(pool)
        .await
}

async fn read_page(pool: &PgPool, tenant: &str, after_opt: Option<Uuid>) -> sqlx::Result<Vec<Row>> {
    sqlx::query_as(READ_PAGE)
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
