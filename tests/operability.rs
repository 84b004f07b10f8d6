//! Operability on the real stack: reflection and health through real
//! clients, the admin `/health` `/ready` `/metrics`, the retrieval log event
//! (JSON, every field, no raw query text) and that the deploy manifests parse.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use engram::stack::{Service, Stack, StackOptions, random_token, sha256_hex};
use engram_common::admin::AdminState;
use engram_common::settings::ApiKeySettings;
use engram_proto::{FeedbackItem, FeedbackRequest, FeedbackSignal, RetrieveRequest};
use engram_tests::{TestStack, settings};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// Every log line of this test binary (one global subscriber: the gateway
/// logs from tokio worker threads, which a thread-local one would miss).
fn captured_logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static BUF: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    BUF.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = Capture(buf.clone());
        let sub = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish();
        let _ = tracing::subscriber::set_global_default(sub);
        buf
    })
}

#[derive(Clone)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(b);
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A minimal HTTP/1.1 GET: status code and body.
async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await?;
    let code = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status line in {raw:?}"))?;
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    Ok((code, body.to_string()))
}

async fn channel(addr: SocketAddr) -> anyhow::Result<Channel> {
    Ok(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect()
            .await?,
    )
}

/// The admin server over `stack`, as the lead wires it in `engram up`.
async fn start_admin(
    stack: &Stack,
    stop: CancellationToken,
) -> anyhow::Result<(AdminState, SocketAddr)> {
    let state = AdminState::new();
    for svc in Service::ALL {
        if let Some(addr) = stack.addr(svc) {
            // The cross-encoder is optional: without it the gateway skips the
            // relevance check, so rerank must not hold readiness hostage.
            let required = svc != Service::Rerank;
            state.add_grpc_health(svc.name(), addr, &["", svc.grpc_name()], required)?;
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(engram_common::admin::serve(
        listener,
        state.clone(),
        stop.cancelled_owned(),
    ));
    Ok((state, addr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reflection_and_health_through_real_clients() -> anyhow::Result<()> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let ts = TestStack::start("sensitive").await?;
    let gw = ts
        .stack
        .addr(Service::Retrieval)
        .ok_or_else(|| anyhow::anyhow!("no gateway"))?;
    let mut refl = ServerReflectionClient::new(channel(gw).await?);
    let reqs = vec![
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        },
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(
                "engram.v1.RetrievalService".into(),
            )),
        },
    ];
    let mut stream = refl
        .server_reflection_info(tokio_stream::iter(reqs))
        .await?
        .into_inner();
    let listed = match stream.message().await?.and_then(|r| r.message_response) {
        Some(MessageResponse::ListServicesResponse(l)) => {
            l.service.into_iter().map(|s| s.name).collect::<Vec<_>>()
        }
        other => anyhow::bail!("expected a service list, got {other:?}"),
    };
    for name in [
        "engram.v1.RetrievalService",
        "engram.v1.MemoryService",
        "grpc.health.v1.Health",
    ] {
        assert!(listed.iter().any(|s| s == name), "{name} not in {listed:?}");
    }
    let files = match stream.message().await?.and_then(|r| r.message_response) {
        Some(MessageResponse::FileDescriptorResponse(f)) => f.file_descriptor_proto,
        other => anyhow::bail!("expected file descriptors, got {other:?}"),
    };
    let has_service = files.iter().any(|bytes| {
        prost_types::FileDescriptorProto::decode(bytes.as_slice()).is_ok_and(|fd| {
            fd.service
                .iter()
                .any(|s| s.name.as_deref() == Some("RetrievalService"))
        })
    });
    assert!(has_service, "no file describes RetrievalService");

    // grpcurl 1.8 and older clients speak v1alpha.
    {
        use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient as AlphaClient;
        use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest as AlphaReq;
        use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse as AlphaResp;
        let mut alpha = AlphaClient::new(channel(gw).await?);
        let req = tonic_reflection::pb::v1alpha::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(AlphaReq::ListServices(String::new())),
        };
        let mut s = alpha
            .server_reflection_info(tokio_stream::iter(vec![req]))
            .await?
            .into_inner();
        match s.message().await?.and_then(|r| r.message_response) {
            Some(AlphaResp::ListServicesResponse(l)) => assert!(
                l.service
                    .iter()
                    .any(|x| x.name == "engram.v1.RetrievalService"),
                "{l:?}"
            ),
            other => anyhow::bail!("v1alpha: expected a service list, got {other:?}"),
        }
    }

    // Standard health on every service, under its own gRPC name.
    for svc in Service::ALL {
        let addr = ts
            .stack
            .addr(svc)
            .ok_or_else(|| anyhow::anyhow!("{} missing", svc.name()))?;
        let mut h = tonic_health::pb::health_client::HealthClient::new(channel(addr).await?);
        let status = h
            .check(tonic_health::pb::HealthCheckRequest {
                service: svc.grpc_name().into(),
            })
            .await?
            .into_inner()
            .status;
        if svc == Service::Rerank {
            assert!(status == 1 || status == 2, "rerank status {status}");
        } else {
            assert_eq!(status, 1, "{} is not SERVING", svc.name());
        }
    }

    // The admin HTTP view of the same thing.
    let stop = CancellationToken::new();
    let (state, admin) = start_admin(&ts.stack, stop.clone()).await?;
    let (code, body) = http_get(admin, "/health").await?;
    assert_eq!(code, 200, "{body}");
    let health: serde_json::Value = serde_json::from_str(&body)?;
    for svc in [Service::Retrieval, Service::Search, Service::Graph] {
        assert_eq!(
            health["services"][svc.name()]["components"][svc.grpc_name()]["status"],
            "SERVING",
            "{body}"
        );
    }
    let (code, body) = http_get(admin, "/ready").await?;
    assert_eq!(code, 200, "{body}");
    // Draining flips readiness before anything stops.
    state.start_draining();
    let (code, _) = http_get(admin, "/ready").await?;
    assert_eq!(code, 503);
    // A stopped service shows as unreachable and keeps readiness down.
    let r = state.health().await;
    assert!(!r.ready);
    stop.cancel();
    ts.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_move_and_retrieval_logs_are_scrubbed() -> anyhow::Result<()> {
    let logs = captured_logs();
    // Downstreams from the stack; the gateway built here so its registry is
    // reachable (as `engram up` does for the admin port).
    let mut s = settings().await?;
    s.auth.internal_token_opt = Some(random_token());
    // Off by default; this test checks the scrubbing of what is logged.
    s.log.query_text = true;
    let tenant = format!("t-{}", uuid::Uuid::new_v4().simple());
    let key = format!("k-{}", uuid::Uuid::new_v4().simple());
    s.auth.api_keys.push(ApiKeySettings {
        sha256: sha256_hex(&key),
        tenant: tenant.clone(),
        agent_id: "agent-ops".into(),
        trust: "sensitive".into(),
    });
    let stack = Stack::start(
        s,
        StackOptions {
            services: [Service::Search, Service::Graph, Service::Rerank]
                .into_iter()
                .collect(),
            ephemeral_ports: true,
            dev_api_key: false,
            extra_keys: Vec::new(),
        },
    )
    .await?;
    let gateway = retrieval_svc::Gateway::new(stack.settings.clone())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let gw_addr = listener.local_addr()?;
    let stop = CancellationToken::new();
    let gw_task = tokio::spawn(retrieval_svc::serve_gateway(
        listener,
        gateway.clone(),
        stop.clone().cancelled_owned(),
    ));
    let (state, admin) = start_admin(&stack, stop.clone()).await?;
    state.add_grpc_health(
        "retrieval",
        gw_addr,
        &["engram.v1.RetrievalService", "engram.v1.MemoryService"],
        true,
    )?;
    let g = gateway.clone();
    state.add_metrics(move || g.metrics_text());

    let mut client = engram::client::Client::connect(&format!("http://{gw_addr}"), &key).await?;
    engram::demo::load_sample(&mut client, &tenant).await?;
    let secret_query = "What does alice.chen@example.com drink? call +1 415 555 0132, acct 987654321, key sk-live4f9a8b7c6d5e4f3a2b1c";
    let mut query_ids = Vec::new();
    for text in [
        "Who leads the project that migrates the billing system?",
        secret_query,
        "oat-milk flat white",
    ] {
        let r = client
            .retrieval
            .retrieve(RetrieveRequest {
                text: text.into(),
                limit: Some(3),
                no_cache: true,
                ..Default::default()
            })
            .await?
            .into_inner();
        query_ids.push(r.query_id);
    }
    let memory_id = client
        .retrieval
        .retrieve(RetrieveRequest {
            text: "Who leads the project that migrates the billing system?".into(),
            limit: Some(3),
            ..Default::default()
        })
        .await?
        .into_inner()
        .records
        .first()
        .and_then(|r| r.memory.as_ref())
        .map(|m| m.id.clone())
        .ok_or_else(|| anyhow::anyhow!("no record to give feedback on"))?;
    client
        .retrieval
        .feedback(FeedbackRequest {
            query_id: query_ids[0].clone(),
            items: vec![FeedbackItem {
                memory_id,
                signal: FeedbackSignal::Helpful as i32,
                value: true,
            }],
        })
        .await?;

    let (code, m) = http_get(admin, "/metrics").await?;
    assert_eq!(code, 200);
    let value = |series: &str| -> f64 {
        m.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    };
    assert!(
        value("engram_retrieval_e2e_latency_seconds_count") >= 4.0,
        "{m}"
    );
    let routed: f64 = m
        .lines()
        .filter(|l| l.starts_with("engram_retrieval_route_total{route="))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(routed >= 4.0, "{m}");
    assert!(
        value("engram_retrieval_hit_rate{result=\"hit\"}") >= 1.0,
        "{m}"
    );
    assert!(
        value("engram_retrieval_latency_seconds_count{stage=\"search\"}") >= 1.0,
        "{m}"
    );
    assert!(
        value("engram_retrieval_candidates_count{stage=\"search\",strategy=\"fused\"}") >= 1.0,
        "{m}"
    );
    assert!(
        value("engram_retrieval_feedback_total{signal=\"helpful\"}") >= 1.0,
        "{m}"
    );
    assert!(value("engram_retrieval_precision_at_k_count") >= 1.0, "{m}");
    // The self-RAG score is the cross-encoder's: a clone without the
    // optional model (no ../shared) has none to observe.
    if stack.settings.pipeline.cross_encoder {
        assert!(value("engram_retrieval_selfrag_score_count") >= 1.0, "{m}");
    }
    assert!(
        value("engram_downstream_requests_total{outcome=\"ok\",stack=\"search.vector\"}") >= 1.0,
        "{m}"
    );
    assert!(
        m.contains("engram_retrieval_circuit_state{stage=\"graph.ppr\"} 0"),
        "{m}"
    );
    // Per-service gRPC server metrics from the shared server layer: every
    // service in the process, labelled by service/method/code only.
    let grpc = |service: &str, method: &str| -> f64 {
        let prefix = "engram_grpc_server_requests_total{";
        m.lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .filter(|l| {
                l.contains(&format!("method=\"{method}\""))
                    && l.contains(&format!("service=\"{service}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert!(
        value(
            "engram_grpc_server_requests_total{code=\"OK\",method=\"VectorSearch\",service=\"engram.v1.SearchService\"}"
        ) >= 4.0,
        "{m}"
    );
    assert!(grpc("engram.v1.SearchService", "Upsert") >= 1.0, "{m}");
    assert!(
        grpc("engram.v1.GraphService", "PersonalizedPageRank") >= 1.0,
        "{m}"
    );
    if stack.settings.pipeline.cross_encoder {
        assert!(grpc("engram.v1.RerankService", "Score") >= 1.0, "{m}");
    }
    assert!(grpc("engram.v1.RetrievalService", "Retrieve") >= 4.0, "{m}");
    assert!(grpc("grpc.health.v1.Health", "Check") >= 1.0, "{m}");
    assert!(
        value(
            "engram_grpc_server_request_duration_seconds_count{method=\"VectorSearch\",service=\"engram.v1.SearchService\"}"
        ) >= 4.0,
        "{m}"
    );
    assert!(
        m.lines()
            .any(|l| l
                .starts_with("engram_grpc_server_in_flight{service=\"engram.v1.SearchService\"}")),
        "{m}"
    );
    for leak in [
        "alice",
        "example.com",
        "987654321",
        "billing",
        tenant.as_str(),
    ] {
        assert!(!m.contains(leak), "metrics leak {leak:?}");
    }

    // One JSON event per retrieval, every field present, nothing raw.
    let text = String::from_utf8(logs.lock().map(|b| b.clone()).unwrap_or_default())?;
    let events: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "retrieval" && v["agent_id"] == "agent-ops")
        .collect();
    assert!(
        events.len() >= 4,
        "{} retrieval events in {text}",
        events.len()
    );
    for e in &events {
        for field in [
            "query_id",
            "agent_id",
            "route",
            "stage_latencies",
            "candidate_counts",
            "result_count",
            "retry_count",
            "retrieval_confidence",
            "conflicts_detected",
        ] {
            assert!(!e[field].is_null(), "{field} missing in {e}");
        }
    }
    // The log names the answer id, the part of the query id before its
    // receipt (retrieval-svc/src/receipt.rs).
    let logged = query_ids[1].split('~').next().unwrap_or_default();
    assert!(
        events
            .iter()
            .any(|e| e["query_id"].as_str() == Some(logged)),
        "no event for the scrubbed query"
    );
    let scrubbed = events
        .iter()
        .find(|e| e["query_id"].as_str() == Some(logged))
        .and_then(|e| e["query"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(scrubbed.contains("[email]"), "{scrubbed}");
    for raw in [
        "alice.chen@example.com",
        "555 0132",
        "987654321",
        "sk-live4f9a8b7c6d5e4f3a2b1c",
    ] {
        assert!(!text.contains(raw), "raw {raw:?} in the logs");
    }
    assert!(!text.contains("query_embedding"), "embeddings logged");

    stop.cancel();
    let _ = gw_task.await;
    stack.shutdown().await;
    Ok(())
}

/// Every deploy manifest is YAML (kubectl/kubeconform are optional extras:
/// `deploy/validate`).
#[test]
fn deploy_manifests_parse_as_yaml() -> anyhow::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut files = Vec::new();
    let mut dirs = vec![root];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d)? {
            let p = entry?.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                files.push(p);
            }
        }
    }
    assert!(
        files.len() >= 8,
        "expected compose + k8s manifests, found {files:?}"
    );
    let mut kinds = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f)?;
        let docs = yaml_rust2::YamlLoader::load_from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
        assert!(!docs.is_empty(), "{} is empty", f.display());
        for d in docs {
            if let Some(k) = d["kind"].as_str() {
                kinds.push(k.to_string());
            }
        }
    }
    for kind in [
        "Deployment",
        "Service",
        "ConfigMap",
        "Secret",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Kustomization",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "no {kind} in {kinds:?}");
    }
    Ok(())
}

/// No deploy file turns on query-text logging: the README's privacy
/// default (`log.query_text = false`) is what a deployment gets. The k8s
/// base config map set it to "true" (issue 47, item 20). Checks every YAML
/// file under deploy/ (a `KEY: value` map, as in a ConfigMap or a compose
/// `environment`, and a Kubernetes `env` list of `name` / `value`) and every
/// other file's text (`ENV` in the Dockerfile, scripts).
#[test]
fn no_deploy_file_logs_query_text() -> anyhow::Result<()> {
    const KEY: &str = "ENGRAM__LOG__QUERY_TEXT";
    assert!(!engram_common::Settings::default().log.query_text);
    fn off(v: &yaml_rust2::Yaml) -> bool {
        match v {
            yaml_rust2::Yaml::Boolean(b) => !b,
            yaml_rust2::Yaml::String(s) => s.eq_ignore_ascii_case("false"),
            _ => false,
        }
    }
    /// Where `KEY` is set in this document, with its value.
    fn settings(doc: &yaml_rust2::Yaml, out: &mut Vec<yaml_rust2::Yaml>) {
        match doc {
            yaml_rust2::Yaml::Hash(h) => {
                for (k, v) in h {
                    if k.as_str() == Some(KEY) {
                        out.push(v.clone());
                    }
                    if k.as_str() == Some("name") && v.as_str() == Some(KEY) {
                        out.push(doc["value"].clone());
                    }
                    settings(v, out);
                }
            }
            yaml_rust2::Yaml::Array(a) => a.iter().for_each(|d| settings(d, out)),
            _ => {}
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let (mut dirs, mut seen) = (vec![root], 0);
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d)? {
            let p = entry?.path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            let text = std::fs::read_to_string(&p)?;
            if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                let docs = yaml_rust2::YamlLoader::load_from_str(&text)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
                let mut found = Vec::new();
                docs.iter().for_each(|d| settings(d, &mut found));
                for v in &found {
                    assert!(off(v), "{}: {KEY} is {v:?}", p.display());
                }
                seen += found.len();
            } else {
                for line in text.lines().filter(|l| l.contains(KEY)) {
                    let value = line.split(KEY).nth(1).unwrap_or_default();
                    assert!(
                        !value.to_ascii_lowercase().contains("true"),
                        "{}: {line}",
                        p.display()
                    );
                }
            }
        }
    }
    // The config map states the default outright; the walk found it.
    assert!(seen >= 1, "the k8s config map sets {KEY}");
    Ok(())
}

/// The Foundry HTTP API listens on all interfaces and is published in both
/// deployments (it defaults to 127.0.0.1:8080, unreachable from outside a
/// container).
#[test]
fn the_foundry_http_api_is_exposed_in_compose_and_kubernetes() -> anyhow::Result<()> {
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let load = |rel: &str| -> anyhow::Result<Vec<yaml_rust2::Yaml>> {
        let text = std::fs::read_to_string(deploy.join(rel))?;
        yaml_rust2::YamlLoader::load_from_str(&text).map_err(|e| anyhow::anyhow!("{rel}: {e}"))
    };
    let config = &load("k8s/base/configmap.yaml")?[0];
    assert_eq!(
        config["data"]["ENGRAM__LISTEN__HTTP"].as_str(),
        Some("0.0.0.0:8080")
    );
    let retrieval = load("k8s/base/retrieval.yaml")?;
    let kind = |d: &yaml_rust2::Yaml, k: &str| d["kind"].as_str() == Some(k);
    let names = |list: &yaml_rust2::Yaml| -> Vec<String> {
        list.as_vec()
            .into_iter()
            .flatten()
            .filter_map(|p| p["name"].as_str().map(str::to_string))
            .collect()
    };
    let service = retrieval.iter().find(|d| kind(d, "Service"));
    let service = service.ok_or_else(|| anyhow::anyhow!("no retrieval Service"))?;
    assert!(names(&service["spec"]["ports"]).contains(&"http".to_string()));
    let deployment = retrieval.iter().find(|d| kind(d, "Deployment"));
    let deployment = deployment.ok_or_else(|| anyhow::anyhow!("no retrieval Deployment"))?;
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert!(names(&container["ports"]).contains(&"http".to_string()));
    let compose = &load("compose.yaml")?[0];
    let gateway = &compose["services"]["retrieval"];
    let published: Vec<&str> = (gateway["ports"].as_vec().into_iter().flatten())
        .filter_map(|p| p.as_str())
        .collect();
    assert!(
        published.iter().any(|p| p.ends_with(":8080")),
        "{published:?}"
    );
    let env = &compose["x-engram"]["environment"];
    assert_eq!(env["ENGRAM__LISTEN__HTTP"].as_str(), Some("0.0.0.0:8080"));
    Ok(())
}

/// Graceful shutdown on a real service: the shutdown signal flips health to
/// NOT_SERVING (an open Watch sees it) while a slow call is still in flight;
/// that call still gets its gRPC answer, then the server exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_drains_in_flight_calls_after_health_goes_not_serving() -> anyhow::Result<()> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    // Downstreams that accept TCP and never answer: every call is slow.
    let blackhole = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let hole = format!("http://{}", blackhole.local_addr()?);
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = blackhole.accept().await {
            conns.push(c);
        }
    });
    let mut s = settings().await?;
    s.auth.internal_token_opt = Some(random_token());
    let key = format!("k-{}", uuid::Uuid::new_v4().simple());
    s.auth.api_keys.push(ApiKeySettings {
        sha256: sha256_hex(&key),
        tenant: format!("t-{}", uuid::Uuid::new_v4().simple()),
        agent_id: "agent-drain".into(),
        trust: "sensitive".into(),
    });
    s.downstream.search = hole.clone();
    s.downstream.graph = hole.clone();
    s.downstream.rerank = hole;
    s.pipeline.vector_timeout_ms = 1500;
    s.pipeline.keyword_timeout_ms = 1500;
    s.pipeline.graph_timeout_ms = 1500;
    let gateway = retrieval_svc::Gateway::new(s)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let stop = CancellationToken::new();
    let server = tokio::spawn(retrieval_svc::serve_gateway(
        listener,
        gateway,
        stop.clone().cancelled_owned(),
    ));
    let mut health = HealthClient::new(channel(addr).await?);
    let mut watch = health
        .watch(HealthCheckRequest {
            service: "engram.v1.RetrievalService".into(),
        })
        .await?
        .into_inner();
    let first = watch
        .message()
        .await?
        .ok_or_else(|| anyhow::anyhow!("watch ended"))?;
    assert_eq!(first.status, 1, "serving before shutdown");

    let mut client = engram::client::Client::connect(&format!("http://{addr}"), &key).await?;
    let t0 = std::time::Instant::now();
    let slow = tokio::spawn(async move {
        client
            .retrieval
            .retrieve(RetrieveRequest {
                text: "what is slow".into(),
                no_cache: true,
                ..Default::default()
            })
            .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!slow.is_finished(), "the call must still be in flight");
    stop.cancel();
    let next = watch
        .message()
        .await?
        .ok_or_else(|| anyhow::anyhow!("watch ended without NOT_SERVING"))?;
    assert_eq!(next.status, 2, "NOT_SERVING once draining starts");
    assert!(
        !slow.is_finished(),
        "health flipped before the in-flight call ended"
    );

    // The in-flight call ends with a gRPC answer from the gateway (a result
    // or its own error), not a connection torn down under it.
    match slow.await? {
        Ok(_) => {}
        Err(status) => assert!(
            !status.message().contains("transport") && status.code() != tonic::Code::Cancelled,
            "in-flight call was cut: {status:?}"
        ),
    }
    tokio::time::timeout(std::time::Duration::from_secs(12), server).await???;
    eprintln!(
        "drain: call answered and server stopped {:?} after the call began",
        t0.elapsed()
    );
    held.abort();
    Ok(())
}
