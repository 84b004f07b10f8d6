//! Every tenant graph one instance holds, within a memory budget: a first
//! load runs detached from the query that asked for it (the query waits a
//! bounded time, then degrades; the load goes on and later queries share
//! it), the least recently used graphs are evicted past the budget, and
//! each graph remembers which change notifications it reflects so an
//! answer can say it is stale.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use engram_common::settings::GraphSettings;
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, TryFutureExt};
use sqlx::PgPool;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use uuid::Uuid;

use super::budget::{self, Resident};
use super::delta;
use super::heard::Heard;
use super::load_parts;
use super::parts::Parts;
use crate::error::Error;
use crate::graph::Graph;

/// A built graph with what the budget and the freshness flag need.
pub struct Loaded {
    pub graph: Arc<Graph>,
    /// Change notifications noted for the tenant before this graph's
    /// snapshot was taken: later ones may be missing from it.
    seq: u64,
    /// [`Graph::estimated_bytes`] plus the parts kept to apply changes,
    /// fixed at install.
    bytes: u64,
}

/// Changes noted since the current graph's snapshot, for the next rebuild.
#[derive(Debug, Default)]
struct Pending {
    ids: HashSet<Uuid>,
    /// A change without its ids (or with too many): load in full.
    unknown: bool,
}

/// How a rebuild is made.
enum Plan {
    /// Apply the changes to these memories to the kept parts.
    Apply(Vec<Uuid>, Parts),
    /// Nothing is pending: every counted change is in the graph already
    /// (an earlier rebuild took its ids after reading the count), so only
    /// the count the graph reflects moves on.
    Refresh(Parts),
    /// Read the whole tenant again, for this reason.
    Full(&'static str),
}

/// A first load under way, shared by every query waiting for it; its error
/// is already a status so each waiter gets the same answer.
type LoadFuture = Shared<BoxFuture<'static, Result<Arc<Loaded>, tonic::Status>>>;

/// Everything graph-svc keeps about one tenant.
pub(crate) struct Tenant {
    current: ArcSwapOption<Loaded>,
    /// Milliseconds on the registry's clock of the last query.
    last_used_ms: AtomicU64,
    /// Change notifications noted so far (see [`Loaded::seq`]).
    changes: AtomicU64,
    /// Serialises builds of this tenant, so a rebuild queued during the
    /// first load starts after it and sees the newer snapshot.
    build: tokio::sync::Mutex<()>,
    loading: parking_lot::Mutex<Option<(LoadFuture, AbortHandle)>>,
    pending: parking_lot::Mutex<Pending>,
    /// What the current graph was built from; taken by a rebuild while it
    /// runs (`build` is held), absent when the next rebuild must be full.
    parts: parking_lot::Mutex<Option<Parts>>,
    /// Changes applied in place since the last full load.
    applied_since_full: AtomicU32,
}

impl Tenant {
    fn new() -> Self {
        Self {
            current: ArcSwapOption::empty(),
            last_used_ms: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            build: tokio::sync::Mutex::new(()),
            loading: parking_lot::Mutex::new(None),
            pending: parking_lot::Mutex::new(Pending::default()),
            parts: parking_lot::Mutex::new(None),
            applied_since_full: AtomicU32::new(0),
        }
    }

    fn held(&self) -> bool {
        self.current.load().is_some() || self.loading.lock().is_some()
    }
}

/// The graph a query runs on, and whether newer changes are known.
pub struct Served {
    loaded: Arc<Loaded>,
    tenant: Arc<Tenant>,
}

impl Served {
    pub fn graph(&self) -> &Arc<Graph> {
        &self.loaded.graph
    }

    /// A change notification arrived after this graph's snapshot was taken
    /// (its rebuild has not finished, or failed).
    pub fn stale(&self) -> bool {
        self.tenant.changes.load(Ordering::SeqCst) > self.loaded.seq
    }
}

/// Loaded graphs and their footprint, for Stats.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    pub tenants: usize,
    pub nodes: u64,
    pub edges: u64,
    pub bytes: u64,
}

/// Every tenant graph this instance holds.
pub struct Registry {
    pool: PgPool,
    settings: GraphSettings,
    tenants: parking_lot::RwLock<HashMap<String, Arc<Tenant>>>,
    /// Write ids whose notifications were noted (heard.rs).
    heard: parking_lot::Mutex<Heard>,
    /// The clock of `last_used_ms` (tokio's, so tests can pause it).
    epoch: Instant,
}

impl Registry {
    pub fn new(pool: PgPool, settings: GraphSettings) -> Self {
        Self {
            pool,
            settings,
            tenants: parking_lot::RwLock::new(HashMap::new()),
            heard: parking_lot::Mutex::new(Heard::default()),
            epoch: Instant::now(),
        }
    }

    pub fn settings(&self) -> &GraphSettings {
        &self.settings
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn slot(&self, tenant: &str) -> Arc<Tenant> {
        if let Some(s) = self.tenants.read().get(tenant) {
            return s.clone();
        }
        self.tenants
            .write()
            .entry(tenant.to_string())
            .or_insert_with(|| Arc::new(Tenant::new()))
            .clone()
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The tenant's current graph, waiting for a first load however long
    /// it takes (preloading, tests, tools).
    pub async fn graph(self: &Arc<Self>, tenant: &str) -> Result<Arc<Graph>, Error> {
        let t = self.slot(tenant);
        t.last_used_ms.fetch_max(self.now_ms(), Ordering::Relaxed);
        if let Some(l) = t.current.load_full() {
            return Ok(l.graph.clone());
        }
        let loaded = self.loading(tenant, &t).await.map_err(Error::Load)?;
        Ok(loaded.graph.clone())
    }

    /// The tenant's current graph for a query: a first load starts (or is
    /// joined) in the background and the query waits at most `wait` for it,
    /// then gets [`Error::Loading`] while the load goes on.
    pub async fn serve(self: &Arc<Self>, tenant: &str, wait: Duration) -> Result<Served, Error> {
        let t = self.slot(tenant);
        t.last_used_ms.fetch_max(self.now_ms(), Ordering::Relaxed);
        if let Some(loaded) = t.current.load_full() {
            return Ok(Served { loaded, tenant: t });
        }
        let load = self.loading(tenant, &t);
        let outcome = match wait.is_zero() {
            true => load.now_or_never(),
            false => tokio::time::timeout(wait, load).await.ok(),
        };
        match outcome {
            Some(Ok(loaded)) => Ok(Served { loaded, tenant: t }),
            Some(Err(status)) => Err(Error::Load(status)),
            None => {
                tracing::info!(tenant = %tenant, wait_ms = wait.as_millis() as u64, "tenant graph still loading; query degraded");
                Err(Error::Loading)
            }
        }
    }

    /// The first load under way for `t`, started here if there is none. It
    /// runs as its own task: dropping every waiter does not cancel it.
    fn loading(self: &Arc<Self>, tenant: &str, t: &Arc<Tenant>) -> LoadFuture {
        let mut slot = t.loading.lock();
        if let Some((load, _)) = slot.as_ref() {
            return load.clone();
        }
        let (reg, name, tc) = (self.clone(), tenant.to_string(), t.clone());
        let task = tokio::spawn(async move { reg.load_once(&name, &tc).await });
        let abort = task.abort_handle();
        let load = task
            .map_err(|e| tonic::Status::internal(format!("graph load task: {e}")))
            .map(|r| r.and_then(|r| r))
            .boxed()
            .shared();
        *slot = Some((load.clone(), abort));
        load
    }

    /// The body of a detached first load.
    async fn load_once(&self, tenant: &str, t: &Tenant) -> Result<Arc<Loaded>, tonic::Status> {
        let result = {
            let _build = t.build.lock().await;
            match t.current.load_full() {
                // A rebuild or an install got there first.
                Some(l) => Ok(l),
                None => self.build(tenant, t, "loaded tenant graph").await,
            }
        };
        t.loading.lock().take();
        result.map_err(tonic::Status::from)
    }

    /// Loads a snapshot and installs it; the caller holds `t.build`.
    async fn build(&self, tenant: &str, t: &Tenant, what: &str) -> Result<Arc<Loaded>, Error> {
        // Read the count before taking the pending ids (note_change adds
        // ids before it counts), so the graph never claims a change whose
        // ids it missed.
        let seq = t.changes.load(Ordering::SeqCst);
        *t.pending.lock() = Pending::default();
        self.full(tenant, t, seq, what).await
    }

    /// Reads the whole tenant and installs its graph.
    async fn full(
        &self,
        tenant: &str,
        t: &Tenant,
        seq: u64,
        what: &str,
    ) -> Result<Arc<Loaded>, Error> {
        t.parts.lock().take();
        let started = std::time::Instant::now();
        let parts = load_parts(&self.pool, tenant).await?;
        t.applied_since_full.store(0, Ordering::Relaxed);
        self.install_parts(tenant, t, parts, seq, started, what)
            .await
    }

    /// Lays out the graph from `parts` off the runtime and installs both.
    async fn install_parts(
        &self,
        tenant: &str,
        t: &Tenant,
        parts: Parts,
        seq: u64,
        started: std::time::Instant,
        what: &str,
    ) -> Result<Arc<Loaded>, Error> {
        let read_ms = started.elapsed().as_millis() as u64;
        let home_weight = self.settings.home_weight;
        let (graph, parts) = tokio::task::spawn_blocking(move || {
            let graph = parts.build(home_weight);
            (graph, parts)
        })
        .await
        .map_err(|e| Error::Internal(e.to_string()))?;
        let bytes = graph.estimated_bytes() + parts.estimated_bytes();
        tracing::info!(
            tenant = %tenant,
            memories = graph.memory_count(),
            entities = graph.entity_count(),
            edges = graph.edge_count(),
            bytes,
            read_ms,
            ms = started.elapsed().as_millis() as u64,
            "{what}"
        );
        let loaded = Arc::new(Loaded {
            graph: Arc::new(graph),
            seq,
            bytes,
        });
        t.current.store(Some(loaded.clone()));
        *t.parts.lock() = Some(parts);
        if t.current.load().is_none() {
            // Evicted between the two stores: the parts go with the graph.
            t.parts.lock().take();
        }
        self.enforce_budget();
        Ok(loaded)
    }

    /// Rebuilds a tenant this instance holds (others load lazily later):
    /// the noted changes applied to the kept parts when they name their
    /// memories, a full load otherwise.
    pub async fn rebuild(&self, tenant: &str) -> Result<(), Error> {
        let Some(t) = self.tenants.read().get(tenant).cloned() else {
            return Ok(());
        };
        let _build = t.build.lock().await;
        if t.current.load().is_none() {
            // Evicted, or its first load failed: the next query loads fresh.
            return Ok(());
        }
        let seq = t.changes.load(Ordering::SeqCst);
        let pending = std::mem::take(&mut *t.pending.lock());
        let reason = match self.plan(&t, pending) {
            Plan::Apply(ids, mut parts) => {
                let started = std::time::Instant::now();
                let limit = self.settings.rematch_limit;
                match delta::apply(&self.pool, tenant, &mut parts, &ids, limit).await {
                    Ok(Ok(())) => {
                        t.applied_since_full.fetch_add(1, Ordering::Relaxed);
                        let what = "applied changes to tenant graph";
                        self.install_parts(tenant, &t, parts, seq, started, what)
                            .await?;
                        return Ok(());
                    }
                    Ok(Err(full)) => full.reason(),
                    Err(e) => {
                        tracing::warn!(tenant = %tenant, error = %e, "applying changes failed; loading in full");
                        "applying the changes failed"
                    }
                }
            }
            Plan::Refresh(parts) => {
                if let Some(current) = t.current.load_full() {
                    let loaded = Arc::new(Loaded {
                        graph: current.graph.clone(),
                        seq,
                        bytes: current.bytes,
                    });
                    *t.parts.lock() = Some(parts);
                    t.current.store(Some(loaded));
                    return Ok(());
                }
                "evicted while planning"
            }
            Plan::Full(reason) => reason,
        };
        tracing::debug!(tenant = %tenant, reason, "full tenant rebuild");
        self.full(tenant, &t, seq, "rebuilt tenant graph").await?;
        Ok(())
    }

    /// Whether the pending changes can be applied to the kept parts.
    fn plan(&self, t: &Tenant, pending: Pending) -> Plan {
        let max_ids = self.settings.incremental_max_ids;
        let parts_opt = t.parts.lock().take();
        let Some(parts) = parts_opt else {
            return Plan::Full("no parts kept");
        };
        if pending.unknown {
            return Plan::Full("a change without its memories");
        }
        if pending.ids.is_empty() {
            return Plan::Refresh(parts);
        }
        if pending.ids.len() > max_ids {
            return Plan::Full("more changed memories than graph.incremental_max_ids");
        }
        let applied = t.applied_since_full.load(Ordering::Relaxed);
        if applied >= self.settings.full_rebuild_every {
            return Plan::Full("graph.full_rebuild_every reached");
        }
        let mut ids: Vec<Uuid> = pending.ids.into_iter().collect();
        ids.sort_unstable();
        Plan::Apply(ids, parts)
    }

    /// Notes a change notification for `tenant`; true when this instance
    /// holds (or is loading) its graph, which then needs a rebuild.
    /// `ids_opt` names the memories it changed (None: unknown, so the
    /// rebuild reads the whole tenant).
    pub fn note_change(&self, tenant: &str, ids_opt: Option<&[Uuid]>) -> bool {
        let Some(t) = self.tenants.read().get(tenant).cloned() else {
            return false;
        };
        {
            // Before the count: see `build`.
            let mut pending = t.pending.lock();
            match ids_opt {
                Some(ids) if !pending.unknown => pending.ids.extend(ids),
                Some(_) => {}
                None => pending.unknown = true,
            }
            // A tenant writing faster than it rebuilds cannot grow this
            // without bound: past the limit the rebuild is full anyway.
            if pending.unknown || pending.ids.len() > self.settings.incremental_max_ids {
                pending.unknown = true;
                pending.ids = HashSet::new();
            }
        }
        t.changes.fetch_add(1, Ordering::SeqCst);
        t.held()
    }

    /// The notification of `tenant`'s write `write_id` was noted (after
    /// [`Registry::note_change`]).
    pub fn heard(&self, tenant: &str, write_id: &str) {
        self.heard.lock().note(tenant, write_id);
    }

    /// Whether the notification of `tenant`'s write `write_id` was noted
    /// here; an empty id asks nothing.
    pub fn has_heard(&self, tenant: &str, write_id: &str) -> bool {
        self.heard.lock().has(tenant, write_id)
    }

    /// Evicts what the budget and the idle limit say must go.
    pub fn enforce_budget(&self) {
        let held: Vec<(String, Arc<Tenant>, Arc<Loaded>)> = self
            .tenants
            .read()
            .iter()
            .filter_map(|(n, t)| Some((n.clone(), t.clone(), t.current.load_full()?)))
            .collect();
        let residents: Vec<Resident> = held
            .iter()
            .map(|(_, t, l)| Resident {
                bytes: l.bytes + l.graph.scratch_bytes(),
                last_used_ms: t.last_used_ms.load(Ordering::Relaxed),
            })
            .collect();
        let idle_ms_opt =
            (self.settings.idle_evict_secs > 0).then(|| self.settings.idle_evict_secs * 1000);
        let now = self.now_ms();
        for i in budget::evictions(
            &residents,
            self.settings.memory_budget_bytes,
            now,
            idle_ms_opt,
        ) {
            let (name, t, l) = &held[i];
            // Not if a query used it or a rebuild replaced it meanwhile.
            if t.last_used_ms.load(Ordering::Relaxed) != residents[i].last_used_ms {
                continue;
            }
            let was = t.current.compare_and_swap(&Some(l.clone()), None);
            if was.as_ref().is_some_and(|w| Arc::ptr_eq(w, l)) {
                // Its parts go too: the next load reads the tenant afresh.
                t.parts.lock().take();
                tracing::info!(
                    tenant = %name,
                    bytes = residents[i].bytes,
                    idle_ms = now.saturating_sub(residents[i].last_used_ms),
                    "evicted tenant graph"
                );
            }
        }
    }

    /// Installs a graph directly (tests, and in-process evaluation).
    pub fn install(&self, tenant: &str, graph: Graph) {
        let t = self.slot(tenant);
        // Parts of an earlier load no longer describe what is served.
        t.parts.lock().take();
        let loaded = Loaded {
            bytes: graph.estimated_bytes(),
            graph: Arc::new(graph),
            seq: t.changes.load(Ordering::SeqCst),
        };
        t.current.store(Some(Arc::new(loaded)));
        self.enforce_budget();
    }

    /// Tenants whose graph this instance holds or is loading.
    pub fn tenants(&self) -> Vec<String> {
        self.tenants
            .read()
            .iter()
            .filter(|(_, t)| t.held())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Loaded tenants, nodes, edges and estimated bytes.
    pub fn totals(&self) -> Totals {
        let tenants = self.tenants.read();
        let mut out = Totals::default();
        for t in tenants.values() {
            if let Some(l) = t.current.load_full() {
                out.tenants += 1;
                out.nodes += (l.graph.memory_count() + l.graph.entity_count()) as u64;
                out.edges += l.graph.edge_count() as u64;
                out.bytes += l.bytes + l.graph.scratch_bytes();
            }
        }
        out
    }

    pub fn loaded(&self, tenant: &str) -> Option<Arc<Graph>> {
        self.tenants
            .read()
            .get(tenant)
            .and_then(|t| t.current.load_full())
            .map(|l| l.graph.clone())
    }

    /// Changes applied in place since the tenant's last full load (None:
    /// not held), for diagnostics and tests.
    pub fn applied_in_place(&self, tenant: &str) -> Option<u32> {
        let t = self.tenants.read().get(tenant).cloned()?;
        Some(t.applied_since_full.load(Ordering::Relaxed))
    }

    /// Stops first loads under way (at shutdown: they outlive requests).
    pub fn abort_loads(&self) {
        for t in self.tenants.read().values() {
            if let Some((_, abort)) = t.loading.lock().take() {
                abort.abort();
            }
        }
    }
}
