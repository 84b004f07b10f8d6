//! Hostile input at scale (issue 16): at least 10,000 generated requests
//! (arbitrary Unicode with NUL, control and combining characters, extreme
//! numbers and timestamps, oversized fields, malformed JSON) through the
//! real gateway over gRPC and HTTP. None may panic or answer INTERNAL /
//! 500, none may open a breaker, and every rejection names its field.
//! `ENGRAM_HOSTILE_CASES` changes the count (default 10,000).

use std::collections::BTreeMap;

use engram_proto::knowledge_foundry_service_client::KnowledgeFoundryServiceClient;
use engram_proto::memory_service_client::MemoryServiceClient;
use engram_proto::retrieval_service_client::RetrievalServiceClient;
use engram_proto::{
    BasicRetrieveRequest, ConversationMessage, FeedbackItem, FeedbackRequest, Memory,
    RetrieveRequest, TimeRange, Triple, UpsertRequest,
};
use engram_tests::{authed, stack_with_keys};
use futures::StreamExt;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use prost_types::{Struct, Timestamp, Value, value::Kind};
use tonic::transport::Channel;

/// Text a hostile caller would send: arbitrary Unicode, control and
/// combining characters, case-folding traps, sizes up to far past limits.
fn nasty_text() -> BoxedStrategy<String> {
    prop_oneof![
        3 => any::<String>(),
        3 => "[a-z \u{0}\u{1}\u{7f}\t\n\r\u{300}-\u{36f}\u{212a}İé?]{0,60}",
        2 => "[a-zA-Z ]{1,40}",
        1 => (1usize..200_000).prop_map(|n| "x".repeat(n)),
        1 => Just(String::new()),
    ]
    .boxed()
}

fn extreme_f32() -> BoxedStrategy<f32> {
    prop_oneof![
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(f32::NEG_INFINITY),
        Just(-1.0),
        Just(1e30),
        Just(0.5),
        any::<f32>(),
    ]
    .boxed()
}

fn timestamp() -> BoxedStrategy<Option<Timestamp>> {
    prop_oneof![
        Just(None),
        (any::<i64>(), any::<i32>())
            .prop_map(|(seconds, nanos)| Some(Timestamp { seconds, nanos })),
        (0i64..2_000_000_000).prop_map(|seconds| Some(Timestamp { seconds, nanos: 0 })),
    ]
    .boxed()
}

fn metadata() -> BoxedStrategy<Option<Struct>> {
    let value = prop_oneof![
        nasty_text().prop_map(Kind::StringValue),
        any::<f64>().prop_map(Kind::NumberValue),
        any::<bool>().prop_map(Kind::BoolValue),
        Just(Kind::NullValue(0)),
    ];
    prop_oneof![
        Just(None),
        proptest::collection::btree_map(nasty_text(), value, 0..4).prop_map(|m| {
            let fields: BTreeMap<String, Value> = m
                .into_iter()
                .map(|(k, v)| (k, Value { kind: Some(v) }))
                .collect();
            Some(Struct {
                fields: fields.into_iter().collect(),
            })
        }),
    ]
    .boxed()
}

/// Benign text: what an ordinary caller sends.
fn plain_text() -> BoxedStrategy<String> {
    "[a-zA-Z ]{1,40}".boxed()
}

/// A field's strategy: hostile when `dirty`, ordinary otherwise.
fn text(dirty: bool) -> BoxedStrategy<String> {
    if dirty { nasty_text() } else { plain_text() }
}

fn texts(dirty: bool) -> BoxedStrategy<Vec<String>> {
    proptest::collection::vec(text(dirty), 0..3).boxed()
}

fn fraction(dirty: bool) -> BoxedStrategy<Option<f32>> {
    if dirty {
        proptest::option::of(extreme_f32()).boxed()
    } else {
        proptest::option::of(0.0f32..1.0).boxed()
    }
}

fn when(dirty: bool) -> BoxedStrategy<Option<Timestamp>> {
    if dirty {
        timestamp()
    } else {
        Just(None).boxed()
    }
}

fn meta(dirty: bool) -> BoxedStrategy<Option<Struct>> {
    if dirty {
        metadata()
    } else {
        Just(None).boxed()
    }
}

/// Which fields of a request are hostile: none (a third of requests, so
/// the full pipeline runs), one, or all.
fn dirt() -> BoxedStrategy<[bool; 8]> {
    prop_oneof![
        Just([false; 8]),
        (0usize..8).prop_map(|i| {
            let mut d = [false; 8];
            d[i] = true;
            d
        }),
        Just([true; 8]),
    ]
    .boxed()
}

fn retrieve() -> BoxedStrategy<RetrieveRequest> {
    dirt()
        .prop_flat_map(|d| {
            let filters = (
                texts(d[1]),
                proptest::option::of((when(d[2]), when(d[2]))),
                if d[3] {
                    texts(true)
                } else {
                    Just(Vec::new()).boxed()
                },
                fraction(d[4]),
                when(d[2]),
                if d[3] {
                    nasty_text()
                } else {
                    Just(String::new()).boxed()
                },
                meta(d[5]),
            );
            let shape = (
                text(d[0]),
                if d[6] {
                    proptest::option::of(any::<u32>()).boxed()
                } else {
                    proptest::option::of(1u32..50).boxed()
                },
                if d[6] {
                    any::<i32>().boxed()
                } else {
                    (0i32..=7).boxed()
                },
                texts(d[7]),
                if d[7] {
                    nasty_text()
                } else {
                    Just(String::new()).boxed()
                },
                if d[6] {
                    any::<u32>().boxed()
                } else {
                    (0u32..4000).boxed()
                },
                proptest::collection::vec(
                    (
                        if d[7] {
                            nasty_text()
                        } else {
                            Just("user".to_string()).boxed()
                        },
                        text(d[7]),
                    ),
                    0..3,
                ),
            );
            (filters, shape)
        })
        .prop_map(
            |(
                (memory_types, range, agent_scope, min_confidence, as_of, namespace, meta),
                (text, limit, mode, hypotheses, turn_id, token_budget, conversation),
            )| RetrieveRequest {
                text,
                memory_types,
                time_range: range.map(|(start, end)| TimeRange { start, end }),
                agent_scope,
                limit,
                min_confidence,
                as_of_event: as_of,
                namespace,
                metadata_filter: meta,
                mode,
                hypotheses,
                turn_id,
                token_budget,
                conversation: conversation
                    .into_iter()
                    .map(|(role, content)| ConversationMessage {
                        role,
                        content,
                        summary_marker: false,
                    })
                    .collect(),
                // Every request runs: a cached answer would test nothing.
                no_cache: true,
                skip_rerank: true,
                ..Default::default()
            },
        )
        .boxed()
}

fn memory() -> BoxedStrategy<Memory> {
    dirt()
        .prop_flat_map(|d| {
            let id = if d[0] {
                prop_oneof![Just(uuid::Uuid::new_v4().to_string()), nasty_text()].boxed()
            } else {
                Just(String::new()).boxed()
            };
            (
                (
                    id,
                    text(d[1]),
                    if d[2] {
                        nasty_text()
                    } else {
                        Just(String::new()).boxed()
                    },
                ),
                (
                    if d[3] {
                        any::<i32>().boxed()
                    } else {
                        (1i32..=2).boxed()
                    },
                    fraction(d[4]),
                    when(d[5]),
                    when(d[5]),
                    meta(d[6]),
                    texts(d[7]),
                    proptest::collection::vec((text(d[7]), text(d[7]), text(d[7])), 0..2),
                ),
            )
        })
        .prop_map(
            |(
                (id, content, namespace),
                (access_level, source_confidence, event_time, valid_to, meta, entities, triples),
            )| Memory {
                id,
                content,
                namespace,
                access_level,
                source_confidence,
                event_time,
                valid_to,
                metadata: meta,
                entities,
                triples: triples
                    .into_iter()
                    .map(|(subject, relation, object)| Triple {
                        subject,
                        relation,
                        object,
                    })
                    .collect(),
                ..Default::default()
            },
        )
        .boxed()
}

/// One generated call.
#[derive(Debug, Clone)]
enum Call {
    Retrieve(RetrieveRequest),
    Upsert(UpsertRequest),
    Feedback(FeedbackRequest),
    Basic(BasicRetrieveRequest),
    /// A JSON body (or garbage) for one of the HTTP paths.
    Http(&'static str, Vec<u8>),
}

fn json_value() -> BoxedStrategy<serde_json::Value> {
    let leaf = prop_oneof![
        nasty_text().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(|f| serde_json::json!(f)),
        any::<bool>().prop_map(serde_json::Value::from),
        Just(serde_json::Value::Null),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map("[a-z_]{1,12}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

fn http_body(tenant: String) -> BoxedStrategy<Vec<u8>> {
    let kb = prop_oneof![
        Just(serde_json::json!(uuid::Uuid::new_v4().to_string())),
        json_value(),
    ];
    let fields = (
        prop_oneof![plain_text(), nasty_text()],
        prop_oneof![(1u32..20).prop_map(serde_json::Value::from), json_value()],
        prop_oneof![Just(serde_json::json!("hybrid")), json_value()],
        prop_oneof![Just(serde_json::Value::Null), json_value()],
        kb,
        any::<bool>(),
    );
    prop_oneof![
        3 => fields.prop_map(move |(query, top_k, mode, filters, kb, own_tenant)| {
            serde_json::to_vec(&serde_json::json!({
                "query": query,
                "tenant_id": if own_tenant { serde_json::json!(tenant) } else { kb.clone() },
                "kb_id": kb.clone(),
                "kb_ids": [kb],
                "top_k": top_k,
                "mode": mode,
                "filters": filters,
            }))
            .unwrap_or_default()
        }),
        1 => json_value().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        1 => proptest::collection::vec(any::<u8>(), 0..200),
    ]
    .boxed()
}

fn call(tenant: String) -> BoxedStrategy<Call> {
    let upsert = proptest::collection::vec(memory(), 1..3)
        .prop_map(|memories| Call::Upsert(UpsertRequest { memories }));
    let feedback = (
        nasty_text(),
        proptest::collection::vec((nasty_text(), any::<i32>(), any::<bool>()), 0..3),
    )
        .prop_map(|(query_id, items)| {
            Call::Feedback(FeedbackRequest {
                query_id,
                items: items
                    .into_iter()
                    .map(|(memory_id, signal, value)| FeedbackItem {
                        memory_id,
                        signal,
                        value,
                    })
                    .collect(),
            })
        });
    let basic = (
        nasty_text(),
        nasty_text(),
        proptest::option::of(any::<u32>()),
        nasty_text(),
        proptest::option::of(extreme_f32()),
    )
        .prop_map(move |(kb_id, query, top_k, mode, similarity_threshold)| {
            Call::Basic(BasicRetrieveRequest {
                kb_id,
                query,
                tenant_id: String::new(),
                top_k,
                mode,
                filters: None,
                similarity_threshold,
            })
        });
    // The Foundry routes and the REST routes of the public RPCs.
    let path = prop_oneof![
        Just("/api/v1/retrieve/basic"),
        Just("/api/v1/retrieve/agentic"),
        Just("/v1/retrieve"),
        Just("/v1/memories"),
        Just("/v1/feedback"),
        Just("/v1/memories/list"),
        Just("/v1/conflicts/list"),
        Just("/v1/working-memory"),
    ];
    let http = (path, http_body(tenant)).prop_map(|(p, body)| Call::Http(p, body));
    prop_oneof![
        5 => retrieve().prop_map(Call::Retrieve),
        1 => upsert,
        1 => feedback,
        1 => basic,
        4 => http,
    ]
    .boxed()
}

/// What a hostile call may get back, and what it may never get.
fn check_status(call: &Call, s: &tonic::Status) -> Result<(), String> {
    use tonic::Code;
    match s.code() {
        Code::InvalidArgument => {
            // "invalid argument <field>: <rule>", or a downstream's
            // "<field>: <rule>" passed through.
            let named = s
                .message()
                .split_once(": ")
                .is_some_and(|(f, _)| !f.is_empty());
            if named {
                Ok(())
            } else {
                Err(format!("rejection names no field: {s:?} for {call:?}"))
            }
        }
        Code::NotFound
        | Code::PermissionDenied
        | Code::ResourceExhausted
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::AlreadyExists => Ok(()),
        _ => Err(format!("{:?}: {} for {call:?}", s.code(), s.message())),
    }
}

struct Clients {
    key: String,
    retrieval: RetrievalServiceClient<Channel>,
    memory: MemoryServiceClient<Channel>,
    foundry: KnowledgeFoundryServiceClient<Channel>,
    http: reqwest::Client,
    http_base: String,
}

/// The outcome's label (`"grpc OK"`, `"http 400"`, ...), or why it is wrong.
async fn send(c: Clients, call: Call) -> Result<String, String> {
    let Clients {
        key,
        mut retrieval,
        mut memory,
        mut foundry,
        http,
        http_base,
    } = c;
    let grpc = match &call {
        Call::Retrieve(r) => retrieval
            .retrieve(authed(&key, r.clone()))
            .await
            .map(|_| ()),
        Call::Upsert(r) => memory.upsert(authed(&key, r.clone())).await.map(|_| ()),
        Call::Feedback(r) => retrieval
            .feedback(authed(&key, r.clone()))
            .await
            .map(|_| ()),
        Call::Basic(r) => foundry
            .retrieve_basic(authed(&key, r.clone()))
            .await
            .map(|_| ()),
        Call::Http(path, body) => {
            let resp = http
                .post(format!("{http_base}{path}"))
                .bearer_auth(&key)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .map_err(|e| format!("http transport: {e}"))?;
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            if status.is_server_error() {
                return Err(format!("http {status}: {text} for {call:?}"));
            }
            if status == 400 && !text.contains("invalid argument ") {
                return Err(format!("http 400 names no field: {text} for {call:?}"));
            }
            return Ok(format!("http {}", status.as_u16()));
        }
    };
    match grpc {
        Ok(()) => Ok("grpc Ok".into()),
        Err(s) => check_status(&call, &s).map(|()| format!("grpc {:?}", s.code())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_hostile_requests_never_panic_fail_internally_or_open_a_breaker()
-> anyhow::Result<()> {
    let cases: usize = std::env::var("ENGRAM_HOSTILE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mut settings = engram_tests::settings().await?;
    // The flood is one tenant's; fairness limits are another test's subject.
    settings.tenant.requests_per_second = 1_000_000;
    settings.tenant.burst = 1_000_000;
    settings.tenant.max_concurrent = 64;
    // The subject is input handling, not the stage budgets: a debug build
    // on a loaded 2-core CI runner sometimes takes longer than the 300 ms
    // vector budget, and a VECTOR-only request whose one strategy timed out
    // is UNAVAILABLE by design (1 in 10,000 failed a CI run that way). The
    // budgets under load are `engram soak`'s and `engram bench`'s subject.
    settings.pipeline.vector_timeout_ms = 2_000;
    settings.pipeline.keyword_timeout_ms = 2_000;
    settings.pipeline.graph_timeout_ms = 2_000;
    let (stack, uri, keys) = stack_with_keys(settings, &[("hostile", "sensitive")]).await?;
    let key = keys[0].clone();
    let tenant = stack
        .settings
        .auth
        .api_keys
        .iter()
        .find(|k| k.sha256 == engram::stack::sha256_hex(&key))
        .map(|k| k.tenant.clone())
        .unwrap_or_default();
    let channel = tonic::transport::Endpoint::from_shared(uri)?
        .connect()
        .await?;
    let http_addr = stack
        .http_addr_opt
        .ok_or_else(|| anyhow::anyhow!("no http api"))?;
    let clients = Clients {
        key,
        retrieval: RetrievalServiceClient::new(channel.clone()).max_encoding_message_size(64 << 20),
        memory: MemoryServiceClient::new(channel.clone()).max_encoding_message_size(64 << 20),
        foundry: KnowledgeFoundryServiceClient::new(channel),
        http: reqwest::Client::new(),
        http_base: format!("http://{http_addr}"),
    };
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let strategy = call(tenant);
    let mut calls = Vec::with_capacity(cases);
    for _ in 0..cases {
        let tree = strategy
            .new_tree(&mut runner)
            .map_err(|e| anyhow::anyhow!("generating a call: {e}"))?;
        calls.push(tree.current());
    }
    let clone = |c: &Clients| Clients {
        key: c.key.clone(),
        retrieval: c.retrieval.clone(),
        memory: c.memory.clone(),
        foundry: c.foundry.clone(),
        http: c.http.clone(),
        http_base: c.http_base.clone(),
    };
    let results: Vec<Result<String, String>> = futures::stream::iter(calls)
        .map(|call| send(clone(&clients), call))
        .buffer_unordered(8)
        .collect()
        .await;
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for label in results.iter().flatten() {
        *tally.entry(label.clone()).or_default() += 1;
    }
    eprintln!("outcomes: {tally:?}");
    let failures: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    let body = reqwest::get(format!("http://{}/metrics", stack.admin_addr))
        .await?
        .text()
        .await?;
    stack.shutdown().await;
    let downstream: Vec<&str> = body
        .lines()
        .filter(|l| {
            l.starts_with("engram_downstream_requests_total{")
                && !l.contains("\"ok\"")
                && !l.ends_with(" 0")
        })
        .collect();
    eprintln!("downstream outcomes other than ok: {downstream:?}");
    assert!(
        failures.is_empty(),
        "{} of {cases} calls failed; first: {:?}",
        failures.len(),
        failures.iter().take(5).collect::<Vec<_>>()
    );
    let open: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("engram_retrieval_circuit_state{"))
        .filter(|l| !l.ends_with(" 0"))
        .collect();
    assert!(open.is_empty(), "breakers not closed: {open:?}");
    Ok(())
}
