//! One retrieval is one trace: the gateway's server span, its downstream
//! client spans and the search/graph server spans they caused share a trace
//! id, with parent links across the gRPC hop (W3C traceparent in metadata).
//! Spans go to the SDK's in-memory exporter through the same
//! `tracing-opentelemetry` layer `telemetry::init` installs for OTLP.

use std::collections::HashMap;

use engram_proto::RetrieveRequest;
use engram_tests::TestStack;
use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::layer::SubscriberExt as _;

fn install() -> InMemorySpanExporter {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("engram-test")))
        .with(tracing_subscriber::filter::LevelFilter::INFO);
    tracing::subscriber::set_global_default(subscriber).expect("one subscriber per test binary");
    exporter
}

/// `span`'s ancestors (nearest first) among `spans`, by span id.
fn ancestors<'a>(span: &'a SpanData, by_id: &HashMap<SpanId, &'a SpanData>) -> Vec<&'a SpanData> {
    let mut out = Vec::new();
    let mut cur = span;
    while cur.parent_span_id != SpanId::INVALID {
        match by_id.get(&cur.parent_span_id) {
            Some(p) => {
                out.push(*p);
                cur = p;
            }
            None => break,
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_retrieval_is_one_trace_across_services() -> anyhow::Result<()> {
    let exporter = install();
    let ts = TestStack::start("sensitive").await?;
    let mut client = ts.client().await?;
    engram::demo::load_sample(&mut client, &ts.tenant).await?;
    // Only the retrieval's spans from here on.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    exporter.reset();

    let r = client
        .retrieval
        .retrieve(RetrieveRequest {
            text: "Who leads the project that migrates the billing system?".into(),
            limit: Some(3),
            no_cache: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    assert!(!r.records.is_empty(), "the sample answers this question");
    // Server spans close when the response future completes, just after the
    // client has its answer.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let spans = exporter.get_finished_spans()?;
    let http_spans = http_retrieval_spans(&ts, &exporter).await?;
    ts.shutdown().await;
    http_is_one_trace(&http_spans)?;

    let gateway = spans
        .iter()
        .find(|s| s.name == "engram.v1.RetrievalService/Retrieve")
        .ok_or_else(|| {
            let names: Vec<_> = spans.iter().map(|s| s.name.to_string()).collect();
            anyhow::anyhow!("no gateway server span in {names:?}")
        })?;
    let trace = gateway.span_context.trace_id();
    assert_eq!(
        gateway.parent_span_id,
        SpanId::INVALID,
        "the client sent no traceparent, so the gateway span is the root"
    );
    let in_trace: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.span_context.trace_id() == trace)
        .collect();
    let by_id: HashMap<SpanId, &SpanData> = in_trace
        .iter()
        .map(|s| (s.span_context.span_id(), *s))
        .collect();
    let mut names: Vec<&str> = in_trace.iter().map(|s| s.name.as_ref()).collect();
    names.sort_unstable();
    names.dedup();
    eprintln!("spans in the retrieval trace: {names:?}");
    for stage in [
        "stage.route",
        "stage.search",
        "stage.validate",
        "stage.assemble",
    ] {
        assert!(names.contains(&stage), "no {stage} span in {names:?}");
    }

    let downstream_servers: Vec<&SpanData> = in_trace
        .iter()
        .copied()
        .filter(|s| {
            s.name.starts_with("engram.v1.SearchService/")
                || s.name.starts_with("engram.v1.GraphService/")
        })
        .collect();
    assert!(
        !downstream_servers.is_empty(),
        "no search or graph server span in the gateway's trace: {names:?}"
    );
    for server in &downstream_servers {
        let parent = by_id
            .get(&server.parent_span_id)
            .ok_or_else(|| anyhow::anyhow!("{}: parent span not in the trace", server.name))?;
        assert!(
            parent.name.starts_with("downstream."),
            "{} is a child of {}, expected a downstream.* client span",
            server.name,
            parent.name
        );
        assert!(
            server.parent_span_is_remote,
            "{}: the parent came over the wire",
            server.name
        );
        let chain = ancestors(server, &by_id);
        assert!(
            chain
                .iter()
                .any(|a| a.span_context.span_id() == gateway.span_context.span_id()),
            "{} does not descend from the gateway span",
            server.name
        );
    }
    // Every downstream client span of this retrieval sits under the gateway.
    for client_span in in_trace
        .iter()
        .filter(|s| s.name.starts_with("downstream."))
    {
        assert!(
            ancestors(client_span, &by_id)
                .iter()
                .any(|a| a.span_context.span_id() == gateway.span_context.span_id()),
            "{} is not under the gateway span",
            client_span.name
        );
    }
    // No query text in span names or attributes.
    for s in &spans {
        assert!(!s.name.contains("billing"), "query text in span name");
        for kv in &s.attributes {
            assert!(
                !kv.value.as_str().contains("billing"),
                "query text in attribute {} of {}",
                kv.key,
                s.name
            );
        }
    }
    Ok(())
}

/// The spans of one Foundry basic retrieval over HTTP.
async fn http_retrieval_spans(
    ts: &TestStack,
    exporter: &InMemorySpanExporter,
) -> anyhow::Result<Vec<SpanData>> {
    let addr = ts
        .stack
        .http_addr_opt
        .ok_or_else(|| anyhow::anyhow!("no http api"))?;
    exporter.reset();
    let body = serde_json::json!({
        "kb_id": uuid::Uuid::new_v4().to_string(),
        "query": "Who leads the project that migrates the billing system?",
        "tenant_id": ts.tenant,
    });
    let status = reqwest::Client::new()
        .post(format!("http://{addr}/api/v1/retrieve/basic"))
        .bearer_auth(&ts.key)
        .json(&body)
        .send()
        .await?
        .status();
    assert_eq!(status, 200);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    Ok(exporter.get_finished_spans()?)
}

/// An HTTP request is a server span at the root of a trace that reaches
/// search-svc, as a gRPC one is.
fn http_is_one_trace(spans: &[SpanData]) -> anyhow::Result<()> {
    let names: Vec<_> = spans.iter().map(|s| s.name.to_string()).collect();
    let server = spans
        .iter()
        .find(|s| s.name == "POST /api/v1/retrieve/basic")
        .ok_or_else(|| anyhow::anyhow!("no http server span in {names:?}"))?;
    assert_eq!(server.parent_span_id, SpanId::INVALID);
    let trace = server.span_context.trace_id();
    assert!(
        spans.iter().any(|s| s.span_context.trace_id() == trace
            && s.name.starts_with("engram.v1.SearchService/")),
        "no search-svc span in the http request's trace: {names:?}"
    );
    Ok(())
}
