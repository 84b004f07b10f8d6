//! The gateway against in-test gRPC doubles of its downstreams (allowed for
//! resilience tests: a slow graph, a dead reranker, nothing listening). The
//! doubles check the internal token and identity like the real services.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use engram_common::settings::ApiKeySettings;
use engram_common::{Identity, Settings};
use engram_proto::graph_service_server::{GraphService, GraphServiceServer};
use engram_proto::memory_service_client::MemoryServiceClient;
use engram_proto::rerank_service_server::{RerankService, RerankServiceServer};
use engram_proto::retrieval_service_client::RetrievalServiceClient;
use engram_proto::search_service_server::{SearchService, SearchServiceServer};
use engram_proto::*;
use sha2::Digest;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

const TOKEN: &str = "internal-test-token";
const KEY: &str = "test-key";
/// The graph's own hit: a UUID, as feedback on it must name one.
const G1: &str = "00000000-0000-4000-8000-0000000000a1";

fn check<T>(r: &Request<T>) -> Result<Identity, Status> {
    Ok(Identity::read_internal(r.metadata(), Some(TOKEN))?)
}

fn mem(id: &str, tenant: &str, secs: i64) -> Memory {
    Memory {
        id: id.into(),
        tenant_id: tenant.into(),
        content: format!("memory {id} about the deploy procedure"),
        access_level: AccessLevel::Public as i32,
        decay_score: 1.0,
        source_confidence: Some(0.9),
        version: 1,
        event_time: Some(prost_types::Timestamp {
            seconds: secs,
            nanos: 0,
        }),
        ..Default::default()
    }
}

#[derive(Default)]
struct FakeSearch {
    vector_calls: AtomicU32,
    /// Stored vectors Get returns when asked for embeddings (Stage 4b).
    vectors: std::sync::Mutex<std::collections::HashMap<String, Vec<f32>>>,
    /// Get fails when asked for embeddings.
    fail_vector_reads: std::sync::atomic::AtomicBool,
    /// Gets that asked for embeddings.
    vector_reads: AtomicU32,
}

fn hits(tenant: &str, ids: &[&str]) -> SearchResponse {
    SearchResponse {
        hits: ids
            .iter()
            .enumerate()
            .map(|(i, id)| SearchHit {
                memory: Some(mem(id, tenant, 1000 + i as i64 * 1000)),
                score: 1.0 - i as f32 * 0.1,
                rank: i as u32 + 1,
            })
            .collect(),
        query_embedding: vec![1.0, 0.0, 0.0],
        facts: Vec::new(),
        from_keyword_index: false,
    }
}

#[tonic::async_trait]
impl SearchService for FakeSearch {
    type WatchChangesStream = futures::stream::Empty<Result<engram_proto::ChangeEvent, Status>>;

    async fn watch_changes(
        &self,
        _r: Request<engram_proto::WatchChangesRequest>,
    ) -> Result<Response<Self::WatchChangesStream>, Status> {
        Err(Status::unimplemented("no change feed in the fake"))
    }

    async fn upsert(&self, r: Request<UpsertRequest>) -> Result<Response<UpsertResponse>, Status> {
        check(&r)?;
        Ok(Response::new(UpsertResponse {
            results: r
                .into_inner()
                .memories
                .iter()
                .map(|m| UpsertResult {
                    id: m.id.clone(),
                    version: 1,
                    created: true,
                    embedded: true,
                })
                .collect(),
        }))
    }
    async fn delete(&self, r: Request<DeleteRequest>) -> Result<Response<DeleteResponse>, Status> {
        check(&r)?;
        Ok(Response::new(DeleteResponse { deleted: 1 }))
    }
    async fn get(&self, r: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let id = check(&r)?;
        let req = r.into_inner();
        if req.include_embedding {
            self.vector_reads.fetch_add(1, Ordering::SeqCst);
        }
        if req.include_embedding && self.fail_vector_reads.load(Ordering::SeqCst) {
            return Err(Status::unavailable("vector reads injected to fail"));
        }
        let vectors = self.vectors.lock().expect("vectors").clone();
        let with_vector = |i: &String| Memory {
            embedding: (req.include_embedding)
                .then(|| vectors.get(i).cloned())
                .flatten()
                .unwrap_or_default(),
            ..mem(i, &id.tenant, 500)
        };
        Ok(Response::new(GetResponse {
            memories: req.ids.iter().map(with_vector).collect(),
        }))
    }
    async fn add_edges(
        &self,
        r: Request<AddEdgesRequest>,
    ) -> Result<Response<AddEdgesResponse>, Status> {
        check(&r)?;
        Ok(Response::new(AddEdgesResponse { added: 1 }))
    }
    async fn delete_edges(
        &self,
        r: Request<engram_proto::DeleteEdgesRequest>,
    ) -> Result<Response<engram_proto::DeleteEdgesResponse>, Status> {
        check(&r)?;
        Ok(Response::new(engram_proto::DeleteEdgesResponse {
            deleted: 1,
        }))
    }
    async fn vector_search(
        &self,
        r: Request<VectorSearchRequest>,
    ) -> Result<Response<SearchResponse>, Status> {
        let id = check(&r)?;
        self.vector_calls.fetch_add(1, Ordering::SeqCst);
        // One record of another tenant sneaks through: the gateway must drop it.
        let mut resp = hits(&id.tenant, &["v1", "v2", "c1", "c2"]);
        resp.hits.push(SearchHit {
            memory: Some(mem("foreign", "other-tenant", 0)),
            score: 0.1,
            rank: 5,
        });
        Ok(Response::new(resp))
    }
    async fn keyword_search(
        &self,
        r: Request<KeywordSearchRequest>,
    ) -> Result<Response<SearchResponse>, Status> {
        let id = check(&r)?;
        Ok(Response::new(hits(&id.tenant, &["k1", "v2"])))
    }
    async fn embed(&self, r: Request<EmbedRequest>) -> Result<Response<EmbedResponse>, Status> {
        check(&r)?;
        Ok(Response::new(EmbedResponse {
            embeddings: vec![Embedding {
                values: vec![1.0, 0.0, 0.0],
            }],
        }))
    }
    async fn store_feedback(
        &self,
        r: Request<StoreFeedbackRequest>,
    ) -> Result<Response<StoreFeedbackResponse>, Status> {
        check(&r)?;
        Ok(Response::new(StoreFeedbackResponse {
            stored: r.into_inner().items.len() as u32,
        }))
    }
}

#[derive(Default)]
struct FakeGraph {
    delay: Duration,
    /// What its PPR answers say of the tenant's graph.
    no_contradicts_edges: bool,
    stale: bool,
}

#[tonic::async_trait]
impl GraphService for FakeGraph {
    async fn personalized_page_rank(
        &self,
        r: Request<PprRequest>,
    ) -> Result<Response<PprResponse>, Status> {
        check(&r)?;
        tokio::time::sleep(self.delay).await;
        Ok(Response::new(PprResponse {
            hits: vec![
                GraphHit {
                    memory_id: G1.into(),
                    score: 0.5,
                    rank: 1,
                    via_entities: vec!["Deploy".into()],
                },
                GraphHit {
                    memory_id: "v1".into(),
                    score: 0.3,
                    rank: 2,
                    via_entities: vec![],
                },
            ],
            linked_entities: vec![],
            nodes_touched: 3,
            no_contradicts_edges: self.no_contradicts_edges,
            stale: self.stale,
            ..Default::default()
        }))
    }
    async fn neighbors(
        &self,
        _r: Request<NeighborsRequest>,
    ) -> Result<Response<NeighborsResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }
    async fn contradictions(
        &self,
        r: Request<ContradictionsRequest>,
    ) -> Result<Response<ContradictionsResponse>, Status> {
        check(&r)?;
        tokio::time::sleep(self.delay).await;
        Ok(Response::new(ContradictionsResponse {
            pairs: vec![Contradiction {
                memory_a: "c1".into(),
                memory_b: "c2".into(),
                weight: 1.0,
            }],
        }))
    }
    async fn link_query(
        &self,
        _r: Request<LinkQueryRequest>,
    ) -> Result<Response<LinkQueryResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }
    async fn stats(&self, _r: Request<StatsRequest>) -> Result<Response<StatsResponse>, Status> {
        Ok(Response::new(StatsResponse::default()))
    }
}

struct FakeRerank;

#[tonic::async_trait]
impl RerankService for FakeRerank {
    async fn score(&self, r: Request<ScoreRequest>) -> Result<Response<ScoreResponse>, Status> {
        check(&r)?;
        let n = r.into_inner().candidates.len();
        Ok(Response::new(ScoreResponse {
            scores: descending(n),
        }))
    }
}

/// Finds nothing relevant (every score 0.01, so every attempt is "low" and
/// the gateway retries) and counts the pairs it is asked to score.
#[derive(Default)]
struct UnimpressedRerank {
    pairs: AtomicU32,
}

#[tonic::async_trait]
impl RerankService for UnimpressedRerank {
    async fn score(&self, r: Request<ScoreRequest>) -> Result<Response<ScoreResponse>, Status> {
        check(&r)?;
        let n = r.into_inner().candidates.len();
        self.pairs.fetch_add(n as u32, Ordering::SeqCst);
        Ok(Response::new(ScoreResponse {
            scores: vec![0.01; n],
        }))
    }
}

/// rerank-svc under load: scores only the head it had time for (the proto
/// allows no head shorter than 3).
struct HeadOnlyRerank(usize);

#[tonic::async_trait]
impl RerankService for HeadOnlyRerank {
    async fn score(&self, r: Request<ScoreRequest>) -> Result<Response<ScoreResponse>, Status> {
        check(&r)?;
        let n = r.into_inner().candidates.len().min(self.0);
        Ok(Response::new(ScoreResponse {
            scores: descending(n),
        }))
    }
}

/// Relevance falling from 0.9 by 0.01 a candidate, as a healthy
/// cross-encoder's scores for an already ordered list.
fn descending(n: usize) -> Vec<f32> {
    (0..n).map(|i| 0.9 - i as f32 * 0.01).collect()
}

/// A slow cross-encoder that counts the calls it serves at once.
#[derive(Default)]
struct SlowRerank {
    now: AtomicU32,
    most: AtomicU32,
}

#[tonic::async_trait]
impl RerankService for SlowRerank {
    async fn score(&self, r: Request<ScoreRequest>) -> Result<Response<ScoreResponse>, Status> {
        check(&r)?;
        let n = r.into_inner().candidates.len();
        let at_once = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(at_once, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        Ok(Response::new(ScoreResponse {
            scores: descending(n),
        }))
    }
}

async fn serve<S>(svc: S) -> String
where
    S: tonic::codegen::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l)),
    );
    format!("http://{addr}")
}

/// A URI where nothing listens.
async fn dead() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    format!("http://{addr}")
}

struct Env {
    addr: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn gateway(search: String, graph: String, rerank: String) -> Env {
    gateway_with(search, graph, rerank, |_| {}).await
}

async fn gateway_with(
    search: String,
    graph: String,
    rerank: String,
    tweak: impl FnOnce(&mut Settings),
) -> Env {
    let mut s = Settings::default();
    // The faults below include the cross-encoder's.
    s.pipeline.cross_encoder = true;
    s.downstream.search = search;
    s.downstream.graph = graph;
    s.downstream.rerank = rerank;
    s.auth.internal_token_opt = Some(TOKEN.into());
    s.auth.api_keys = vec![ApiKeySettings {
        sha256: hex::encode(sha2::Sha256::digest(KEY.as_bytes())),
        tenant: "t1".into(),
        agent_id: "agent".into(),
        trust: "internal".into(),
    }];
    tweak(&mut s);
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = format!("http://{}", l.local_addr().expect("addr"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(retrieval_svc::run(l, s, async {
        let _ = rx.await;
    }));
    Env { addr, _stop: tx }
}

async fn healthy_env(graph_delay: Duration) -> (Env, Arc<FakeSearch>) {
    let search = Arc::new(FakeSearch::default());
    let env = gateway(
        serve(SearchServiceServer::from_arc(search.clone())).await,
        serve(GraphServiceServer::new(FakeGraph {
            delay: graph_delay,
            ..Default::default()
        }))
        .await,
        serve(RerankServiceServer::new(FakeRerank)).await,
    )
    .await;
    (env, search)
}

/// Healthy search and graph doubles in front of the reranker at `rerank`.
async fn env_with_reranker(rerank: String) -> Env {
    gateway(
        serve(SearchServiceServer::new(FakeSearch::default())).await,
        serve(GraphServiceServer::new(FakeGraph::default())).await,
        rerank,
    )
    .await
}

fn authed<T>(msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut().insert(
        "authorization",
        format!("Bearer {KEY}").parse().expect("ascii"),
    );
    r
}

async fn client(env: &Env) -> RetrievalServiceClient<tonic::transport::Channel> {
    for _ in 0..50 {
        if let Ok(c) = RetrievalServiceClient::connect(env.addr.clone()).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("gateway did not start");
}

fn q(text: &str) -> RetrieveRequest {
    RetrieveRequest {
        text: text.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn slow_graph_degrades_but_answers_within_the_ceiling() {
    let (env, _) = healthy_env(Duration::from_secs(5)).await;
    let mut c = client(&env).await;
    let t = Instant::now();
    let r = c
        .retrieve(authed(RetrieveRequest {
            mode: RetrievalMode::MultiHop as i32,
            explain: true,
            ..q("what is the relationship between Deploy and Rollback")
        }))
        .await
        .expect("answer")
        .into_inner();
    let elapsed = t.elapsed();
    eprintln!("slow graph: {elapsed:?}, degraded {:?}", r.degraded_stages);
    assert!(elapsed < Duration::from_millis(3000), "{elapsed:?}");
    assert!(
        r.degraded_stages.iter().any(|s| s == "graph"),
        "{:?}",
        r.degraded_stages
    );
    assert!(!r.records.is_empty());
    // The foreign-tenant record never leaves the gateway.
    assert!(
        r.records
            .iter()
            .all(|m| m.memory.as_ref().is_some_and(|m| m.tenant_id == "t1"))
    );
    assert!(
        r.dropped
            .iter()
            .any(|d| d.memory_id == "foreign" && d.stage == "access")
    );
}

#[tokio::test]
async fn healthy_pipeline_fuses_reranks_and_resolves_conflicts() {
    let (env, _) = healthy_env(Duration::ZERO).await;
    let mut c = client(&env).await;
    let mut r = c
        .retrieve(authed(RetrieveRequest {
            mode: RetrievalMode::Exploratory as i32,
            token_budget: 40,
            no_cache: true,
            ..q("tell me about the deploy procedure")
        }))
        .await
        .expect("answer")
        .into_inner();
    assert!(r.degraded_stages.is_empty(), "{:?}", r.degraded_stages);
    assert_eq!(r.route, QueryRoute::Exploratory as i32);
    let ids: Vec<_> = r
        .records
        .iter()
        .filter_map(|m| m.memory.as_ref().map(|m| m.id.as_str()))
        .collect();
    assert!(ids.contains(&G1), "graph hit fetched by id: {ids:?}");
    // c2 is newer with equal confidence: recency wins, c1 removed.
    assert!(ids.contains(&"c2") && !ids.contains(&"c1"), "{ids:?}");
    // The graph's pair; the fixtures' look-alike texts ("memory c1 about
    // the deploy procedure") are also read-time versions (`same_slot`).
    r.conflicts.retain(|p| p.edge_type == "contradicts");
    assert_eq!(r.conflicts.len(), 1);
    assert_eq!(
        r.conflicts[0].resolution,
        ConflictResolution::Recency as i32
    );
    let p = r.records[0].provenance.as_ref().expect("provenance");
    assert!(p.relevance.is_some());
    assert!(p.checks_passed.iter().any(|c| c == "relevance"));
    assert!(r.context_tokens <= 40 && r.context_tokens > 0);
    assert!(r.retrieval_confidence > 0.5);

    let hyde = c
        .retrieve(authed(RetrieveRequest {
            hypotheses: vec!["deploys run on fridays".into()],
            skip_rerank: true,
            ..q("when do deploys run")
        }))
        .await
        .expect("hyde")
        .into_inner();
    let strategies: Vec<_> = hyde
        .records
        .iter()
        .flat_map(|r| r.provenance.iter().flat_map(|p| p.strategies.iter()))
        .map(|h| h.strategy.as_str())
        .collect();
    assert!(strategies.contains(&"hyde"), "{strategies:?}");

    let fb = c
        .feedback(authed(FeedbackRequest {
            query_id: r.query_id.clone(),
            items: vec![FeedbackItem {
                memory_id: G1.into(),
                signal: FeedbackSignal::Helpful as i32,
                value: true,
            }],
        }))
        .await
        .expect("feedback")
        .into_inner();
    assert_eq!(fb.accepted, 1);
}

#[tokio::test]
async fn a_short_client_deadline_bounds_the_pipeline() {
    let (env, _) = healthy_env(Duration::from_secs(5)).await;
    let mut c = client(&env).await;
    let mut req = authed(RetrieveRequest {
        mode: RetrievalMode::MultiHop as i32,
        ..q("how is Deploy related to Rollback")
    });
    req.set_timeout(Duration::from_millis(400));
    let t = Instant::now();
    let r = c.retrieve(req).await;
    let elapsed = t.elapsed();
    eprintln!(
        "short deadline: {elapsed:?} -> {:?}",
        r.as_ref().map(|r| r.get_ref().degraded_stages.clone())
    );
    assert!(elapsed < Duration::from_millis(600), "{elapsed:?}");
    let r = r.expect("partial answer").into_inner();
    assert!(r.degraded_stages.iter().any(|s| s == "graph"));
    assert!(!r.records.is_empty());
}

#[tokio::test]
async fn raw_modes_keep_the_strategy_order() {
    let (env, _) = healthy_env(Duration::ZERO).await;
    let mut c = client(&env).await;
    let r = c
        .retrieve(authed(RetrieveRequest {
            mode: RetrievalMode::Vector as i32,
            limit: Some(3),
            ..q("deploy")
        }))
        .await
        .expect("answer")
        .into_inner();
    let ids: Vec<_> = r
        .records
        .iter()
        .filter_map(|m| m.memory.as_ref().map(|m| m.id.clone()))
        .collect();
    assert_eq!(ids, ["v1", "v2", "c1"]);
    assert!(
        r.records[0]
            .provenance
            .as_ref()
            .is_some_and(|p| p.relevance.is_none())
    );
}

#[tokio::test]
async fn cache_hits_and_writes_invalidate() {
    let (env, search) = healthy_env(Duration::ZERO).await;
    let mut c = client(&env).await;
    let first = c
        .retrieve(authed(q("what is the deploy procedure")))
        .await
        .expect("first")
        .into_inner();
    assert_eq!(first.skip_reason, SkipReason::None as i32);
    let second = c
        .retrieve(authed(q("What is the  deploy procedure")))
        .await
        .expect("second")
        .into_inner();
    assert_eq!(second.skip_reason, SkipReason::CacheHit as i32);
    let calls = search.vector_calls.load(Ordering::SeqCst);
    // A near-duplicate hits by cosine (the fake embeds everything alike).
    let third = c
        .retrieve(authed(q("deploy procedure, what is it")))
        .await
        .expect("third")
        .into_inner();
    assert_eq!(third.skip_reason, SkipReason::CacheHit as i32);
    assert_eq!(search.vector_calls.load(Ordering::SeqCst), calls);

    let mut m = MemoryServiceClient::connect(env.addr.clone())
        .await
        .expect("connect");
    m.upsert(authed(UpsertRequest {
        memories: vec![Memory {
            content: "new".into(),
            ..Default::default()
        }],
    }))
    .await
    .expect("upsert");
    let after = c
        .retrieve(authed(q("what is the deploy procedure")))
        .await
        .expect("after write")
        .into_inner();
    assert_eq!(after.skip_reason, SkipReason::None as i32);

    // Writing above the caller's trust level is refused.
    let err = m
        .upsert(authed(UpsertRequest {
            memories: vec![Memory {
                content: "secret".into(),
                access_level: AccessLevel::Sensitive as i32,
                ..Default::default()
            }],
        }))
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
}

#[tokio::test]
async fn dead_reranker_is_skipped_and_marked() {
    let env = env_with_reranker(dead().await).await;
    let mut c = client(&env).await;
    let r = c
        .retrieve(authed(q("what is the deploy procedure")))
        .await
        .expect("answer")
        .into_inner();
    assert!(
        r.degraded_stages.iter().any(|s| s == "rerank"),
        "{:?}",
        r.degraded_stages
    );
    assert!(!r.records.is_empty());
}

#[tokio::test]
async fn a_run_waiting_on_the_cross_encoder_holds_no_work_slot() {
    // A tenant alone may run one pipeline at once here; four queries that
    // each wait 300 ms on the model still reach it together, because a run
    // gives its slot to the next while it waits (pipeline/ctx.rs, `Gates`).
    let rerank = Arc::new(SlowRerank::default());
    let env = gateway_with(
        serve(SearchServiceServer::new(FakeSearch::default())).await,
        serve(GraphServiceServer::new(FakeGraph::default())).await,
        serve(RerankServiceServer::from_arc(rerank.clone())).await,
        |s| s.tenant.alone_work_slots = 1,
    )
    .await;
    let c = client(&env).await;
    let answers = futures::future::join_all((0..4).map(|i| {
        let mut c = c.clone();
        async move {
            let req = RetrieveRequest {
                no_cache: true,
                ..q(&format!("deploy procedure {i}"))
            };
            c.retrieve(authed(req)).await
        }
    }))
    .await;
    for a in answers {
        let a = a.expect("answered").into_inner();
        assert!(a.degraded_stages.is_empty(), "{:?}", a.degraded_stages);
    }
    assert!(
        rerank.most.load(Ordering::SeqCst) >= 2,
        "runs waited on the model one at a time: the work slot was held through the rerank"
    );
}

/// A head scored is a partial rerank: marked as such, never a failure, and
/// the candidates past the head stay in the answer unchecked (a missing
/// score is not a relevance of 0, which the floor would drop).
#[tokio::test]
async fn a_reranked_head_is_marked_partial_and_drops_nothing() {
    let full = env_with_reranker(serve(RerankServiceServer::new(FakeRerank)).await).await;
    let head = env_with_reranker(serve(RerankServiceServer::new(HeadOnlyRerank(3))).await).await;
    let short = env_with_reranker(serve(RerankServiceServer::new(HeadOnlyRerank(2))).await).await;
    let ask = || authed(q("what is the deploy procedure"));
    let whole = (client(&full).await.retrieve(ask()).await)
        .expect("answer")
        .into_inner();
    let partial = (client(&head).await.retrieve(ask()).await)
        .expect("answer")
        .into_inner();
    assert!(
        whole.degraded_stages.is_empty(),
        "{:?}",
        whole.degraded_stages
    );
    assert_eq!(partial.degraded_stages, vec!["rerank_partial".to_string()]);
    let ids = |r: &engram_proto::RetrieveResponse| {
        let mut v: Vec<String> = (r.records.iter())
            .filter_map(|x| x.memory.as_ref().map(|m| m.id.clone()))
            .collect();
        v.sort();
        v
    };
    assert!(whole.records.len() > 3, "more candidates than the head");
    assert_eq!(ids(&partial), ids(&whole));
    let malformed = (client(&short).await.retrieve(ask()).await)
        .expect("answer")
        .into_inner();
    assert_eq!(
        malformed.degraded_stages,
        vec!["rerank".to_string()],
        "a head shorter than 3 breaks the contract: no rerank"
    );
    assert_eq!(ids(&malformed), ids(&whole));
}

#[tokio::test]
async fn everything_down_is_unavailable_and_auth_is_required() {
    let env = gateway(dead().await, dead().await, dead().await).await;
    let mut c = client(&env).await;
    let err = c
        .retrieve(Request::new(q("anything")))
        .await
        .expect_err("no credentials");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let err = c
        .retrieve(authed(q("what is the deploy procedure")))
        .await
        .expect_err("all down");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(
        err.message().contains("retrieval circuit open"),
        "{}",
        err.message()
    );
    let err = c
        .retrieve(authed(RetrieveRequest {
            limit: Some(500),
            ..q("x")
        }))
        .await
        .expect_err("invalid");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("limit"));
    // Greetings skip retrieval entirely, even with everything down.
    let r = c
        .retrieve(authed(q("hello!")))
        .await
        .expect("skip")
        .into_inner();
    assert_eq!(r.skip_reason, SkipReason::NoRetrievalNeeded as i32);
}

/// Retries escalate, but a memory the cross-encoder already scored in this
/// request is not scored again (the doubles return the same memories to
/// every attempt, so only the first attempt's pairs reach the reranker).
#[tokio::test]
async fn retries_do_not_rescore_the_same_memories() {
    let rerank = Arc::new(UnimpressedRerank::default());
    let env = env_with_reranker(serve(RerankServiceServer::from_arc(rerank.clone())).await).await;
    let mut c = client(&env).await;
    let r = c
        .retrieve(authed(q("what is the deploy procedure")))
        .await
        .expect("answer")
        .into_inner();
    assert!(r.retry_count >= 1, "retry_count {}", r.retry_count);
    assert!(r.degraded_stages.is_empty(), "{:?}", r.degraded_stages);
    let pairs = rerank.pairs.load(Ordering::SeqCst);
    let distinct: std::collections::HashSet<&str> = r
        .records
        .iter()
        .filter_map(|m| m.memory.as_ref().map(|m| m.id.as_str()))
        .collect();
    assert!(pairs > 0);
    assert!(
        pairs as usize <= distinct.len().max(10),
        "{pairs} pairs scored for {} distinct memories over {} attempts",
        distinct.len(),
        r.retry_count + 1
    );
}

/// A graph that says it holds no `contradicts` edge is not asked for
/// contradictions (the double would report c1/c2 if it were); a stale one
/// still is, since the change it has not applied may be one.
#[tokio::test]
async fn a_graph_without_contradiction_edges_is_not_asked_for_them() {
    for (stale, asked) in [(false, false), (true, true)] {
        let env = gateway(
            serve(SearchServiceServer::new(FakeSearch::default())).await,
            serve(GraphServiceServer::new(FakeGraph {
                no_contradicts_edges: true,
                stale,
                ..Default::default()
            }))
            .await,
            serve(RerankServiceServer::new(FakeRerank)).await,
        )
        .await;
        let mut c = client(&env).await;
        let r = c
            .retrieve(authed(RetrieveRequest {
                mode: RetrievalMode::Exploratory as i32,
                no_cache: true,
                ..q("tell me about the deploy procedure")
            }))
            .await
            .expect("answer")
            .into_inner();
        assert!(r.degraded_stages.is_empty(), "{:?}", r.degraded_stages);
        // Graph contradictions only: the read-time versions (`same_slot`,
        // pipeline/current.rs) of these look-alike fixtures are not asked.
        let graph = (r.conflicts.iter()).filter(|p| p.edge_type == "contradicts");
        assert_eq!(graph.count(), usize::from(asked), "stale: {stale}");
        let ids: Vec<_> = r
            .records
            .iter()
            .filter_map(|m| m.memory.as_ref().map(|m| m.id.as_str()))
            .collect();
        assert_eq!(ids.contains(&"c1"), !asked, "{ids:?}");
    }
}

/// Stage 4b on a multi-hop question: with the head's vectors read, the #2
/// goes to the memory that completes the #1 (the query embeds as [1, 0, 0];
/// the #1 and the old #2 are the same half of it, the old #3 the other
/// half); when that read fails, Stage 4's order stands and the answer says
/// `complement` was degraded; it never fails.
#[tokio::test]
async fn complementary_slots_reorder_the_head_or_degrade() {
    let search = Arc::new(FakeSearch::default());
    // The fixtures' look-alike texts ("memory v1 about the deploy
    // procedure") are versions of one slot to Stage 4c, which would order
    // them by time after Stage 4b; this test is about Stage 4b alone.
    let env = gateway_with(
        serve(SearchServiceServer::from_arc(search.clone())).await,
        serve(GraphServiceServer::new(FakeGraph::default())).await,
        serve(RerankServiceServer::new(FakeRerank)).await,
        |s| s.pipeline.current_first = false,
    )
    .await;
    let mut c = client(&env).await;
    let mut ask = async || {
        let r = c
            .retrieve(authed(RetrieveRequest {
                mode: RetrievalMode::MultiHop as i32,
                no_cache: true,
                ..q("who approved the deploy procedure of the payments team")
            }))
            .await
            .expect("answer")
            .into_inner();
        let ids: Vec<String> = (r.records.iter())
            .filter_map(|m| m.memory.as_ref().map(|m| m.id.clone()))
            .collect();
        // Scores fall with rank whatever moved: callers sort by them.
        assert!(r.records.windows(2).all(|w| w[0].score >= w[1].score));
        (ids, r.degraded_stages)
    };
    // No vectors stored: nothing to choose with, Stage 4's order.
    let (before, degraded) = ask().await;
    assert!(degraded.is_empty(), "{degraded:?}");
    assert!(before.len() >= 3, "{before:?}");
    {
        let mut v = search.vectors.lock().expect("vectors");
        v.insert(before[0].clone(), vec![0.6, 0.8, 0.0]);
        v.insert(before[1].clone(), vec![0.6, 0.8, 0.0]);
        v.insert(before[2].clone(), vec![0.6, -0.8, 0.0]);
    }
    let (after, degraded) = ask().await;
    assert!(degraded.is_empty(), "{degraded:?}");
    assert_eq!(
        after[..3],
        [&before[0], &before[2], &before[1]].map(String::clone)
    );
    assert_eq!(after[3..], before[3..]);
    // One vector read an answer (Stage 2's, beside the graph hits' rows).
    assert_eq!(search.vector_reads.load(Ordering::SeqCst), 2);
    search.fail_vector_reads.store(true, Ordering::SeqCst);
    let (failed, degraded) = ask().await;
    assert_eq!(degraded, vec!["complement".to_string()]);
    assert_eq!(failed, before);
}
