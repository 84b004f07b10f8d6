//! Everything the gateway needs to call search-, graph- and rerank-svc:
//! one resilience stack per RPC ([`stack::layered`]: metrics, timeout or
//! deadline, retry, breaker, shedding, concurrency limit), built from one
//! table of per-RPC specs in [`Downstreams::connect`].

mod breaker;
mod deadline;
pub mod members;
mod stack;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use engram_common::settings::TenantLimitSettings;
use engram_common::{Identity, Settings};
use engram_proto::gateway_state_service_client::GatewayStateServiceClient;
use engram_proto::graph_service_client::GraphServiceClient;
use engram_proto::rerank_service_client::RerankServiceClient;
use engram_proto::search_service_client::SearchServiceClient;
use engram_proto::{
    AddEdgesRequest, AddEdgesResponse, ContradictionsRequest, ContradictionsResponse,
    DeleteEdgesRequest, DeleteEdgesResponse, DeleteRequest, DeleteResponse, EmbedRequest,
    EmbedResponse, GetRequest, GetResponse, KeywordSearchRequest, NeighborsRequest,
    NeighborsResponse, PprRequest, PprResponse, ScoreRequest, ScoreResponse, SearchResponse,
    StoreFeedbackRequest, StoreFeedbackResponse, UpsertRequest, UpsertResponse,
    VectorSearchRequest,
};
use engram_proto::{
    DeleteNotesRequest, DeleteNotesResponse, GetNotesRequest, GetNotesResponse, GetTurnRequest,
    GetTurnResponse, PutNotesRequest, PutNotesResponse, PutTurnRequest, PutTurnResponse,
};
use tokio::time::Instant;
use tonic::Status;
use tonic::transport::Channel;
use tower::retry::budget::TpsBudget;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Service, ServiceExt};

pub use breaker::{BreakerConfig, BreakerHandle};
pub use stack::{StackSpec, layered};

use crate::fair::{FairConfig, FairGate};
use crate::metrics::Metrics;

/// A downstream request with the caller identity that travels in metadata
/// and, when the caller has one, the deadline the call must finish by.
#[derive(Debug, Clone)]
pub struct Call<T> {
    pub identity: Arc<Identity>,
    pub msg: T,
    /// The stack gives up at this instant or at its own timeout, whichever
    /// comes first.
    pub deadline_opt: Option<Instant>,
    /// A write call's id, sent as `x-engram-write-id` (own_writes.rs).
    pub write_id_opt: Option<String>,
}

impl<T> Call<T> {
    pub fn new(identity: &Arc<Identity>, msg: T) -> Self {
        Self {
            identity: identity.clone(),
            msg,
            deadline_opt: None,
            write_id_opt: None,
        }
    }

    /// The call gives up at `deadline` too (a request's time left).
    pub fn until(self, deadline: Instant) -> Self {
        Self {
            deadline_opt: Some(deadline),
            ..self
        }
    }

    /// The call is a write known by `write_id` (own_writes.rs).
    pub fn write(self, write_id: &str) -> Self {
        Self {
            write_id_opt: Some(write_id.to_string()),
            ..self
        }
    }
}

/// Sends one call through its stack. Stacks are cheap clones sharing
/// breaker, limit and metrics, so none is held across the await.
pub async fn send<T, R>(svc: &Down<T, R>, c: Call<T>) -> Result<R, DownstreamError>
where
    T: Send + 'static,
    R: Send + 'static,
{
    svc.clone().oneshot(c).await
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum DownstreamError {
    /// The stack's own timeout: the downstream was too slow.
    #[error("timed out")]
    Timeout,
    /// The request's deadline passed first: the caller ran out of time.
    #[error("request deadline reached")]
    Deadline,
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
        } else if e.is::<deadline::DeadlineReached>() {
            Self::Deadline
        } else if e.is::<breaker::BreakerOpen>() {
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

/// Calls one stack, bounded by the stack's own timeout only (writes, the
/// feedback queue).
pub async fn call<T, R>(
    svc: &Down<T, R>,
    identity: &Arc<Identity>,
    msg: T,
) -> Result<R, DownstreamError>
where
    T: Send + 'static,
    R: Send + 'static,
{
    send(svc, Call::new(identity, msg)).await
}

/// Shared-state calls in flight from one gateway, all tenants together.
const STATE_CONCURRENCY: usize = 16;

/// A shared-state call (GatewayStateService) through `gate`, of which one
/// tenant holds half at most: a tenant over its share is told
/// [`DownstreamError::Overloaded`] (its callers then keep the state on this
/// replica, or refuse a delete) instead of waiting in every tenant's way.
/// Gives up at `deadline` when there is one.
pub async fn call_shared<T, R>(
    svc: &Down<T, R>,
    gate: &FairGate,
    identity: &Arc<Identity>,
    deadline_opt: Option<Instant>,
    msg: T,
) -> Result<R, DownstreamError>
where
    T: Send + 'static,
    R: Send + 'static,
{
    // The gate's own wait (tenant.slot_wait_ms) ends a wait with no deadline.
    let wait_until = deadline_opt.unwrap_or_else(|| Instant::now() + Duration::from_secs(60));
    let _slot = (gate.acquire(&identity.tenant, wait_until).await)
        .map_err(|_| DownstreamError::Overloaded)?;
    match deadline_opt {
        Some(deadline) => call_until(svc, identity, deadline, msg).await,
        None => call(svc, identity, msg).await,
    }
}

/// [`call`] that also gives up at `deadline` (a request's time left).
pub async fn call_until<T, R>(
    svc: &Down<T, R>,
    identity: &Arc<Identity>,
    deadline: Instant,
    msg: T,
) -> Result<R, DownstreamError>
where
    T: Send + 'static,
    R: Send + 'static,
{
    send(svc, Call::new(identity, msg).until(deadline)).await
}

type RpcFuture<R> = Pin<Box<dyn Future<Output = Result<tonic::Response<R>, Status>> + Send>>;

/// The grpc-timeout to advertise for a call with `own` stack timeout and
/// the caller's deadline: the time left when that is shorter (the
/// downstream stops working on an answer nobody will wait for), and whether
/// it was the caller's deadline that set it.
fn advertised_timeout(
    own: Duration,
    deadline_opt: Option<Instant>,
    now: Instant,
) -> (Duration, bool) {
    match deadline_opt.map(|d| d.saturating_duration_since(now)) {
        Some(left) if left < own => (left.max(Duration::from_millis(1)), true),
        _ => (own, false),
    }
}

/// The innermost service: one tonic RPC with identity + internal token and
/// the W3C trace context in metadata, and min(stack timeout, time left)
/// advertised as grpc-timeout.
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
            if let Some(id) = &call.write_id_opt {
                engram_common::identity::write_write_id(req.metadata_mut(), id);
            }
            engram_common::telemetry::inject_current(req.metadata_mut());
            let (advertised, by_caller) =
                advertised_timeout(timeout, call.deadline_opt, Instant::now());
            req.set_timeout(advertised);
            f(client, req)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|s| {
                    // tonic enforces the same grpc-timeout client-side and
                    // reports it as Cancelled; it is a timeout: the stack's
                    // own (a failure) or the caller's deadline (neutral).
                    // A downstream that gave up on the caller's advertised
                    // time (DEADLINE_EXCEEDED) ran out of the caller's time
                    // too.
                    let client_timer =
                        s.code() == tonic::Code::Cancelled && s.message() == "Timeout expired";
                    let gave_up = s.code() == tonic::Code::DeadlineExceeded;
                    if by_caller && (client_timer || gave_up) {
                        BoxError::from(deadline::DeadlineReached)
                    } else if client_timer {
                        BoxError::from(tower::timeout::error::Elapsed::new())
                    } else {
                        BoxError::from(s)
                    }
                })
        }
    })
}

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
    pub delete_edges: Down<DeleteEdgesRequest, DeleteEdgesResponse>,
    pub store_feedback: Down<StoreFeedbackRequest, StoreFeedbackResponse>,
    pub ppr: Down<PprRequest, PprResponse>,
    pub contradictions: Down<ContradictionsRequest, ContradictionsResponse>,
    /// Causal expansion for working-memory fallback (`GetMemory`).
    pub neighbors: Down<NeighborsRequest, NeighborsResponse>,
    pub score: Down<ScoreRequest, ScoreResponse>,
    /// Turn answers every gateway replica shares (search-svc's
    /// GatewayStateService, Postgres).
    pub get_turn: Down<GetTurnRequest, GetTurnResponse>,
    pub put_turn: Down<PutTurnRequest, PutTurnResponse>,
    /// Working-memory notes every replica shares (the same service).
    pub put_notes: Down<PutNotesRequest, PutNotesResponse>,
    pub get_notes: Down<GetNotesRequest, GetNotesResponse>,
    pub delete_notes: Down<DeleteNotesRequest, DeleteNotesResponse>,
    /// Every stack's breaker, for the circuit-state gauge.
    pub breakers: Arc<Vec<(&'static str, BreakerHandle)>>,
    /// search-svc's channel, for its long-lived change feed (no stack: a
    /// stream that lives as long as the gateway has no timeout to keep).
    pub search_channel: Channel,
    /// Each tenant's share of the write stacks ([`WriteGates`]).
    pub write_gates: Arc<WriteGates>,
    /// Each tenant's share of the listings in flight (ListMemories and
    /// ListConflicts go to search-svc's channel directly, with no stack):
    /// 16 listing threads of one key took another tenant's retrieval p95
    /// from 20 to 270 ms (issue 47, item 7).
    pub list_gate: Arc<FairGate>,
    /// Each tenant's share of the shared-state calls in flight (the five
    /// GatewayStateService stacks together): one tenant's notes and turn
    /// answers cannot take the slots every other tenant's sharing needs.
    pub state_gate: Arc<FairGate>,
}

/// Listings in flight, all tenants together; one tenant alone at most half.
const LIST_CONCURRENCY: usize = 4;

fn list_gate(tenant: &TenantLimitSettings) -> FairGate {
    half_gate(tenant, LIST_CONCURRENCY).named("listings in flight")
}

const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Calls in flight to each of search-svc's write RPCs (upsert, delete,
/// add_edges, delete_edges), all tenants together.
const WRITE_CONCURRENCY: usize = 16;

/// One tenant's share of each write stack, taken before the call: at most
/// half of the stack's slots, fewer while more tenants are active
/// (fair.rs). One tenant's write lane (`tenant.max_concurrent`, 32) could
/// fill the 16 slots of `search.upsert`, and every other tenant's writes
/// were shed as "overloaded" (issue 47). Over its share a tenant waits, as
/// its reads wait for a work slot, at most `tenant.slot_wait_ms`, then gets
/// RESOURCE_EXHAUSTED: the wait costs nobody else a slot, and a refusal
/// tells the flooding client, and only it, to back off.
pub struct WriteGates {
    pub upsert: FairGate,
    pub delete: FairGate,
    /// AddEdges and DeleteEdges together.
    pub add_edges: FairGate,
}

impl WriteGates {
    /// Gates for write stacks of `stack_limit` slots each.
    pub fn new(tenant: &TenantLimitSettings, stack_limit: usize) -> Self {
        let gate = |what| half_gate(tenant, stack_limit).named(what);
        Self {
            upsert: gate("search upserts in flight"),
            delete: gate("search deletes in flight"),
            add_edges: gate("search edge writes in flight"),
        }
    }
}

/// A gate of `stack_limit` slots of which one tenant holds half at most (at
/// least one), so another tenant always finds one free.
fn half_gate(tenant: &TenantLimitSettings, stack_limit: usize) -> FairGate {
    let slots = u32::try_from(stack_limit).unwrap_or(u32::MAX).max(1);
    FairGate::new(FairConfig {
        slots,
        alone: (slots / 2).max(1),
        active_window: Duration::from_millis(tenant.active_window_ms),
        max_wait: Duration::from_millis(tenant.slot_wait_ms),
    })
}

/// The three services; each has its own retry budget so one failing
/// service cannot spend another's retries.
#[derive(Clone, Copy)]
enum Service3 {
    Search,
    Graph,
    Rerank,
}

impl Downstreams {
    /// Lazy channels: a downstream that is not up yet only fails its calls.
    /// Stack metrics register in `metrics`' registry.
    pub fn connect(settings: &Settings, metrics: &Metrics) -> anyhow::Result<Self> {
        let ds = &settings.downstream;
        let p = &settings.pipeline;
        let channel = |uri: &str| -> anyhow::Result<Channel> {
            Ok(engram_common::tls::endpoint(uri, &settings.tls)?.connect_lazy())
        };
        let search_channel = channel(&ds.search)?;
        let search = SearchServiceClient::new(search_channel.clone())
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        let state = GatewayStateServiceClient::new(search_channel.clone())
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        let graph = GraphServiceClient::new(channel(&ds.graph)?);
        let rerank = RerankServiceClient::new(channel(&ds.rerank)?);
        let mut b = Builder::new(settings, metrics);
        let ms = Duration::from_millis;
        let (read, write, graph_t) = (
            ms(p.vector_timeout_ms),
            WRITE_TIMEOUT,
            ms(p.graph_timeout_ms),
        );
        use Service3::{Graph as G, Rerank as R, Search as S};
        // name, service, timeout, idempotent (retried), max concurrency
        Ok(Self {
            vector: b.add(("search.vector", S, read, true, 64), &search, |mut c, r| {
                Box::pin(async move { c.vector_search(r).await })
            }),
            keyword: b.add(
                ("search.keyword", S, ms(p.keyword_timeout_ms), true, 64),
                &search,
                |mut c, r| Box::pin(async move { c.keyword_search(r).await }),
            ),
            embed: b.add(("search.embed", S, read, true, 64), &search, |mut c, r| {
                Box::pin(async move { c.embed(r).await })
            }),
            get: b.add(
                ("search.get", S, ms(p.vector_timeout_ms.max(300)), true, 64),
                &search,
                |mut c, r| Box::pin(async move { c.get(r).await }),
            ),
            upsert: b.add(
                ("search.upsert", S, write, false, WRITE_CONCURRENCY),
                &search,
                |mut c, r| Box::pin(async move { c.upsert(r).await }),
            ),
            delete: b.add(
                ("search.delete", S, write, false, WRITE_CONCURRENCY),
                &search,
                |mut c, r| Box::pin(async move { c.delete(r).await }),
            ),
            add_edges: b.add(
                ("search.add_edges", S, write, false, WRITE_CONCURRENCY),
                &search,
                |mut c, r| Box::pin(async move { c.add_edges(r).await }),
            ),
            delete_edges: b.add(
                ("search.delete_edges", S, write, false, WRITE_CONCURRENCY),
                &search,
                |mut c, r| Box::pin(async move { c.delete_edges(r).await }),
            ),
            store_feedback: b.add(
                ("search.store_feedback", S, Duration::from_secs(2), false, 4),
                &search,
                |mut c, r| Box::pin(async move { c.store_feedback(r).await }),
            ),
            ppr: b.add(("graph.ppr", G, graph_t, true, 32), &graph, |mut c, r| {
                Box::pin(async move { c.personalized_page_rank(r).await })
            }),
            contradictions: b.add(
                ("graph.contradictions", G, graph_t, true, 32),
                &graph,
                |mut c, r| Box::pin(async move { c.contradictions(r).await }),
            ),
            neighbors: b.add(
                ("graph.neighbors", G, graph_t, true, 32),
                &graph,
                |mut c, r| Box::pin(async move { c.neighbors(r).await }),
            ),
            score: b.add(
                ("rerank.score", R, ms(p.rerank_timeout_ms), false, 16),
                &rerank,
                |mut c, r| Box::pin(async move { c.score(r).await }),
            ),
            get_turn: b.add(
                ("search.get_turn", S, read, true, 16),
                &state,
                |mut c, r| Box::pin(async move { c.get_turn(r).await }),
            ),
            put_turn: b.add(
                ("search.put_turn", S, read, false, 16),
                &state,
                |mut c, r| Box::pin(async move { c.put_turn(r).await }),
            ),
            put_notes: b.add(
                ("search.put_notes", S, read, false, 16),
                &state,
                |mut c, r| Box::pin(async move { c.put_notes(r).await }),
            ),
            get_notes: b.add(
                ("search.get_notes", S, read, true, 16),
                &state,
                |mut c, r| Box::pin(async move { c.get_notes(r).await }),
            ),
            delete_notes: b.add(
                ("search.delete_notes", S, read, false, 16),
                &state,
                |mut c, r| Box::pin(async move { c.delete_notes(r).await }),
            ),
            breakers: Arc::new(b.breakers),
            search_channel,
            write_gates: Arc::new(WriteGates::new(
                &settings.tenant,
                WRITE_CONCURRENCY.min(ds.max_concurrency.max(1)),
            )),
            list_gate: Arc::new(list_gate(&settings.tenant)),
            state_gate: Arc::new(
                half_gate(&settings.tenant, STATE_CONCURRENCY)
                    .named("shared state calls in flight"),
            ),
        })
    }
}

/// One row of the table in [`Downstreams::connect`]: stack name, service,
/// timeout, idempotent, max concurrency.
type Row = (&'static str, Service3, Duration, bool, usize);

/// Turns table rows into stacks: shared breaker settings, the concurrency
/// cap from settings, one retry budget per service, the internal token.
struct Builder<'a> {
    token: Arc<str>,
    breaker: BreakerConfig,
    max_concurrency: usize,
    budgets: [Arc<TpsBudget>; 3],
    metrics: &'a Metrics,
    breakers: Vec<(&'static str, BreakerHandle)>,
}

impl<'a> Builder<'a> {
    fn new(settings: &Settings, metrics: &'a Metrics) -> Self {
        let ds = &settings.downstream;
        let budget = || Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.2));
        Self {
            token: Arc::from(settings.auth.internal_token_opt.clone().unwrap_or_default()),
            breaker: BreakerConfig {
                failure_threshold: ds.breaker_failures.max(1),
                open_for: Duration::from_millis(ds.breaker_open_ms),
                half_open_trials: 1,
                ..BreakerConfig::default()
            },
            max_concurrency: ds.max_concurrency.max(1),
            budgets: [budget(), budget(), budget()],
            metrics,
            breakers: Vec::new(),
        }
    }

    fn add<C, T, R>(
        &mut self,
        (name, service, timeout, idempotent, max_concurrency): Row,
        client: &C,
        f: fn(C, tonic::Request<T>) -> RpcFuture<R>,
    ) -> Down<T, R>
    where
        C: Clone + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
        R: Send + 'static,
    {
        let spec = StackSpec {
            name,
            timeout,
            idempotent,
            max_concurrency: max_concurrency.min(self.max_concurrency),
            breaker: self.breaker.clone(),
        };
        let inner = rpc(client.clone(), self.token.clone(), timeout, f);
        let budget = self.budgets[service as usize].clone();
        let m = Arc::new(self.metrics.stack(name));
        let (svc, handle) = layered(&spec, budget, m, inner);
        self.breakers.push((name, handle));
        svc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    #[tokio::test(start_paused = true)]
    async fn one_tenant_never_holds_more_than_half_a_write_stack() {
        let gates = WriteGates::new(&TenantLimitSettings::default(), WRITE_CONCURRENCY);
        let mut held = Vec::new();
        for _ in 0..WRITE_CONCURRENCY / 2 {
            held.push(gates.upsert.acquire("a", soon()).await.expect("its half"));
        }
        let over = gates.upsert.acquire("a", soon()).await;
        assert!(
            matches!(
                over,
                Err(crate::error::Error::TenantLimit {
                    what: "search upserts in flight",
                    ..
                })
            ),
            "a alone is held to half of the 16 slots"
        );
        let started = Instant::now();
        let _b = gates.upsert.acquire("b", soon()).await.expect("b's slot");
        assert_eq!(started.elapsed(), Duration::ZERO, "b never waits for a");
        assert_eq!(held.len(), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_over_its_share_of_shared_state_is_told_overloaded() {
        let gate = half_gate(&TenantLimitSettings::default(), 2);
        let svc: Down<u32, u32> =
            BoxCloneSyncService::new(tower::service_fn(|c: Call<u32>| async move {
                Ok::<_, DownstreamError>(c.msg + 1)
            }));
        let who = |tenant: &str| {
            Arc::new(Identity {
                tenant: tenant.into(),
                agent_id: "agent".into(),
                trust: engram_common::AccessLevel::Internal,
            })
        };
        let (a, b) = (who("a"), who("b"));
        let held = gate.acquire("a", soon()).await.expect("a's half");
        let over = call_shared(&svc, &gate, &a, Some(soon()), 1).await;
        assert!(matches!(over, Err(DownstreamError::Overloaded)), "{over:?}");
        assert_eq!(call_shared(&svc, &gate, &b, None, 1).await.ok(), Some(2));
        drop(held);
        assert_eq!(
            call_shared(&svc, &gate, &a, Some(soon()), 41).await.ok(),
            Some(42)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_tenants_listings_leave_room_for_anothers() {
        let gate = list_gate(&TenantLimitSettings::default());
        let held = [
            gate.acquire("a", soon()).await.expect("one"),
            gate.acquire("a", soon()).await.expect("two"),
        ];
        let over = gate.acquire("a", soon()).await;
        assert!(
            matches!(
                over,
                Err(crate::error::Error::TenantLimit {
                    what: "listings in flight",
                    ..
                })
            ),
            "a alone lists at most two at once"
        );
        let started = Instant::now();
        let _b = gate.acquire("b", soon()).await.expect("b's listing");
        assert_eq!(started.elapsed(), Duration::ZERO, "b never waits for a");
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_over_its_write_share_gets_the_next_of_its_own_slots() {
        let gates = WriteGates::new(&TenantLimitSettings::default(), 2);
        let first = gates.delete.acquire("a", soon()).await.expect("one of two");
        let next = gates.delete.acquire("a", soon());
        tokio::pin!(next);
        assert!(
            futures::FutureExt::now_or_never(&mut next).is_none(),
            "a waits while it holds its share"
        );
        drop(first);
        assert!(next.await.is_ok(), "its own call ended, so it goes on");
    }

    #[test]
    fn the_advertised_timeout_is_the_shorter_of_the_stacks_and_the_callers() {
        let now = Instant::now();
        let own = Duration::from_millis(300);
        assert_eq!(advertised_timeout(own, None, now), (own, false));
        let far = Some(now + Duration::from_secs(2));
        assert_eq!(advertised_timeout(own, far, now), (own, false));
        let near = Some(now + Duration::from_millis(80));
        assert_eq!(
            advertised_timeout(own, near, now),
            (Duration::from_millis(80), true)
        );
        let gone = Some(now);
        assert_eq!(
            advertised_timeout(own, gone, now + Duration::from_millis(5)),
            (Duration::from_millis(1), true)
        );
    }
}
