//! Starts any subset of the four services in one process. Every service gets
//! its own listener and the gateway reaches the others over gRPC (loopback),
//! so the code path and the tower layers are the same as in a deployment.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use engram_common::Settings;
use engram_common::admin::{self, AdminState};
use engram_common::db::Database;
use engram_common::server;
use engram_common::settings::{ApiKeySettings, TlsSettings};
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Service {
    Retrieval,
    Search,
    Graph,
    Rerank,
}

impl Service {
    pub const ALL: [Service; 4] = [Self::Search, Self::Graph, Self::Rerank, Self::Retrieval];

    pub fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s.trim() {
            "retrieval" | "gateway" => Self::Retrieval,
            "search" => Self::Search,
            "graph" => Self::Graph,
            "rerank" => Self::Rerank,
            other => {
                bail!("unknown service {other:?}: expected retrieval, search, graph or rerank")
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Retrieval => "retrieval",
            Self::Search => "search",
            Self::Graph => "graph",
            Self::Rerank => "rerank",
        }
    }

    /// The gRPC service name its health status is reported under.
    pub fn grpc_name(self) -> &'static str {
        match self {
            Self::Retrieval => "engram.v1.RetrievalService",
            Self::Search => "engram.v1.SearchService",
            Self::Graph => "engram.v1.GraphService",
            Self::Rerank => "engram.v1.RerankService",
        }
    }
}

#[derive(Debug, Clone)]
pub struct StackOptions {
    pub services: BTreeSet<Service>,
    /// Bind every service on 127.0.0.1:0 instead of the configured addresses
    /// (tests, demo, eval: never collide with a running `engram up`).
    pub ephemeral_ports: bool,
    /// Create a dev API key for tenant `default` when none is configured
    /// (only ever on loopback) and write it to `<home>/dev-api-key`.
    pub dev_api_key: bool,
    /// Extra API keys (plain text) to accept: (key, tenant, agent, trust).
    pub extra_keys: Vec<(String, String, String, String)>,
}

impl Default for StackOptions {
    fn default() -> Self {
        Self {
            services: Service::ALL.into_iter().collect(),
            ephemeral_ports: false,
            dev_api_key: true,
            extra_keys: Vec::new(),
        }
    }
}

/// A running set of services.
pub struct Stack {
    pub settings: Settings,
    pub addrs: Vec<(Service, SocketAddr)>,
    /// Admin HTTP (/health, /ready, /metrics).
    pub admin_addr: SocketAddr,
    /// The gateway's HTTP JSON API, when the gateway runs here.
    pub http_addr_opt: Option<SocketAddr>,
    pub admin: AdminState,
    /// The dev key, when one was created or read.
    pub api_key_opt: Option<String>,
    db_opt: Option<Database>,
    tasks: Vec<(Service, JoinHandle<anyhow::Result<()>>)>,
    shutdown: CancellationToken,
}

impl Stack {
    pub async fn start(mut settings: Settings, opts: StackOptions) -> anyhow::Result<Self> {
        let needs_db =
            opts.services.contains(&Service::Search) || opts.services.contains(&Service::Graph);
        let all_in_process = opts.services.len() == Service::ALL.len();
        if settings.auth.internal_token_opt.is_none() {
            if !all_in_process {
                bail!(
                    "services started separately must share an internal token: set ENGRAM__AUTH__INTERNAL_TOKEN_OPT to the same secret for every `engram serve`"
                );
            }
            settings.auth.internal_token_opt = Some(random_token());
        }
        if opts.ephemeral_ports {
            // A stack on port 0 (tests, eval, bench) is a deployment of its
            // own: its gateway shares limits only with replicas started on
            // its settings, not with every gateway on the same Postgres.
            settings.tenant.replica_group = format!("ephemeral-{}", random_token());
        }
        let mut api_key_opt = None;
        if opts.services.contains(&Service::Retrieval) {
            let configured = settings.auth.api_keys.len();
            for (key, tenant, agent, trust) in &opts.extra_keys {
                settings.auth.api_keys.push(ApiKeySettings {
                    sha256: sha256_hex(key),
                    tenant: tenant.clone(),
                    agent_id: agent.clone(),
                    trust: trust.clone(),
                });
            }
            if opts.dev_api_key && configured == 0 {
                let loopback = opts.ephemeral_ports || is_loopback(&settings.listen.retrieval);
                if !loopback {
                    bail!(
                        "no API keys configured and the gateway listens on {} (not loopback): configure auth.api_keys (sha256 of each key) instead of a dev key",
                        settings.listen.retrieval
                    );
                }
                let key = dev_api_key(&settings.home)?;
                settings.auth.api_keys.push(ApiKeySettings {
                    sha256: sha256_hex(&key),
                    tenant: "default".into(),
                    agent_id: "dev".into(),
                    trust: "sensitive".into(),
                });
                api_key_opt = Some(key);
            }
        }

        let shutdown = CancellationToken::new();
        let db_opt = if needs_db {
            Some(Database::open(&settings).await.context("database")?)
        } else {
            None
        };

        // Bind everything first so the gateway knows its downstreams' ports.
        let mut listeners = Vec::new();
        for svc in Service::ALL {
            if !opts.services.contains(&svc) {
                continue;
            }
            let addr = if opts.ephemeral_ports {
                "127.0.0.1:0".to_string()
            } else {
                match svc {
                    Service::Retrieval => settings.listen.retrieval.clone(),
                    Service::Search => settings.listen.search.clone(),
                    Service::Graph => settings.listen.graph.clone(),
                    Service::Rerank => settings.listen.rerank.clone(),
                }
            };
            let l = server::bind(&addr, svc.name()).await?;
            listeners.push((svc, l));
        }
        let mut addrs = Vec::new();
        for (svc, l) in &listeners {
            let a = l.local_addr()?;
            addrs.push((*svc, a));
            let uri = engram_common::tls::uri(a, &settings.tls);
            match svc {
                Service::Search => settings.downstream.search = uri,
                Service::Graph => settings.downstream.graph = uri,
                Service::Rerank => settings.downstream.rerank = uri,
                Service::Retrieval => {}
            }
        }

        let admin_state = AdminState::new();
        for (svc, addr) in &addrs {
            // Rerank is optional: without the cross-encoder the gateway skips the check.
            admin_state.add_grpc_health_at(
                svc.name(),
                health_endpoint(*addr, *svc, &settings.tls)?,
                &["", svc.grpc_name()],
                *svc != Service::Rerank,
            )?;
        }
        let bind_addr = |configured: &str| {
            if opts.ephemeral_ports {
                "127.0.0.1:0".to_string()
            } else {
                configured.to_string()
            }
        };
        let admin_listener = server::bind(&bind_addr(&settings.listen.admin), "admin").await?;
        let admin_addr = admin_listener.local_addr()?;
        let http_listener_opt = if opts.services.contains(&Service::Retrieval) {
            Some(server::bind(&bind_addr(&settings.listen.http), "http").await?)
        } else {
            None
        };
        let http_addr_opt = http_listener_opt.as_ref().and_then(|l| l.local_addr().ok());

        // The cross-encoder is loaded here rather than in rerank-svc's task so
        // that, when it is missing, the gateway beside it skips the relevance
        // check as if `pipeline.cross_encoder` were off: reported once now,
        // not as a warning and `degraded=rerank` on every query.
        let mut rerank_model_opt = None;
        if opts.services.contains(&Service::Rerank) {
            let model = rerank_svc::load_model_thread(&settings).await.map_err(|e| {
                rerank_svc::report_unavailable(&settings, &e);
                e.to_string()
            });
            if model.is_err() && opts.services.contains(&Service::Retrieval) {
                settings.pipeline.cross_encoder = false;
            }
            rerank_model_opt = Some(model);
        }

        let mut tasks = Vec::new();
        // Each gateway started here, to wait for its change feed once all serve.
        let mut gateways = Vec::new();
        {
            let stop = shutdown.clone().cancelled_owned();
            let state = admin_state.clone();
            // /ready answers 503 for the drain delay so balancers stop routing first.
            let listen = settings.listen.clone();
            tasks.push((
                Service::Retrieval,
                tokio::spawn(async move {
                    admin::serve_with(admin_listener, state, &listen, stop).await
                }),
            ));
            // Admin is reported under the gateway's name only if it fails; see any_exited.
        }
        let mut http_listener_opt = http_listener_opt;
        for (svc, listener) in listeners {
            let s = settings.clone();
            let stop = shutdown.clone().cancelled_owned();
            let pool_opt = db_opt.as_ref().map(|d| d.pool.clone());
            let task = match svc {
                Service::Search => {
                    let pool = pool_opt.context("search needs the database")?;
                    tokio::spawn(async move { search_svc::run(listener, s, pool, stop).await })
                }
                Service::Graph => {
                    let pool = pool_opt.context("graph needs the database")?;
                    tokio::spawn(async move { graph_svc::run(listener, s, pool, stop).await })
                }
                Service::Rerank => {
                    let model = rerank_model_opt
                        .take()
                        .context("rerank needs its model loaded")?;
                    tokio::spawn(async move {
                        rerank_svc::run_with_model(listener, s, model, stop).await
                    })
                }
                Service::Retrieval => {
                    let gw = retrieval_svc::Gateway::new(s)?;
                    gateways.push(gw.clone());
                    let g = gw.clone();
                    admin_state.add_metrics(move || g.metrics_text());
                    if let Some(http) = http_listener_opt.take() {
                        let gw = gw.clone();
                        let stop = shutdown.clone().cancelled_owned();
                        tasks.push((
                            Service::Retrieval,
                            tokio::spawn(async move {
                                retrieval_svc::http::serve(http, gw, stop).await
                            }),
                        ));
                    }
                    tokio::spawn(
                        async move { retrieval_svc::serve_gateway(listener, gw, stop).await },
                    )
                }
            };
            tasks.push((svc, task));
        }
        let stack = Self {
            settings,
            addrs,
            admin_addr,
            http_addr_opt,
            admin: admin_state,
            api_key_opt,
            db_opt,
            tasks,
            shutdown,
        };
        stack.wait_serving(Duration::from_secs(120)).await?;
        for gw in gateways {
            gw.feed_heard(retrieval_svc::FEED_WAIT).await;
        }
        Ok(stack)
    }

    pub fn addr(&self, svc: Service) -> Option<SocketAddr> {
        self.addrs.iter().find(|(s, _)| *s == svc).map(|(_, a)| *a)
    }

    /// The gateway's URI (`http://127.0.0.1:PORT`).
    pub fn gateway_uri(&self) -> Option<String> {
        self.addr(Service::Retrieval).map(|a| format!("http://{a}"))
    }

    pub fn database_url_opt(&self) -> Option<&str> {
        self.db_opt.as_ref().map(|d| d.url.as_str())
    }

    /// Polls grpc.health.v1 until every started service reports SERVING.
    /// rerank may stay NOT_SERVING (no cross-encoder installed): the gateway
    /// then skips the relevance check, so that is not a failure.
    async fn wait_serving(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        for (svc, addr) in &self.addrs {
            loop {
                if self.tasks.iter().any(|(s, t)| s == svc && t.is_finished()) {
                    bail!(
                        "{} service exited during start-up (see the log above)",
                        svc.name()
                    );
                }
                let status = health_status(*addr, *svc, &self.settings.tls).await;
                match status {
                    Some(1) => break,
                    // Reported once when the model failed to load.
                    Some(2) if *svc == Service::Rerank => break,
                    _ => {}
                }
                if tokio::time::Instant::now() > deadline {
                    bail!(
                        "{} service did not report SERVING within {within:?}",
                        svc.name()
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Resolves when any service task ends (it should not before shutdown).
    pub async fn any_exited(&mut self) -> (Service, anyhow::Result<()>) {
        let futs = self.tasks.iter_mut().map(|(s, t)| {
            let s = *s;
            Box::pin(async move {
                let r = match t.await {
                    Ok(r) => r,
                    Err(e) => Err(anyhow::anyhow!("task panicked or was cancelled: {e}")),
                };
                (s, r)
            })
        });
        futures::future::select_all(futs).await.0
    }

    /// Graceful shutdown: stop accepting, drain, close the pool, stop Postgres.
    pub async fn shutdown(mut self) {
        // Readiness fails first so load balancers stop sending new work.
        self.admin.start_draining();
        self.shutdown.cancel();
        for (svc, task) in self.tasks.drain(..) {
            match tokio::time::timeout(Duration::from_secs(10), task).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => {
                    tracing::warn!(service = svc.name(), error = %e, "service ended with an error")
                }
                Ok(Err(e)) => {
                    tracing::warn!(service = svc.name(), error = %e, "service task failed")
                }
                Err(_) => tracing::warn!(service = svc.name(), "service did not stop within 10s"),
            }
        }
        if let Some(db) = self.db_opt.take() {
            db.close().await;
        }
    }
}

/// How to reach `svc` at `addr`: the internal services through TLS when
/// the settings ask for it, the gateway's public port in plaintext.
pub fn health_endpoint(
    addr: SocketAddr,
    svc: Service,
    tls: &TlsSettings,
) -> anyhow::Result<tonic::transport::Endpoint> {
    match svc {
        Service::Retrieval => Ok(tonic::transport::Endpoint::from_shared(format!(
            "http://{addr}"
        ))?),
        _ => engram_common::tls::endpoint(&engram_common::tls::uri(addr, tls), tls),
    }
}

/// One grpc.health.v1 check of `svc` at `addr`; `None` when unreachable.
pub async fn health_status(addr: SocketAddr, svc: Service, tls: &TlsSettings) -> Option<i32> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let ch = health_endpoint(addr, svc, tls).ok()?.connect().await.ok()?;
    let r = HealthClient::new(ch)
        .check(HealthCheckRequest {
            service: svc.grpc_name().into(),
        })
        .await
        .ok()?;
    Some(r.into_inner().status)
}

pub fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

pub fn random_token() -> String {
    let bytes: [u8; 24] = rand::random();
    hex::encode(bytes)
}

fn is_loopback(addr: &str) -> bool {
    addr.parse::<SocketAddr>()
        .map(|a| a.ip().is_loopback())
        .unwrap_or_else(|_| addr.starts_with("localhost:"))
}

/// Reads `<home>/dev-api-key`, creating it (mode 0600) the first time.
pub fn dev_api_key(home: &std::path::Path) -> anyhow::Result<String> {
    let path: PathBuf = home.join("dev-api-key");
    if let Ok(k) = std::fs::read_to_string(&path) {
        let k = k.trim().to_string();
        if !k.is_empty() {
            return Ok(k);
        }
    }
    std::fs::create_dir_all(home).with_context(|| format!("creating {}", home.display()))?;
    let key = format!("engram_dev_{}", random_token());
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    writeln!(f, "{key}")?;
    Ok(key)
}
