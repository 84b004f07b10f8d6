//! The gateway's HTTP JSON API for Knowledge Foundry clients that do not
//! speak gRPC. Same credentials, same validation and the same error
//! mapping as gRPC (through `tonic::Status`), so the two surfaces cannot
//! drift apart.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use engram_common::convert::{json_to_struct, struct_to_json};
use engram_common::text::{MAX_NESTING, NESTING_RULE, json_within_depth};
use engram_proto::{AgenticRetrieveRequest, BasicRetrieveRequest, FoundryResponse};
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tonic::metadata::MetadataMap;
use tower_http::catch_panic::CatchPanicLayer;

use super::status::status_response;
use super::{console, rest};
use crate::error::Error;
use crate::gateway::Gateway;
use crate::surfaces::foundry::{self, Agentic, Basic};

pub const BASIC_PATH: &str = "/api/v1/retrieve/basic";
pub const AGENTIC_PATH: &str = "/api/v1/retrieve/agentic";
pub const OPENAPI_PATH: &str = "/openapi.json";

/// The OpenAPI 3.1 document of the REST routes (openapi.rs).
async fn openapi_json() -> Response {
    (StatusCode::OK, axum::Json(super::openapi::document())).into_response()
}

/// Serves the HTTP API on `listener` until `shutdown`. A request's headers
/// must arrive within `listen.header_read_timeout_ms` of the connection
/// opening or of the previous response, else the connection is closed
/// (`engram_common::conn::serve_http`).
pub async fn serve(
    listener: TcpListener,
    gateway: Gateway,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    tracing::info!(addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), "http api listening");
    let header_read = Duration::from_millis(gateway.settings().listen.header_read_timeout_ms);
    engram_common::conn::serve_http(listener, router(gateway), header_read, shutdown).await?;
    Ok(())
}

pub fn router(gateway: Gateway) -> Router {
    let routes = Router::new()
        .route(BASIC_PATH, post(basic))
        .route(AGENTIC_PATH, post(agentic))
        .route(OPENAPI_PATH, get(openapi_json));
    console::router(rest::router(routes))
        .with_state(gateway)
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(axum::middleware::from_fn(console::no_store))
        .layer(axum::middleware::from_fn(server_span))
}

/// One server span per HTTP request, continuing the caller's trace
/// (`traceparent`), as the gRPC servers do: an HTTP retrieval is one trace
/// down to search-svc and graph-svc. The span name is the route, never the
/// raw path, so a scanner cannot mint span names.
async fn server_span(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let route = match req.uri().path() {
        p @ (BASIC_PATH | AGENTIC_PATH | OPENAPI_PATH) => p,
        p => (rest::route_name(p))
            .or_else(|| console::route_name(p))
            .unwrap_or("unmatched"),
    };
    let span = tracing::info_span!(
        "http.server",
        otel.name = format!("{} {route}", req.method()),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %req.method(),
        http.route = route,
        http.response.status_code = tracing::field::Empty,
    );
    engram_common::telemetry::set_remote_parent(&span, req.headers());
    let resp = tracing::Instrument::instrument(next.run(req), span.clone()).await;
    span.record("http.response.status_code", resp.status().as_u16());
    if resp.status().is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    resp
}

/// A handler that panicked answers 500 in the API's error shape, with one
/// structured log line, never a dropped connection.
fn panic_response(payload: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let message = engram_common::server::panic_message(payload.as_ref());
    tracing::error!(panic = %message, "http handler panicked; answered 500");
    error_response(Error::Internal("internal error".into()))
}

fn error_response(e: Error) -> Response {
    status_response(tonic::Status::from(e))
}

fn object(body: &[u8]) -> Result<Map<String, Value>, Error> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Error::invalid("body", "must be a JSON object")),
        Err(_) => Err(Error::invalid("body", "must be valid JSON")),
    }
}

/// Typed field readers: a wrong type is a 400 naming the field, like a
/// missing or out-of-range one.
fn string(m: &Map<String, Value>, field: &'static str) -> Result<String, Error> {
    match m.get(field) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(Error::invalid(field, "must be a string")),
    }
}

fn uint_opt(m: &Map<String, Value>, field: &'static str) -> Result<Option<u32>, Error> {
    match m.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) => Ok(Some(u32::try_from(v).unwrap_or(u32::MAX))),
            // Negative values are out of range rather than mistyped.
            None if n.as_i64().is_some() => Ok(Some(0)),
            None => Err(Error::invalid(field, "must be an integer")),
        },
        Some(_) => Err(Error::invalid(field, "must be an integer")),
    }
}

fn float_opt(m: &Map<String, Value>, field: &'static str) -> Result<Option<f32>, Error> {
    match m.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64().map(|v| v as f32)),
        Some(_) => Err(Error::invalid(field, "must be a number")),
    }
}

fn filters_opt(m: &Map<String, Value>) -> Result<Option<prost_types::Struct>, Error> {
    match m.get("filters") {
        None | Some(Value::Null) => Ok(None),
        // Bounded before it is converted (json_to_struct recurses).
        Some(v @ Value::Object(_)) if !json_within_depth(v, MAX_NESTING) => {
            Err(Error::invalid("filters", NESTING_RULE))
        }
        Some(v @ Value::Object(_)) => Ok(Some(json_to_struct(v))),
        Some(_) => Err(Error::invalid("filters", "must be an object")),
    }
}

fn strings(m: &Map<String, Value>, field: &'static str) -> Result<Vec<String>, Error> {
    match m.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                _ => Err(Error::invalid(field, "must be an array of strings")),
            })
            .collect(),
        Some(_) => Err(Error::invalid(field, "must be an array of strings")),
    }
}

fn basic_request(body: &[u8]) -> Result<BasicRetrieveRequest, Error> {
    let m = object(body)?;
    Ok(BasicRetrieveRequest {
        kb_id: string(&m, "kb_id")?,
        query: string(&m, "query")?,
        tenant_id: string(&m, "tenant_id")?,
        top_k: uint_opt(&m, "top_k")?,
        mode: string(&m, "mode")?,
        filters: filters_opt(&m)?,
        similarity_threshold: float_opt(&m, "similarity_threshold")?,
    })
}

fn agentic_request(body: &[u8]) -> Result<AgenticRetrieveRequest, Error> {
    let m = object(body)?;
    Ok(AgenticRetrieveRequest {
        query: string(&m, "query")?,
        tenant_id: string(&m, "tenant_id")?,
        kb_ids: strings(&m, "kb_ids")?,
        max_steps: uint_opt(&m, "max_steps")?,
        reasoning_effort: string(&m, "reasoning_effort")?,
        top_k_per_step: uint_opt(&m, "top_k_per_step")?,
        token_budget: uint_opt(&m, "token_budget")?,
        max_latency_ms: uint_opt(&m, "max_latency_ms")?,
        mode: string(&m, "mode")?,
        filters: filters_opt(&m)?,
    })
}

pub fn response_json(r: FoundryResponse) -> Value {
    let FoundryResponse {
        request_id,
        answer,
        results,
        steps,
        total_tokens_used,
        total_latency_ms,
        truncated,
        truncated_reason,
        context,
    } = r;
    json!({
        "request_id": request_id,
        "answer": answer,
        "results": results.into_iter().map(|x| json!({
            "chunk_id": x.chunk_id,
            "document_id": x.document_id,
            "text": x.text,
            "score": x.score,
            "metadata": x.metadata.as_ref().map(struct_to_json).unwrap_or_else(|| json!({})),
        })).collect::<Vec<_>>(),
        "steps": steps.into_iter().map(|s| json!({
            "step_number": s.step_number,
            "action": s.action,
            "input": s.input,
            "result_count": s.result_count,
            "tokens": s.tokens,
            "latency_ms": s.latency_ms,
            "detail": s.detail,
        })).collect::<Vec<_>>(),
        "total_tokens_used": total_tokens_used,
        "total_latency_ms": total_latency_ms,
        "truncated": truncated,
        "truncated_reason": if truncated_reason.is_empty() { Value::Null } else { Value::String(truncated_reason) },
        "context": context,
    })
}

fn reply(r: Result<FoundryResponse, Error>) -> Response {
    match r {
        Ok(r) => (StatusCode::OK, axum::Json(response_json(r))).into_response(),
        Err(e) => error_response(e),
    }
}

async fn basic(State(gw): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let start = Instant::now();
    let md = MetadataMap::from_headers(headers);
    let run = async {
        let identity = gw.authenticate(&md)?;
        let _permit = gw.admit(&identity, 1)?;
        let b = Basic::try_from(basic_request(&body)?)?;
        let deadline = gw.deadline(&md, start);
        foundry::basic(&gw, identity, b, start, deadline).await
    };
    let r = run.await;
    super::foundry::observe(&gw, "basic", start, &r);
    reply(r)
}

async fn agentic(State(gw): State<Gateway>, headers: HeaderMap, body: Bytes) -> Response {
    let start = Instant::now();
    let md = MetadataMap::from_headers(headers);
    let run = async {
        let identity = gw.authenticate(&md)?;
        let _permit = gw.admit(&identity, foundry::AGENTIC_IN_FLIGHT)?;
        let a = Agentic::try_from(agentic_request(&body)?)?;
        foundry::agentic(&gw, identity, a, start).await
    };
    let r = run.await;
    super::foundry::observe(&gw, "agentic", start, &r);
    reply(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Foundry HTTP port on port 0 with `listen.header_read_timeout_ms`
    /// at 200: a connection that sends nothing, or half a header, is closed
    /// (issue 47, item 17: unauthenticated connections were held 70 s).
    #[tokio::test]
    async fn a_connection_without_a_header_in_time_is_closed() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut settings = engram_common::Settings::default();
        settings.listen.header_read_timeout_ms = 200;
        let gateway = Gateway::new(settings).expect("gateway");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(serve(listener, gateway, std::future::pending()));
        let partial = format!("POST {BASIC_PATH} HTTP/1.1\r\nHost: x\r\nContent-Ty");
        for sent in ["", partial.as_str()] {
            let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
            tcp.write_all(sent.as_bytes()).await.expect("write");
            let mut rest = Vec::new();
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                tcp.read_to_end(&mut rest),
            );
            assert!(read.await.is_ok(), "{sent:?}: still open after 5 s");
        }
    }

    fn field(r: Result<BasicRetrieveRequest, Error>) -> &'static str {
        match r.and_then(Basic::try_from) {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("expected invalid argument, got {other:?}"),
        }
    }

    #[test]
    fn json_fields_are_typed_and_named() {
        let kb = "0b7c3f0e-8a51-4c53-9a43-6b8f7e3c1d20";
        assert_eq!(field(basic_request(b"[]")), "body");
        assert_eq!(field(basic_request(b"{nope")), "body");
        assert_eq!(
            field(basic_request(
                br#"{"kb_id": 5, "query": "q", "tenant_id": "t"}"#
            )),
            "kb_id"
        );
        let with =
            |extra: &str| format!(r#"{{"kb_id": "{kb}", "query": "q", "tenant_id": "t"{extra}}}"#);
        assert_eq!(
            field(basic_request(with(r#", "top_k": -1"#).as_bytes())),
            "top_k"
        );
        assert_eq!(
            field(basic_request(with(r#", "top_k": "ten""#).as_bytes())),
            "top_k"
        );
        assert_eq!(
            field(basic_request(with(r#", "filters": [1]"#).as_bytes())),
            "filters"
        );
        let b = Basic::try_from(
            basic_request(with(r#", "filters": {"lang": "en"}"#).as_bytes()).expect("json"),
        )
        .expect("valid");
        assert_eq!(b.top_k, 10);
        assert!(b.filters_opt.is_some());
    }

    /// `{"k": {"k": ... "v"}}`, `levels` objects deep.
    fn nested(levels: usize) -> String {
        format!("{}\"v\"{}", r#"{"k": "#.repeat(levels), "}".repeat(levels))
    }

    #[test]
    fn filters_nest_at_most_eight_levels() {
        let kb = "0b7c3f0e-8a51-4c53-9a43-6b8f7e3c1d20";
        let with = |filters: &str| {
            format!(r#"{{"kb_id": "{kb}", "query": "q", "tenant_id": "t", "filters": {filters}}}"#)
        };
        let eight = basic_request(with(&nested(8)).as_bytes()).expect("json");
        assert!(Basic::try_from(eight).is_ok());
        match basic_request(with(&nested(40)).as_bytes()) {
            Err(Error::InvalidArgument { field, rule }) => {
                assert_eq!(field, "filters");
                assert_eq!(rule, NESTING_RULE);
            }
            other => panic!("expected invalid filters, got {other:?}"),
        }
        // The gRPC path gets a struct, checked by the same TryFrom.
        let deep = json_to_struct(&serde_json::from_str(&nested(40)).expect("json"));
        let request = BasicRetrieveRequest {
            kb_id: kb.into(),
            query: "q".into(),
            tenant_id: "t".into(),
            filters: Some(deep),
            ..Default::default()
        };
        let e = Basic::try_from(request).expect_err("too deep");
        assert!(e.to_string().contains("filters"), "{e}");
    }
}
