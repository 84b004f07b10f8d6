//! Tenant graphs in memory: loaded lazily from Postgres on a tenant's first
//! query, rebuilt from a consistent snapshot when `engram_changes`
//! notifications arrive (debounced, since bulk ingest sends many), and
//! swapped whole so a query sees either the old or the new graph.
//!
//! Every change rebuilds the tenant's graph rather than patching it: a new
//! entity name can add mentions to old memories (the dictionary is matched
//! against every memory's text), which a local patch would miss. Rebuilds run
//! one tenant at a time, off the async runtime.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use engram_common::settings::GraphSettings;
use futures::TryStreamExt;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use uuid::Uuid;

use crate::error::Error;
use crate::graph::{Dictionary, Graph, GraphBuilder};

pub const CHANNEL: &str = "engram_changes";
const PAGE: i64 = 2000;

/// Builds one tenant's graph from a REPEATABLE READ snapshot.
pub async fn load_tenant(pool: &PgPool, tenant: &str, home_weight: f32) -> Result<Graph, Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let rows: Vec<(i64, String, String)> =
        sqlx::query_as("SELECT id, name, display FROM entities WHERE tenant_id = $1 ORDER BY id")
            .bind(tenant)
            .fetch_all(&mut *tx)
            .await?;
    let mut dict = Dictionary::default();
    let mut by_db: HashMap<i64, u32> = HashMap::with_capacity(rows.len());
    for (id, name, display) in rows {
        if let Some(e) = dict.add_normalized(name, &display) {
            by_db.insert(id, e);
        }
    }
    let dict = Arc::new(dict);
    let mut b = GraphBuilder::new(dict.clone(), home_weight);
    let mut after = Uuid::nil();
    type MemRow = (Uuid, String, String, String, i16, Option<i64>, bool);
    loop {
        let page: Vec<MemRow> = sqlx::query_as(
            "SELECT id, namespace, title, content, access_level, \
                    EXTRACT(EPOCH FROM valid_to)::bigint, retracted_at IS NOT NULL \
             FROM memories WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3",
        )
        .bind(tenant)
        .bind(after)
        .bind(PAGE)
        .fetch_all(&mut *tx)
        .await?;
        let Some(last) = page.last() else { break };
        after = last.0;
        let full = page.len() as i64 == PAGE;
        let d = dict.clone();
        // Dictionary matching is the CPU-heavy part of a build.
        let matched = tokio::task::spawn_blocking(move || {
            page.into_iter()
                .map(|(id, ns, title, content, level, valid_to, retracted)| {
                    let m = d.match_text(&title, &content);
                    (id, ns, level, valid_to, retracted, m)
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| Error::Internal(e.to_string()))?;
        for (id, ns, level, valid_to, retracted, mentions) in matched {
            let m = b.add_memory(id, &ns, level, valid_to, retracted);
            for (e, home) in mentions {
                b.add_mention(m, e, home);
            }
        }
        if !full {
            break;
        }
    }
    {
        let mut rows = sqlx::query_as::<_, (Uuid, i64, bool)>(
            "SELECT me.memory_id, me.entity_id, me.is_home FROM memory_entities me \
             JOIN memories m ON m.id = me.memory_id WHERE m.tenant_id = $1",
        )
        .bind(tenant)
        .fetch(&mut *tx);
        while let Some((mid, eid, home)) = rows.try_next().await? {
            if let (Some(m), Some(&e)) = (b.memory(&mid), by_db.get(&eid)) {
                b.add_mention(m, e, home);
            }
        }
    }
    {
        let mut rows = sqlx::query_as::<_, (Uuid, i64, i64)>(
            "SELECT memory_id, subject_id, object_id FROM triples WHERE tenant_id = $1",
        )
        .bind(tenant)
        .fetch(&mut *tx);
        while let Some((mid, s, o)) = rows.try_next().await? {
            if let (Some(m), Some(&s), Some(&o)) = (b.memory(&mid), by_db.get(&s), by_db.get(&o)) {
                b.add_triple(m, s, o);
            }
        }
    }
    {
        let mut rows = sqlx::query_as::<_, (Uuid, Uuid, String, f32)>(
            "SELECT src_id, dst_id, edge_type, weight FROM edges WHERE tenant_id = $1",
        )
        .bind(tenant)
        .fetch(&mut *tx);
        while let Some((src, dst, t, w)) = rows.try_next().await? {
            if let (Some(a), Some(c)) = (b.memory(&src), b.memory(&dst)) {
                b.add_typed_edge(a, c, &t, w);
            }
        }
    }
    tx.commit().await?;
    tokio::task::spawn_blocking(move || b.build())
        .await
        .map_err(|e| Error::Internal(e.to_string()))
}

struct Slot {
    graph: ArcSwapOption<Graph>,
    /// Serialises loads of one tenant, so a rebuild queued during the first
    /// load starts after it and sees the newer snapshot.
    load: tokio::sync::Mutex<()>,
}

/// Every tenant graph this instance holds.
pub struct Registry {
    pool: PgPool,
    settings: GraphSettings,
    tenants: parking_lot::RwLock<HashMap<String, Arc<Slot>>>,
}

impl Registry {
    pub fn new(pool: PgPool, settings: GraphSettings) -> Self {
        Self {
            pool,
            settings,
            tenants: parking_lot::RwLock::new(HashMap::new()),
        }
    }

    pub fn settings(&self) -> &GraphSettings {
        &self.settings
    }

    fn slot(&self, tenant: &str) -> Arc<Slot> {
        if let Some(s) = self.tenants.read().get(tenant) {
            return s.clone();
        }
        self.tenants
            .write()
            .entry(tenant.to_string())
            .or_insert_with(|| {
                Arc::new(Slot {
                    graph: ArcSwapOption::empty(),
                    load: tokio::sync::Mutex::new(()),
                })
            })
            .clone()
    }

    /// The tenant's current graph, loading it on first use.
    pub async fn graph(&self, tenant: &str) -> Result<Arc<Graph>, Error> {
        let slot = self.slot(tenant);
        if let Some(g) = slot.graph.load_full() {
            return Ok(g);
        }
        let _guard = slot.load.lock().await;
        if let Some(g) = slot.graph.load_full() {
            return Ok(g);
        }
        let g = Arc::new(load_tenant(&self.pool, tenant, self.settings.home_weight).await?);
        tracing::info!(
            tenant = %tenant,
            memories = g.memory_count(),
            entities = g.entity_count(),
            edges = g.edge_count(),
            "loaded tenant graph"
        );
        slot.graph.store(Some(g.clone()));
        Ok(g)
    }

    /// Rebuilds a tenant this instance holds (others load lazily later).
    pub async fn rebuild(&self, tenant: &str) -> Result<(), Error> {
        let Some(slot) = self.tenants.read().get(tenant).cloned() else {
            return Ok(());
        };
        let _guard = slot.load.lock().await;
        let started = std::time::Instant::now();
        let g = Arc::new(load_tenant(&self.pool, tenant, self.settings.home_weight).await?);
        tracing::info!(
            tenant = %tenant,
            memories = g.memory_count(),
            edges = g.edge_count(),
            ms = started.elapsed().as_millis() as u64,
            "rebuilt tenant graph"
        );
        slot.graph.store(Some(g));
        Ok(())
    }

    /// Installs a graph directly (tests, and in-process evaluation).
    pub fn install(&self, tenant: &str, graph: Graph) {
        self.slot(tenant).graph.store(Some(Arc::new(graph)));
    }

    pub fn tenants(&self) -> Vec<String> {
        self.tenants.read().keys().cloned().collect()
    }

    /// (loaded tenants, nodes, edges) over every loaded graph.
    pub fn totals(&self) -> (usize, u64, u64) {
        let tenants = self.tenants.read();
        let mut out = (0usize, 0u64, 0u64);
        for slot in tenants.values() {
            if let Some(g) = slot.graph.load_full() {
                out.0 += 1;
                out.1 += (g.memory_count() + g.entity_count()) as u64;
                out.2 += g.edge_count() as u64;
            }
        }
        out
    }

    pub fn loaded(&self, tenant: &str) -> Option<Arc<Graph>> {
        self.tenants
            .read()
            .get(tenant)
            .and_then(|s| s.graph.load_full())
    }
}

/// Loads the configured tenants one after the other (`["*"]` = every
/// tenant with memories now); queries meanwhile load on demand as usual,
/// sharing a load already under way. Failures are logged, never fatal.
pub async fn preload(registry: Arc<Registry>, tenants: Vec<String>) {
    if tenants.is_empty() {
        return;
    }
    let tenants = if tenants.iter().any(|t| t == "*") {
        match sqlx::query_scalar::<_, String>(
            "SELECT DISTINCT tenant_id FROM memories ORDER BY tenant_id",
        )
        .fetch_all(&registry.pool)
        .await
        {
            Ok(all) => all,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list tenants to preload");
                return;
            }
        }
    } else {
        tenants
    };
    let started = std::time::Instant::now();
    for tenant in &tenants {
        if let Err(e) = registry.graph(tenant).await {
            tracing::warn!(tenant = %tenant, error = %e, "tenant preload failed");
        }
    }
    tracing::info!(
        tenants = tenants.len(),
        ms = started.elapsed().as_millis() as u64,
        "preloaded tenant graphs"
    );
}

#[derive(Debug, serde::Deserialize)]
struct Change {
    tenant: String,
    #[allow(dead_code)]
    #[serde(default)]
    op: String,
}

/// What the listener tells the debouncer.
#[derive(Debug)]
pub enum Dirty {
    Tenant(String),
    /// The connection dropped: notifications may have been lost.
    All,
}

/// Listens on `engram_changes` until `ready` has been reported once per
/// (re)connection; reconnects forever with a pause.
pub async fn listen(
    pool: PgPool,
    tx: mpsc::UnboundedSender<Dirty>,
    on_listening: impl Fn(bool) + Send + 'static,
) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "change listener cannot connect");
                on_listening(false);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(e) = listener.listen(CHANNEL).await {
            tracing::warn!(error = %e, "change listener cannot listen");
            on_listening(false);
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        on_listening(true);
        // Anything may have changed while we were not listening.
        let _ = tx.send(Dirty::All);
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) => match serde_json::from_str::<Change>(n.payload()) {
                    Ok(c) if !c.tenant.is_empty() => {
                        let _ = tx.send(Dirty::Tenant(c.tenant));
                    }
                    Ok(_) | Err(_) => {
                        tracing::warn!(bytes = n.payload().len(), "unparsable change notification")
                    }
                },
                Ok(None) => {
                    tracing::warn!("change listener reconnected; rebuilding loaded tenants");
                    let _ = tx.send(Dirty::All);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "change listener failed");
                    on_listening(false);
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Collects dirty tenants and rebuilds them once the burst is over: after
/// `debounce_ms` without a new event, or `max_debounce_ms` after the first.
pub async fn debounce(registry: Arc<Registry>, mut rx: mpsc::UnboundedReceiver<Dirty>) {
    let quiet = Duration::from_millis(registry.settings().debounce_ms);
    let cap = Duration::from_millis(registry.settings().max_debounce_ms.max(1));
    loop {
        let Some(first) = rx.recv().await else { return };
        let mut dirty: HashSet<String> = HashSet::new();
        let mut all = false;
        let mut add = |d: Dirty, dirty: &mut HashSet<String>| match d {
            Dirty::Tenant(t) => {
                dirty.insert(t);
            }
            Dirty::All => all = true,
        };
        add(first, &mut dirty);
        let hard = Instant::now() + cap;
        loop {
            let until = (Instant::now() + quiet).min(hard);
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(d)) => add(d, &mut dirty),
                Ok(None) => return,
                Err(_) => break,
            }
        }
        if all {
            dirty.extend(registry.tenants());
        }
        for tenant in dirty {
            if let Err(e) = registry.rebuild(&tenant).await {
                tracing::warn!(tenant = %tenant, error = %e, "tenant rebuild failed; keeping the old graph");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{NodeBudget, PprParams};

    fn graph(offset: u128, n: u128) -> Graph {
        let mut dict = Dictionary::default();
        dict.add("hub");
        let mut b = GraphBuilder::new(Arc::new(dict), 5.0);
        for i in 0..n {
            let m = b.add_memory(Uuid::from_u128(offset + i), "default", 1, None, false);
            b.add_mention(m, 0, i == 0);
        }
        b.build()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queries_during_rebuilds_see_one_whole_graph() {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .expect("lazy pool");
        let reg = Arc::new(Registry::new(pool, GraphSettings::default()));
        reg.install("t", graph(1_000, 40));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (reg, stop) = (reg.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut flip = false;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Old: ids 1000.., 40 memories; new: ids 5000.., 60.
                    reg.install(
                        "t",
                        if flip {
                            graph(1_000, 40)
                        } else {
                            graph(5_000, 60)
                        },
                    );
                    flip = !flip;
                }
            })
        };
        let params = PprParams {
            damping: 0.5,
            max_iter: 100,
            tol: 1e-6,
            max_nodes: 1000,
            max_hops: 4,
            k: 50,
            budget: NodeBudget::AllNodes,
            deadline_opt: None,
        };
        for _ in 0..300 {
            let g = reg.graph("t").await.expect("installed graph");
            let view = g.view(1, None, false);
            let out = g.ppr(&[(g.entity_node(0), 1.0)], &view, &params);
            let ids: Vec<u128> = out
                .hits
                .iter()
                .map(|h| g.memory_id(h.memory).as_u128())
                .collect();
            let old = ids.iter().all(|&i| (1_000..1_040).contains(&i)) && g.memory_count() == 40;
            let new = ids.iter().all(|&i| (5_000..5_060).contains(&i)) && g.memory_count() == 60;
            assert!(
                old ^ new,
                "mixed graph: {} memories, ids {ids:?}",
                g.memory_count()
            );
            assert_eq!(ids.len(), g.memory_count().min(50));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().expect("writer");
    }
}
