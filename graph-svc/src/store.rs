//! Tenant graphs in memory: loaded from Postgres on a tenant's first query
//! (detached from it, see [`registry`]), kept within a memory budget, and
//! rebuilt from a consistent snapshot when `engram_changes` notifications
//! arrive (debounced, since bulk ingest sends many, and paced, see
//! [`pacer`]), then swapped whole so a query sees either the old or the new
//! graph.
//!
//! A notification names the memories it changed: a rebuild then reads only
//! those (and the memories a new entity name may mention, since the
//! dictionary is matched against every memory's text) into the [`Parts`]
//! kept beside the graph, and lays the graph out again from them
//! ([`delta`]); at 100K memories ~2 s instead of ~8 s. A notification
//! without ids, a listener reconnect, too many changed memories or every
//! `graph.full_rebuild_every`-th rebuild reads the whole tenant again.
//! Rebuilds run off the async runtime, at most `max_concurrent_rebuilds` at
//! once.

pub mod budget;
pub mod delta;
pub mod heard;
pub mod pacer;
pub mod parts;
pub mod registry;

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use uuid::Uuid;

use crate::error::Error;
use crate::graph::{Dictionary, Graph};
pub use pacer::Pacer;
pub use parts::{MemoryRow, Parts, TypedEdge};
pub use registry::{Registry, Served, Totals};

pub const CHANNEL: &str = "engram_changes";
const PAGE: i64 = 2000;

/// The columns of a [`MemRow`] (a macro, so queries stay `&'static str`).
macro_rules! memory_columns {
    () => {
        "id, namespace, title, content, access_level, \
         EXTRACT(EPOCH FROM valid_to)::bigint, retracted_at IS NOT NULL"
    };
}
pub(crate) use memory_columns;

/// A page of memory rows as read: id, namespace, title, content, access
/// level, end of validity, retracted.
type MemRow = (Uuid, String, String, String, i16, Option<i64>, bool);

/// Matches one page of rows against the dictionary.
fn match_page(dict: &Dictionary, page: Vec<MemRow>) -> Vec<(Uuid, MemoryRow)> {
    page.into_iter()
        .map(
            |(id, namespace, title, content, access_level, valid_to_opt, retracted)| {
                let row = MemoryRow {
                    namespace,
                    access_level,
                    valid_to_opt,
                    retracted,
                    text_mentions: dict.match_text(&title, &content),
                    stored_mentions: Vec::new(),
                    triples: Vec::new(),
                };
                (id, row)
            },
        )
        .collect()
}

/// Adds one matched page's memories to the parts.
async fn add_matched(
    parts: &mut Parts,
    matching: tokio::task::JoinHandle<Vec<(Uuid, MemoryRow)>>,
) -> Result<(), Error> {
    let matched = matching.await.map_err(|e| Error::Internal(e.to_string()))?;
    parts.memories.extend(matched);
    Ok(())
}

/// Builds one tenant's graph from a REPEATABLE READ snapshot.
pub async fn load_tenant(pool: &PgPool, tenant: &str, home_weight: f32) -> Result<Graph, Error> {
    let parts = load_parts(pool, tenant).await?;
    tokio::task::spawn_blocking(move || parts.build(home_weight))
        .await
        .map_err(|e| Error::Internal(e.to_string()))
}

/// Reads every row of one tenant's graph from a REPEATABLE READ snapshot.
pub async fn load_parts(pool: &PgPool, tenant: &str) -> Result<Parts, Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let rows: Vec<(i64, String, String)> =
        sqlx::query_as("SELECT id, name, display FROM entities WHERE tenant_id = $1 ORDER BY id")
            .bind(tenant)
            .fetch_all(&mut *tx)
            .await?;
    let mut parts = Parts {
        entity_rows: rows.len(),
        max_entity_id: rows.last().map_or(0, |row| row.0),
        ..Parts::default()
    };
    let mut dict = Dictionary::default();
    for (id, name, display) in rows {
        if let Some(e) = dict.add_normalized(name, &display) {
            parts.by_db.insert(id, e);
        }
    }
    let dict = Arc::new(dict);
    parts.dict = dict.clone();
    let mut after = Uuid::nil();
    // Dictionary matching is the CPU-heavy part of a load: each page is
    // matched on a blocking thread while the next one is fetched, so
    // Postgres and the matcher use the two cores side by side.
    let mut matching_opt: Option<tokio::task::JoinHandle<Vec<(Uuid, MemoryRow)>>> = None;
    loop {
        let page: Vec<MemRow> = sqlx::query_as(concat!(
            "SELECT ",
            memory_columns!(),
            " FROM memories WHERE tenant_id = $1 AND id > $2 ORDER BY id LIMIT $3"
        ))
        .bind(tenant)
        .bind(after)
        .bind(PAGE)
        .fetch_all(&mut *tx)
        .await?;
        let last_opt = page.last().map(|row| row.0);
        let full = page.len() as i64 == PAGE;
        let d = dict.clone();
        let matching = tokio::task::spawn_blocking(move || match_page(&d, page));
        if let Some(previous) = matching_opt.replace(matching) {
            add_matched(&mut parts, previous).await?;
        }
        match last_opt {
            Some(last) if full => after = last,
            _ => break,
        }
    }
    if let Some(previous) = matching_opt {
        add_matched(&mut parts, previous).await?;
    }
    let mentions = sqlx::query_as::<_, (Uuid, i64, bool)>(
        "SELECT me.memory_id, me.entity_id, me.is_home FROM memory_entities me \
         JOIN memories m ON m.id = me.memory_id WHERE m.tenant_id = $1",
    )
    .bind(tenant)
    .fetch(&mut *tx);
    add_stored_mentions(&mut parts, mentions).await?;
    let triples = sqlx::query_as::<_, (Uuid, i64, i64)>(
        "SELECT memory_id, subject_id, object_id FROM triples WHERE tenant_id = $1",
    )
    .bind(tenant)
    .fetch(&mut *tx);
    add_triples(&mut parts, triples).await?;
    let edges = sqlx::query_as::<_, (Uuid, Uuid, String, f32)>(
        "SELECT src_id, dst_id, edge_type, weight FROM edges WHERE tenant_id = $1",
    )
    .bind(tenant)
    .fetch(&mut *tx);
    add_edges(&mut parts, edges).await?;
    tx.commit().await?;
    Ok(parts)
}

/// Attaches stored mentions to the memories the parts hold.
pub(crate) async fn add_stored_mentions(
    parts: &mut Parts,
    mut rows: impl futures::Stream<Item = Result<(Uuid, i64, bool), sqlx::Error>> + Unpin,
) -> Result<(), Error> {
    while let Some((mid, eid, home)) = rows.try_next().await? {
        if let (Some(row), Some(&e)) = (parts.memories.get_mut(&mid), parts.by_db.get(&eid)) {
            row.stored_mentions.push((e, home));
        }
    }
    Ok(())
}

/// Adds typed edges as read (`src_id, dst_id, edge_type, weight`).
pub(crate) async fn add_edges(
    parts: &mut Parts,
    mut rows: impl futures::Stream<Item = Result<(Uuid, Uuid, String, f32), sqlx::Error>> + Unpin,
) -> Result<(), Error> {
    while let Some((src, dst, edge_type, weight)) = rows.try_next().await? {
        parts.edges.push(TypedEdge {
            src,
            dst,
            edge_type,
            weight,
        });
    }
    Ok(())
}

/// Attaches caller-given facts to the memories the parts hold.
pub(crate) async fn add_triples(
    parts: &mut Parts,
    mut rows: impl futures::Stream<Item = Result<(Uuid, i64, i64), sqlx::Error>> + Unpin,
) -> Result<(), Error> {
    while let Some((mid, s, o)) = rows.try_next().await? {
        let Some(row) = parts.memories.get_mut(&mid) else {
            continue;
        };
        if let (Some(&s), Some(&o)) = (parts.by_db.get(&s), parts.by_db.get(&o)) {
            row.triples.push((s, o));
        }
    }
    Ok(())
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
        .fetch_all(registry.pool())
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
    /// The memories changed; `[]` (or missing) when the writer left them
    /// out (too many for one notification).
    #[serde(default)]
    ids: Vec<String>,
    /// The gateway's id of the write call ("" for search-svc's own work).
    #[serde(default)]
    write: String,
}

impl Change {
    /// The changed memories, when the notification names them all.
    fn ids_opt(&self) -> Option<Vec<Uuid>> {
        if self.ids.is_empty() {
            return None;
        }
        self.ids.iter().map(|s| Uuid::parse_str(s).ok()).collect()
    }
}

/// What the listener tells the debouncer.
#[derive(Debug)]
pub enum Dirty {
    /// A tenant changed: the memories it names, when known, and the
    /// gateway's id of the write ("" when none).
    Tenant {
        tenant: String,
        ids_opt: Option<Vec<Uuid>>,
        write_id: String,
    },
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
                        let ids_opt = c.ids_opt();
                        let _ = tx.send(Dirty::Tenant {
                            tenant: c.tenant,
                            ids_opt,
                            write_id: c.write,
                        });
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

/// Turns change notifications into paced rebuilds (see [`pacer`]): each
/// notification is noted at once, so answers say they are stale, and the
/// rebuild follows when the pacer allows. Rebuild tasks end with this loop.
pub async fn rebuilds(registry: Arc<Registry>, mut rx: mpsc::UnboundedReceiver<Dirty>) {
    let mut pacer = Pacer::new(registry.settings());
    let mut running: JoinSet<(String, bool)> = JoinSet::new();
    loop {
        for tenant in pacer.take_ready(Instant::now()) {
            let reg = registry.clone();
            running.spawn(async move {
                let ok = match reg.rebuild(&tenant).await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(tenant = %tenant, error = %e, "tenant rebuild failed; keeping the old graph");
                        false
                    }
                };
                (tenant, ok)
            });
        }
        let wake_opt = pacer.next_due();
        tokio::select! {
            d = rx.recv() => match d {
                Some(d) => note(&registry, &mut pacer, d),
                None => return,
            },
            Some(done) = running.join_next(), if !running.is_empty() => match done {
                Ok((tenant, ok)) => pacer.finished(&tenant, ok, Instant::now()),
                Err(e) => tracing::error!(error = %e, "tenant rebuild task failed"),
            },
            _ = sleep_until_opt(wake_opt), if wake_opt.is_some() => {}
        }
    }
}

async fn sleep_until_opt(at_opt: Option<Instant>) {
    match at_opt {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Marks the tenants a notification names as changed, and schedules a
/// rebuild of those this instance holds.
fn note(registry: &Registry, pacer: &mut Pacer, d: Dirty) {
    let now = Instant::now();
    let (tenants, ids_opt, write_id) = match d {
        Dirty::Tenant {
            tenant,
            ids_opt,
            write_id,
        } => (vec![tenant], ids_opt, write_id),
        Dirty::All => (registry.tenants(), None, String::new()),
    };
    for tenant in tenants {
        let held = registry.note_change(&tenant, ids_opt.as_deref());
        // After the change is counted: a query that finds the write heard
        // also finds its graph stale until the rebuild (heard.rs).
        registry.heard(&tenant, &write_id);
        if held {
            pacer.note(tenant, now);
        }
    }
}

/// Evicts idle tenants every so often (`idle_evict_secs`; 0 = never), since
/// nothing else runs while no queries or changes arrive.
pub async fn sweep(registry: Arc<Registry>) {
    let idle = registry.settings().idle_evict_secs;
    if idle == 0 {
        return;
    }
    let every = Duration::from_secs(idle.div_ceil(4).clamp(1, 60));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        registry.enforce_budget();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{GraphBuilder, NodeBudget, PprParams};
    use engram_common::settings::GraphSettings;

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
