//! REST/JSON for every public RPC, on the gateway's HTTP port: one route
//! per RPC, not a second implementation. A request's JSON body is read
//! into the RPC's own protobuf message by the proto3 JSON mapping
//! (`prost-reflect`, from the descriptors the build already embeds), the
//! gRPC handler itself is called with the HTTP headers as its metadata
//! (the same authentication, validation and limits), and its answer is
//! written back as JSON with the proto's field names. An error is the gRPC
//! status mapped to HTTP (`status::status_response`): the field and the rule
//! in the body.
//!
//! The routes and the OpenAPI document (`openapi.rs`, served at
//! `/openapi.json`) come from the one [`ROUTES`] table.

use std::sync::LazyLock;

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, on};
use engram_common::text::json_within_depth;
use engram_proto::knowledge_foundry_service_server::KnowledgeFoundryService;
use engram_proto::memory_service_server::MemoryService;
use engram_proto::retrieval_service_server::RetrievalService;
use engram_proto::working_memory_service_server::WorkingMemoryService;
use prost::Message;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions,
};
use serde_json::{Value, json};
use tonic::Status;
use tonic::metadata::MetadataMap;

use super::foundry::Foundry;
use super::memory::Memory;
use super::retrieval::Retrieval;
use super::status::status_response;
use super::working::Working;
use crate::error::Error;
use crate::gateway::Gateway;

/// How deep a request body may nest objects and lists. Deeper than any
/// message here needs with a metadata object inside, and far below what
/// serde_json or protobuf decoding would refuse on their own; the RPC's
/// own checks bound `filters` and `metadata` tighter.
pub const MAX_BODY_NESTING: usize = 32;

/// One RPC's HTTP route.
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    /// The gRPC method, `Service/Rpc`.
    pub rpc: &'static str,
    /// Full protobuf names of its request and response messages.
    pub request: &'static str,
    pub response: &'static str,
    pub summary: &'static str,
}

const fn post(
    path: &'static str,
    rpc: &'static str,
    (request, response): (&'static str, &'static str),
    summary: &'static str,
) -> Route {
    Route {
        method: "post",
        path,
        rpc,
        request,
        response,
        summary,
    }
}

/// Every public RPC. A route's body is its request message as JSON.
pub const ROUTES: &[Route] = &[
    post(
        "/v1/retrieve",
        "RetrievalService/Retrieve",
        ("engram.v1.RetrieveRequest", "engram.v1.RetrieveResponse"),
        "Find the memories that matter for a query, with provenance and a context block",
    ),
    post(
        "/v1/feedback",
        "RetrievalService/Feedback",
        ("engram.v1.FeedbackRequest", "engram.v1.FeedbackResponse"),
        "Say which memories of an answer were used or wrong",
    ),
    post(
        "/v1/memories",
        "MemoryService/Upsert",
        ("engram.v1.UpsertRequest", "engram.v1.UpsertResponse"),
        "Remember: write or update memories",
    ),
    post(
        "/v1/memories/get",
        "MemoryService/Get",
        ("engram.v1.GetRequest", "engram.v1.GetResponse"),
        "Read memories by id",
    ),
    post(
        "/v1/memories/delete",
        "MemoryService/Delete",
        ("engram.v1.DeleteRequest", "engram.v1.DeleteResponse"),
        "Forget memories by id",
    ),
    post(
        "/v1/memories/list",
        "MemoryService/ListMemories",
        (
            "engram.v1.ListMemoriesRequest",
            "engram.v1.ListMemoriesResponse",
        ),
        "List memories, a page at a time",
    ),
    post(
        "/v1/edges",
        "MemoryService/AddEdges",
        ("engram.v1.AddEdgesRequest", "engram.v1.AddEdgesResponse"),
        "Link memories",
    ),
    post(
        "/v1/edges/delete",
        "MemoryService/DeleteEdges",
        (
            "engram.v1.DeleteEdgesRequest",
            "engram.v1.DeleteEdgesResponse",
        ),
        "Remove links between memories",
    ),
    post(
        "/v1/conflicts/list",
        "MemoryService/ListConflicts",
        (
            "engram.v1.ListConflictsRequest",
            "engram.v1.ListConflictsResponse",
        ),
        "List detected conflicts between memories, a page at a time",
    ),
    post(
        "/v1/conflicts/review",
        "MemoryService/ReviewConflict",
        (
            "engram.v1.ReviewConflictRequest",
            "engram.v1.ReviewConflictResponse",
        ),
        "Confirm or reject a detected conflict",
    ),
    post(
        "/v1/working-memory",
        "WorkingMemoryService/GetMemory",
        ("engram.v1.GetMemoryRequest", "engram.v1.GetMemoryResponse"),
        "Read and write a session's working memory",
    ),
    post(
        "/v1/demand",
        "WorkingMemoryService/GetDemand",
        ("engram.v1.GetDemandRequest", "engram.v1.GetDemandResponse"),
        "The retrieval shapes this tenant asks for most",
    ),
    post(
        "/v1/foundry/basic",
        "KnowledgeFoundryService/RetrieveBasic",
        (
            "engram.v1.BasicRetrieveRequest",
            "engram.v1.FoundryResponse",
        ),
        "Knowledge Foundry basic retrieval (protobuf JSON mapping)",
    ),
    post(
        "/v1/foundry/agentic",
        "KnowledgeFoundryService/RetrieveAgentic",
        (
            "engram.v1.AgenticRetrieveRequest",
            "engram.v1.FoundryResponse",
        ),
        "Knowledge Foundry agentic retrieval (protobuf JSON mapping)",
    ),
];

/// `GET` and `DELETE` of one memory by id: `MemoryService/Get` and
/// `MemoryService/Delete` with `ids: [id]`.
pub const MEMORY_PATH: &str = "/v1/memories/{id}";

/// The largest JSON body a route reads (axum's default, named here so the
/// error can say it).
pub const MAX_BODY_BYTES: usize = 2 << 20;

/// The descriptors of every engram message, decoded once.
pub static POOL: LazyLock<Result<DescriptorPool, String>> = LazyLock::new(|| {
    DescriptorPool::decode(engram_proto::FILE_DESCRIPTOR_SET).map_err(|e| e.to_string())
});

pub fn router(router: Router<Gateway>) -> Router<Gateway> {
    let mut router = router;
    for route in ROUTES {
        router = router.route(
            route.path,
            on(MethodFilter::POST, move |gw, headers, body| {
                handle(gw, route, headers, body)
            })
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES)),
        );
    }
    router.route(
        MEMORY_PATH,
        on(MethodFilter::GET, get_one).on(MethodFilter::DELETE, delete_one),
    )
}

/// The route a request path belongs to, for span names (never the raw
/// path).
pub fn route_name(path: &str) -> Option<&'static str> {
    if let Some(r) = ROUTES.iter().find(|r| r.path == path) {
        return Some(r.path);
    }
    path.strip_prefix("/v1/memories/")
        .filter(|id| !id.is_empty() && !id.contains('/'))
        .map(|_| MEMORY_PATH)
}

async fn handle(
    State(gw): State<Gateway>,
    route: &'static Route,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match body {
        Ok(body) => reply(transcode(&gw, route, headers, &body).await),
        Err(rejection) => unread(&rejection),
    }
}

/// A body the server would not read (over [`MAX_BODY_BYTES`], a stream
/// cut short): axum's HTTP code (413 for a body over the limit) with the
/// API's JSON error naming the field and the rule, not axum's plain text.
/// The answer says `Connection: close`: the server will not read the rest
/// of that body, so it closes the connection after answering, and a client
/// told so does not send its next request down a socket about to close
/// (the race a keep-alive pool otherwise loses with `IncompleteMessage`).
fn unread(rejection: &BytesRejection) -> Response {
    let message = match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => format!("body: must be at most {MAX_BODY_BYTES} bytes"),
        _ => format!("body: {}", rejection.body_text()),
    };
    let body = json!({
        "error": {
            "code": format!("{:?}", tonic::Code::InvalidArgument),
            "message": message,
        }
    });
    (
        rejection.status(),
        [(header::CONNECTION, "close")],
        axum::Json(body),
    )
        .into_response()
}

async fn get_one(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let route = by_rpc("MemoryService/Get");
    let body = json!({ "ids": [id] }).to_string();
    match transcode(&gw, route, headers, body.as_bytes()).await {
        Ok(v) if v["memories"].as_array().is_some_and(Vec::is_empty) => status_response(
            Status::not_found(format!("id: no memory {id} that this key can read")),
        ),
        other => reply(other),
    }
}

async fn delete_one(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let route = by_rpc("MemoryService/Delete");
    let body = json!({ "ids": [id] }).to_string();
    reply(transcode(&gw, route, headers, body.as_bytes()).await)
}

fn by_rpc(rpc: &str) -> &'static Route {
    // Both callers name RPCs of the table; a test checks they are there.
    ROUTES.iter().find(|r| r.rpc == rpc).unwrap_or(&ROUTES[0])
}

fn reply(r: Result<Value, Status>) -> Response {
    match r {
        Ok(v) => (StatusCode::OK, axum::Json(v)).into_response(),
        Err(s) => status_response(s),
    }
}

/// JSON body → the RPC's request → its handler → JSON answer.
async fn transcode(
    gw: &Gateway,
    route: &'static Route,
    headers: HeaderMap,
    body: &[u8],
) -> Result<Value, Status> {
    let request = from_json(descriptor(route.request)?, body)?;
    let md = MetadataMap::from_headers(headers);
    let answer = call(gw, route.rpc, md, &request).await?;
    to_json(descriptor(route.response)?, &answer)
}

fn descriptor(name: &str) -> Result<MessageDescriptor, Status> {
    let pool = POOL.as_ref().map_err(|e| {
        tracing::error!(error = %e, "protobuf descriptors do not decode");
        Status::internal("internal error")
    })?;
    pool.get_message_by_name(name).ok_or_else(|| {
        tracing::error!(message = name, "no descriptor for a routed message");
        Status::internal("internal error")
    })
}

/// A JSON object (an empty body is `{}`) as the encoded request message.
pub fn from_json(desc: MessageDescriptor, body: &[u8]) -> Result<Vec<u8>, Status> {
    let value: Value = match body.iter().all(u8::is_ascii_whitespace) {
        true => json!({}),
        false => serde_json::from_slice(body)
            .map_err(|e| bad_body(format!("must be valid JSON ({e})")))?,
    };
    if !value.is_object() {
        return Err(bad_body("must be a JSON object"));
    }
    if !json_within_depth(&value, MAX_BODY_NESTING) {
        return Err(bad_body(format!(
            "must nest objects and lists at most {MAX_BODY_NESTING} levels deep"
        )));
    }
    let message = DynamicMessage::deserialize_with_options(desc, value, &DeserializeOptions::new())
        .map_err(|e| bad_body(e.to_string()))?;
    Ok(message.encode_to_vec())
}

/// The body broke `rule`: INVALID_ARGUMENT naming it, worded as every
/// other check's ("invalid argument body: …").
fn bad_body(rule: impl Into<String>) -> Status {
    Status::from(Error::invalid("body", rule))
}

/// An encoded answer as JSON: the proto's field names, every field
/// written (a default too), 64-bit integers as strings (the proto3 JSON
/// mapping).
pub fn to_json(desc: MessageDescriptor, bytes: &[u8]) -> Result<Value, Status> {
    let message = DynamicMessage::decode(desc, bytes).map_err(|e| {
        tracing::error!(error = %e, "an answer does not decode by its descriptor");
        Status::internal("internal error")
    })?;
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(false);
    message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|e| {
            tracing::error!(error = %e, "an answer does not serialize");
            Status::internal("internal error")
        })
}

/// Calls `$svc.$method` with the request decoded from `$bytes` and the
/// HTTP headers as metadata; the answer encoded.
macro_rules! unary {
    ($svc:expr, $method:ident, $bytes:expr, $md:expr) => {{
        let msg =
            Message::decode($bytes).map_err(|_| bad_body("does not decode as the request"))?;
        let mut request = tonic::Request::new(msg);
        *request.metadata_mut() = $md;
        $svc.$method(request)
            .await
            .map(|r| r.into_inner().encode_to_vec())
    }};
}

async fn call(gw: &Gateway, rpc: &str, md: MetadataMap, b: &[u8]) -> Result<Vec<u8>, Status> {
    let (r, m, w, f) = (
        Retrieval(gw.clone()),
        Memory(gw.clone()),
        Working(gw.clone()),
        Foundry(gw.clone()),
    );
    match rpc {
        "RetrievalService/Retrieve" => unary!(r, retrieve, b, md),
        "RetrievalService/Feedback" => unary!(r, feedback, b, md),
        "MemoryService/Upsert" => unary!(m, upsert, b, md),
        "MemoryService/Get" => unary!(m, get, b, md),
        "MemoryService/Delete" => unary!(m, delete, b, md),
        "MemoryService/ListMemories" => unary!(m, list_memories, b, md),
        "MemoryService/AddEdges" => unary!(m, add_edges, b, md),
        "MemoryService/DeleteEdges" => unary!(m, delete_edges, b, md),
        "MemoryService/ListConflicts" => unary!(m, list_conflicts, b, md),
        "MemoryService/ReviewConflict" => unary!(m, review_conflict, b, md),
        "WorkingMemoryService/GetMemory" => unary!(w, get_memory, b, md),
        "WorkingMemoryService/GetDemand" => unary!(w, get_demand, b, md),
        "KnowledgeFoundryService/RetrieveBasic" => unary!(f, retrieve_basic, b, md),
        "KnowledgeFoundryService/RetrieveAgentic" => unary!(f, retrieve_agentic, b, md),
        _ => Err(Status::unimplemented(format!("{rpc}: no such RPC"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_public_rpc_has_a_route_and_every_message_a_descriptor() {
        let pool = POOL.as_ref().expect("descriptors");
        let public = [
            "RetrievalService",
            "MemoryService",
            "WorkingMemoryService",
            "KnowledgeFoundryService",
        ];
        for svc in pool.services().filter(|s| public.contains(&s.name())) {
            for m in svc.methods() {
                let rpc = format!("{}/{}", svc.name(), m.name());
                let route = ROUTES.iter().find(|r| r.rpc == rpc);
                let route = route.unwrap_or_else(|| panic!("{rpc} has no route"));
                assert_eq!(route.request, m.input().full_name(), "{rpc}");
                assert_eq!(route.response, m.output().full_name(), "{rpc}");
            }
        }
        assert_eq!(by_rpc("MemoryService/Get").path, "/v1/memories/get");
        assert_eq!(by_rpc("MemoryService/Delete").path, "/v1/memories/delete");
    }

    #[test]
    fn json_bodies_are_read_by_the_proto_mapping_and_bad_ones_name_the_body() {
        let desc = descriptor("engram.v1.RetrieveRequest").expect("descriptor");
        let bytes = from_json(desc.clone(), br#"{"text": "tea?", "limit": 3}"#).expect("ok");
        let r = engram_proto::RetrieveRequest::decode(bytes.as_slice()).expect("decodes");
        assert_eq!((r.text.as_str(), r.limit), ("tea?", Some(3)));
        assert!(from_json(desc.clone(), b"  ").is_ok(), "empty is {{}}");
        for bad in [
            &b"[]"[..],
            b"{nope",
            br#"{"limit": "x"}"#,
            br#"{"nope": 1}"#,
        ] {
            let e = from_json(desc.clone(), bad).expect_err("bad body");
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            let m = e.message();
            assert!(m.starts_with("invalid argument body: "), "{m}");
        }
        let deep = format!(
            "{}{}",
            "{\"a\":".repeat(40),
            "1".to_string() + &"}".repeat(40)
        );
        let e = from_json(desc, deep.as_bytes()).expect_err("too deep");
        assert!(e.message().contains("levels deep"), "{}", e.message());
    }

    #[test]
    fn answers_are_written_with_proto_field_names_and_defaults() {
        let desc = descriptor("engram.v1.FeedbackResponse").expect("descriptor");
        let v = to_json(
            desc,
            &engram_proto::FeedbackResponse::default().encode_to_vec(),
        );
        assert_eq!(v.expect("json")["accepted"], json!(0));
    }

    #[test]
    fn span_names_are_routes_not_paths() {
        assert_eq!(route_name("/v1/retrieve"), Some("/v1/retrieve"));
        assert_eq!(route_name("/v1/memories/abc"), Some(MEMORY_PATH));
        assert_eq!(route_name("/v1/memories/a/b"), None);
        assert_eq!(route_name("/etc/passwd"), None);
    }
}
