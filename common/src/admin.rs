//! The admin HTTP server (default 127.0.0.1:9464): `/health` (every service
//! and component with its status, as JSON), `/ready` (200 only when every
//! required component is SERVING and the process is not draining) and
//! `/metrics` (Prometheus text from every registered source).
//!
//! It is separate from the gRPC ports so a scraper or a load balancer never
//! needs an API key, and so it can keep answering "not ready" while the gRPC
//! servers drain. Health comes from registered probes; the usual probe asks a
//! service's own `grpc.health.v1` endpoint, which works the same whether the
//! service runs in this process or (one role per pod) next to it.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use tokio::net::TcpListener;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::settings::ListenSettings;

/// How long one probe may take before its component counts as unreachable;
/// a probe must never make `/ready` hang past a kubelet's own timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    Serving,
    NotServing,
    /// The service answered but does not know the component.
    Unknown,
    /// No answer within [`PROBE_TIMEOUT`] (not started, crashed, overloaded).
    Unreachable,
}

type ProbeFuture = Pin<Box<dyn Future<Output = Status> + Send>>;
type Probe = Arc<dyn Fn() -> ProbeFuture + Send + Sync>;
type MetricsSource = Arc<dyn Fn() -> String + Send + Sync>;

struct Check {
    service: String,
    component: String,
    /// Optional components (e.g. the cross-encoder, which the gateway can do
    /// without) show in `/health` but do not gate `/ready`.
    required: bool,
    probe: Probe,
}

#[derive(Default)]
struct Inner {
    checks: RwLock<Vec<Arc<Check>>>,
    sources: RwLock<Vec<MetricsSource>>,
    draining: AtomicBool,
}

/// What the admin server reports on; cheap to clone, and registration may
/// happen after [`serve`] started (services bind later than the admin port).
#[derive(Clone, Default)]
pub struct AdminState {
    inner: Arc<Inner>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ComponentReport {
    pub status: Status,
    pub required: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ServiceReport {
    pub status: Status,
    pub components: BTreeMap<String, ComponentReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HealthReport {
    /// SERVING when every required component is, and not draining.
    pub status: Status,
    pub ready: bool,
    pub draining: bool,
    pub services: BTreeMap<String, ServiceReport>,
}

impl AdminState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a probe for `component` of `service`.
    pub fn add_check<F, Fut>(&self, service: &str, component: &str, required: bool, probe: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Status> + Send + 'static,
    {
        let probe: Probe = Arc::new(move || Box::pin(probe()));
        self.inner
            .checks
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::new(Check {
                service: service.into(),
                component: component.into(),
                required,
                probe,
            }));
    }

    /// One component per name in `grpc_services`, each probed with
    /// `grpc.health.v1.Health/Check` on `addr` (the channel is lazy and
    /// shared, so an unstarted service is just UNREACHABLE).
    pub fn add_grpc_health(
        &self,
        service: &str,
        addr: SocketAddr,
        grpc_services: &[&str],
        required: bool,
    ) -> anyhow::Result<()> {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?;
        self.add_grpc_health_at(service, endpoint, grpc_services, required)
    }

    /// [`Self::add_grpc_health`] through a prepared endpoint (an internal
    /// service behind TLS: common/src/tls.rs).
    pub fn add_grpc_health_at(
        &self,
        service: &str,
        endpoint: tonic::transport::Endpoint,
        grpc_services: &[&str],
        required: bool,
    ) -> anyhow::Result<()> {
        let channel = endpoint.connect_timeout(PROBE_TIMEOUT).connect_lazy();
        for name in grpc_services {
            let channel = channel.clone();
            let name = name.to_string();
            self.add_check(service, &name.clone(), required, move || {
                let mut client = HealthClient::new(channel.clone());
                let req = HealthCheckRequest {
                    service: name.clone(),
                };
                async move {
                    match tokio::time::timeout(PROBE_TIMEOUT, client.check(req)).await {
                        Ok(Ok(r)) => match r.into_inner().status {
                            1 => Status::Serving,
                            2 => Status::NotServing,
                            _ => Status::Unknown,
                        },
                        Ok(Err(s)) if s.code() == tonic::Code::NotFound => Status::Unknown,
                        _ => Status::Unreachable,
                    }
                }
            });
        }
        Ok(())
    }

    /// Adds a source of Prometheus text exposition; `/metrics` concatenates
    /// all of them (each must use its own metric names).
    pub fn add_metrics<F>(&self, source: F)
    where
        F: Fn() -> String + Send + Sync + 'static,
    {
        self.inner
            .sources
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::new(source));
    }

    /// First step of a graceful shutdown: `/ready` answers 503 from now on,
    /// so load balancers stop sending work while in-flight calls finish.
    pub fn start_draining(&self) {
        if !self.inner.draining.swap(true, Ordering::SeqCst) {
            tracing::info!("admin: draining, readiness now fails");
        }
    }

    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::SeqCst)
    }

    /// Runs every probe concurrently.
    pub async fn health(&self) -> HealthReport {
        let checks: Vec<Arc<Check>> = self
            .inner
            .checks
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut set = tokio::task::JoinSet::new();
        for (i, c) in checks.iter().enumerate() {
            let fut = (c.probe)();
            set.spawn(async move {
                let s = tokio::time::timeout(PROBE_TIMEOUT, fut)
                    .await
                    .unwrap_or(Status::Unreachable);
                (i, s)
            });
        }
        let mut statuses = vec![Status::Unreachable; checks.len()];
        while let Some(joined) = set.join_next().await {
            if let Ok((i, s)) = joined
                && let Some(slot) = statuses.get_mut(i)
            {
                *slot = s;
            }
        }
        let draining = self.is_draining();
        let mut services: BTreeMap<String, ServiceReport> = BTreeMap::new();
        let mut all_required = true;
        for (c, status) in checks.iter().zip(statuses) {
            let svc = services
                .entry(c.service.clone())
                .or_insert_with(|| ServiceReport {
                    status: Status::Serving,
                    components: BTreeMap::new(),
                });
            if c.required && status != Status::Serving {
                all_required = false;
                if svc.status == Status::Serving {
                    svc.status = status;
                }
            }
            svc.components.insert(
                c.component.clone(),
                ComponentReport {
                    status,
                    required: c.required,
                },
            );
        }
        let ready = all_required && !draining;
        HealthReport {
            status: if ready {
                Status::Serving
            } else {
                Status::NotServing
            },
            ready,
            draining,
            services,
        }
    }

    /// Every source's text, newline-separated, then the gRPC server metrics
    /// of every service in this process and `engram_admin_draining`.
    pub fn metrics_text(&self) -> String {
        let sources: Vec<MetricsSource> = self
            .inner
            .sources
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut out = String::new();
        for s in sources {
            let text = s();
            out.push_str(&text);
            if !text.ends_with('\n') && !text.is_empty() {
                out.push('\n');
            }
        }
        out.push_str(&crate::server::metrics_text());
        out.push_str("# HELP engram_admin_draining 1 while the process is shutting down.\n");
        out.push_str("# TYPE engram_admin_draining gauge\n");
        out.push_str(&format!(
            "engram_admin_draining {}\n",
            u8::from(self.is_draining())
        ));
        out
    }
}

/// The admin routes, for embedding in another server or testing.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Serves the admin routes on `listener` until `shutdown`; `/ready` fails
/// from the moment `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listen = ListenSettings {
        drain_delay_ms: 0,
        ..ListenSettings::default()
    };
    serve_with(listener, state, &listen, shutdown).await
}

/// [`serve`] that keeps answering (503 on `/ready`) for
/// `listen.drain_delay_ms` after `shutdown`, matching the gRPC servers'
/// drain delay so a kubelet or load balancer sees "not ready" rather than
/// "connection refused"; a request's headers must arrive within
/// `listen.header_read_timeout_ms` ([`crate::conn::serve_http`]).
pub async fn serve_with(
    listener: TcpListener,
    state: AdminState,
    listen: &ListenSettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    tracing::info!(addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), "admin http listening");
    let s = state.clone();
    let linger = Duration::from_millis(listen.drain_delay_ms);
    let signal = async move {
        shutdown.await;
        s.start_draining();
        tokio::time::sleep(linger).await;
    };
    let header_read = Duration::from_millis(listen.header_read_timeout_ms);
    crate::conn::serve_http(listener, router(state), header_read, signal).await?;
    Ok(())
}

/// Always 200 while the process answers (liveness); the body tells which
/// component is unhealthy.
async fn health(State(state): State<AdminState>) -> Json<HealthReport> {
    Json(state.health().await)
}

async fn ready(State(state): State<AdminState>) -> Response {
    let report = state.health().await;
    let code = if report.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(report)).into_response()
}

async fn metrics(State(state): State<AdminState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics_text(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get_text(addr: SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("write");
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.expect("read");
        let code = buf
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("status");
        let body = buf.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
        (code, body)
    }

    #[tokio::test]
    async fn ready_follows_required_components_and_draining() {
        let state = AdminState::new();
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        state.add_check("search", "model", true, move || {
            let up = f.load(Ordering::SeqCst);
            async move {
                if up {
                    Status::Serving
                } else {
                    Status::NotServing
                }
            }
        });
        state.add_check("rerank", "cross_encoder", false, || async {
            Status::NotServing
        });
        state.add_metrics(|| "# TYPE x_total counter\nx_total 3".into());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, state.clone(), async {
            let _ = rx.await;
        }));

        let (code, body) = get_text(addr, "/ready").await;
        assert_eq!(code, 503, "{body}");
        flag.store(true, Ordering::SeqCst);
        let (code, body) = get_text(addr, "/ready").await;
        assert_eq!(code, 200, "{body}");
        let (code, body) = get_text(addr, "/health").await;
        assert_eq!(code, 200);
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(
            v["services"]["search"]["components"]["model"]["status"],
            "SERVING"
        );
        assert_eq!(
            v["services"]["rerank"]["components"]["cross_encoder"]["status"],
            "NOT_SERVING"
        );
        let (_, m) = get_text(addr, "/metrics").await;
        assert!(
            m.contains("x_total 3\n") && m.contains("engram_admin_draining 0"),
            "{m}"
        );

        state.start_draining();
        let (code, _) = get_text(addr, "/ready").await;
        assert_eq!(code, 503);
        let _ = tx.send(());
        server.await.expect("join").expect("serve");
    }

    #[tokio::test]
    async fn unreachable_grpc_service_is_reported() {
        let state = AdminState::new();
        // Port 1 is never an engram service.
        let addr: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        state
            .add_grpc_health("graph", addr, &["engram.v1.GraphService"], true)
            .expect("register");
        let r = state.health().await;
        assert!(!r.ready);
        assert_eq!(
            r.services["graph"].components["engram.v1.GraphService"].status,
            Status::Unreachable
        );
    }
}
