//! Issue 10 surfaces end to end on the real stack: Knowledge Foundry basic
//! and agentic retrieval over gRPC (generated client) and HTTP (a real HTTP
//! client), the conversation window, fail-open and the context block.

use std::time::Duration;

use engram_common::convert::json_to_struct;
use engram_proto::knowledge_foundry_service_client::KnowledgeFoundryServiceClient;
use engram_proto::retrieval_service_client::RetrievalServiceClient;
use engram_proto::{
    AgenticRetrieveRequest, BasicRetrieveRequest, ConversationMessage, FoundryResponse, Memory,
    RetrieveRequest, UpsertRequest,
};
use engram_tests::TestStack;
use engram_tests::authed;
use retrieval_svc::Gateway;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::Channel;

type Foundry = KnowledgeFoundryServiceClient<Channel>;

async fn foundry(uri: String) -> anyhow::Result<Foundry> {
    Ok(KnowledgeFoundryServiceClient::connect(uri).await?)
}

fn mem(id_seed: &str, ns: &str, kind: &str, content: &str, meta: Value) -> Memory {
    Memory {
        id: uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, id_seed.as_bytes()).to_string(),
        namespace: ns.into(),
        memory_type: kind.into(),
        content: content.into(),
        metadata: Some(json_to_struct(&meta)),
        ..Default::default()
    }
}

/// Starts the HTTP API on port 0 against a gateway built from `settings`.
async fn http_api(settings: engram_common::Settings) -> anyhow::Result<String> {
    let gw = Gateway::new(settings)?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(retrieval_svc::http::serve(
        listener,
        gw,
        std::future::pending(),
    ));
    Ok(format!("http://{addr}"))
}

fn field_error(r: Result<tonic::Response<FoundryResponse>, tonic::Status>, field: &str) {
    match r {
        Err(s) => {
            assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
            assert!(s.message().contains(field), "{field}: {}", s.message());
        }
        Ok(r) => panic!("expected invalid {field}, got {:?}", r.into_inner()),
    }
}

struct Seeded {
    ts: TestStack,
    kb: String,
    other_kb: String,
    uid: String,
}

/// A tenant with two knowledge bases; ids are per-run so reruns don't clash.
async fn seeded() -> anyhow::Result<Seeded> {
    let ts = TestStack::start("sensitive").await?;
    let kb = uuid::Uuid::new_v4().to_string();
    let other_kb = uuid::Uuid::new_v4().to_string();
    let uid = uuid::Uuid::new_v4().simple().to_string();
    let filler = " The archive also lists cast, crew, budget, box office, awards, \
        release dates in many countries, critical reception and home media editions.";
    let mut memories = vec![
        mem(
            &format!("{uid}-inception"),
            &kb,
            "semantic",
            &format!(
                "Inception is a 2010 science fiction film written and directed by Christopher Nolan.{filler}"
            ),
            json!({"lang": "en", "document_id": "films.md"}),
        ),
        mem(
            &format!("{uid}-nolan"),
            &kb,
            "semantic",
            &format!(
                "Christopher Nolan was born in Westminster, London, England, on 30 July 1970.{filler}"
            ),
            json!({"lang": "en", "document_id": "people.md"}),
        ),
        mem(
            &format!("{uid}-turing"),
            &kb,
            "semantic",
            &format!("Alan Turing was born on 23 June 1912 in Maida Vale, London.{filler}"),
            json!({"lang": "en"}),
        ),
        mem(
            &format!("{uid}-neumann"),
            &kb,
            "semantic",
            &format!("John von Neumann was born on 28 December 1903 in Budapest, Hungary.{filler}"),
            json!({"lang": "de"}),
        ),
        mem(
            &format!("{uid}-other"),
            &other_kb,
            "semantic",
            "Inception is a 2010 science fiction film written and directed by Christopher Nolan, says the other base.",
            json!({"lang": "en"}),
        ),
    ];
    for i in 0..6 {
        memories.push(mem(
            &format!("{uid}-f{i}"),
            &kb,
            "episodic",
            &format!("Film trivia note {i}: Nolan's films often use practical effects and IMAX cameras.{filler}"),
            json!({"lang": "en"}),
        ));
    }
    let mut c = ts.client().await?;
    c.memories.upsert(UpsertRequest { memories }).await?;
    Ok(Seeded {
        ts,
        kb,
        other_kb,
        uid,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn basic_retrieval_over_grpc_and_http() -> anyhow::Result<()> {
    let s = seeded().await?;
    let ts = &s.ts;
    let uri = ts.stack.gateway_uri().expect("gateway");
    let mut f = foundry(uri).await?;
    let req = |q: &str| BasicRetrieveRequest {
        kb_id: s.kb.clone(),
        query: q.into(),
        tenant_id: ts.tenant.clone(),
        ..Default::default()
    };

    // Defaults: vector mode, top_k 10, similarity 0.4; only this kb.
    let r = f
        .retrieve_basic(authed(&ts.key, req("Who directed the film Inception?")))
        .await?
        .into_inner();
    assert_eq!(r.answer, "");
    assert!(!r.request_id.is_empty());
    assert!(!r.results.is_empty() && r.results.len() <= 10, "{r:?}");
    assert!(r.results.iter().all(|x| x.score >= 0.4), "{:?}", r.results);
    assert!(r.results[0].text.contains("directed by Christopher Nolan"));
    assert_eq!(r.results[0].document_id, "films.md");
    assert!(r.results.iter().all(|x| !x.text.contains("other base")));
    assert_eq!(r.steps.len(), 1);
    assert_eq!(r.steps[0].action, "retrieve");
    assert_eq!(r.steps[0].step_number, 1);
    assert!(r.total_tokens_used > 0 && !r.truncated);

    // A threshold of 1 keeps nothing; 0 keeps every vector hit up to top_k.
    let strict = f
        .retrieve_basic(authed(
            &ts.key,
            BasicRetrieveRequest {
                similarity_threshold: Some(1.0),
                ..req("Who directed the film Inception?")
            },
        ))
        .await?
        .into_inner();
    assert!(strict.results.is_empty());
    let loose = f
        .retrieve_basic(authed(
            &ts.key,
            BasicRetrieveRequest {
                similarity_threshold: Some(0.0),
                top_k: Some(3),
                ..req("Who directed the film Inception?")
            },
        ))
        .await?
        .into_inner();
    assert_eq!(loose.results.len(), 3);

    // Keyword and hybrid modes; filters are metadata containment.
    let kw = f
        .retrieve_basic(authed(
            &ts.key,
            BasicRetrieveRequest {
                mode: "keyword".into(),
                ..req("Budapest")
            },
        ))
        .await?
        .into_inner();
    assert_eq!(kw.results.len(), 1, "{kw:?}");
    assert!(kw.results[0].text.contains("von Neumann"));
    let filtered = f
        .retrieve_basic(authed(
            &ts.key,
            BasicRetrieveRequest {
                mode: "hybrid".into(),
                filters: Some(json_to_struct(&json!({"lang": "de"}))),
                ..req("Where was John von Neumann born?")
            },
        ))
        .await?
        .into_inner();
    assert!(!filtered.results.is_empty());
    assert!(
        filtered
            .results
            .iter()
            .all(|x| x.text.contains("von Neumann")),
        "{filtered:?}"
    );

    // Validation names the field; another tenant is PermissionDenied.
    field_error(
        f.retrieve_basic(authed(
            &ts.key,
            BasicRetrieveRequest {
                top_k: Some(0),
                ..req("q")
            },
        ))
        .await,
        "top_k",
    );
    field_error(
        f.retrieve_basic(authed(
            &ts.key,
            BasicRetrieveRequest {
                top_k: Some(101),
                ..req("q")
            },
        ))
        .await,
        "top_k",
    );
    field_error(
        f.retrieve_basic(authed(
            &ts.key,
            BasicRetrieveRequest {
                similarity_threshold: Some(1.5),
                ..req("q")
            },
        ))
        .await,
        "similarity_threshold",
    );
    field_error(
        f.retrieve_basic(authed(
            &ts.key,
            BasicRetrieveRequest {
                mode: "fuzzy".into(),
                ..req("q")
            },
        ))
        .await,
        "mode",
    );
    field_error(
        f.retrieve_basic(authed(
            &ts.key,
            BasicRetrieveRequest {
                kb_id: "kb\u{0}1".into(),
                ..req("q")
            },
        ))
        .await,
        "kb_id",
    );
    field_error(f.retrieve_basic(authed(&ts.key, req(" "))).await, "query");
    let denied = f
        .retrieve_basic(authed(
            &ts.key,
            BasicRetrieveRequest {
                tenant_id: "someone-else".into(),
                ..req("q")
            },
        ))
        .await
        .expect_err("denied");
    assert_eq!(denied.code(), Code::PermissionDenied);
    let anon = f
        .retrieve_basic(tonic::Request::new(req("q")))
        .await
        .expect_err("anon");
    assert_eq!(anon.code(), Code::Unauthenticated);

    // HTTP: the same contract with a real client.
    let base = http_api(ts.stack.settings.clone()).await?;
    let http = reqwest::Client::new();
    let url = format!("{base}/api/v1/retrieve/basic");
    let body =
        json!({"kb_id": s.kb, "query": "Who directed the film Inception?", "tenant_id": ts.tenant});
    let resp = http
        .post(&url)
        .header("authorization", format!("Bearer {}", ts.key))
        .json(&body)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await?;
    assert_eq!(v["answer"], "");
    assert!(v["request_id"].as_str().is_some_and(|s| !s.is_empty()));
    let results = v["results"].as_array().expect("results");
    assert!(!results.is_empty());
    assert!(
        results[0]["text"]
            .as_str()
            .unwrap_or("")
            .contains("Christopher Nolan")
    );
    assert_eq!(results[0]["metadata"]["document_id"], "films.md");
    assert!(results[0]["chunk_id"].as_str().is_some());
    assert_eq!(v["steps"][0]["action"], "retrieve");
    assert_eq!(v["truncated"], false);
    assert!(v["total_tokens_used"].as_u64().is_some_and(|t| t > 0));
    // x-api-key works too.
    let resp = http
        .post(&url)
        .header("x-api-key", &ts.key)
        .json(&body)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    // No credentials: 401; another tenant: 403; bad fields: 400 naming them.
    assert_eq!(http.post(&url).json(&body).send().await?.status(), 401);
    let mut other = body.clone();
    other["tenant_id"] = json!("someone-else");
    let resp = http
        .post(&url)
        .header("x-api-key", &ts.key)
        .json(&other)
        .send()
        .await?;
    assert_eq!(resp.status(), 403);
    for (field, bad) in [
        ("top_k", json!(101)),
        ("top_k", json!("ten")),
        ("similarity_threshold", json!(-0.1)),
        ("mode", json!("semantic")),
        ("kb_id", json!("")),
        ("filters", json!("lang=en")),
    ] {
        let mut b = body.clone();
        b[field] = bad;
        let resp = http
            .post(&url)
            .header("x-api-key", &ts.key)
            .json(&b)
            .send()
            .await?;
        assert_eq!(resp.status(), 400, "{field}");
        let e: Value = resp.json().await?;
        assert!(
            e["error"]["message"].as_str().unwrap_or("").contains(field),
            "{field}: {e}"
        );
    }
    let _ = (&s.other_kb, &s.uid);
    s.ts.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agentic_retrieval_decomposes_and_respects_budgets() -> anyhow::Result<()> {
    let s = seeded().await?;
    let ts = &s.ts;
    let mut f = foundry(ts.stack.gateway_uri().expect("gateway")).await?;
    let req = |q: &str| AgenticRetrieveRequest {
        query: q.into(),
        tenant_id: ts.tenant.clone(),
        kb_ids: vec![s.kb.clone()],
        ..Default::default()
    };

    // Bridge: the director first (beside the whole question), then where
    // the director was born.
    let question = "Where was the director of film Inception born?";
    let r = f
        .retrieve_agentic(authed(&ts.key, req(question)))
        .await?
        .into_inner();
    let actions: Vec<&str> = r.steps.iter().map(|s| s.action.as_str()).collect();
    assert_eq!(
        actions,
        [
            "decompose",
            "retrieve",
            "retrieve",
            "retrieve",
            "synthesize"
        ],
        "{r:#?}"
    );
    assert_eq!(r.steps[1].input, question);
    assert_eq!(r.steps[2].input, "director of film Inception");
    assert_eq!(
        r.steps[3].input, "Where was Christopher Nolan born?",
        "{r:#?}"
    );
    assert!(r.steps[3].detail.contains("Christopher Nolan"));
    assert!(
        r.results
            .iter()
            .any(|x| x.text.contains("born in Westminster"))
    );
    assert!(r.results.iter().all(|x| !x.text.contains("other base")));
    assert!(r.context.starts_with("[Source 1] "), "{}", r.context);
    assert_eq!(r.answer, "");
    assert!(!r.truncated && r.truncated_reason.is_empty());
    assert!(
        r.steps
            .iter()
            .enumerate()
            .all(|(i, s)| s.step_number == i as u32 + 1)
    );
    let retrieved: u32 = r
        .steps
        .iter()
        .filter(|s| s.action == "retrieve")
        .map(|s| s.tokens)
        .sum();
    assert_eq!(r.total_tokens_used, retrieved);

    // The same bridge with every step through the whole pipeline (`auto`):
    // the same plan, the same bridge entity, the answer found.
    let r = f
        .retrieve_agentic(authed(
            &ts.key,
            AgenticRetrieveRequest {
                mode: "auto".into(),
                ..req(question)
            },
        ))
        .await?
        .into_inner();
    assert_eq!(
        r.steps[3].input, "Where was Christopher Nolan born?",
        "{r:#?}"
    );
    assert!(
        r.results
            .iter()
            .any(|x| x.text.contains("born in Westminster"))
    );
    assert!(r.results.iter().all(|x| !x.text.contains("other base")));

    // Comparison: the whole question and one sub-query per entity, in
    // parallel.
    let question = "Who was born first, Alan Turing or John von Neumann?";
    let r = f
        .retrieve_agentic(authed(&ts.key, req(question)))
        .await?
        .into_inner();
    let inputs: Vec<&str> = r
        .steps
        .iter()
        .filter(|s| s.action == "retrieve")
        .map(|s| s.input.as_str())
        .collect();
    assert_eq!(
        inputs,
        [
            question,
            "Who was born first, Alan Turing?",
            "Who was born first, John von Neumann?"
        ]
    );
    assert!(r.results.iter().any(|x| x.text.contains("Maida Vale")));
    assert!(r.results.iter().any(|x| x.text.contains("Budapest")));

    // Low effort is a single pass without decomposition; empty kb_ids = all.
    let r = f
        .retrieve_agentic(authed(
            &ts.key,
            AgenticRetrieveRequest {
                reasoning_effort: "low".into(),
                kb_ids: vec![],
                ..req("Who directed Inception?")
            },
        ))
        .await?
        .into_inner();
    let actions: Vec<&str> = r.steps.iter().map(|s| s.action.as_str()).collect();
    assert_eq!(actions, ["retrieve", "synthesize"]);
    assert!(
        r.results.iter().any(|x| x.text.contains("other base")),
        "all kbs"
    );

    // A tiny token budget stops before the follow-up; the context stays
    // within 70% of it.
    let r = f
        .retrieve_agentic(authed(
            &ts.key,
            AgenticRetrieveRequest {
                token_budget: Some(100),
                ..req("Where was the director of film Inception born?")
            },
        ))
        .await?
        .into_inner();
    assert!(r.truncated);
    assert_eq!(r.truncated_reason, "budget");
    // The whole question and the first hop ran side by side; no follow-up.
    assert_eq!(
        r.steps.iter().filter(|s| s.action == "retrieve").count(),
        2,
        "{r:#?}"
    );
    assert!(r.context.len().div_ceil(4) <= 70, "{}", r.context);
    // max_steps 1 also truncates the bridge.
    let r = f
        .retrieve_agentic(authed(
            &ts.key,
            AgenticRetrieveRequest {
                max_steps: Some(1),
                ..req("Where was the director of film Inception born?")
            },
        ))
        .await?
        .into_inner();
    assert_eq!(
        (r.truncated, r.truncated_reason.as_str()),
        (true, "max_steps")
    );

    // Validation and defaults.
    for (field, bad) in [
        (
            "max_steps",
            AgenticRetrieveRequest {
                max_steps: Some(21),
                ..req("q")
            },
        ),
        (
            "top_k_per_step",
            AgenticRetrieveRequest {
                top_k_per_step: Some(51),
                ..req("q")
            },
        ),
        (
            "token_budget",
            AgenticRetrieveRequest {
                token_budget: Some(99),
                ..req("q")
            },
        ),
        (
            "max_latency_ms",
            AgenticRetrieveRequest {
                max_latency_ms: Some(999),
                ..req("q")
            },
        ),
        (
            "reasoning_effort",
            AgenticRetrieveRequest {
                reasoning_effort: "max".into(),
                ..req("q")
            },
        ),
        (
            "kb_ids",
            AgenticRetrieveRequest {
                kb_ids: vec![String::new()],
                ..req("q")
            },
        ),
        (
            "tenant_id",
            AgenticRetrieveRequest {
                tenant_id: String::new(),
                ..req("q")
            },
        ),
    ] {
        field_error(f.retrieve_agentic(authed(&ts.key, bad)).await, field);
    }

    // HTTP agentic with a real client.
    let base = http_api(ts.stack.settings.clone()).await?;
    let resp = reqwest::Client::new()
        .post(format!("{base}/api/v1/retrieve/agentic"))
        .header("x-api-key", &ts.key)
        .json(&json!({
            "query": "Where was the director of film Inception born?",
            "tenant_id": ts.tenant,
            "kb_ids": [s.kb],
            "token_budget": 100,
        }))
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await?;
    assert_eq!(v["truncated"], true);
    assert_eq!(v["truncated_reason"], "budget");
    assert_eq!(v["steps"][0]["action"], "decompose");
    s.ts.shutdown().await;
    Ok(())
}

/// A gRPC server that accepts every call and never answers: a hung
/// downstream (every RPC hangs until the caller's own deadline).
async fn hung_downstream() -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let uri = format!("http://{}", listener.local_addr()?);
    let router = axum::Router::new().fallback(std::future::pending::<()>);
    let (_reporter, health) = engram_common::server::health();
    tokio::spawn(engram_common::server::serve(
        listener,
        tonic::service::Routes::from(router),
        health,
        std::future::pending(),
    ));
    Ok(uri)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn latency_stop_and_fail_open_against_a_hung_downstream() -> anyhow::Result<()> {
    let ts = TestStack::start("sensitive").await?;
    let uri = hung_downstream().await?;
    let mut settings = ts.stack.settings.clone();
    settings.downstream.search = uri.clone();
    settings.downstream.graph = uri.clone();
    settings.downstream.rerank = uri;
    settings.pipeline.vector_timeout_ms = 10_000;
    settings.pipeline.keyword_timeout_ms = 10_000;
    settings.pipeline.graph_timeout_ms = 10_000;
    settings.pipeline.ceiling_ms = 1_000;
    let gw = Gateway::new(settings)?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(retrieval_svc::serve_gateway(
        listener,
        gw,
        std::future::pending(),
    ));
    let uri = format!("http://{addr}");

    let mut f = foundry(uri.clone()).await?;
    let t = std::time::Instant::now();
    let r = f
        .retrieve_agentic(authed(
            &ts.key,
            AgenticRetrieveRequest {
                query: "Who directed Inception?".into(),
                tenant_id: ts.tenant.clone(),
                max_latency_ms: Some(1_000),
                reasoning_effort: "low".into(),
                ..Default::default()
            },
        ))
        .await?
        .into_inner();
    assert!(
        t.elapsed() < Duration::from_millis(2_500),
        "{:?}",
        t.elapsed()
    );
    assert!(r.truncated);
    assert_eq!(r.truncated_reason, "latency");
    assert!(r.results.is_empty());

    let mut c = RetrievalServiceClient::connect(uri).await?;
    let q = RetrieveRequest {
        text: "who leads billing?".into(),
        no_cache: true,
        ..Default::default()
    };
    let mut timed = authed(&ts.key, q.clone());
    timed.set_timeout(Duration::from_millis(800));
    let err = c.retrieve(timed).await.expect_err("hung downstream fails");
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Unavailable),
        "{err:?}"
    );
    let r = c
        .retrieve(authed(
            &ts.key,
            RetrieveRequest {
                fail_open: true,
                ..q.clone()
            },
        ))
        .await?
        .into_inner();
    assert!(r.records.is_empty());
    assert_eq!(r.degraded_stages, ["fail_open"]);
    // Bad input still fails: fail_open is for outages, not for bugs.
    let bad = c
        .retrieve(authed(
            &ts.key,
            RetrieveRequest {
                text: String::new(),
                fail_open: true,
                ..Default::default()
            },
        ))
        .await
        .expect_err("invalid");
    assert_eq!(bad.code(), Code::InvalidArgument);
    ts.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conversation_window_and_context_block() -> anyhow::Result<()> {
    let ts = TestStack::start("sensitive").await?;
    let mut c = ts.client().await?;
    let uid = uuid::Uuid::new_v4().simple().to_string();
    let old = mem(
        &format!("{uid}-old"),
        "",
        "semantic",
        "Bob Marsh leads the billing migration project.",
        json!({}),
    );
    let old_id = old.id.clone();
    c.memories
        .upsert(UpsertRequest {
            memories: vec![old],
        })
        .await?;
    let mut newer = mem(
        &format!("{uid}-new"),
        "",
        "semantic",
        "Alice Chen now leads the billing migration project, replacing Bob Marsh.",
        json!({"scope": "team"}),
    );
    newer.supersedes = old_id.clone();
    let filler: Vec<Memory> = (0..5)
        .map(|i| mem(&format!("{uid}-n{i}"), "", "episodic",
            &format!("Standup note {i}: the billing migration moved its cutover window again after load tests."),
            json!({})))
        .collect();
    let mut batch = vec![newer];
    batch.extend(filler);
    c.memories.upsert(UpsertRequest { memories: batch }).await?;

    let msg = |role: &str, content: &str, marker: bool| ConversationMessage {
        role: role.into(),
        content: content.into(),
        summary_marker: marker,
    };
    let window = vec![
        msg("user", "what's the weather like on mars?", false),
        msg("system", "Summary: the user asked about space.", true),
        msg(
            "user",
            "Who leads the billing migration project now?",
            false,
        ),
        msg(
            "tool",
            "{\"error\": \"lookup_people failed with status 500\"}",
            false,
        ),
        msg("assistant", "Let me check the project records.", false),
    ];
    let r = c
        .retrieval
        .retrieve(RetrieveRequest {
            conversation: window.clone(),
            token_budget: 120,
            no_cache: true,
            // The block format is under test, not the cross-encoder's
            // verdict on a chatty window.
            skip_rerank: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    assert!(!r.records.is_empty(), "{r:?}");
    let block = &r.context_block;
    assert!(
        block.starts_with("## Relevant Long-Term Memories\n"),
        "{block}"
    );
    assert!(r.context_tokens <= 120 && r.context_tokens > 0);
    assert_eq!(r.context_tokens as usize, block.chars().count().div_ceil(4));
    let alice = r
        .records
        .iter()
        .filter_map(|x| x.memory.as_ref())
        .find(|m| m.content.starts_with("Alice Chen"))
        .expect("the superseding memory is retrieved");
    assert!(
        block.contains(&format!(
            "\n\n**[semantic | team | v{} | {}]**\n_Supersedes memory {old_id}._\nAlice Chen now leads",
            alice.version,
            chrono::DateTime::from_timestamp(alice.event_time.as_ref().map_or(0, |t| t.seconds), 0)
                .map(|d| d.format("%Y-%m-%d").to_string())
                .unwrap_or_default()
        )),
        "{block}"
    );
    // The superseded memory is closed: not in the block.
    assert!(!block.contains("Bob Marsh leads"), "{block}");
    // Highest relevance first: entries keep the record order, and the
    // budget left some records out.
    let positions: Vec<usize> = r
        .records
        .iter()
        .filter_map(|x| x.memory.as_ref())
        .filter_map(|m| block.find(m.content.as_str()))
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{block}");
    assert!(positions.len() < r.records.len(), "{block}");

    // A window with nothing to ask is InvalidArgument naming the field.
    let err = c
        .retrieval
        .retrieve(RetrieveRequest {
            conversation: vec![msg("tool", "{}", false)],
            ..Default::default()
        })
        .await
        .expect_err("invalid");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("conversation"));
    ts.shutdown().await;
    Ok(())
}

/// How `engram ingest` reaches a test stack: its connection, and the
/// deployment's settings with an id secret (file ids derive from it).
fn ingest_target(ts: &TestStack) -> (engram::commands::Conn, engram_common::Settings) {
    let conn = engram::commands::Conn {
        addr: ts.stack.gateway_uri(),
        api_key: Some(ts.key.clone()),
        tenant: ts.tenant.clone(),
    };
    let mut settings = ts.stack.settings.clone();
    settings.auth.id_secret_opt = Some("a test deployment's id secret, 32+ bytes".into());
    (conn, settings)
}

/// The error text of an ingest that must be refused.
async fn refused_ingest(
    settings: engram_common::Settings,
    file: &std::path::Path,
    conn: engram::commands::Conn,
) -> String {
    let err = engram::commands::ingest(settings, file, conn)
        .await
        .expect_err("refused");
    format!("{err:#}")
}

#[tokio::test]
async fn ingest_writes_in_file_supersedes_in_order_and_names_lines_not_indices()
-> anyhow::Result<()> {
    let ts = engram_tests::TestStack::start("internal").await?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("notes.jsonl");
    // v2 supersedes v1, written before it in the file.
    std::fs::write(
        &file,
        concat!(
            "{\"id\":\"standup-v2\",\"content\":\"The standup moved to 10:00.\",\"supersedes\":\"standup-v1\"}\n",
            "{\"id\":\"standup-v1\",\"content\":\"The standup is at 9:30.\"}\n",
        ),
    )?;
    let (conn, settings) = ingest_target(&ts);
    engram::commands::ingest(settings.clone(), &file, conn.clone()).await?;
    let key = engram::ingest::IdKey::for_deployment(&settings)?;
    let v1 = engram::ingest::memory_id(&key, &ts.tenant, "standup-v1");
    let mut c = ts.client().await?;
    let got = c
        .memories
        .get(engram_proto::GetRequest {
            ids: vec![v1],
            ..Default::default()
        })
        .await?
        .into_inner();
    assert!(
        got.memories
            .iter()
            .any(|m| m.valid_to.is_some() || m.retracted_at.is_some()),
        "v1 closed by v2: {got:?}"
    );
    // A refused line is named by file line and the user's id.
    std::fs::write(
        &file,
        "{\"id\":\"ok\",\"content\":\"fine\"}\n{\"id\":\"bad\",\"content\":\"x\",\"memory_type\":\"Not A Label\"}\n",
    )?;
    let text = refused_ingest(settings, &file, conn).await;
    assert!(
        text.contains("notes.jsonl:2") && text.contains("\"bad\""),
        "{text}"
    );
    ts.shutdown().await;
    Ok(())
}

/// `engram ingest` sends its batches of 500 two at a time: a file of three
/// batches is written whole, and a refused line in a later batch is still
/// named by its file line.
#[tokio::test]
async fn ingest_writes_every_batch_of_a_long_file() -> anyhow::Result<()> {
    let ts = engram_tests::TestStack::start("internal").await?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("long.jsonl");
    let line = |i: usize| format!("{{\"id\":\"n{i}\",\"content\":\"Note {i} on the rollout.\"}}\n");
    std::fs::write(&file, (0..1_201).map(line).collect::<String>())?;
    let (conn, settings) = ingest_target(&ts);
    engram::commands::ingest(settings.clone(), &file, conn.clone()).await?;
    let key = engram::ingest::IdKey::for_deployment(&settings)?;
    let ids: Vec<String> = [0, 499, 500, 999, 1_000, 1_200]
        .iter()
        .map(|i| engram::ingest::memory_id(&key, &ts.tenant, &format!("n{i}")))
        .collect();
    let mut c = ts.client().await?;
    let got = (c.memories)
        .get(engram_proto::GetRequest {
            ids: ids.clone(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(
        got.memories.len(),
        ids.len(),
        "one of each batch's ends is missing"
    );
    let mut lines: String = (0..1_201).map(line).collect();
    lines.push_str("{\"id\":\"bad\",\"content\":\"x\",\"memory_type\":\"Not A Label\"}\n");
    std::fs::write(&file, lines)?;
    let text = refused_ingest(settings, &file, conn).await;
    assert!(
        text.contains("long.jsonl:1202") && text.contains("\"bad\""),
        "{text}"
    );
    ts.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_knowledge_base_may_be_named_by_its_namespace() -> anyhow::Result<()> {
    let ts = engram_tests::TestStack::start("internal").await?;
    let mut c = ts.client().await?;
    c.memories
        .upsert(UpsertRequest {
            memories: vec![engram_proto::Memory {
                namespace: "team-notes".into(),
                content: "The on-call rotation changes every Monday at noon.".into(),
                ..Default::default()
            }],
        })
        .await?;
    // Defaults (vector mode, the embedder-fitted threshold) find it.
    let r = c
        .foundry
        .retrieve_basic(BasicRetrieveRequest {
            kb_id: "team-notes".into(),
            query: "When does the on-call rotation change?".into(),
            tenant_id: ts.tenant.clone(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert!(
        r.results.iter().any(|x| x.text.contains("every Monday")),
        "{r:?}"
    );
    ts.shutdown().await;
    Ok(())
}
