//! Issue 10's optional-LLM paths on the real stack: LLM decomposition and
//! synthesis in agentic retrieval, HyDE for conversation windows, and every
//! fallback (endpoint failing, hanging, answering garbage, not configured).
//! The endpoint is a local OpenAI-compatible test double: no model can run
//! on this machine, and the paths under test are the gateway's, not a
//! model's.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use engram_common::Settings;
use engram_common::convert::json_to_struct;
use engram_proto::knowledge_foundry_service_client::KnowledgeFoundryServiceClient;
use engram_proto::retrieval_service_client::RetrievalServiceClient;
use engram_proto::{
    AgenticRetrieveRequest, ConversationMessage, FoundryResponse, Memory, RetrieveRequest,
    RetrieveResponse, UpsertRequest,
};
use engram_tests::TestStack;
use engram_tests::authed;
use retrieval_svc::Gateway;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tonic::transport::Channel;

const MODEL: &str = "test-model-7b";
/// Set by cargo for every test process, so the bearer-key path is tested
/// without `set_var` racing other test threads.
const KEY_VAR: &str = "CARGO_PKG_NAME";
const DECOMPOSE_TOKENS: u32 = 50;
const SYNTH_TOKENS: u32 = 120;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Mode {
    Ok = 0,
    Fail = 1,
    Hang = 2,
    Garbage = 3,
}

#[derive(Debug, Clone)]
struct Call {
    model: String,
    authorization: String,
    system: String,
    user: String,
    temperature: f64,
}

impl Call {
    fn kind(&self) -> &'static str {
        if self.system.contains("sub-questions") {
            "decompose"
        } else if self.system.contains("numbered sources") {
            "synthesize"
        } else if self.system.contains("hypothetical") {
            "hyde"
        } else {
            "other"
        }
    }
}

/// The OpenAI-compatible double: canned answers per prompt kind, a switch
/// to fail, hang or answer garbage, and a record of every call.
#[derive(Clone, Default)]
struct Double {
    mode: Arc<AtomicU8>,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Double {
    fn set(&self, m: Mode) {
        self.mode.store(m as u8, Ordering::SeqCst);
    }

    fn take(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().expect("calls lock"))
    }

    async fn start(&self) -> anyhow::Result<String> {
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(chat))
            .with_state(self.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(format!("http://{addr}/v1"))
    }
}

fn completion(content: &str, total_tokens: u32) -> Response {
    axum::Json(json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "stop",
        }],
        "usage": {
            "prompt_tokens": total_tokens - 10,
            "completion_tokens": 10,
            "total_tokens": total_tokens,
        },
    }))
    .into_response()
}

async fn chat(State(d): State<Double>, headers: HeaderMap, body: String) -> Response {
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let msg = |i: usize| {
        v["messages"][i]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let call = Call {
        model: v["model"].as_str().unwrap_or_default().into(),
        authorization: headers
            .get("authorization")
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default()
            .into(),
        system: msg(0),
        user: msg(1),
        temperature: v["temperature"].as_f64().unwrap_or(-1.0),
    };
    let kind = call.kind();
    d.calls.lock().expect("calls lock").push(call);
    match d.mode.load(Ordering::SeqCst) {
        1 => return (StatusCode::INTERNAL_SERVER_ERROR, "overloaded").into_response(),
        2 => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            return completion("too late", 10);
        }
        3 => return (StatusCode::OK, "<html>502 bad gateway</html>").into_response(),
        _ => {}
    }
    match kind {
        "decompose" => completion(
            "Here are the sub-questions:\n```json\n[\"When was Alan Turing born?\", \"When was John von Neumann born?\"]\n```",
            DECOMPOSE_TOKENS,
        ),
        "synthesize" => completion(
            "John von Neumann was born first, in 1903 [Source 1]; Alan Turing followed in 1912 [Source 2].",
            SYNTH_TOKENS,
        ),
        "hyde" => completion(
            "[\"Alice Chen leads the billing migration project.\", \"The billing migration project is led by Alice Chen.\"]",
            40,
        ),
        _ => completion("", 10),
    }
}

fn mem(uid: &str, seed: &str, content: &str) -> Memory {
    Memory {
        id: uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_OID,
            format!("{uid}-{seed}").as_bytes(),
        )
        .to_string(),
        memory_type: "semantic".into(),
        content: content.into(),
        metadata: Some(json_to_struct(&json!({}))),
        ..Default::default()
    }
}

/// A tenant with people for the agentic questions and a project for the
/// conversation window.
async fn seeded() -> anyhow::Result<TestStack> {
    let ts = TestStack::start("sensitive").await?;
    let uid = uuid::Uuid::new_v4().simple().to_string();
    let filler = " The archive also lists schooling, awards, later life and legacy.";
    let mut memories = vec![
        mem(
            &uid,
            "turing",
            &format!("Alan Turing was born on 23 June 1912 in Maida Vale, London.{filler}"),
        ),
        mem(
            &uid,
            "neumann",
            &format!("John von Neumann was born on 28 December 1903 in Budapest, Hungary.{filler}"),
        ),
        mem(
            &uid,
            "alice",
            "Alice Chen now leads the billing migration project, replacing Bob Marsh.",
        ),
    ];
    for i in 0..4 {
        memories.push(mem(
            &uid,
            &format!("n{i}"),
            &format!("Standup note {i}: the billing migration moved its cutover window again after load tests."),
        ));
    }
    let mut c = ts.client().await?;
    c.memories.upsert(UpsertRequest { memories }).await?;
    Ok(ts)
}

/// A gateway over the stack's downstreams with its own `[llm]` section.
async fn gateway(ts: &TestStack, endpoint_opt: Option<String>) -> anyhow::Result<String> {
    let mut settings: Settings = ts.stack.settings.clone();
    settings.llm.endpoint_opt = endpoint_opt;
    settings.llm.model = MODEL.into();
    settings.llm.api_key_env_opt = Some(KEY_VAR.into());
    settings.llm.timeout_ms = 1_500;
    // The production ceiling: the hung-LLM check below is about HyDE's
    // share of it (the test stack's own is raised for slow CI machines).
    settings.pipeline.ceiling_ms = engram_common::settings::PipelineSettings::default().ceiling_ms;
    let gw = Gateway::new(settings)?;
    assert_eq!(gw.llm().is_some(), gw.settings().llm.endpoint_opt.is_some());
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(retrieval_svc::serve_gateway(
        listener,
        gw,
        std::future::pending(),
    ));
    Ok(format!("http://{addr}"))
}

fn step<'a>(r: &'a FoundryResponse, action: &str) -> &'a engram_proto::FoundryStep {
    r.steps
        .iter()
        .find(|s| s.action == action)
        .unwrap_or_else(|| panic!("no {action} step: {r:#?}"))
}

fn retrieve_inputs(r: &FoundryResponse) -> Vec<&str> {
    r.steps
        .iter()
        .filter(|s| s.action == "retrieve")
        .map(|s| s.input.as_str())
        .collect()
}

fn retrieve_tokens(r: &FoundryResponse) -> u32 {
    r.steps
        .iter()
        .filter(|s| s.action == "retrieve")
        .map(|s| s.tokens)
        .sum()
}

const QUESTION: &str = "Who was born first, Alan Turing or John von Neumann?";
/// The rules' split, led by the whole question.
const RULE_PARTS: [&str; 3] = [
    QUESTION,
    "Who was born first, Alan Turing?",
    "Who was born first, John von Neumann?",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agentic_retrieval_with_an_llm_and_its_fallbacks() -> anyhow::Result<()> {
    let ts = seeded().await?;
    let double = Double::default();
    let uri = gateway(&ts, Some(double.start().await?)).await?;
    let f = KnowledgeFoundryServiceClient::connect(uri).await?;
    let req = || AgenticRetrieveRequest {
        query: QUESTION.into(),
        tenant_id: ts.tenant.clone(),
        ..Default::default()
    };
    let agentic = |f: &KnowledgeFoundryServiceClient<Channel>, r: AgenticRetrieveRequest| {
        let mut f = f.clone();
        let key = ts.key.clone();
        async move { anyhow::Ok(f.retrieve_agentic(authed(&key, r)).await?.into_inner()) }
    };

    // Medium effort: the whole question and the LLM's sub-questions are the
    // retrieves; the answer
    // cites the packed sources; the LLM's tokens count.
    let r = agentic(&f, req()).await?;
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
    let d = step(&r, "decompose");
    assert!(d.detail.starts_with("method=llm"), "{}", d.detail);
    assert_eq!((d.result_count, d.tokens), (3, DECOMPOSE_TOKENS));
    assert_eq!(
        retrieve_inputs(&r),
        [
            QUESTION,
            "When was Alan Turing born?",
            "When was John von Neumann born?"
        ]
    );
    let s = step(&r, "synthesize");
    assert!(s.detail.starts_with("method=llm"), "{}", s.detail);
    assert_eq!(s.tokens, SYNTH_TOKENS);
    assert!(s.latency_ms > 0.0 && d.latency_ms > 0.0);
    assert!(r.answer.contains("[Source 1]"), "{}", r.answer);
    assert!(r.context.starts_with("[Source 1] "), "{}", r.context);
    assert!(r.results.iter().any(|x| x.text.contains("Maida Vale")));
    assert!(r.results.iter().any(|x| x.text.contains("Budapest")));
    assert_eq!(
        r.total_tokens_used,
        retrieve_tokens(&r) + DECOMPOSE_TOKENS + SYNTH_TOKENS
    );
    assert!(!r.truncated, "{r:#?}");
    let calls = double.take();
    let kinds: Vec<&str> = calls.iter().map(Call::kind).collect();
    assert_eq!(kinds, ["decompose", "synthesize"]);
    let bearer = format!("Bearer {}", std::env::var(KEY_VAR)?);
    for c in &calls {
        assert_eq!(c.model, MODEL);
        assert_eq!(c.authorization, bearer);
        assert_eq!(c.temperature, 0.0);
    }
    assert!(calls[0].user.contains(QUESTION));
    // The synthesis prompt holds the very context returned, numbered alike.
    assert!(calls[1].user.contains(QUESTION));
    assert!(
        calls[1].user.contains(r.context.trim()),
        "{}",
        calls[1].user
    );

    // Low effort: no decomposition, still an answer.
    let r = agentic(
        &f,
        AgenticRetrieveRequest {
            reasoning_effort: "low".into(),
            ..req()
        },
    )
    .await?;
    let actions: Vec<&str> = r.steps.iter().map(|s| s.action.as_str()).collect();
    assert_eq!(actions, ["retrieve", "synthesize"]);
    assert!(!r.answer.is_empty());
    let kinds: Vec<&str> = double.take().iter().map(Call::kind).collect();
    assert_eq!(kinds, ["synthesize"]);

    // The smallest token budget: retrieval spends it, synthesis is skipped
    // rather than overrunning it.
    let r = agentic(
        &f,
        AgenticRetrieveRequest {
            token_budget: Some(100),
            ..req()
        },
    )
    .await?;
    assert!(
        step(&r, "synthesize").detail.contains("skipped: budget"),
        "{r:#?}"
    );
    assert_eq!(r.answer, "");
    assert!(r.truncated);
    assert_eq!(r.truncated_reason, "budget");
    let kinds: Vec<&str> = double.take().iter().map(Call::kind).collect();
    assert_eq!(kinds, ["decompose"]);

    // The endpoint failing, answering garbage or hanging: the rules
    // decompose, the answer is "", no error, and a hang costs at most the
    // configured call budget (1.5 s) per call.
    for (mode, why) in [
        (Mode::Fail, "status"),
        (Mode::Garbage, "unusable"),
        (Mode::Hang, "timeout"),
    ] {
        double.set(mode);
        let t = Instant::now();
        let r = agentic(&f, req()).await?;
        let took = t.elapsed();
        let d = step(&r, "decompose");
        assert_eq!(
            d.detail,
            format!(
                "method=rules (llm failed: {why}); parallel: {}",
                RULE_PARTS.join(" | ")
            ),
            "{mode:?}"
        );
        assert_eq!(d.tokens, 0);
        assert_eq!(retrieve_inputs(&r), RULE_PARTS, "{mode:?}");
        assert_eq!(r.answer, "", "{mode:?}");
        assert_eq!(
            step(&r, "synthesize").detail,
            format!("llm failed: {why}: context only")
        );
        assert!(r.context.starts_with("[Source 1] "));
        assert_eq!(r.total_tokens_used, retrieve_tokens(&r), "{mode:?}");
        assert!(!r.truncated, "{mode:?}: {r:#?}");
        let kinds: Vec<&str> = double.take().iter().map(Call::kind).collect();
        assert_eq!(kinds, ["decompose", "synthesize"], "{mode:?}");
        if mode == Mode::Hang {
            assert!(d.latency_ms >= 1_400.0, "{}", d.latency_ms);
            assert!(took < Duration::from_millis(6_000), "{took:?}");
        }
        eprintln!("agentic with llm {mode:?}: {took:?}");
    }
    // A tight latency budget leaves the hung LLM a third of it to decompose
    // and cuts synthesis at the deadline.
    let t = Instant::now();
    let r = agentic(
        &f,
        AgenticRetrieveRequest {
            max_latency_ms: Some(1_200),
            ..req()
        },
    )
    .await?;
    let took = t.elapsed();
    assert!(
        step(&r, "decompose").latency_ms < 800.0,
        "{:?}",
        step(&r, "decompose")
    );
    assert_eq!(r.answer, "");
    assert!(r.truncated && r.truncated_reason == "latency", "{r:#?}");
    assert!(took < Duration::from_millis(2_500), "{took:?}");
    double.take();

    // No LLM configured: the same request never calls the endpoint.
    double.set(Mode::Ok);
    let plain = gateway(&ts, None).await?;
    let f = KnowledgeFoundryServiceClient::connect(plain).await?;
    let r = agentic(&f, req()).await?;
    assert!(step(&r, "decompose").detail.starts_with("method=rules; "));
    assert_eq!(
        step(&r, "synthesize").detail,
        "no llm configured: context only"
    );
    assert_eq!(r.answer, "");
    assert!(double.take().is_empty());
    ts.shutdown().await;
    Ok(())
}

fn window() -> Vec<ConversationMessage> {
    let msg = |role: &str, content: &str| ConversationMessage {
        role: role.into(),
        content: content.into(),
        summary_marker: false,
    };
    vec![
        msg("user", "We need a decision on the cutover."),
        msg("assistant", "Sure. Who should sign off?"),
        msg("user", "Whoever runs the billing migration project now."),
    ]
}

fn hyde_hits(r: &RetrieveResponse) -> usize {
    r.records
        .iter()
        .filter(|x| {
            x.provenance
                .as_ref()
                .is_some_and(|p| p.strategies.iter().any(|h| h.strategy == "hyde"))
        })
        .count()
}

fn alice(r: &RetrieveResponse) -> bool {
    r.records
        .iter()
        .filter_map(|x| x.memory.as_ref())
        .any(|m| m.content.starts_with("Alice Chen"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conversation_window_hyde_and_its_silent_skips() -> anyhow::Result<()> {
    let ts = seeded().await?;
    let double = Double::default();
    let uri = gateway(&ts, Some(double.start().await?)).await?;
    let mut c = RetrievalServiceClient::connect(uri).await?;
    let req = || RetrieveRequest {
        conversation: window(),
        no_cache: true,
        skip_rerank: true,
        ..Default::default()
    };

    // With the LLM: hypotheses from the window's text, searched and fused.
    let t = Instant::now();
    let r = c.retrieve(authed(&ts.key, req())).await?.into_inner();
    eprintln!("conversation retrieve with hyde: {:?}", t.elapsed());
    let calls = double.take();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].kind(), "hyde");
    assert_eq!(calls[0].model, MODEL);
    assert_eq!(
        calls[0].authorization,
        format!("Bearer {}", std::env::var(KEY_VAR)?)
    );
    assert!(
        calls[0]
            .user
            .contains("Whoever runs the billing migration project now.")
    );
    assert!(alice(&r), "{r:#?}");
    assert!(hyde_hits(&r) > 0, "{r:#?}");
    assert!(r.degraded_stages.is_empty(), "{:?}", r.degraded_stages);

    // Same turn → no LLM call: the turn's answer is given again as it is.
    let turn = || RetrieveRequest {
        turn_id: "turn-hyde-1".into(),
        ..req()
    };
    let first = c.retrieve(authed(&ts.key, turn())).await?.into_inner();
    assert_eq!(double.take().len(), 1);
    let again = c.retrieve(authed(&ts.key, turn())).await?.into_inner();
    assert!(
        double.take().is_empty(),
        "a sub-turn paid the LLM call again"
    );
    assert_eq!(again.query_id, first.query_id);

    // Caller hypotheses, a text query or a keyword-only mode: no LLM call.
    for q in [
        RetrieveRequest {
            hypotheses: vec!["Alice Chen leads billing.".into()],
            ..req()
        },
        RetrieveRequest {
            text: "who leads the billing migration?".into(),
            ..req()
        },
        RetrieveRequest {
            mode: engram_proto::RetrievalMode::Keyword as i32,
            ..req()
        },
    ] {
        c.retrieve(authed(&ts.key, q)).await?;
    }
    assert!(double.take().is_empty());
    // Unauthenticated: the gateway refuses, the LLM is never asked.
    let err = c.retrieve(req()).await.expect_err("no key");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert!(double.take().is_empty());

    // Failing or garbage: skipped silently, the window still answers.
    for mode in [Mode::Fail, Mode::Garbage] {
        double.set(mode);
        let r = c.retrieve(authed(&ts.key, req())).await?.into_inner();
        assert!(alice(&r), "{mode:?}: {r:#?}");
        assert_eq!(hyde_hits(&r), 0, "{mode:?}");
        assert_eq!(double.take().len(), 1, "{mode:?}");
    }

    // Hanging: HyDE gives up at half the ceiling (its 2 s budget is more)
    // and the pipeline runs in what is left: the whole Retrieve stays under
    // the 3 s ceiling (plus the answer's way back over loopback).
    double.set(Mode::Hang);
    let t = Instant::now();
    let r = c.retrieve(authed(&ts.key, req())).await?.into_inner();
    let took = t.elapsed();
    eprintln!("conversation retrieve with a hung llm: {took:?}");
    // The gateway's (gateway() sets the production ceiling).
    let ceiling_ms = engram_common::settings::PipelineSettings::default().ceiling_ms;
    let ceiling = Duration::from_millis(ceiling_ms);
    assert!(took >= ceiling / 2 - Duration::from_millis(100), "{took:?}");
    assert!(took < ceiling + Duration::from_millis(100), "{took:?}");
    assert!(alice(&r), "{r:#?}");
    assert_eq!(hyde_hits(&r), 0);
    // A caller deadline bounds HyDE to half of it, and the pipeline gets
    // what is left rather than its full ceiling.
    let mut timed = authed(&ts.key, req());
    timed.set_timeout(Duration::from_millis(2_400));
    let t = Instant::now();
    let r = c.retrieve(timed).await?.into_inner();
    let took = t.elapsed();
    assert!(took < Duration::from_millis(2_400), "{took:?}");
    assert!(took >= Duration::from_millis(1_100), "{took:?}");
    assert!(r.degraded_stages.iter().all(|s| s != "fail_open"));
    double.take();

    // No LLM configured: no calls.
    double.set(Mode::Ok);
    let plain = gateway(&ts, None).await?;
    let mut c = RetrievalServiceClient::connect(plain).await?;
    let r = c.retrieve(authed(&ts.key, req())).await?.into_inner();
    assert!(alice(&r));
    assert_eq!(hyde_hits(&r), 0);
    assert!(double.take().is_empty());
    ts.shutdown().await;
    Ok(())
}
