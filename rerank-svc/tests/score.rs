//! RerankService end to end: the real cross-encoder behind a real server on
//! port 0, called with a tonic client.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use engram_common::{AccessLevel, Identity, Settings};
use engram_models::CrossEncoder;
use engram_proto::ScoreRequest;
use engram_proto::rerank_service_client::RerankServiceClient;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const TOKEN: &str = "test-internal-token";

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn settings() -> Settings {
    let home = std::env::var_os("ENGRAM_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest().join("../.engram"));
    let mut s = Settings::default();
    s.models.onnxruntime_path_opt = Some(home.join("py/onnxruntime/capi/libonnxruntime.so.1.31.1"));
    s.models.cross_encoder_dir_opt = Some(cross_encoder_dir());
    s.models.intra_threads = 2;
    s.home = home;
    s.auth.internal_token_opt = Some(TOKEN.into());
    s
}

/// `ENGRAM_CROSS_ENCODER_DIR`, else the model in the `shared/` folder
/// (`ENGRAM_SHARED_DIR`, else the one beside the checkout).
fn cross_encoder_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ENGRAM_CROSS_ENCODER_DIR") {
        return PathBuf::from(dir);
    }
    std::env::var_os("ENGRAM_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest().join("../../shared"))
        .join("models/engram-ce-minilm-l6")
}

/// One model for the whole test binary; None, and the calling test skips
/// saying why, in a clone without the optional cross-encoder.
fn model() -> Option<Arc<CrossEncoder>> {
    static MODEL: OnceLock<Arc<CrossEncoder>> = OnceLock::new();
    let dir = cross_encoder_dir();
    if !engram_common::bootstrap::present_or_skip(&dir, "the optional cross-encoder") {
        return None;
    }
    let model = MODEL.get_or_init(|| {
        Arc::new(
            rerank_svc::load_model(&settings())
                .expect("cross-encoder and onnx runtime (installed by the CI script)"),
        )
    });
    Some(model.clone())
}

struct Server {
    channel: Channel,
    _stop: oneshot::Sender<()>,
}

async fn start(settings: Settings, model: Result<Arc<CrossEncoder>, String>) -> Server {
    let model = match model {
        Ok(m) => Ok(rerank_svc::ModelThread::start_with(
            move || Ok(m),
            rerank_svc::backlog::Backlog::from_settings(&settings.rerank),
        )
        .await
        .expect("model thread")),
        Err(e) => Err(e),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(rerank_svc::run_with_model(
        listener,
        settings,
        model,
        async move {
            let _ = stopped.await;
        },
    ));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    Server {
        channel,
        _stop: stop,
    }
}

fn request(query: &str, candidates: &[&str], max_length: u32) -> tonic::Request<ScoreRequest> {
    let mut r = tonic::Request::new(ScoreRequest {
        query: query.into(),
        candidates: candidates.iter().map(|s| s.to_string()).collect(),
        max_length,
    });
    Identity {
        tenant: "t-rerank".into(),
        agent_id: "agent".into(),
        trust: AccessLevel::Internal,
    }
    .write_internal(r.metadata_mut(), TOKEN);
    r
}

fn client(s: &Server) -> RerankServiceClient<Channel> {
    RerankServiceClient::new(s.channel.clone()).max_encoding_message_size(32 * 1024 * 1024)
}

async fn health(s: &Server) -> i32 {
    HealthClient::new(s.channel.clone())
        .check(HealthCheckRequest {
            service: rerank_svc::SERVICE_NAME.into(),
        })
        .await
        .expect("health")
        .into_inner()
        .status
}

#[tokio::test]
async fn relevant_passages_score_above_unrelated_ones_in_order() {
    let Some(model) = model() else { return };
    let s = start(settings(), Ok(model)).await;
    assert_eq!(health(&s).await, ServingStatus::Serving as i32);
    let mut c = client(&s);
    let cases = [
        (
            "what is the capital of france?",
            "Paris is the capital and most populous city of France.",
            "Bananas are rich in potassium.",
        ),
        (
            "who wrote the novel Moby-Dick?",
            "Moby-Dick is an 1851 novel by the American writer Herman Melville.",
            "The Great Barrier Reef is the largest coral reef system in the world.",
        ),
        (
            "when did the user adopt their dog?",
            "Caroline: We adopted our dog Max from the shelter last March.",
            "Melanie: I finally finished painting the kitchen cabinets yesterday.",
        ),
        (
            "which river flows through Vienna?",
            "Vienna lies on the Danube, the second-longest river in Europe.",
            "Photosynthesis converts light energy into chemical energy in plants.",
        ),
    ];
    for (q, good, bad) in cases {
        // Both orders: the response follows the request order.
        let r = c
            .score(request(q, &[good, bad], 0))
            .await
            .expect("score")
            .into_inner();
        assert_eq!(r.scores.len(), 2);
        assert!(r.scores[0] > r.scores[1], "{q}: {:?}", r.scores);
        let r = c
            .score(request(q, &[bad, good], 0))
            .await
            .expect("score")
            .into_inner();
        assert!(r.scores[1] > r.scores[0], "{q}: {:?}", r.scores);
        assert!(r.scores.iter().all(|s| (0.0..=1.0).contains(s)));
    }
}

#[tokio::test]
async fn empty_list_oversize_passage_and_bounds() {
    let Some(model) = model() else { return };
    let s = start(settings(), Ok(model)).await;
    let mut c = client(&s);
    let r = c.score(request("anything", &[], 0)).await.expect("empty");
    assert!(r.into_inner().scores.is_empty());

    // Under the 64 KiB bound but far over max_length: truncated, not rejected.
    let long = format!(
        "Paris is the capital of France. {}",
        "It has many museums. ".repeat(3000)
    );
    assert!(long.len() < 64 * 1024);
    let r = c
        .score(request(
            "what is the capital of france?",
            &[long.as_str(), "Bananas are rich in potassium."],
            128,
        ))
        .await
        .expect("long passage")
        .into_inner();
    assert_eq!(r.scores.len(), 2);
    assert!(r.scores[0] > r.scores[1], "{:?}", r.scores);

    let too_big = "x".repeat(64 * 1024 + 1);
    let err = c
        .score(request("q", &["fine", too_big.as_str()], 0))
        .await
        .expect_err("too big");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("candidates[1]"), "{}", err.message());
    let err = c
        .score(request("q", &["p"], 1000))
        .await
        .expect_err("max_length");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("max_length"), "{}", err.message());
}

#[tokio::test]
async fn missing_internal_token_is_unauthenticated() {
    let Some(model) = model() else { return };
    let s = start(settings(), Ok(model)).await;
    let mut c = client(&s);
    let mut r = request("q", &["p"], 0);
    r.metadata_mut()
        .remove(engram_common::identity::INTERNAL_TOKEN_KEY);
    let err = c.score(r).await.expect_err("no token");
    assert_eq!(err.code(), Code::Unauthenticated);
    let mut r = request("q", &["p"], 0);
    r.metadata_mut().insert(
        engram_common::identity::INTERNAL_TOKEN_KEY,
        "wrong".parse().expect("ascii"),
    );
    let err = c.score(r).await.expect_err("wrong token");
    assert_eq!(err.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn full_queue_is_resource_exhausted_at_once() {
    let Some(model) = model() else { return };
    let mut settings = settings();
    settings.rerank.queue_capacity = 0;
    let s = start(settings, Ok(model)).await;
    let passage =
        "The bridge was widened in 1903 to carry trams, and again in 1968 for cars. ".repeat(8);
    let passages: Vec<&str> = vec![passage.as_str(); 40];
    let calls = (0..6).map(|_| {
        let mut c = client(&s);
        let req = request("when was the bridge widened?", &passages, 256);
        async move {
            let t = Instant::now();
            let r = c.score(req).await;
            (r, t.elapsed())
        }
    });
    let results = futures::future::join_all(calls).await;
    let ok = results.iter().filter(|(r, _)| r.is_ok()).count();
    let exhausted: Vec<Duration> = results
        .iter()
        .filter_map(|(r, d)| match r {
            Err(e) if e.code() == Code::ResourceExhausted => Some(*d),
            _ => None,
        })
        .collect();
    assert!(ok >= 1, "no request got through");
    assert!(!exhausted.is_empty(), "no request was refused");
    assert_eq!(ok + exhausted.len(), results.len(), "unexpected errors");
    for d in exhausted {
        assert!(d < Duration::from_millis(500), "refusal took {d:?}");
    }
}

#[tokio::test]
async fn missing_model_reports_not_serving_and_failed_precondition() {
    let mut settings = settings();
    settings.models.cross_encoder_dir_opt = Some(PathBuf::from("/nonexistent/cross-encoder"));
    let err = rerank_svc::load_model(&settings).expect_err("missing model");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(rerank_svc::run(listener, settings, async move {
        let _ = stopped.await;
    }));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let s = Server {
        channel,
        _stop: stop,
    };
    assert!(err.to_string().contains("unavailable"), "{err}");
    assert_eq!(health(&s).await, ServingStatus::NotServing as i32);
    let err = client(&s)
        .score(request("q", &["p"], 0))
        .await
        .expect_err("no model");
    assert_eq!(err.code(), Code::FailedPrecondition);
    drop(s);
    server.await.expect("join").expect("clean shutdown");
}

/// The nice value of every thread of this process named `name`
/// (`/proc/self/task/<tid>/stat`, field 19).
fn nice_of_threads(name: &str) -> Vec<i64> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .filter_map(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            // Fields after the parenthesised command name, which may hold spaces.
            let after = stat.rsplit_once(')')?.1;
            after.split_whitespace().nth(16)?.parse().ok()
        })
        .collect()
}

#[tokio::test]
async fn the_model_runs_on_a_thread_of_lower_priority() {
    let Some(model) = model() else { return };
    let s = start(settings(), Ok(model)).await;
    let scored = client(&s)
        .score(request(
            "who painted it",
            &["The painting is by Vermeer."],
            0,
        ))
        .await
        .expect("scored");
    assert_eq!(scored.into_inner().scores.len(), 1);
    let nices = nice_of_threads("rerank-model");
    assert!(
        !nices.is_empty(),
        "a thread named rerank-model runs the model"
    );
    assert!(
        nices
            .iter()
            .all(|n| *n >= i64::from(rerank_svc::worker::NICE)),
        "search must win the cores: {nices:?}"
    );
}

#[tokio::test]
async fn a_request_that_cannot_finish_before_its_deadline_is_skipped_at_once() {
    let Some(model) = model() else { return };
    let s = start(settings(), Ok(model)).await;
    let passage = "The ferry crossed twice a day until the tunnel opened in 1988. ".repeat(6);
    let q = "when did the tunnel open?";
    // One measured request teaches the service what a pair costs.
    client(&s)
        .score(request(q, &[passage.as_str(); 4], 128))
        .await
        .expect("scored");
    // 200 pairs keep the model busy for far more than 250 ms on any CPU...
    let mut busy_client = client(&s);
    let busy_req = request(q, &[passage.as_str(); 200], 128);
    let busy = tokio::spawn(async move { busy_client.score(busy_req).await });
    tokio::time::sleep(Duration::from_millis(250)).await;
    // ...so 200 more behind them cannot be ready in 300 ms: refused before
    // the model sees them (RESOURCE_EXHAUSTED naming the skip, not the
    // client's own "Timeout expired").
    let mut late = request(q, &[passage.as_str(); 200], 128);
    late.set_timeout(Duration::from_millis(300));
    let err = client(&s).score(late).await.expect_err("too late");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("skipped"), "{}", err.message());
    let scored = busy
        .await
        .expect("join")
        .expect("the busy request is scored");
    assert_eq!(scored.into_inner().scores.len(), 200);
    // Nothing queued: a request first in line is always admitted.
    let mut fine = request(q, &[passage.as_str(); 2], 128);
    fine.set_timeout(Duration::from_secs(30));
    let scored = client(&s).score(fine).await.expect("in time");
    assert_eq!(scored.into_inner().scores.len(), 2);
}
