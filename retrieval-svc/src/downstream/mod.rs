//! The one place where a downstream call gets its resilience: every RPC the
//! gateway makes goes through [`layered`], which stacks (outside → in)
//! metrics, the per-strategy timeout, retry (idempotent reads only, inside a
//! shared retry budget), a circuit breaker, load shedding and a concurrency
//! limit. Metrics sit outside retry so a retried call counts once.
//!
//! The breaker is hand-written rather than tower-resilience 0.13's: that one
//! keeps time with `std::time::Instant`, so its open → half-open transition
//! cannot be driven by tokio's paused clock in tests, and it adds a boxed
//! future per call anyway. This one is ~100 lines, uses `tokio::time`, and
//! counts a call cancelled by the outer timeout as a failure, so a hanging
//! downstream trips it exactly like a failing one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use engram_common::{Identity, Settings};
use engram_proto::graph_service_client::GraphServiceClient;
use engram_proto::rerank_service_client::RerankServiceClient;
use engram_proto::search_service_client::SearchServiceClient;
use engram_proto::{
    AddEdgesRequest, AddEdgesResponse, ContradictionsRequest, ContradictionsResponse,
    DeleteRequest, DeleteResponse, EmbedRequest, EmbedResponse, GetRequest, GetResponse,
    KeywordSearchRequest, NeighborsRequest, NeighborsResponse, PprRequest, PprResponse,
    ScoreRequest, ScoreResponse, SearchResponse, StoreFeedbackRequest, StoreFeedbackResponse,
    UpsertRequest, UpsertResponse, VectorSearchRequest,
};
use parking_lot::Mutex;
use tokio::time::Instant;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};
use tower::retry::budget::{Budget, TpsBudget};
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tracing::Instrument as _;

pub use crate::metrics::StackMetrics;
use crate::metrics::{CallOutcome, Metrics};

/// A downstream request with the caller identity that travels in metadata.
#[derive(Debug, Clone)]
pub struct Call<T> {
    pub identity: Arc<Identity>,
    pub msg: T,
}

impl<T> Call<T> {
    pub fn new(identity: &Arc<Identity>, msg: T) -> Self {
        Self {
            identity: identity.clone(),
            msg,
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum DownstreamError {
    #[error("timed out")]
    Timeout,
    #[error("circuit open")]
    CircuitOpen,
    #[error("overloaded")]
    Overloaded,
    #[error("status {}: {}", .0.code(), .0.message())]
    Status(Status),
    #[error("{0}")]
    Other(String),
}

impl DownstreamError {
    fn classify(e: BoxError) -> Self {
        if e.is::<tower::timeout::error::Elapsed>() {
            Self::Timeout
        } else if e.is::<BreakerOpen>() {
            Self::CircuitOpen
        } else if e.is::<tower::load_shed::error::Overloaded>() {
            Self::Overloaded
        } else {
            match e.downcast::<Status>() {
                Ok(s) => Self::Status(*s),
                Err(e) => Self::Other(e.to_string()),
            }
        }
    }
}

pub type Down<T, R> = BoxCloneSyncService<Call<T>, R, DownstreamError>;

/// Calls one stack without holding it across the await (stacks are cheap
/// clones sharing breaker, limit and metrics).
pub async fn call<T, R>(
    svc: &Down<T, R>,
    identity: &Arc<Identity>,
    msg: T,
) -> Result<R, DownstreamError>
where
    T: Send + 'static,
    R: Send + 'static,
{
    svc.clone().oneshot(Call::new(identity, msg)).await
}

#[derive(Debug, Clone)]
pub struct BreakerConfig {
    /// Consecutive failures that open the circuit.
    pub failure_threshold: u32,
    pub open_for: Duration,
    /// Trial calls let through while half-open.
    pub half_open_trials: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            open_for: Duration::from_secs(5),
            half_open_trials: 1,
        }
    }
}

#[derive(Debug, Clone)]
pub struct StackSpec {
    pub name: &'static str,
    pub timeout: Duration,
    pub idempotent: bool,
    pub max_concurrency: usize,
    pub breaker: BreakerConfig,
}

/// Builds the resilience stack around `inner` (a tonic call in production,
/// a `tower_test` mock in tests).
pub fn layered<S, T, R>(
    spec: &StackSpec,
    budget: Arc<TpsBudget>,
    metrics: Arc<StackMetrics>,
    inner: S,
) -> (Down<T, R>, BreakerHandle)
where
    S: Service<Call<T>, Response = R, Error = BoxError> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    T: Clone + Send + Sync + 'static,
    R: Send + 'static,
{
    let breaker = BreakerLayer::new(spec.breaker.clone());
    let handle = BreakerHandle(breaker.shared.clone());
    let name = spec.name;
    let svc = ServiceBuilder::new()
        .map_future(move |fut| {
            let metrics = metrics.clone();
            let start = Instant::now();
            // One client span per call (retries included), a child of the
            // caller's stage span; `rpc` injects its context as traceparent.
            let span = tracing::info_span!(
                "downstream",
                otel.name = format!("downstream.{name}"),
                otel.kind = "client",
                otel.status_code = tracing::field::Empty,
                rpc.system = "grpc",
                downstream = name,
                outcome = tracing::field::Empty,
            );
            let record = span.clone();
            async move {
                let r: Result<R, DownstreamError> = fut.await;
                let (outcome, label) = match &r {
                    Ok(_) => (CallOutcome::Ok, "ok"),
                    Err(DownstreamError::Timeout) => (CallOutcome::Timeout, "timeout"),
                    Err(DownstreamError::CircuitOpen) => (CallOutcome::CircuitOpen, "circuit_open"),
                    Err(DownstreamError::Overloaded) => (CallOutcome::Overloaded, "overloaded"),
                    Err(_) => (CallOutcome::Error, "error"),
                };
                metrics.record(outcome, start.elapsed());
                record.record("outcome", label);
                if let Err(e) = &r {
                    record.record("otel.status_code", "ERROR");
                    tracing::debug!(downstream = name, error = %e, "downstream call failed");
                }
                r
            }
            .instrument(span)
        })
        .map_err(DownstreamError::classify)
        .timeout(spec.timeout)
        .retry(RetryPolicy {
            idempotent: spec.idempotent,
            budget,
            retries_left: 1,
        })
        .layer(breaker)
        .load_shed()
        .concurrency_limit(spec.max_concurrency)
        .service(inner);
    (BoxCloneSyncService::new(svc), handle)
}

/// tower clones the policy per call, so `retries_left` bounds one call's
/// retries: without it a refusing downstream was retried every 10 ms until
/// the shared budget ran dry, and one query's retries alone opened the
/// breaker for everyone.
#[derive(Clone)]
struct RetryPolicy {
    idempotent: bool,
    budget: Arc<TpsBudget>,
    retries_left: u32,
}

impl<T: Clone, R> tower::retry::Policy<Call<T>, R, BoxError> for RetryPolicy {
    type Future = Pin<Box<tokio::time::Sleep>>;

    fn retry(
        &mut self,
        _req: &mut Call<T>,
        result: &mut Result<R, BoxError>,
    ) -> Option<Self::Future> {
        match result {
            Ok(_) => {
                self.budget.deposit();
                None
            }
            Err(e) => {
                // Only transient transport failures; the breaker's own
                // rejection and client errors are final.
                let transient = e
                    .downcast_ref::<Status>()
                    .is_some_and(|s| s.code() == tonic::Code::Unavailable);
                if self.idempotent && transient && self.retries_left > 0 && self.budget.withdraw() {
                    self.retries_left -= 1;
                    Some(Box::pin(tokio::time::sleep(Duration::from_millis(10))))
                } else {
                    None
                }
            }
        }
    }

    fn clone_request(&mut self, req: &Call<T>) -> Option<Call<T>> {
        self.idempotent.then(|| req.clone())
    }
}

// ---------------------------------------------------------------- breaker

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerPhase {
    Closed,
    Open,
    HalfOpen,
}

#[derive(Debug)]
struct BreakerState {
    phase: BreakerPhase,
    open_until: Instant,
    consecutive_failures: u32,
    trials_in_flight: u32,
}

#[derive(Debug, thiserror::Error)]
#[error("circuit open")]
pub struct BreakerOpen;

#[derive(Clone)]
pub struct BreakerHandle(Arc<Mutex<BreakerState>>);

impl BreakerHandle {
    /// The phase as a caller would see it now (an expired open is half-open).
    pub fn phase(&self) -> BreakerPhase {
        let s = self.0.lock();
        if s.phase == BreakerPhase::Open && Instant::now() >= s.open_until {
            BreakerPhase::HalfOpen
        } else {
            s.phase
        }
    }
}

#[derive(Clone)]
pub struct BreakerLayer {
    cfg: Arc<BreakerConfig>,
    shared: Arc<Mutex<BreakerState>>,
}

impl BreakerLayer {
    pub fn new(cfg: BreakerConfig) -> Self {
        Self {
            cfg: Arc::new(cfg),
            shared: Arc::new(Mutex::new(BreakerState {
                phase: BreakerPhase::Closed,
                open_until: Instant::now(),
                consecutive_failures: 0,
                trials_in_flight: 0,
            })),
        }
    }
}

impl<S> Layer<S> for BreakerLayer {
    type Service = Breaker<S>;
    fn layer(&self, inner: S) -> Breaker<S> {
        Breaker {
            inner,
            cfg: self.cfg.clone(),
            shared: self.shared.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Breaker<S> {
    inner: S,
    cfg: Arc<BreakerConfig>,
    shared: Arc<Mutex<BreakerState>>,
}

fn admit(s: &mut BreakerState, cfg: &BreakerConfig) -> bool {
    match s.phase {
        BreakerPhase::Closed => true,
        BreakerPhase::Open => {
            if Instant::now() >= s.open_until {
                s.phase = BreakerPhase::HalfOpen;
                s.trials_in_flight = 1;
                true
            } else {
                false
            }
        }
        BreakerPhase::HalfOpen => {
            if s.trials_in_flight < cfg.half_open_trials {
                s.trials_in_flight += 1;
                true
            } else {
                false
            }
        }
    }
}

fn record(shared: &Mutex<BreakerState>, cfg: &BreakerConfig, failed: bool) {
    let mut s = shared.lock();
    match (s.phase, failed) {
        (BreakerPhase::HalfOpen, true) => {
            s.phase = BreakerPhase::Open;
            s.open_until = Instant::now() + cfg.open_for;
            s.trials_in_flight = 0;
            tracing::warn!("downstream circuit re-opened after failed trial");
        }
        (BreakerPhase::HalfOpen, false) => {
            s.phase = BreakerPhase::Closed;
            s.consecutive_failures = 0;
            s.trials_in_flight = 0;
        }
        (BreakerPhase::Closed, true) => {
            s.consecutive_failures += 1;
            if s.consecutive_failures >= cfg.failure_threshold {
                s.phase = BreakerPhase::Open;
                s.open_until = Instant::now() + cfg.open_for;
                tracing::warn!(
                    failures = s.consecutive_failures,
                    "downstream circuit opened"
                );
            }
        }
        (BreakerPhase::Closed, false) => s.consecutive_failures = 0,
        // A late answer from before the circuit opened changes nothing.
        (BreakerPhase::Open, _) => {}
    }
}

/// Failures that say something about the downstream's health; client
/// errors (bad argument, not found, auth) do not trip the circuit.
fn is_failure<R>(r: &Result<R, BoxError>) -> bool {
    match r {
        Ok(_) => false,
        Err(e) => match e.downcast_ref::<Status>() {
            Some(s) => matches!(
                s.code(),
                tonic::Code::Unavailable
                    | tonic::Code::Unknown
                    | tonic::Code::Internal
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::ResourceExhausted
                    | tonic::Code::Cancelled
            ),
            None => true,
        },
    }
}

/// Records a failure when the call is dropped before finishing (the outer
/// timeout fired), so slowness trips the breaker too.
struct Outcome {
    shared: Arc<Mutex<BreakerState>>,
    cfg: Arc<BreakerConfig>,
    done: bool,
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if !self.done {
            record(&self.shared, &self.cfg, true);
        }
    }
}

impl<S, Req> Service<Req> for Breaker<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let admitted = admit(&mut self.shared.lock(), &self.cfg);
        if !admitted {
            return Box::pin(std::future::ready(Err(BreakerOpen.into())));
        }
        let fut = self.inner.call(req);
        let mut outcome = Outcome {
            shared: self.shared.clone(),
            cfg: self.cfg.clone(),
            done: false,
        };
        Box::pin(async move {
            let r = fut.await.map_err(Into::into);
            outcome.done = true;
            record(&outcome.shared, &outcome.cfg, is_failure(&r));
            r
        })
    }
}

// ---------------------------------------------------------------- clients

type RpcFuture<R> = Pin<Box<dyn Future<Output = Result<tonic::Response<R>, Status>> + Send>>;

/// The innermost service: one tonic RPC with identity + internal token and
/// the W3C trace context in metadata, and the stack's timeout advertised as
/// grpc-timeout.
fn rpc<C, T, R>(
    client: C,
    token: Arc<str>,
    timeout: Duration,
    f: fn(C, tonic::Request<T>) -> RpcFuture<R>,
) -> impl Service<Call<T>, Response = R, Error = BoxError, Future: Send> + Clone + Send + Sync + 'static
where
    C: Clone + Send + Sync + 'static,
    T: Send + 'static,
    R: Send + 'static,
{
    tower::service_fn(move |call: Call<T>| {
        let client = client.clone();
        let token = token.clone();
        async move {
            let mut req = tonic::Request::new(call.msg);
            call.identity.write_internal(req.metadata_mut(), &token);
            engram_common::telemetry::inject_current(req.metadata_mut());
            req.set_timeout(timeout);
            f(client, req)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|s| {
                    // tonic enforces the same grpc-timeout client-side and
                    // reports it as Cancelled; it is our timeout, so count
                    // it as one (metrics, breaker, DownstreamError::Timeout).
                    if s.code() == tonic::Code::Cancelled && s.message() == "Timeout expired" {
                        BoxError::from(tower::timeout::error::Elapsed::new())
                    } else {
                        BoxError::from(s)
                    }
                })
        }
    })
}

type Search = SearchServiceClient<Channel>;
type Graph = GraphServiceClient<Channel>;
type Rerank = RerankServiceClient<Channel>;

/// Every downstream RPC the gateway uses, each behind its own stack.
#[derive(Clone)]
pub struct Downstreams {
    pub vector: Down<VectorSearchRequest, SearchResponse>,
    pub keyword: Down<KeywordSearchRequest, SearchResponse>,
    pub embed: Down<EmbedRequest, EmbedResponse>,
    pub get: Down<GetRequest, GetResponse>,
    pub upsert: Down<UpsertRequest, UpsertResponse>,
    pub delete: Down<DeleteRequest, DeleteResponse>,
    pub add_edges: Down<AddEdgesRequest, AddEdgesResponse>,
    pub store_feedback: Down<StoreFeedbackRequest, StoreFeedbackResponse>,
    pub ppr: Down<PprRequest, PprResponse>,
    pub contradictions: Down<ContradictionsRequest, ContradictionsResponse>,
    /// Causal expansion for working-memory fallback (`GetMemory`).
    pub neighbors: Down<NeighborsRequest, NeighborsResponse>,
    pub score: Down<ScoreRequest, ScoreResponse>,
    /// The gateway's registry: downstream families and the pipeline's.
    pub metrics: Arc<Metrics>,
    pub breakers: Arc<Vec<(&'static str, BreakerHandle)>>,
}

const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

impl Downstreams {
    /// Lazy channels: a downstream that is not up yet only fails its calls.
    pub fn connect(settings: &Settings) -> anyhow::Result<Self> {
        let ds = &settings.downstream;
        let p = &settings.pipeline;
        let token: Arc<str> =
            Arc::from(settings.auth.internal_token_opt.clone().unwrap_or_default());
        let channel = |uri: &str| -> anyhow::Result<Channel> {
            Ok(Endpoint::from_shared(uri.to_string())
                .map_err(|e| anyhow::anyhow!("downstream uri {uri}: {e}"))?
                .connect_timeout(Duration::from_secs(1))
                .tcp_nodelay(true)
                .connect_lazy())
        };
        let search = Search::new(channel(&ds.search)?)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        let graph = Graph::new(channel(&ds.graph)?);
        let rerank = Rerank::new(channel(&ds.rerank)?);
        let ms = Duration::from_millis;
        let mut b = Builder {
            budget_search: Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.2)),
            budget_graph: Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.2)),
            budget_rerank: Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.2)),
            metrics: Arc::new(Metrics::new()?),
            breakers: Vec::new(),
        };
        let breaker = BreakerConfig {
            failure_threshold: ds.breaker_failures.max(1),
            open_for: ms(ds.breaker_open_ms),
            half_open_trials: 1,
        };
        let limit = ds.max_concurrency.max(1);
        let spec = |name, timeout, idempotent, max_concurrency: usize| StackSpec {
            name,
            timeout,
            idempotent,
            max_concurrency: max_concurrency.min(limit),
            breaker: breaker.clone(),
        };
        let s_vector = spec("search.vector", ms(p.vector_timeout_ms), true, 64);
        let s_keyword = spec("search.keyword", ms(p.keyword_timeout_ms), true, 64);
        let s_embed = spec("search.embed", ms(p.vector_timeout_ms), true, 64);
        let s_get = spec("search.get", ms(p.vector_timeout_ms.max(300)), true, 64);
        let s_upsert = spec("search.upsert", WRITE_TIMEOUT, false, 16);
        let s_delete = spec("search.delete", WRITE_TIMEOUT, false, 16);
        let s_edges = spec("search.add_edges", WRITE_TIMEOUT, false, 16);
        let s_feedback = spec("search.store_feedback", Duration::from_secs(2), false, 4);
        let s_ppr = spec("graph.ppr", ms(p.graph_timeout_ms), true, 32);
        let s_contra = spec("graph.contradictions", ms(p.graph_timeout_ms), true, 32);
        let s_neighbors = spec("graph.neighbors", ms(p.graph_timeout_ms), true, 32);
        let s_score = spec("rerank.score", ms(p.rerank_timeout_ms), false, 16);
        let bs = b.budget_search.clone();
        let bg = b.budget_graph.clone();
        let br = b.budget_rerank.clone();
        Ok(Self {
            vector: b.add(
                &s_vector,
                &bs,
                rpc(
                    search.clone(),
                    token.clone(),
                    s_vector.timeout,
                    |mut c, r| Box::pin(async move { c.vector_search(r).await }),
                ),
            ),
            keyword: b.add(
                &s_keyword,
                &bs,
                rpc(
                    search.clone(),
                    token.clone(),
                    s_keyword.timeout,
                    |mut c, r| Box::pin(async move { c.keyword_search(r).await }),
                ),
            ),
            embed: b.add(
                &s_embed,
                &bs,
                rpc(
                    search.clone(),
                    token.clone(),
                    s_embed.timeout,
                    |mut c, r| Box::pin(async move { c.embed(r).await }),
                ),
            ),
            get: b.add(
                &s_get,
                &bs,
                rpc(search.clone(), token.clone(), s_get.timeout, |mut c, r| {
                    Box::pin(async move { c.get(r).await })
                }),
            ),
            upsert: b.add(
                &s_upsert,
                &bs,
                rpc(
                    search.clone(),
                    token.clone(),
                    s_upsert.timeout,
                    |mut c, r| Box::pin(async move { c.upsert(r).await }),
                ),
            ),
            delete: b.add(
                &s_delete,
                &bs,
                rpc(
                    search.clone(),
                    token.clone(),
                    s_delete.timeout,
                    |mut c, r| Box::pin(async move { c.delete(r).await }),
                ),
            ),
            add_edges: b.add(
                &s_edges,
                &bs,
                rpc(
                    search.clone(),
                    token.clone(),
                    s_edges.timeout,
                    |mut c, r| Box::pin(async move { c.add_edges(r).await }),
                ),
            ),
            store_feedback: b.add(
                &s_feedback,
                &bs,
                rpc(search, token.clone(), s_feedback.timeout, |mut c, r| {
                    Box::pin(async move { c.store_feedback(r).await })
                }),
            ),
            ppr: b.add(
                &s_ppr,
                &bg,
                rpc(graph.clone(), token.clone(), s_ppr.timeout, |mut c, r| {
                    Box::pin(async move { c.personalized_page_rank(r).await })
                }),
            ),
            contradictions: b.add(
                &s_contra,
                &bg,
                rpc(
                    graph.clone(),
                    token.clone(),
                    s_contra.timeout,
                    |mut c, r| Box::pin(async move { c.contradictions(r).await }),
                ),
            ),
            neighbors: b.add(
                &s_neighbors,
                &bg,
                rpc(graph, token.clone(), s_neighbors.timeout, |mut c, r| {
                    Box::pin(async move { c.neighbors(r).await })
                }),
            ),
            score: b.add(
                &s_score,
                &br,
                rpc(rerank, token, s_score.timeout, |mut c, r| {
                    Box::pin(async move { c.score(r).await })
                }),
            ),
            metrics: b.metrics,
            breakers: Arc::new(b.breakers),
        })
    }
}

struct Builder {
    budget_search: Arc<TpsBudget>,
    budget_graph: Arc<TpsBudget>,
    budget_rerank: Arc<TpsBudget>,
    metrics: Arc<Metrics>,
    breakers: Vec<(&'static str, BreakerHandle)>,
}

impl Builder {
    fn add<S, T, R>(&mut self, spec: &StackSpec, budget: &Arc<TpsBudget>, inner: S) -> Down<T, R>
    where
        S: Service<Call<T>, Response = R, Error = BoxError> + Clone + Send + Sync + 'static,
        S::Future: Send + 'static,
        T: Clone + Send + Sync + 'static,
        R: Send + 'static,
    {
        let m = Arc::new(self.metrics.stack(spec.name));
        let (svc, handle) = layered(spec, budget.clone(), m, inner);
        self.breakers.push((spec.name, handle));
        svc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engram_common::AccessLevel;
    use tower_test::mock;

    fn ident() -> Arc<Identity> {
        Arc::new(Identity {
            tenant: "t".into(),
            agent_id: "a".into(),
            trust: AccessLevel::Public,
        })
    }

    fn spec(idempotent: bool) -> StackSpec {
        StackSpec {
            name: "test",
            timeout: Duration::from_millis(300),
            idempotent,
            max_concurrency: 8,
            breaker: BreakerConfig {
                failure_threshold: 3,
                open_for: Duration::from_secs(5),
                half_open_trials: 1,
            },
        }
    }

    fn stack(idempotent: bool) -> (Down<u32, u32>, BreakerHandle, mock::Handle<Call<u32>, u32>) {
        let (m, handle) = mock::pair::<Call<u32>, u32>();
        let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 100, 0.5));
        let (svc, breaker) = layered(&spec(idempotent), budget, Arc::default(), m);
        (svc, breaker, handle)
    }

    #[tokio::test(start_paused = true)]
    async fn timeout_fires_at_the_strategy_budget() {
        let (svc, _b, mut handle) = stack(true);
        let id = ident();
        let task = tokio::spawn(async move { call(&svc, &id, 1).await });
        let (_req, _send) = handle.next_request().await.expect("request");
        // Never answered: the paused clock auto-advances to the timeout.
        let r = task.await.expect("join");
        assert!(matches!(r, Err(DownstreamError::Timeout)), "{r:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn breaker_opens_half_opens_and_closes() {
        let (svc, breaker, mut handle) = stack(false);
        let id = ident();
        for _ in 0..3 {
            let s = svc.clone();
            let i = id.clone();
            let task = tokio::spawn(async move { call(&s, &i, 1).await });
            let (_r, send) = handle.next_request().await.expect("request");
            send.send_error(Status::unavailable("down"));
            assert!(matches!(
                task.await.expect("join"),
                Err(DownstreamError::Status(_))
            ));
        }
        assert_eq!(breaker.phase(), BreakerPhase::Open);
        // While open, calls fail fast without reaching the downstream.
        let r = call(&svc, &id, 1).await;
        assert!(matches!(r, Err(DownstreamError::CircuitOpen)), "{r:?}");

        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(breaker.phase(), BreakerPhase::HalfOpen);
        let s = svc.clone();
        let i = id.clone();
        let task = tokio::spawn(async move { call(&s, &i, 7).await });
        let (req, send) = handle.next_request().await.expect("trial");
        assert_eq!(req.msg, 7);
        send.send_response(8);
        assert_eq!(task.await.expect("join").expect("trial ok"), 8);
        assert_eq!(breaker.phase(), BreakerPhase::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn slow_calls_trip_the_breaker() {
        let (svc, breaker, mut handle) = stack(false);
        let id = ident();
        for _ in 0..3 {
            let s = svc.clone();
            let i = id.clone();
            let task = tokio::spawn(async move { call(&s, &i, 1).await });
            let _pending = handle.next_request().await.expect("request");
            assert!(matches!(
                task.await.expect("join"),
                Err(DownstreamError::Timeout)
            ));
        }
        assert_eq!(breaker.phase(), BreakerPhase::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn idempotent_reads_are_retried_writes_are_not() {
        let (svc, _b, mut handle) = stack(true);
        let id = ident();
        let i = id.clone();
        let s = svc.clone();
        let task = tokio::spawn(async move { call(&s, &i, 1).await });
        let (_r, send) = handle.next_request().await.expect("first");
        send.send_error(Status::unavailable("blip"));
        let (_r, send) = handle.next_request().await.expect("retry");
        send.send_response(2);
        assert_eq!(task.await.expect("join").expect("ok"), 2);

        let (svc, _b, mut handle) = stack(false);
        let task = tokio::spawn(async move { call(&svc, &id, 1).await });
        let (_r, send) = handle.next_request().await.expect("first");
        send.send_error(Status::unavailable("blip"));
        assert!(task.await.expect("join").is_err());
    }
}
