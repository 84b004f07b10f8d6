//! Hostile input at scale, part two (issue 23; tests/hostile_input.rs is
//! part one: typed Retrieve / Upsert / Feedback / Basic requests and the
//! HTTP JSON bodies). cargo-fuzz needs nightly and a separate crate per
//! target; these are long proptest runs instead, over protobuf *wire*
//! messages: random (field number, wire type, value) records, nested to
//! three levels, decoded by prost into each request type, and, half the
//! time, a valid request of that type with such records appended (a later
//! record overrides a scalar field and merges into a message field, so
//! this mutates a request that would pass into one that may not). Every
//! field of every message is reachable that way, including ones a typed
//! generator would have to list by hand; a decode that fails is skipped.
//!
//! * search-svc's validation (`TryFrom` of each internal request) in
//!   process: never panics, and is deterministic;
//! * route classification (query parsing) on arbitrary text;
//! * every public gRPC request through the real gateway (including
//!   RetrieveAgentic's decomposition, Get / Delete / AddEdges /
//!   ListMemories and working memory): never INTERNAL, UNKNOWN or a
//!   breaker-opening UNAVAILABLE, and a rejection names its field;
//! * the credential parser: arbitrary and mutated bearer tokens, JWTs
//!   with arbitrary claims signed with the right key, and API keys: only
//!   OK or UNAUTHENTICATED, and never OK for a token that is expired,
//!   without a tenant, or re-signed.
//!
//! `ENGRAM_FUZZ_CASES` (default 2,000) is the count per in-process target;
//! the gateway targets run a tenth of it. Each target prints its
//! executions; a crash fails the test and proptest saves the case to
//! `tests/fuzz_validation.proptest-regressions`, replayed on every run.

use std::collections::BTreeMap;

use engram_proto::knowledge_foundry_service_client::KnowledgeFoundryServiceClient;
use engram_proto::memory_service_client::MemoryServiceClient;
use engram_proto::retrieval_service_client::RetrievalServiceClient;
use engram_proto::working_memory_service_client::WorkingMemoryServiceClient;
use engram_tests::{authed, stack_with_keys};
use futures::StreamExt;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use prost::Message;
use tonic::transport::Channel;

fn cases() -> u32 {
    std::env::var("ENGRAM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

/// One protobuf record: field number and a value of one wire type.
#[derive(Debug, Clone)]
enum Field {
    Varint(u32, u64),
    Fixed32(u32, u32),
    Fixed64(u32, u64),
    Bytes(u32, Vec<u8>),
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn encode(fields: &[Field]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in fields {
        let (tag, wire) = match f {
            Field::Varint(t, _) => (*t, 0),
            Field::Fixed64(t, _) => (*t, 1),
            Field::Bytes(t, _) => (*t, 2),
            Field::Fixed32(t, _) => (*t, 5),
        };
        put_varint(&mut out, (u64::from(tag) << 3) | wire);
        match f {
            Field::Varint(_, v) => put_varint(&mut out, *v),
            Field::Fixed64(_, v) => out.extend_from_slice(&v.to_le_bytes()),
            Field::Fixed32(_, v) => out.extend_from_slice(&v.to_le_bytes()),
            Field::Bytes(_, b) => {
                put_varint(&mut out, b.len() as u64);
                out.extend_from_slice(b);
            }
        }
    }
    out
}

/// Text a hostile caller sends: NUL and control characters, combining
/// marks, case-folding traps, UUIDs (so id fields sometimes validate),
/// labels, and sizes past every limit.
fn text() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        3 => "[a-z \u{0}\u{1}\u{7f}\t\n\u{300}-\u{36f}\u{212a}İ?.]{0,40}".prop_map(String::into_bytes),
        2 => any::<String>().prop_map(String::into_bytes),
        2 => Just(()).prop_map(|_| uuid::Uuid::new_v4().to_string().into_bytes()),
        1 => prop_oneof![Just("semantic"), Just("low"), Just("high"), Just("hybrid"), Just("vector"),
                         Just("keyword"), Just("HS256"), Just("default"), Just("related")]
            .prop_map(|s| s.as_bytes().to_vec()),
        1 => (1usize..300_000).prop_map(|n| vec![b'x'; n]),
        1 => proptest::collection::vec(any::<u8>(), 0..64),
    ]
    .boxed()
}

/// Packed floats: an embedding of the right size now and then.
fn floats() -> BoxedStrategy<Vec<u8>> {
    let f = prop_oneof![
        4 => -1.0f32..1.0,
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => any::<f32>(),
    ];
    prop_oneof![
        proptest::collection::vec(f.clone(), 384..=384),
        proptest::collection::vec(f, 0..8),
    ]
    .prop_map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect())
    .boxed()
}

fn varint() -> BoxedStrategy<u64> {
    prop_oneof![
        4 => 0u64..64,
        2 => 0u64..100_000,
        1 => Just(u64::MAX),
        1 => Just(i64::MIN as u64),
        1 => Just(u64::from(u32::MAX)),
        1 => any::<u64>(),
    ]
    .boxed()
}

fn fixed32() -> BoxedStrategy<u32> {
    prop_oneof![
        Just(f32::NAN.to_bits()),
        Just(f32::INFINITY.to_bits()),
        Just((-1.0f32).to_bits()),
        (0.0f32..1.0).prop_map(f32::to_bits),
        any::<u32>(),
    ]
    .boxed()
}

/// A message: up to 10 records, fields 1..=32, nested messages 3 deep.
fn message() -> BoxedStrategy<Vec<Field>> {
    let leaf = prop_oneof![
        (1u32..33, varint()).prop_map(|(t, v)| Field::Varint(t, v)),
        (1u32..33, fixed32()).prop_map(|(t, v)| Field::Fixed32(t, v)),
        (1u32..33, any::<u64>()).prop_map(|(t, v)| Field::Fixed64(t, v)),
        (1u32..33, text()).prop_map(|(t, v)| Field::Bytes(t, v)),
        (1u32..33, floats()).prop_map(|(t, v)| Field::Bytes(t, v)),
    ];
    let records = proptest::collection::vec(leaf.clone(), 0..10);
    records
        .prop_recursive(3, 40, 10, move |inner| {
            proptest::collection::vec(
                prop_oneof![
                    3 => leaf.clone(),
                    2 => (1u32..33, inner).prop_map(|(t, m)| Field::Bytes(t, encode(&m))),
                ],
                0..10,
            )
        })
        .boxed()
}

/// One case: a random message, or mutations appended to a valid request.
#[derive(Debug, Clone)]
struct Case {
    random: Vec<Field>,
    mutations_opt: Option<Vec<Field>>,
}

fn case() -> BoxedStrategy<Case> {
    (
        message(),
        proptest::option::of(message().prop_map(|m| m.into_iter().take(3).collect())),
    )
        .prop_map(|(random, mutations_opt)| Case {
            random,
            mutations_opt,
        })
        .boxed()
}

impl Case {
    /// The bytes sent as a request whose valid form is `base`.
    fn bytes<M: Message>(&self, base: &M) -> Vec<u8> {
        match &self.mutations_opt {
            None => encode(&self.random),
            Some(m) => {
                let mut b = base.encode_to_vec();
                b.extend(encode(m));
                b
            }
        }
    }
}

fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Valid requests of every public RPC (for the caller's `tenant`).
mod base {
    use super::uuid;
    use engram_proto as pb;

    pub fn retrieve() -> pb::RetrieveRequest {
        pb::RetrieveRequest {
            text: "where is the red ledger kept?".into(),
            ..Default::default()
        }
    }
    pub fn memory() -> pb::Memory {
        pb::Memory {
            id: uuid(),
            content: "the red ledger is kept in the archive".into(),
            ..Default::default()
        }
    }
    pub fn upsert() -> pb::UpsertRequest {
        pb::UpsertRequest {
            memories: vec![memory()],
        }
    }
    pub fn ids() -> pb::GetRequest {
        pb::GetRequest {
            ids: vec![uuid()],
            include_embedding: false,
        }
    }
    pub fn delete() -> pb::DeleteRequest {
        pb::DeleteRequest { ids: vec![uuid()] }
    }
    pub fn edges() -> pb::AddEdgesRequest {
        pb::AddEdgesRequest {
            edges: vec![pb::Edge {
                src_id: uuid(),
                dst_id: uuid(),
                edge_type: "related".into(),
                weight: 1.0,
            }],
        }
    }
    pub fn review_conflict() -> pb::ReviewConflictRequest {
        pb::ReviewConflictRequest {
            new_id: uuid(),
            old_id: uuid(),
            decision: pb::ConflictDecision::Reject as i32,
        }
    }
    pub fn feedback() -> pb::FeedbackRequest {
        pb::FeedbackRequest {
            query_id: uuid(),
            items: vec![pb::FeedbackItem {
                memory_id: uuid(),
                signal: 1,
                value: true,
            }],
        }
    }
    pub fn get_memory() -> pb::GetMemoryRequest {
        pb::GetMemoryRequest {
            query: "the red ledger".into(),
            session_id: "s-1".into(),
            ..Default::default()
        }
    }
    pub fn basic(tenant: &str) -> pb::BasicRetrieveRequest {
        pb::BasicRetrieveRequest {
            kb_id: uuid(),
            query: "the red ledger".into(),
            tenant_id: tenant.into(),
            ..Default::default()
        }
    }
    pub fn agentic(tenant: &str) -> pb::AgenticRetrieveRequest {
        pb::AgenticRetrieveRequest {
            query: "compare the red ledger and the blue router, then the badge".into(),
            tenant_id: tenant.into(),
            ..Default::default()
        }
    }
    pub fn vector() -> pb::VectorSearchRequest {
        pb::VectorSearchRequest {
            embedding: vec![0.05; 384],
            k: 10,
            ..Default::default()
        }
    }
    pub fn keyword() -> pb::KeywordSearchRequest {
        pb::KeywordSearchRequest {
            text: "red ledger".into(),
            k: 10,
            ..Default::default()
        }
    }
    pub fn embed() -> pb::EmbedRequest {
        pb::EmbedRequest {
            texts: vec!["red ledger".into()],
        }
    }
    pub fn store_feedback() -> pb::StoreFeedbackRequest {
        pb::StoreFeedbackRequest {
            items: vec![pb::StoredFeedback {
                query_id: uuid(),
                memory_id: uuid(),
                signal: "used".into(),
                value: true,
            }],
            examples: Vec::new(),
        }
    }
}

/// Decodes `bytes` as `M`, validates it twice: never a panic, the same verdict.
fn validates<M, V>(bytes: &[u8]) -> Result<Option<bool>, TestCaseError>
where
    M: Message + Default + Clone,
    V: TryFrom<M>,
{
    let Ok(msg) = M::decode(bytes) else {
        return Ok(None);
    };
    let first = V::try_from(msg.clone()).is_ok();
    let again = V::try_from(msg).is_ok();
    prop_assert_eq!(first, again, "validation is not deterministic");
    Ok(Some(first))
}

/// (decoded, accepted) per request type, printed at the end.
type Tally = BTreeMap<&'static str, (u64, u64)>;

fn note(t: &mut Tally, name: &'static str, r: Option<bool>) {
    let e = t.entry(name).or_default();
    if let Some(ok) = r {
        e.0 += 1;
        e.1 += u64::from(ok);
    }
}

/// One internal request type: decodes a case against its valid base
/// message and validates it.
type Target = (
    &'static str,
    fn(&Case) -> Result<Option<bool>, TestCaseError>,
);

/// Every request search-svc validates, by name.
fn search_svc_targets() -> [Target; 11] {
    use engram_proto as pb;
    use search_svc::conflicts::{ConflictQuery, Review};
    use search_svc::list::ListQuery;
    use search_svc::validate as v;
    [
        ("Upsert", |c| {
            validates::<pb::UpsertRequest, v::UpsertBatch>(&c.bytes(&base::upsert()))
        }),
        ("Delete", |c| {
            validates::<pb::DeleteRequest, v::DeleteIds>(&c.bytes(&base::delete()))
        }),
        ("Get", |c| {
            validates::<pb::GetRequest, v::GetQuery>(&c.bytes(&base::ids()))
        }),
        ("AddEdges", |c| {
            validates::<pb::AddEdgesRequest, v::EdgeBatch>(&c.bytes(&base::edges()))
        }),
        ("VectorSearch", |c| {
            validates::<pb::VectorSearchRequest, v::VectorQuery>(&c.bytes(&base::vector()))
        }),
        ("KeywordSearch", |c| {
            validates::<pb::KeywordSearchRequest, v::KeywordQuery>(&c.bytes(&base::keyword()))
        }),
        ("Embed", |c| {
            validates::<pb::EmbedRequest, v::EmbedTexts>(&c.bytes(&base::embed()))
        }),
        ("StoreFeedback", |c| {
            validates::<pb::StoreFeedbackRequest, v::FeedbackBatch>(
                &c.bytes(&base::store_feedback()),
            )
        }),
        ("ListMemories", |c| {
            validates::<pb::ListMemoriesRequest, ListQuery>(
                &c.bytes(&pb::ListMemoriesRequest::default()),
            )
        }),
        ("ListConflicts", |c| {
            validates::<pb::ListConflictsRequest, ConflictQuery>(
                &c.bytes(&pb::ListConflictsRequest::default()),
            )
        }),
        ("ReviewConflict", |c| {
            validates::<pb::ReviewConflictRequest, Review>(&c.bytes(&base::review_conflict()))
        }),
    ]
}

#[test]
fn search_svc_validation_of_every_internal_request_never_panics() {
    let targets = search_svc_targets();
    let mut runner = TestRunner::new_with_rng(
        Config::with_cases(cases()),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[23; 32]),
    );
    let tally = std::sync::Mutex::new(Tally::new());
    let result = runner.run(&case(), |c| {
        let mut t = tally
            .lock()
            .map_err(|_| TestCaseError::fail("tally poisoned"))?;
        for (name, check) in &targets {
            note(&mut t, name, check(&c)?);
        }
        Ok(())
    });
    let tally = tally.into_inner().unwrap_or_default();
    eprintln!(
        "fuzz search-svc validation: {} executions x {} request types; (decoded, accepted) {tally:?}",
        cases(),
        targets.len()
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

proptest! {
    #![proptest_config(Config::with_cases(cases()))]

    /// Route classification reads every query; any text must classify.
    #[test]
    fn route_classification_takes_any_text(t in text()) {
        let s = String::from_utf8_lossy(&t);
        let _ = retrieval_svc::lab::classify(&s);
    }
}

/// The public requests, as wire messages sent to the real gateway.
#[derive(Debug, Clone, Copy)]
enum Rpc {
    Retrieve,
    Feedback,
    Upsert,
    Delete,
    Get,
    AddEdges,
    ListMemories,
    ListConflicts,
    ReviewConflict,
    GetMemory,
    GetDemand,
    Basic,
    Agentic,
}

const RPCS: [Rpc; 13] = [
    Rpc::Retrieve,
    Rpc::Feedback,
    Rpc::Upsert,
    Rpc::Delete,
    Rpc::Get,
    Rpc::AddEdges,
    Rpc::ListMemories,
    Rpc::ListConflicts,
    Rpc::ReviewConflict,
    Rpc::GetMemory,
    Rpc::GetDemand,
    Rpc::Basic,
    Rpc::Agentic,
];

#[derive(Clone)]
struct Clients {
    key: String,
    retrieval: RetrievalServiceClient<Channel>,
    memory: MemoryServiceClient<Channel>,
    working: WorkingMemoryServiceClient<Channel>,
    foundry: KnowledgeFoundryServiceClient<Channel>,
}

/// What one wire request got: its decoded form (for the report) and answer.
type Sent = (String, Result<(), tonic::Status>);

/// Decodes `$bytes` as `$ty` (or returns `None`) and calls `$client.$method`.
macro_rules! call {
    ($client:expr, $method:ident, $ty:ty, $bytes:expr, $key:expr) => {{
        let msg = <$ty>::decode($bytes.as_slice()).ok()?;
        let shown: String = format!("{msg:?}").chars().take(600).collect();
        (shown, $client.$method(authed($key, msg)).await.map(drop))
    }};
}

/// Sends `bytes` as `rpc`'s request; `None` when they do not decode.
async fn send(mut c: Clients, rpc: Rpc, bytes: Vec<u8>) -> Option<Sent> {
    use engram_proto as pb;
    let k = c.key.clone();
    let sent = match rpc {
        Rpc::Retrieve => call!(c.retrieval, retrieve, pb::RetrieveRequest, bytes, &k),
        Rpc::Feedback => call!(c.retrieval, feedback, pb::FeedbackRequest, bytes, &k),
        Rpc::Upsert => call!(c.memory, upsert, pb::UpsertRequest, bytes, &k),
        Rpc::Delete => call!(c.memory, delete, pb::DeleteRequest, bytes, &k),
        Rpc::Get => call!(c.memory, get, pb::GetRequest, bytes, &k),
        Rpc::AddEdges => call!(c.memory, add_edges, pb::AddEdgesRequest, bytes, &k),
        Rpc::ListMemories => call!(c.memory, list_memories, pb::ListMemoriesRequest, bytes, &k),
        Rpc::ListConflicts => call!(
            c.memory,
            list_conflicts,
            pb::ListConflictsRequest,
            bytes,
            &k
        ),
        Rpc::ReviewConflict => call!(
            c.memory,
            review_conflict,
            pb::ReviewConflictRequest,
            bytes,
            &k
        ),
        Rpc::GetMemory => call!(c.working, get_memory, pb::GetMemoryRequest, bytes, &k),
        Rpc::GetDemand => call!(c.working, get_demand, pb::GetDemandRequest, bytes, &k),
        Rpc::Basic => call!(
            c.foundry,
            retrieve_basic,
            pb::BasicRetrieveRequest,
            bytes,
            &k
        ),
        Rpc::Agentic => call!(
            c.foundry,
            retrieve_agentic,
            pb::AgenticRetrieveRequest,
            bytes,
            &k
        ),
    };
    Some(sent)
}

/// What a hostile request may get back: served, or refused with a code
/// that blames the request (a rejection naming its field).
fn acceptable(s: &tonic::Status) -> bool {
    use tonic::Code;
    match s.code() {
        Code::InvalidArgument => s
            .message()
            .split_once(": ")
            .is_some_and(|(f, _)| !f.is_empty()),
        Code::NotFound
        | Code::PermissionDenied
        | Code::ResourceExhausted
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::AlreadyExists => true,
        _ => false,
    }
}

/// The bytes of `c` as `rpc`'s request.
fn wire(c: &Case, rpc: Rpc, tenant: &str) -> Vec<u8> {
    match rpc {
        Rpc::Retrieve => c.bytes(&base::retrieve()),
        Rpc::Feedback => c.bytes(&base::feedback()),
        Rpc::Upsert => c.bytes(&base::upsert()),
        Rpc::Delete => c.bytes(&base::delete()),
        Rpc::Get => c.bytes(&base::ids()),
        Rpc::AddEdges => c.bytes(&base::edges()),
        Rpc::ListMemories => c.bytes(&engram_proto::ListMemoriesRequest::default()),
        Rpc::ListConflicts => c.bytes(&engram_proto::ListConflictsRequest::default()),
        Rpc::ReviewConflict => c.bytes(&base::review_conflict()),
        Rpc::GetMemory => c.bytes(&base::get_memory()),
        Rpc::GetDemand => c.bytes(&engram_proto::GetDemandRequest::default()),
        Rpc::Basic => c.bytes(&base::basic(tenant)),
        Rpc::Agentic => c.bytes(&base::agentic(tenant)),
    }
}

/// Wire messages for every (rpc, case), generated up front.
fn generate(n: usize, seed: u8, tenant: &str) -> anyhow::Result<Vec<(Rpc, Vec<u8>)>> {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]),
    );
    let strategy = case();
    let mut out = Vec::with_capacity(n * RPCS.len());
    for i in 0..n * RPCS.len() {
        let tree = strategy
            .new_tree(&mut runner)
            .map_err(|e| anyhow::anyhow!("generating a message: {e}"))?;
        let rpc = RPCS[i % RPCS.len()];
        out.push((rpc, wire(&tree.current(), rpc, tenant)));
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_public_request_on_the_wire_is_served_or_refused_by_field() -> anyhow::Result<()> {
    let n = (cases() / 10).max(20) as usize;
    let mut settings = engram_tests::settings().await?;
    settings.tenant.requests_per_second = 1_000_000;
    settings.tenant.burst = 1_000_000;
    settings.tenant.max_concurrent = 64;
    // Validation is the subject, not load: on a busy machine a 300 ms
    // stage timeout can fail a one-strategy request (a Basic search is
    // dense only) with UNAVAILABLE, which is not what this test looks for.
    settings.pipeline.vector_timeout_ms = 2_000;
    settings.pipeline.keyword_timeout_ms = 2_000;
    settings.pipeline.graph_timeout_ms = 2_000;
    let (stack, uri, keys) = stack_with_keys(settings, &[("fuzz", "sensitive")]).await?;
    let channel = tonic::transport::Endpoint::from_shared(uri)?
        .connect()
        .await?;
    let clients = Clients {
        key: keys[0].clone(),
        retrieval: RetrievalServiceClient::new(channel.clone()).max_encoding_message_size(64 << 20),
        memory: MemoryServiceClient::new(channel.clone()).max_encoding_message_size(64 << 20),
        working: WorkingMemoryServiceClient::new(channel.clone())
            .max_encoding_message_size(64 << 20),
        foundry: KnowledgeFoundryServiceClient::new(channel).max_encoding_message_size(64 << 20),
    };
    let tenant = stack
        .settings
        .auth
        .api_keys
        .iter()
        .find(|k| k.sha256 == engram::stack::sha256_hex(&keys[0]))
        .map(|k| k.tenant.clone())
        .unwrap_or_default();
    let calls = generate(n, 29, &tenant)?;
    let total = calls.len();
    let results: Vec<(Rpc, Option<Sent>)> = futures::stream::iter(calls)
        .map(|(rpc, b)| {
            let c = clients.clone();
            async move { (rpc, send(c, rpc, b).await) }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    stack.shutdown().await;
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    let mut bad = Vec::new();
    for (rpc, r) in results {
        let label = match &r {
            None => "undecodable".to_string(),
            Some((_, Ok(()))) => "Ok".to_string(),
            Some((_, Err(s))) => format!("{:?}", s.code()),
        };
        *tally.entry(format!("{rpc:?} {label}")).or_default() += 1;
        if let Some((shown, Err(s))) = r
            && !acceptable(&s)
        {
            bad.push(format!(
                "{rpc:?}: {:?} {} for {shown}",
                s.code(),
                s.message()
            ));
        }
    }
    eprintln!("fuzz gateway wire requests: {total} executions; outcomes {tally:?}");
    assert!(
        bad.is_empty(),
        "{} unacceptable answers; first: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    Ok(())
}

const SECRET: &[u8] = b"fuzz-secret-of-at-least-thirty-two-bytes!";

fn b64(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

fn sign(head: &str, body: &str) -> String {
    use hmac::Mac;
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET) else {
        return String::new();
    };
    mac.update(format!("{head}.{body}").as_bytes());
    b64(&mac.finalize().into_bytes())
}

/// A credential and what the gateway must say to it: `Some(true)` = OK,
/// `Some(false)` = UNAUTHENTICATED, `None` = either.
#[derive(Debug, Clone)]
struct Credential {
    header: &'static str,
    value: String,
    expect_opt: Option<bool>,
}

fn claim_value() -> BoxedStrategy<serde_json::Value> {
    use serde_json::json;
    prop_oneof![
        Just(json!(null)),
        Just(json!("")),
        Just(json!("public")),
        Just(json!("sensitive")),
        Just(json!("t-fuzz")),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        Just(json!(["engram", 1])),
        Just(json!({"tenant": "x"})),
        "[a-z\u{0}]{0,8}".prop_map(|s| json!(s)),
    ]
    .boxed()
}

/// Claims with arbitrary values under the names the parser reads.
fn claims() -> BoxedStrategy<serde_json::Map<String, serde_json::Value>> {
    let names = prop_oneof![
        Just("exp"),
        Just("nbf"),
        Just("tenant"),
        Just("sub"),
        Just("trust"),
        Just("aud"),
        Just("iss"),
        Just("x"),
    ];
    proptest::collection::vec((names, claim_value()), 0..8)
        .prop_map(|kv| kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
        .boxed()
}

fn credential(key: String) -> BoxedStrategy<Credential> {
    let now = chrono::Utc::now().timestamp();
    let valid_claims = move || {
        serde_json::json!({"exp": now + 3600, "tenant": "t-fuzz", "sub": "a", "trust": "public",
                           "aud": "engram", "iss": "https://idp.example"})
    };
    let head = b64(br#"{"alg":"HS256","typ":"JWT"}"#);
    let (h1, h2, h3) = (head.clone(), head.clone(), head);
    let k2 = key.clone();
    prop_oneof![
        // Arbitrary header values.
        2 => "[ -~]{0,80}".prop_map(|v| Credential { header: "authorization", value: v, expect_opt: None }),
        1 => "[ -~]{0,80}".prop_map(|v| Credential { header: "x-api-key", value: v, expect_opt: Some(false) }),
        // Three base64url parts of random bytes.
        2 => proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 3..=3)
            .prop_map(|p| Credential {
                header: "authorization",
                value: format!("Bearer {}", p.iter().map(|x| b64(x)).collect::<Vec<_>>().join(".")),
                expect_opt: Some(false),
            }),
        // Arbitrary claims, correctly signed: OK or not, never anything else;
        // never OK without a tenant string or with exp in the past.
        4 => claims().prop_map(move |c| {
            let body = b64(serde_json::Value::Object(c.clone()).to_string().as_bytes());
            let no_tenant = c.get("tenant").and_then(|t| t.as_str()).is_none_or(str::is_empty);
            let expired = c.get("exp").and_then(|e| e.as_i64()).is_some_and(|e| e <= now);
            Credential {
                header: "authorization",
                value: format!("Bearer {h1}.{body}.{}", sign(&h1, &body)),
                expect_opt: (no_tenant || expired).then_some(false),
            }
        }),
        // A valid token with one byte of its signature or body changed.
        2 => (any::<usize>(), any::<u8>(), any::<bool>()).prop_map(move |(at, byte, in_sig)| {
            let body = b64(valid_claims().to_string().as_bytes());
            let mut sig = sign(&h2, &body).into_bytes();
            let mut bod = body.clone().into_bytes();
            let target = if in_sig { &mut sig } else { &mut bod };
            let i = at % target.len().max(1);
            let old = target[i];
            target[i] = if byte == old || !byte.is_ascii_graphic() { if old == b'A' { b'B' } else { b'A' } } else { byte };
            Credential {
                header: "authorization",
                value: format!("Bearer {h2}.{}.{}", String::from_utf8_lossy(&bod), String::from_utf8_lossy(&sig)),
                expect_opt: Some(false),
            }
        }),
        // The genuine articles.
        1 => Just(()).prop_map(move |_| {
            let body = b64(valid_claims().to_string().as_bytes());
            Credential {
                header: "authorization",
                value: format!("Bearer {h3}.{body}.{}", sign(&h3, &body)),
                expect_opt: Some(true),
            }
        }),
        1 => Just(()).prop_map(move |_| Credential { header: "x-api-key", value: k2.clone(), expect_opt: Some(true) }),
    ]
    .boxed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn credentials_are_accepted_only_when_valid() -> anyhow::Result<()> {
    let n = (cases() / 2).max(50) as usize;
    let mut settings = engram_tests::settings().await?;
    settings.auth.jwt_hs256_secret_opt = Some(String::from_utf8(SECRET.to_vec())?);
    settings.auth.jwt_audience_opt = Some("engram".into());
    settings.auth.jwt_issuer_opt = Some("https://idp.example".into());
    settings.tenant.requests_per_second = 1_000_000;
    settings.tenant.burst = 1_000_000;
    let (stack, uri, keys) = stack_with_keys(settings, &[("fuzz", "public")]).await?;
    let channel = tonic::transport::Endpoint::from_shared(uri)?
        .connect()
        .await?;
    let memory = MemoryServiceClient::new(channel);
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[31; 32]),
    );
    let strategy = credential(keys[0].clone());
    let mut creds = Vec::with_capacity(n);
    for _ in 0..n {
        let tree = strategy
            .new_tree(&mut runner)
            .map_err(|e| anyhow::anyhow!("generating a credential: {e}"))?;
        creds.push(tree.current());
    }
    let results: Vec<(Credential, Result<(), tonic::Status>)> = futures::stream::iter(creds)
        .map(|cred| {
            let mut m = memory.clone();
            async move {
                let mut req = tonic::Request::new(engram_proto::GetRequest {
                    ids: vec![uuid::Uuid::new_v4().to_string()],
                    include_embedding: false,
                });
                match cred.value.parse() {
                    Ok(v) => {
                        req.metadata_mut().insert(cred.header, v);
                    }
                    // Not a legal header value: the client cannot send it.
                    Err(_) => return (cred, Err(tonic::Status::unauthenticated("unsendable"))),
                }
                let r = m.get(req).await.map(drop);
                (cred, r)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    stack.shutdown().await;
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    let mut bad = Vec::new();
    for (cred, r) in &results {
        let ok = match r {
            Ok(()) => true,
            Err(s) if s.code() == tonic::Code::Unauthenticated => false,
            Err(s) => {
                bad.push(format!("{:?} {} for {cred:?}", s.code(), s.message()));
                continue;
            }
        };
        *tally.entry(format!("{} ok={ok}", cred.header)).or_default() += 1;
        if cred.expect_opt.is_some_and(|want| want != ok) {
            bad.push(format!("ok={ok} for {cred:?}"));
        }
    }
    eprintln!(
        "fuzz credentials: {} executions; outcomes {tally:?}",
        results.len()
    );
    assert!(
        bad.is_empty(),
        "{} wrong answers; first: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    Ok(())
}
