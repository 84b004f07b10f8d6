//! gRPC server scaffolding shared by every service: standard health and
//! reflection (v1 and v1alpha, so grpcurl 1.8 works too), one request layer
//! (trace context extraction, a server span, Prometheus request metrics) and
//! graceful shutdown. Each service exposes `run(listener, shutdown)` built on
//! this, so every one of them gets the same operability for free.
//!
//! Shutdown order: the shutdown future resolves → health answers NOT_SERVING
//! (overall and every named service; open `Watch` streams get it and end) →
//! after `drain_delay` the listener stops accepting and HTTP/2 GOAWAY tells
//! clients to go elsewhere → in-flight calls finish, for at most
//! `drain_grace` → whatever is left is dropped and `serve` returns.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use prometheus::core::Collector as _;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};
use prost::Message as _;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic_health::pb::health_check_response::ServingStatus as PbStatus;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};
use tower_http::catch_panic::CatchPanicLayer;
use tracing::Instrument as _;

pub use crate::panic::panic_message;

use crate::settings::ListenSettings;

pub use tonic_health::ServingStatus;
pub use tonic_health::pb::health_server::HealthServer;
pub use tonic_health::server::HealthReporter as Reporter;

/// The health service a server hands to [`serve`]: the standard one, except
/// that once draining starts it answers NOT_SERVING for every service it
/// knows, whatever a background task reports meanwhile.
pub struct Health {
    server: HealthServer<DrainingHealth>,
    reporter: HealthReporter,
    drain: watch::Sender<bool>,
}

impl Health {
    /// Flips health to NOT_SERVING (idempotent); [`serve`] calls it when the
    /// shutdown future resolves.
    pub async fn start_draining(&self) {
        if !self.drain.send_replace(true) {
            self.reporter
                .set_service_status("", ServingStatus::NotServing)
                .await;
        }
    }

    /// A handle that drains this health service later (tests, embedders).
    pub fn drain_handle(&self) -> DrainHandle {
        DrainHandle {
            reporter: self.reporter.clone(),
            drain: self.drain.clone(),
        }
    }
}

/// See [`Health::drain_handle`].
#[derive(Clone)]
pub struct DrainHandle {
    reporter: HealthReporter,
    drain: watch::Sender<bool>,
}

impl DrainHandle {
    pub async fn start_draining(&self) {
        if !self.drain.send_replace(true) {
            self.reporter
                .set_service_status("", ServingStatus::NotServing)
                .await;
        }
    }

    pub fn is_draining(&self) -> bool {
        *self.drain.borrow()
    }
}

/// A fresh health service and the reporter that drives it.
pub fn health() -> (HealthReporter, Health) {
    let reporter = HealthReporter::new();
    let (drain, drain_rx) = watch::channel(false);
    let server = HealthServer::new(DrainingHealth {
        inner: HealthService::from_health_reporter(reporter.clone()),
        drain: drain_rx,
    });
    (
        reporter.clone(),
        Health {
            server,
            reporter,
            drain,
        },
    )
}

struct DrainingHealth {
    inner: HealthService,
    drain: watch::Receiver<bool>,
}

fn not_serving() -> HealthCheckResponse {
    HealthCheckResponse {
        status: PbStatus::NotServing as i32,
    }
}

type WatchStream =
    Pin<Box<dyn futures::Stream<Item = Result<HealthCheckResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl tonic_health::pb::health_server::Health for DrainingHealth {
    async fn check(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        // Unknown names stay NOT_FOUND while draining.
        let r = self.inner.check(request).await?;
        if *self.drain.borrow() {
            return Ok(tonic::Response::new(not_serving()));
        }
        Ok(r)
    }

    type WatchStream = WatchStream;

    /// Ends the stream with NOT_SERVING when draining starts: an open watch
    /// is an in-flight call and would otherwise hold the drain to its limit.
    async fn watch(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<WatchStream>, tonic::Status> {
        let inner = Box::pin(self.inner.watch(request).await?.into_inner());
        let drain = self.drain.clone();
        let stream = futures::stream::unfold(
            (inner, drain, false),
            |(mut inner, mut drain, done)| async move {
                if done {
                    return None;
                }
                if *drain.borrow() {
                    return Some((Ok(not_serving()), (inner, drain, true)));
                }
                tokio::select! {
                    item = inner.next() => item.map(|i| (i, (inner, drain, false))),
                    changed = drain.changed() => match changed {
                        Ok(()) => Some((Ok(not_serving()), (inner, drain, true))),
                        Err(_) => None,
                    },
                }
            },
        );
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

/// How a server drains, and whether it serves TLS; [`serve`] uses the
/// defaults of [`ListenSettings`], in plaintext.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub drain_delay: Duration,
    pub drain_grace: Duration,
    pub tls_opt: Option<tonic::transport::ServerTlsConfig>,
    /// The services reflection lists (fully qualified); empty lists every
    /// service in the descriptor sets. The public port names its own, so a
    /// client exploring it never sees internal services that would answer
    /// Unimplemented there.
    pub reflect: Vec<&'static str>,
    /// How long a connection may go without a call in flight
    /// (`listen.header_read_timeout_ms`, `listen.idle_timeout_ms`).
    pub limits: crate::conn::Limits,
    /// HTTP/2 PINGs to every connection, and how long an answer may take.
    pub http2_keepalive_interval: Duration,
    pub http2_keepalive_timeout: Duration,
}

impl ServeOptions {
    /// An internal service's options: drain timing, and TLS when `[tls]`
    /// names a certificate (common/src/tls.rs).
    pub fn internal(settings: &crate::Settings) -> anyhow::Result<Self> {
        Ok(Self {
            tls_opt: crate::tls::server_config(&settings.tls)?,
            ..Self::from(&settings.listen)
        })
    }
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self::from(&ListenSettings::default())
    }
}

impl From<&ListenSettings> for ServeOptions {
    fn from(l: &ListenSettings) -> Self {
        Self {
            drain_delay: Duration::from_millis(l.drain_delay_ms),
            drain_grace: Duration::from_millis(l.drain_grace_ms),
            tls_opt: None,
            reflect: Vec::new(),
            limits: crate::conn::Limits {
                first_call: Duration::from_millis(l.header_read_timeout_ms),
                idle: Duration::from_millis(l.idle_timeout_ms),
            },
            http2_keepalive_interval: Duration::from_millis(l.http2_keepalive_interval_ms),
            http2_keepalive_timeout: Duration::from_millis(l.http2_keepalive_timeout_ms),
        }
    }
}

/// Serves `routes` plus health and reflection on `listener` until
/// `shutdown`, then drains with the default [`ServeOptions`].
pub async fn serve(
    listener: TcpListener,
    routes: Routes,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    serve_with(listener, routes, health, ServeOptions::default(), shutdown).await
}

/// Accepted connections with TCP_NODELAY, each closed when it goes without
/// a call in flight for `limits` ([`crate::conn`]). A listener handed in
/// from outside skips tonic's own socket options, and without NODELAY a
/// reply written in pieces (headers, body, trailers) waits on the peer's
/// delayed ACK: a flat ~40 ms on every call.
fn incoming(
    listener: TcpListener,
    limits: crate::conn::Limits,
) -> impl futures::Stream<Item = std::io::Result<crate::conn::Bounded<tokio::net::TcpStream>>>
+ Send
+ 'static {
    tonic::transport::server::TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .map(move |accepted| accepted.map(|tcp| crate::conn::Bounded::new(tcp, limits)))
}

/// [`serve`] with explicit drain timing (`ServeOptions::from(&settings.listen)`).
pub async fn serve_with(
    listener: TcpListener,
    routes: Routes,
    health: Health,
    opts: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let reflect = opts.reflect.clone();
    let builder = || {
        let b = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(engram_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
        if reflect.is_empty() {
            return b;
        }
        (reflect.iter().copied())
            .chain(["grpc.health.v1.Health"])
            .fold(b, |b, name| b.with_service_name(name))
    };
    let Health {
        server: health_server,
        reporter,
        drain,
    } = health;
    let mut routes = routes.add_service(health_server);
    // Reflection only fails on a malformed descriptor set, which is a build bug.
    match builder().build_v1() {
        Ok(v1) => routes = routes.add_service(v1),
        Err(e) => tracing::error!(error = %e, "reflection v1 unavailable"),
    }
    match builder().build_v1alpha() {
        Ok(v1a) => routes = routes.add_service(v1a),
        Err(e) => tracing::error!(error = %e, "reflection v1alpha unavailable"),
    }
    let addr = listener.local_addr().ok();
    let draining = Arc::new(tokio::sync::Notify::new());
    let signal = {
        let handle = DrainHandle { reporter, drain };
        let draining = draining.clone();
        async move {
            shutdown.await;
            handle.start_draining().await;
            tracing::info!(
                addr = %addr.map(|a| a.to_string()).unwrap_or_default(),
                delay_ms = opts.drain_delay.as_millis() as u64,
                grace_ms = opts.drain_grace.as_millis() as u64,
                "draining: health not serving, finishing in-flight requests"
            );
            draining.notify_one();
            tokio::time::sleep(opts.drain_delay).await;
        }
    };
    let mut builder = Server::builder()
        .http2_keepalive_interval(Some(opts.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(opts.http2_keepalive_timeout));
    if let Some(tls) = opts.tls_opt.clone() {
        builder = builder.tls_config(tls)?;
    }
    let server = builder
        // Outermost: a call counts as in flight on its connection until its
        // response ends, whatever the layers inside make of it.
        .layer(crate::conn::ActivityLayer)
        .layer(ObserveLayer)
        // Inside the observer, so a panic is counted as the INTERNAL it becomes.
        .layer(CatchPanicLayer::custom(panic_response))
        // Inside the observer, so the rewritten code is the one counted.
        .layer(tower::util::MapResponseLayer::new(undecodable_is_invalid))
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming(listener, opts.limits), signal);
    tokio::pin!(server);
    let deadline = async {
        draining.notified().await;
        tokio::time::sleep(opts.drain_delay + opts.drain_grace).await;
    };
    tokio::select! {
        r = &mut server => {
            tracing::info!(addr = %addr.map(|a| a.to_string()).unwrap_or_default(), "server stopped");
            r
        }
        () = deadline => {
            let left = metrics().map_or(0, |m| m.in_flight_total());
            tracing::warn!(
                addr = %addr.map(|a| a.to_string()).unwrap_or_default(),
                in_flight = left,
                grace_ms = opts.drain_grace.as_millis() as u64,
                "drain grace elapsed, dropping in-flight requests"
            );
            Ok(())
        }
    }
}

/// How often [`watch_database`] asks, and how long one check may take.
const DB_CHECK: Duration = Duration::from_secs(2);

/// Follows a service's database: a `SELECT 1` every two seconds (bounded
/// by the same two), and `on_change(reachable)` on the first answer and on
/// every change after, so health can go NOT_SERVING while Postgres is gone
/// and come back by itself. Runs until aborted.
pub async fn watch_database(pool: sqlx::PgPool, on_change: impl Fn(bool) + Send + 'static) {
    let mut last_opt: Option<bool> = None;
    loop {
        let check = sqlx::query("SELECT 1").execute(&pool);
        let ok = matches!(tokio::time::timeout(DB_CHECK, check).await, Ok(Ok(_)));
        if last_opt != Some(ok) {
            match ok {
                true if last_opt.is_some() => tracing::info!("database reachable again"),
                true => {}
                false => tracing::warn!("database unreachable: health NOT_SERVING"),
            }
            on_change(ok);
            last_opt = Some(ok);
        }
        tokio::time::sleep(DB_CHECK).await;
    }
}

/// A handler that panicked answers INTERNAL, never a reset stream, and
/// says so in one structured log line (the message, not the payload's
/// debug dump or a backtrace, which the panic hook logs).
fn panic_response(
    payload: Box<dyn std::any::Any + Send + 'static>,
) -> http::Response<tonic::body::Body> {
    let message = panic_message(payload.as_ref());
    tracing::error!(panic = %message, "handler panicked; answered INTERNAL");
    tonic::Status::internal("internal error").into_http()
}

/// Binds `addr`, turning "address in use" into one line with the fix.
pub async fn bind(addr: &str, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            // The io::Error stays in the chain, so a caller that can pick
            // another port (the soak's in-process deployment) can tell.
            let fix = format!(
                "{what}: address {addr} is already in use; stop the other process or set ENGRAM__LISTEN__{}=127.0.0.1:<port>",
                what.to_ascii_uppercase()
            );
            anyhow::Error::new(e).context(fix)
        } else {
            anyhow::anyhow!("{what}: cannot listen on {addr}: {e}")
        }
    })
}

/// The client's deadline from the `grpc-timeout` header, if any; every
/// service caps its own budget with it.
pub fn grpc_timeout(md: &tonic::metadata::MetadataMap) -> Option<Duration> {
    parse_grpc_timeout(md.get("grpc-timeout")?.to_str().ok()?)
}

/// `grpc-timeout` value: digits then H, M, S, m, u or n (e.g. "2500m").
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let (num, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

// ------------------------------------------------------------ request layer

/// Latency buckets (seconds): a health check (~100 µs) to a slow PPR (5 s).
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Process-wide gRPC server metrics. One registry for the process (not per
/// server) because every server in it reports here and `service` tells them
/// apart; the label sets are closed (see [`known_methods`]).
struct ServerMetrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    in_flight: IntGaugeVec,
}

impl ServerMetrics {
    fn new() -> prometheus::Result<Self> {
        let m = Self {
            registry: Registry::new(),
            requests: IntCounterVec::new(
                Opts::new(
                    "engram_grpc_server_requests_total",
                    "gRPC calls handled, by service, method and status code.",
                ),
                &["service", "method", "code"],
            )?,
            latency: HistogramVec::new(
                HistogramOpts::new(
                    "engram_grpc_server_request_duration_seconds",
                    "Time to the response headers (the whole call for unary RPCs).",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["service", "method"],
            )?,
            in_flight: IntGaugeVec::new(
                Opts::new(
                    "engram_grpc_server_in_flight",
                    "gRPC calls being handled right now.",
                ),
                &["service"],
            )?,
        };
        m.registry.register(Box::new(m.requests.clone()))?;
        m.registry.register(Box::new(m.latency.clone()))?;
        m.registry.register(Box::new(m.in_flight.clone()))?;
        Ok(m)
    }

    fn in_flight_total(&self) -> i64 {
        self.in_flight
            .collect()
            .iter()
            .flat_map(|f| f.get_metric())
            .map(|m| m.get_gauge().get_value() as i64)
            .sum()
    }
}

fn metrics() -> Option<&'static ServerMetrics> {
    static M: OnceLock<Option<ServerMetrics>> = OnceLock::new();
    M.get_or_init(|| match ServerMetrics::new() {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::error!(error = %e, "grpc server metrics unavailable");
            None
        }
    })
    .as_ref()
}

/// Prometheus text of the gRPC server metrics of every server in this
/// process (the admin `/metrics` includes it).
pub fn metrics_text() -> String {
    let Some(m) = metrics() else {
        return String::new();
    };
    let mut buf = Vec::new();
    if let Err(e) = prometheus::TextEncoder::new().encode(&m.registry.gather(), &mut buf) {
        tracing::warn!(error = %e, "grpc server metrics encoding failed");
    }
    String::from_utf8(buf).unwrap_or_default()
}

/// `/pkg.Service/Method` → (service, method) for every RPC this binary can
/// serve, so a client sending made-up paths cannot grow the label sets.
fn known_methods() -> &'static HashMap<String, (String, String)> {
    static KNOWN: OnceLock<HashMap<String, (String, String)>> = OnceLock::new();
    KNOWN.get_or_init(|| {
        let mut map = HashMap::new();
        for set in [
            engram_proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
        ] {
            let Ok(fds) = prost_types::FileDescriptorSet::decode(set) else {
                continue;
            };
            for file in fds.file {
                let package = file.package.unwrap_or_default();
                for svc in file.service {
                    let name = format!("{package}.{}", svc.name.unwrap_or_default());
                    for m in svc.method {
                        let method = m.name.unwrap_or_default();
                        map.insert(format!("/{name}/{method}"), (name.clone(), method));
                    }
                }
            }
        }
        for v in ["v1", "v1alpha"] {
            let name = format!("grpc.reflection.{v}.ServerReflection");
            map.insert(
                format!("/{name}/ServerReflectionInfo"),
                (name, "ServerReflectionInfo".into()),
            );
        }
        map
    })
}

fn labels(path: &str) -> (&'static str, &'static str) {
    known_methods()
        .get(path)
        .map_or(("unknown", "unknown"), |(s, m)| (s.as_str(), m.as_str()))
}

/// gRPC status names as in the spec (and as other exporters label them).
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The status a response carries in its headers: errors from handlers are
/// "trailers-only" responses; a success has its status in the trailers,
/// which come after the body, so no header means OK (a streaming call that
/// fails mid-stream therefore counts as OK here).
fn response_code<B>(resp: &http::Response<B>) -> tonic::Code {
    resp.headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(tonic::Code::Ok, tonic::Code::from)
}

/// tonic answers a request it cannot decode INTERNAL "failed to decode
/// Protobuf message", before any handler runs: a `metadata_filter` nested
/// 40 deep (prost stops at 100 levels of messages, and each level of a
/// Struct is three) got INTERNAL from the gateway, the server's fault by
/// its code (`engram soak --only high`, issue 47). Bytes that are not the
/// RPC's message are the caller's error: INVALID_ARGUMENT, saying what
/// the rule is.
fn undecodable_is_invalid<B>(mut resp: http::Response<B>) -> http::Response<B> {
    let h = resp.headers();
    let undecodable = h.get("grpc-status").is_some_and(|v| v == "13")
        && (h.get("grpc-message").and_then(|v| v.to_str().ok()))
            .is_some_and(|m| m.starts_with(UNDECODABLE) || m.starts_with(UNDECODABLE_ENCODED));
    if !undecodable {
        return resp;
    }
    let message: String = UNDECODABLE_RULE
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    let headers = resp.headers_mut();
    headers.insert("grpc-status", http::HeaderValue::from_static("3"));
    if let Ok(v) = http::HeaderValue::from_str(&message) {
        headers.insert("grpc-message", v);
    }
    resp
}

/// What the caller of an undecodable request is told.
const UNDECODABLE_RULE: &str = "request: cannot be decoded as this RPC's message (messages nest \
     at most 100 levels deep; a Struct such as metadata_filter or metadata takes three per level)";

/// How tonic's decode failure starts, as sent and percent-encoded.
const UNDECODABLE: &str = "failed to decode Protobuf message";
const UNDECODABLE_ENCODED: &str = "failed%20to%20decode%20Protobuf%20message";

/// Health probes and reflection would flood traces with noise; they are
/// still counted.
fn traced(service: &str) -> bool {
    !service.starts_with("grpc.")
}

#[derive(Clone, Copy)]
struct ObserveLayer;

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observe<S>;
    fn layer(&self, inner: S) -> Observe<S> {
        Observe { inner }
    }
}

/// Per request: extract the caller's trace context, open the server span,
/// count and time the call.
#[derive(Clone)]
struct Observe<S> {
    inner: S,
}

/// Decrements in-flight when the call ends, including when the client
/// cancels and the future is dropped.
struct InFlight {
    service: &'static str,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(m) = metrics() {
            m.in_flight.with_label_values(&[self.service]).dec();
        }
    }
}

impl<S, B, RB> tower::Service<http::Request<B>> for Observe<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The clone is not ready; keep the one that is (tower's usual dance).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (service, method) = labels(req.uri().path());
        let span = if traced(service) {
            let span = tracing::info_span!(
                "grpc.server",
                otel.name = format!("{service}/{method}"),
                otel.kind = "server",
                otel.status_code = tracing::field::Empty,
                rpc.system = "grpc",
                rpc.service = service,
                rpc.method = method,
                rpc.grpc.status_code = tracing::field::Empty,
            );
            crate::telemetry::set_remote_parent(&span, req.headers());
            span
        } else {
            tracing::Span::none()
        };
        let guard = metrics().map(|m| {
            m.in_flight.with_label_values(&[service]).inc();
            InFlight { service }
        });
        let start = Instant::now();
        let fut = {
            let _entered = span.enter();
            inner.call(req)
        };
        let record_span = span.clone();
        Box::pin(
            async move {
                let r = fut.await;
                let code = match &r {
                    Ok(resp) => response_code(resp),
                    Err(_) => tonic::Code::Unknown,
                };
                if let Some(m) = metrics() {
                    m.requests
                        .with_label_values(&[service, method, code_name(code)])
                        .inc();
                    m.latency
                        .with_label_values(&[service, method])
                        .observe(start.elapsed().as_secs_f64());
                }
                record_span.record("rpc.grpc.status_code", code as i32);
                if matches!(
                    code,
                    tonic::Code::Unknown
                        | tonic::Code::DeadlineExceeded
                        | tonic::Code::Unimplemented
                        | tonic::Code::Internal
                        | tonic::Code::Unavailable
                        | tonic::Code::DataLoss
                ) {
                    // Server-side failures only, per the OTel rpc conventions.
                    record_span.record("otel.status_code", "ERROR");
                }
                drop(guard);
                r
            }
            .instrument(span),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_handler_answers_internal() {
        use tower::{Layer as _, ServiceExt as _};
        let panics = tower::service_fn(|_req: http::Request<tonic::body::Body>| async {
            if true {
                panic!("boom at a char boundary");
            }
            Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::empty()))
        });
        let svc = CatchPanicLayer::custom(panic_response).layer(panics);
        let req = http::Request::new(tonic::body::Body::empty());
        let resp = svc.oneshot(req).await.expect("answered");
        assert_eq!(resp.status(), http::StatusCode::OK);
        assert_eq!(
            resp.headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok()),
            Some("13")
        );
    }

    #[test]
    fn an_undecodable_request_is_invalid_argument_and_other_errors_stay() {
        let resp = |code: tonic::Code, msg: &str| {
            tonic::Status::new(code, msg).into_http::<tonic::body::Body>()
        };
        let code = |r: &http::Response<tonic::body::Body>| response_code(r);
        let undecodable = resp(
            tonic::Code::Internal,
            "failed to decode Protobuf message: Struct.fields: recursion limit reached",
        );
        let r = undecodable_is_invalid(undecodable);
        assert_eq!(code(&r), tonic::Code::InvalidArgument);
        let status = tonic::Status::from_header_map(r.headers()).expect("a status");
        assert!(
            status.message().starts_with("request: cannot be decoded"),
            "{status:?}"
        );
        let other = undecodable_is_invalid(resp(tonic::Code::Internal, "internal error"));
        assert_eq!(code(&other), tonic::Code::Internal);
        let ok = undecodable_is_invalid(http::Response::new(tonic::body::Body::empty()));
        assert_eq!(code(&ok), tonic::Code::Ok);
    }

    #[test]
    fn labels_are_closed_sets() {
        assert_eq!(
            labels("/engram.v1.SearchService/VectorSearch"),
            ("engram.v1.SearchService", "VectorSearch")
        );
        assert_eq!(
            labels("/grpc.health.v1.Health/Check"),
            ("grpc.health.v1.Health", "Check")
        );
        assert_eq!(labels("/made.up/Path"), ("unknown", "unknown"));
    }

    async fn status(ch: tonic::transport::Channel, name: &str) -> Result<i32, tonic::Status> {
        tonic_health::pb::health_client::HealthClient::new(ch)
            .check(HealthCheckRequest {
                service: name.into(),
            })
            .await
            .map(|r| r.into_inner().status)
    }

    /// A real gRPC server on port 0 with short limits (200 ms to the first
    /// call, 300 ms idle): a connection that sends nothing, or half the
    /// HTTP/2 preface, is closed (issue 47, item 17: held 70 s before); a
    /// health Watch stream, a call in flight, outlives both limits.
    #[tokio::test]
    async fn grpc_connections_without_a_call_in_time_are_closed() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (reporter, health) = health();
        reporter
            .set_service_status("engram.v1.GraphService", ServingStatus::Serving)
            .await;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let opts = ServeOptions {
            limits: crate::conn::Limits {
                first_call: Duration::from_millis(200),
                idle: Duration::from_millis(300),
            },
            drain_grace: Duration::from_millis(500),
            ..ServeOptions::default()
        };
        let server = tokio::spawn(serve_with(
            listener,
            Routes::default(),
            health,
            opts,
            async {
                let _ = rx.await;
            },
        ));
        for sent in [&b""[..], b"PRI * HTTP/2.0\r\n"] {
            let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
            tcp.write_all(sent).await.expect("write");
            let t0 = Instant::now();
            let mut rest = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut rest));
            assert!(read.await.is_ok(), "{sent:?}: still open after 5 s");
            assert!(t0.elapsed() >= Duration::from_millis(150), "{sent:?}");
        }
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        let mut watch = tonic_health::pb::health_client::HealthClient::new(ch)
            .watch(HealthCheckRequest {
                service: "engram.v1.GraphService".into(),
            })
            .await
            .expect("watch")
            .into_inner();
        let first = watch.message().await.expect("watch msg").expect("some");
        assert_eq!(first.status, 1);
        tokio::time::sleep(Duration::from_secs(1)).await;
        reporter
            .set_service_status("engram.v1.GraphService", ServingStatus::NotServing)
            .await;
        let next = watch.message().await.expect("the stream is still open");
        assert_eq!(next.expect("some").status, 2);
        drop(watch);
        let _ = tx.send(());
        server.await.expect("join").expect("serve");
    }

    /// Shutdown flips health first (a watch sees NOT_SERVING and ends), the
    /// server keeps answering for `drain_delay`, then stops within the grace.
    #[tokio::test]
    async fn shutdown_reports_not_serving_before_closing() {
        let (reporter, health) = health();
        reporter
            .set_service_status("engram.v1.GraphService", ServingStatus::Serving)
            .await;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let opts = ServeOptions {
            drain_delay: Duration::from_millis(400),
            drain_grace: Duration::from_secs(2),
            ..ServeOptions::default()
        };
        let server = tokio::spawn(serve_with(
            listener,
            Routes::default(),
            health,
            opts.clone(),
            async {
                let _ = rx.await;
            },
        ));
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        assert_eq!(status(ch.clone(), "").await.expect("check"), 1);
        assert_eq!(
            status(ch.clone(), "engram.v1.GraphService")
                .await
                .expect("check"),
            1
        );
        let mut watch = tonic_health::pb::health_client::HealthClient::new(ch.clone())
            .watch(HealthCheckRequest {
                service: "engram.v1.GraphService".into(),
            })
            .await
            .expect("watch")
            .into_inner();
        let first = watch.message().await.expect("watch msg").expect("some");
        assert_eq!(first.status, 1);

        let t0 = Instant::now();
        let _ = tx.send(());
        let next = watch.message().await.expect("watch msg").expect("some");
        assert_eq!(next.status, 2, "watch sees NOT_SERVING on drain");
        assert!(watch.message().await.expect("end").is_none(), "watch ends");
        // A fresh connection still gets an answer during the delay.
        let fresh = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
            .expect("listener still open while draining");
        assert_eq!(status(fresh.clone(), "").await.expect("check"), 2);
        assert_eq!(
            status(fresh, "engram.v1.GraphService")
                .await
                .expect("check"),
            2
        );
        assert!(t0.elapsed() < opts.drain_delay, "checked within the delay");
        server.await.expect("join").expect("serve");
        assert!(t0.elapsed() >= opts.drain_delay);
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "listener closed after the drain"
        );

        let text = metrics_text();
        assert!(
            text.contains(
                "engram_grpc_server_requests_total{code=\"OK\",method=\"Check\",service=\"grpc.health.v1.Health\"}"
            ),
            "{text}"
        );
    }
}
