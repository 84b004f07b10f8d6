//! graph-svc: the in-memory memory graph per tenant (memories, entities,
//! mentions, facts, typed edges) and bounded Personalized PageRank over it.
//! Graphs load from Postgres on a tenant's first query and are rebuilt from
//! `engram_changes` notifications; see [`store`] and [`graph`].
//!
//! Graph recipe (notes/graph-probe.md, reproduced): entity dictionary = the
//! tenant's entity names (titles + capitalised spans from
//! `engram_common::entities::extract`); a memory mentions every dictionary
//! name occurring as a word n-gram (n ≤ 6) of its title + content, its home
//! (title) entity with weight `graph.home_weight` (5); queries link
//! dictionary n-grams (n ≤ 8), seeds weighted 1/df; caller memory seeds are
//! scaled by `graph.memory_seed_weight` (0.05) so they cannot drown entity
//! seeds. Measured graph-only on 2Wiki dev questions 0–499 (example
//! `twowiki`, release): R@2 74.7, R@5 92.4, PPR p50 2.0 ms / p95 2.7 ms with
//! ≤ 1000 nodes touched. On the `engram bench` tenant at 100K memories
//! (2.76M stored edges, entity hubs of degree up to 22K; example
//! `bench_shape`, bench `ppr`) the service path runs at p50 ≈ 2–3 ms,
//! p95 ≈ 3–5 ms on the shared 2-core machine, restricted callers included.
//!
//! `graph.preload_tenants` loads tenants in the background at start
//! (`["*"]`: every tenant with memories) so their first query is not a
//! multi-second load. Otherwise a tenant's first query starts its load in
//! the background and degrades (RESOURCE_EXHAUSTED) after
//! `graph.load_wait_ms`; graphs stay within `graph.memory_budget_bytes` by
//! evicting the least recently used tenants (docs/operability.md).

pub mod error;
pub mod graph;
pub mod service;
pub mod store;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use engram_common::server::{self, ServingStatus};
use engram_common::settings::Settings;
use engram_proto::graph_service_server::GraphServiceServer;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tonic::service::Routes;

pub use error::Error;
pub use store::Registry;

/// Health name reported SERVING while the change listener is listening and
/// Postgres answers.
pub const SERVICE_NAME: &str = "engram.v1.GraphService";

/// What graph-svc's health is made of.
struct Readiness {
    listening: AtomicBool,
    database: AtomicBool,
    /// Held while a status is computed and set, so reports land in order.
    reporting: tokio::sync::Mutex<()>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self {
            listening: AtomicBool::new(false),
            // Until the first check says otherwise: the pool just connected.
            database: AtomicBool::new(true),
            reporting: tokio::sync::Mutex::new(()),
        }
    }
}

impl Readiness {
    /// Sets health from both flags as they are when the report runs, one
    /// report at a time. Each report used to carry the status computed
    /// when it was spawned, so the database watcher's first NOT_SERVING
    /// (listener not up yet) could land after the listener's SERVING and
    /// stay: both callbacks fire only on a change. Seen once in CI as "graph
    /// service did not report SERVING within 120s".
    fn report(self: &Arc<Self>, reporter: &server::Reporter) {
        let (state, reporter) = (self.clone(), reporter.clone());
        tokio::spawn(async move {
            let _turn = state.reporting.lock().await;
            let serving =
                state.listening.load(Ordering::SeqCst) && state.database.load(Ordering::SeqCst);
            let status = match serving {
                true => ServingStatus::Serving,
                false => ServingStatus::NotServing,
            };
            reporter.set_service_status(SERVICE_NAME, status).await;
        });
    }
}

/// Serves GraphService on `listener` until `shutdown`.
pub async fn run(
    listener: TcpListener,
    settings: Settings,
    pool: PgPool,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let registry = Arc::new(Registry::new(pool.clone(), settings.graph.clone()));
    let (reporter, health) = server::health();
    reporter
        .set_service_status(SERVICE_NAME, ServingStatus::NotServing)
        .await;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let rebuilds = tokio::spawn(store::rebuilds(registry.clone(), rx));
    let sweep = tokio::spawn(store::sweep(registry.clone()));
    // SERVING needs both: the change listener up (graphs stay current) and
    // Postgres answering (graphs can load).
    let state = Arc::new(Readiness::default());
    let (rep, st) = (reporter.clone(), state.clone());
    let listen = tokio::spawn(store::listen(pool.clone(), tx, move |ok| {
        st.listening.store(ok, Ordering::SeqCst);
        st.report(&rep);
    }));
    let (rep, st) = (reporter.clone(), state.clone());
    let watcher = tokio::spawn(server::watch_database(pool, move |ok| {
        st.database.store(ok, Ordering::SeqCst);
        st.report(&rep);
    }));
    let preload = tokio::spawn(store::preload(
        registry.clone(),
        settings.graph.preload_tenants.clone(),
    ));
    let opts = server::ServeOptions::internal(&settings)?;
    let svc = service::GraphSvc::new(registry.clone(), settings);
    let routes = Routes::new(GraphServiceServer::new(svc));
    let result = server::serve_with(listener, routes, health, opts, shutdown).await;
    listen.abort();
    watcher.abort();
    rebuilds.abort();
    sweep.abort();
    preload.abort();
    registry.abort_loads();
    result?;
    Ok(())
}
