//! `engram mcp`: engram's memory as Model Context Protocol tools, over stdio
//! (an MCP host starts `engram mcp` itself) or streamable HTTP on loopback
//! (`--http 127.0.0.1:8765`). Built on `rmcp`, the official Rust SDK
//! (docs/decisions.md, docs/mcp.md).
//!
//! The server is a gRPC client of the gateway like `engram query`: every
//! tool call carries the API key the server was started with
//! (`--api-key`, ENGRAM_API_KEY, else `.engram/dev-api-key`), so tenant,
//! agent and trust come from that key and never from tool arguments; no
//! tool has a tenant or agent argument to forge.
//!
//! Arguments are checked against each tool's own JSON schema before any
//! call (required, unknown, type, minimum), and the gateway validates the
//! rest at its boundary; either way a bad argument comes back as a tool
//! error (`isError`) whose text names the argument, which an LLM can act
//! on, rather than as a protocol error it never sees.

use std::net::SocketAddr;
use std::sync::Arc;

use engram_common::Settings;
use engram_common::convert::{chrono_to_ts, json_to_struct, ts_to_chrono};
use engram_proto::memory_service_client::MemoryServiceClient;
use engram_proto::retrieval_service_client::RetrievalServiceClient;
use engram_proto::working_memory_service_client::WorkingMemoryServiceClient;
use engram_proto::{
    DeleteRequest, FeedbackItem, FeedbackRequest, FeedbackSignal, GetMemoryRequest, Memory,
    MemoryOrigin, RetrieveRequest, UpsertRequest,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::schemars::{self, JsonSchema};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::memories::KeyArgs;

/// `engram mcp`'s options.
#[derive(Debug, Clone, clap::Args)]
pub struct McpArgs {
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio. Loopback
    /// only: every HTTP client acts with this server's API key.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// With --http: a browser origin allowed besides loopback ones
    /// (`scheme://host[:port]`, `:*` for any port); repeatable. A request
    /// with any other `Origin` header is refused with 403.
    #[arg(long = "allow-origin", value_name = "ORIGIN", requires = "http")]
    pub allow_origins: Vec<String>,
    #[command(flatten)]
    pub key: KeyArgs,
}

/// The server's key on every gateway call.
#[derive(Clone)]
struct Bearer(MetadataValue<Ascii>);

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

type Authed = InterceptedService<Channel, Bearer>;

/// The MCP server: the gateway's public clients with one key, and the
/// tool list (schemas computed once).
#[derive(Clone)]
pub struct EngramMcp {
    retrieval: RetrievalServiceClient<Authed>,
    memories: MemoryServiceClient<Authed>,
    working: WorkingMemoryServiceClient<Authed>,
    tools: Arc<Vec<Tool>>,
}

impl EngramMcp {
    /// A lazy channel: an MCP host may start this server before the
    /// gateway; until it is up each tool call fails as a tool error.
    pub fn new(uri: &str, api_key: &str) -> anyhow::Result<Self> {
        let channel = Endpoint::from_shared(uri.to_string())?.connect_lazy();
        let key = Bearer(format!("Bearer {api_key}").parse().map_err(|_| {
            anyhow::anyhow!("the API key contains characters not allowed in metadata")
        })?);
        let max = 64 << 20;
        Ok(Self {
            retrieval: RetrievalServiceClient::with_interceptor(channel.clone(), key.clone())
                .max_decoding_message_size(max),
            memories: MemoryServiceClient::with_interceptor(channel.clone(), key.clone())
                .max_decoding_message_size(max),
            working: WorkingMemoryServiceClient::with_interceptor(channel, key)
                .max_decoding_message_size(max),
            tools: Arc::new(tools()),
        })
    }

    /// Runs one tool; `Err` is the tool error's text.
    async fn run(&self, name: &str, args: JsonObject) -> Result<Value, String> {
        let tool = (self.tools.iter())
            .find(|t| t.name == name)
            .ok_or_else(|| format!("unknown tool {name}"))?;
        check_args(tool, &args)?;
        let args = Value::Object(args);
        match name {
            "search_memory" => self.search(parse(args)?).await,
            "get_memory" => self.get_memory(parse(args)?).await,
            "remember" => self.remember(parse(args)?).await,
            "forget" => self.forget(parse(args)?).await,
            "memory_feedback" => self.feedback(parse(args)?).await,
            other => Err(format!("unknown tool {other}")),
        }
    }

    async fn search(&self, a: SearchArgs) -> Result<Value, String> {
        let req = RetrieveRequest {
            text: a.query,
            limit: a.limit,
            namespace: a.namespace.unwrap_or_default(),
            memory_types: a.memory_types,
            include_historical: a.include_historical,
            token_budget: a.token_budget.unwrap_or(DEFAULT_TOKEN_BUDGET),
            ..Default::default()
        };
        let r = (self.retrieval.clone().retrieve(req).await)
            .map_err(status_text)?
            .into_inner();
        let records: Vec<Value> = r
            .records
            .iter()
            .map(|rec| {
                let m = rec.memory.clone().unwrap_or_default();
                let p = rec.provenance.clone().unwrap_or_default();
                let mut v = memory_json(&m);
                if let Some(o) = v.as_object_mut() {
                    o.insert("rank".into(), rec.rank.into());
                    o.insert("score".into(), json!(rec.score));
                    o.insert(
                        "provenance".into(),
                        json!({
                            "citation": p.citation,
                            "found_by": p.strategies.iter().map(|s| json!({
                                "strategy": s.strategy, "rank": s.rank, "score": s.score,
                            })).collect::<Vec<_>>(),
                            "via_entities": p.via_entities,
                            "checks_passed": p.checks_passed,
                            "confidence": p.confidence,
                        }),
                    );
                }
                v
            })
            .collect();
        Ok(json!({
            "query_id": r.query_id,
            "context": r.context_block,
            "nothing_relevant": r.nothing_relevant,
            "records": records,
            "conflicts": r.conflicts.iter().map(|c| json!({
                "memory_a": c.memory_a, "memory_b": c.memory_b, "winner_id": c.winner_id,
            })).collect::<Vec<_>>(),
            "degraded": r.degraded_stages,
        }))
    }

    async fn get_memory(&self, a: GetMemoryArgs) -> Result<Value, String> {
        let req = GetMemoryRequest {
            query: a.query,
            session_id: a.session_id.unwrap_or_default(),
            min_confidence: a.min_confidence,
            limit: a.limit,
            compact: a.compact,
            include_sources: a.include_sources,
            max_depth: a.max_depth,
        };
        let r = (self.working.clone().get_memory(req).await)
            .map_err(status_text)?
            .into_inner();
        let origin = match MemoryOrigin::try_from(r.origin) {
            Ok(MemoryOrigin::Working) => "working",
            Ok(MemoryOrigin::Graph) => "graph",
            _ => "none",
        };
        Ok(json!({
            "query_id": r.query_id,
            "origin": origin,
            "items": r.items.iter().map(|i| json!({
                "id": i.id, "content": i.content, "memory_type": i.memory_type,
                "confidence": i.confidence, "score": i.score, "session_id": i.session_id,
                "written_at": i.written_at.as_ref().and_then(ts_to_chrono).map(|t| t.to_rfc3339()),
            })).collect::<Vec<_>>(),
            "causal_chain": r.causal_chain.iter().map(|c| json!({
                "memory_id": c.memory_id, "edge_type": c.edge_type, "depth": c.depth,
                "content": c.content, "confidence": c.confidence,
            })).collect::<Vec<_>>(),
            "sources": r.sources.iter().map(|s| json!({
                "memory_id": s.memory_id, "citation": s.citation, "found_by": s.found_by,
                "namespace": s.namespace, "session_id": s.session_id,
            })).collect::<Vec<_>>(),
            "contradictions": r.contradictions.iter().map(|c| json!({
                "memory_a": c.memory_a, "memory_b": c.memory_b,
            })).collect::<Vec<_>>(),
            "degraded": r.degraded_stages,
        }))
    }

    async fn remember(&self, a: RememberArgs) -> Result<Value, String> {
        let working = a.session_id.is_some();
        let memory_type = match (a.memory_type, working) {
            (Some(t), true) if t != "working" => {
                return Err(format!(
                    "memory_type: a note with session_id is working memory; omit memory_type or use \"working\", not {t:?}"
                ));
            }
            (None, true) => "working".to_string(),
            (Some(t), false) if t == "working" => {
                return Err("session_id: required for memory_type \"working\"".into());
            }
            (t, _) => t.unwrap_or_default(),
        };
        if a.ttl_ms.is_some() && !working {
            return Err("ttl_ms: only for working memory (with session_id)".into());
        }
        let event_time = match &a.event_time {
            None => None,
            Some(s) => Some(chrono_to_ts(
                chrono::DateTime::parse_from_rfc3339(s)
                    .map_err(|e| {
                        format!("event_time: must be RFC 3339, e.g. 2025-01-31T09:00:00Z ({e})")
                    })?
                    .with_timezone(&chrono::Utc),
            )),
        };
        let mut metadata = serde_json::Map::new();
        if let Some(s) = &a.session_id {
            metadata.insert("session_id".into(), s.clone().into());
        }
        if let Some(t) = a.ttl_ms {
            metadata.insert("ttl_ms".into(), t.into());
        }
        let memory = Memory {
            content: a.content,
            title: a.title.unwrap_or_default(),
            memory_type,
            namespace: a.namespace.unwrap_or_default(),
            source: a.source.unwrap_or_default(),
            event_time,
            metadata: (!metadata.is_empty()).then(|| json_to_struct(&Value::Object(metadata))),
            ..Default::default()
        };
        let req = UpsertRequest {
            memories: vec![memory],
        };
        let r = (self.memories.clone().upsert(req).await)
            .map_err(status_text)?
            .into_inner();
        let first = r.results.first().cloned().unwrap_or_default();
        Ok(json!({
            "id": first.id, "version": first.version, "created": first.created,
            "working_memory": working,
        }))
    }

    async fn forget(&self, a: ForgetArgs) -> Result<Value, String> {
        if a.ids.is_empty() {
            return Err("ids: must name at least one memory".into());
        }
        let req = DeleteRequest { ids: a.ids };
        let r = (self.memories.clone().delete(req).await)
            .map_err(status_text)?
            .into_inner();
        Ok(json!({ "deleted": r.deleted }))
    }

    async fn feedback(&self, a: FeedbackArgs) -> Result<Value, String> {
        let signal = match a.signal.as_str() {
            "used" => FeedbackSignal::Used,
            "helpful" => FeedbackSignal::Helpful,
            "sufficient" => FeedbackSignal::Sufficient,
            other => {
                return Err(format!(
                    "signal: must be used, helpful or sufficient, not {other:?}"
                ));
            }
        };
        if a.memory_ids.is_empty() {
            return Err("memory_ids: must name at least one memory".into());
        }
        let items = (a.memory_ids.into_iter())
            .map(|memory_id| FeedbackItem {
                memory_id,
                signal: signal as i32,
                value: a.value.unwrap_or(true),
            })
            .collect();
        let req = FeedbackRequest {
            query_id: a.query_id,
            items,
        };
        let r = (self.retrieval.clone().feedback(req).await)
            .map_err(status_text)?
            .into_inner();
        Ok(json!({ "accepted": r.accepted }))
    }
}

/// The rough size of the context block `search_memory` packs when the
/// caller names none: a few paragraphs an LLM can read in one go.
const DEFAULT_TOKEN_BUDGET: u32 = 1000;

/// The gateway's refusal as the tool error's text: its message already
/// names the field (`invalid argument limit: must be in 1..=100`).
fn status_text(s: tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

fn parse<T: for<'de> Deserialize<'de>>(args: Value) -> Result<T, String> {
    serde_json::from_value(args).map_err(|e| format!("arguments: {e}"))
}

/// A stored memory as the tools show it.
fn memory_json(m: &Memory) -> Value {
    let event_time = m
        .event_time
        .as_ref()
        .and_then(ts_to_chrono)
        .map(|t| t.to_rfc3339());
    json!({
        "id": m.id, "title": m.title, "content": m.content,
        "memory_type": m.memory_type, "namespace": m.namespace,
        "event_time": event_time, "source": m.source,
    })
}

/// Checks `args` against the tool's input schema before any call, so the
/// error names the argument: required ones present, no unknown ones, each
/// of its schema type (array items too) and at least its `minimum`.
fn check_args(tool: &Tool, args: &JsonObject) -> Result<(), String> {
    let schema = &tool.input_schema;
    let empty = serde_json::Map::new();
    let props = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let required = schema.get("required").and_then(Value::as_array);
    for r in required.into_iter().flatten().filter_map(Value::as_str) {
        if !args.contains_key(r) {
            return Err(format!("{r}: required"));
        }
    }
    for (name, value) in args {
        let Some(prop) = props.get(name) else {
            let known: Vec<&str> = props.keys().map(String::as_str).collect();
            return Err(format!(
                "{name}: not an argument of {} (its arguments: {})",
                tool.name,
                known.join(", ")
            ));
        };
        check_value(name, prop, value)?;
        if let (Some(items), Some(list)) = (prop.get("items"), value.as_array()) {
            for (i, v) in list.iter().enumerate() {
                check_value(&format!("{name}[{i}]"), items, v)?;
            }
        }
    }
    Ok(())
}

fn check_value(name: &str, prop: &Value, value: &Value) -> Result<(), String> {
    let types: Vec<&str> = match prop.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return Ok(()),
    };
    let fits = |t: &str| match t {
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        "null" => value.is_null(),
        _ => true,
    };
    if !types.iter().any(|t| fits(t)) {
        let wanted: Vec<&str> = types.into_iter().filter(|t| *t != "null").collect();
        return Err(format!("{name}: must be {}", wanted.join(" or ")));
    }
    if let (Some(min), Some(v)) = (prop.get("minimum").and_then(Value::as_f64), value.as_f64())
        && v < min
    {
        return Err(format!("{name}: must be at least {min}"));
    }
    if let (Some(max), Some(v)) = (prop.get("maximum").and_then(Value::as_f64), value.as_f64())
        && v > max
    {
        return Err(format!("{name}: must be at most {max}"));
    }
    Ok(())
}

/// `search_memory`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    /// What you want to know, in plain words (a question or a topic); at most 4096 characters.
    query: String,
    /// How many memories to return, 1..=100 (default 10).
    limit: Option<u32>,
    /// Only memories of this namespace (default: every namespace).
    namespace: Option<String>,
    /// Only these memory types, e.g. ["episodic", "semantic", "procedural"] (default: all).
    #[serde(default)]
    memory_types: Vec<String>,
    /// Also superseded, retracted and faded memories (default false: current ones only).
    #[serde(default)]
    include_historical: bool,
    /// Size of the returned `context` block in tokens, 1..=100000 (default 1000).
    token_budget: Option<u32>,
}

/// `get_memory`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct GetMemoryArgs {
    /// What you need to recall; at most 4096 characters.
    query: String,
    /// Your conversation's session id: its working memory is searched first. Omit to search only long-term memory.
    session_id: Option<String>,
    /// How many items, 1..=100 (default 10).
    limit: Option<u32>,
    /// How far to follow `causes` / `supports` links from the matched memories, 1..=4 (default 2).
    max_depth: Option<u32>,
    /// Items only: no causal chain, sources or contradictions (default false).
    #[serde(default)]
    compact: bool,
    /// Return where each item and chain link came from (default false).
    #[serde(default)]
    include_sources: bool,
    /// Ignore memories whose source confidence is below this, 0..=1 (default 0).
    min_confidence: Option<f32>,
}

/// `remember`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RememberArgs {
    /// The fact, event or instruction to remember, self-contained (it will be read without this conversation); at most 64 KiB.
    content: String,
    /// A short heading, e.g. the person or topic it is about.
    title: Option<String>,
    /// episodic (an event, the default), semantic (a fact), procedural (how to do something), or another lowercase [a-z0-9_] label.
    memory_type: Option<String>,
    /// Namespace to file it under (default "default").
    namespace: Option<String>,
    /// Where it came from: a URL, a document, "user said".
    source: Option<String>,
    /// When it happened, RFC 3339 (default: now).
    event_time: Option<String>,
    /// Keep it only as working memory of this session (not stored long-term); it expires after ttl_ms.
    session_id: Option<String>,
    /// Lifetime of a working-memory note in milliseconds (default one hour); only with session_id.
    ttl_ms: Option<u64>,
}

/// `forget`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ForgetArgs {
    /// Ids of the memories to delete (the `id` of search_memory / get_memory / remember results).
    ids: Vec<String>,
}

/// `memory_feedback`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct FeedbackArgs {
    /// The `query_id` of the search_memory result the memories came from.
    query_id: String,
    /// Ids of memories from that result.
    memory_ids: Vec<String>,
    /// used (you relied on them), helpful (they were right for the question) or sufficient (they answered it fully).
    signal: String,
    /// false to report the opposite (not used, not helpful); default true.
    value: Option<bool>,
}

fn tool<T: JsonSchema + 'static>(name: &'static str, description: &'static str) -> Tool {
    Tool::new(
        name,
        description,
        rmcp::handler::server::common::schema_for_type::<T>(),
    )
}

/// The five tools, with descriptions written for the model that calls them.
fn tools() -> Vec<Tool> {
    let hints = |read_only: bool, destructive: bool| {
        ToolAnnotations::new()
            .read_only(read_only)
            .destructive(destructive)
            .open_world(false)
    };
    vec![
        tool::<SearchArgs>(
            "search_memory",
            "Search your long-term memory. Returns `context` (the most relevant memories packed into a block you can read directly), `records` (each memory with id, content, rank, score and provenance: its citation and which searches found it), `nothing_relevant` (true when memory likely holds nothing on this subject: say you do not know rather than guess) and `query_id` (pass it to memory_feedback).",
        )
        .with_annotations(hints(true, false)),
        tool::<GetMemoryArgs>(
            "get_memory",
            "Recall for the current task: your session's working memory first (notes saved with remember + session_id), falling back to long-term memory with the causes/supports chain around the matches and any contradictions among them. `origin` says where the items came from: working, graph or none.",
        )
        .with_annotations(hints(true, false)),
        tool::<RememberArgs>(
            "remember",
            "Store something worth knowing later: a fact, an event, a preference, a procedure. Write it self-contained. Returns the memory's `id`. With session_id it is a short-lived working-memory note of that session instead.",
        )
        .with_annotations(hints(false, false)),
        tool::<ForgetArgs>(
            "forget",
            "Delete memories by id, for good: use when a memory is wrong, obsolete or the user asks to forget it. Returns how many were deleted (ids you cannot see count as not found).",
        )
        .with_annotations(hints(false, true)),
        tool::<FeedbackArgs>(
            "memory_feedback",
            "Tell memory which results of a search_memory call you used or found helpful, so future searches rank better. Only ids that call returned are accepted.",
        )
        .with_annotations(hints(false, false)),
    ]
}

impl ServerHandler for EngramMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("engram", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "engram is your long-term memory. Before answering from what you know about the user, past work or earlier sessions, call search_memory (or get_memory inside a session). Store durable facts with remember, remove wrong ones with forget, and report what helped with memory_feedback.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if !self.tools.iter().any(|t| t.name == request.name) {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {}", request.name),
                None,
            ));
        }
        let args = request.arguments.unwrap_or_default();
        let result = match self.run(&request.name, args).await {
            Ok(v) => CallToolResult::structured(v),
            Err(text) => CallToolResult::error(vec![ContentBlock::text(text)]),
        };
        Ok(result.into())
    }
}

/// `engram mcp`: stdio until the host closes it, or HTTP until Ctrl-C.
pub async fn run(settings: Settings, args: McpArgs) -> anyhow::Result<()> {
    let key = args.key.api_key(&settings)?;
    let uri = args.key.uri(&settings);
    if let Some(wanted) = &args.key.tenant {
        // The same check as `engram memories`: stop before serving a key
        // of another tenant.
        let s = crate::memories::Session::open(&settings, args.key.clone()).await?;
        tracing::info!(tenant = %s.tenant, wanted = %wanted, "mcp key checked");
    }
    let server = EngramMcp::new(&uri, &key)?;
    match args.http {
        None => {
            let running = server.serve(rmcp::transport::stdio()).await?;
            running.waiting().await?;
            Ok(())
        }
        Some(addr) => {
            let opts = HttpOptions {
                allowed_origins: args.allow_origins,
                header_read: std::time::Duration::from_millis(
                    settings.listen.header_read_timeout_ms,
                ),
            };
            serve_http(server, addr, opts).await
        }
    }
}

/// How the streamable HTTP transport is served.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Browser origins allowed besides the loopback ones ([`LOOPBACK_ORIGINS`]).
    pub allowed_origins: Vec<String>,
    /// A request's headers must arrive within this of the connection
    /// opening or of the previous response (`listen.header_read_timeout_ms`).
    pub header_read: std::time::Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            allowed_origins: Vec::new(),
            header_read: std::time::Duration::from_millis(
                engram_common::settings::ListenSettings::default().header_read_timeout_ms,
            ),
        }
    }
}

/// Origins always allowed: pages served from this machine's loopback
/// names, on any port. Any other `Origin` is a page elsewhere reaching the
/// port through the browser (DNS rebinding, or a plain cross-origin POST),
/// and the MCP spec says the server must refuse it.
pub const LOOPBACK_ORIGINS: [&str; 6] = [
    "http://localhost:*",
    "http://127.0.0.1:*",
    "http://[::1]:*",
    "https://localhost:*",
    "https://127.0.0.1:*",
    "https://[::1]:*",
];

/// Streamable HTTP at `/mcp` on a loopback address until Ctrl-C.
pub async fn serve_http(
    server: EngramMcp,
    addr: SocketAddr,
    opts: HttpOptions,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    serve_http_with(server, listener, opts, stop).await
}

/// [`serve_http_with`] with the default options: loopback origins only.
pub async fn serve_http_on(
    server: EngramMcp,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_http_with(server, listener, HttpOptions::default(), shutdown).await
}

/// An `--allow-origin` value, `scheme://host[:port]` (`:*` for any port),
/// http or https, with nothing after the authority, as rmcp matches it:
/// without a port, the scheme's own (RFC 6454). rmcp skips an entry it
/// cannot parse, so a typo would silently allow nothing.
fn allowed_origin(origin: &str) -> anyhow::Result<String> {
    let bad = |why: &str| anyhow::anyhow!("--allow-origin {origin:?}: {why}");
    let (default_port, rest) = match origin.split_once("://") {
        Some(("http", rest)) => (80, rest),
        Some(("https", rest)) => (443, rest),
        _ => return Err(bad("must start with http:// or https://")),
    };
    if rest.is_empty() || rest.starts_with(':') {
        return Err(bad("has no host"));
    }
    if rest.contains(['/', '?', '#', '@']) || rest.chars().any(char::is_whitespace) {
        return Err(bad("must be scheme://host[:port], nothing after the port"));
    }
    let after_host = rest.rsplit_once(']').map_or(rest, |(_, tail)| tail);
    Ok(if after_host.contains(':') {
        origin.to_string()
    } else {
        format!("{origin}:{default_port}")
    })
}

/// Streamable HTTP at `/mcp` on `listener` (loopback only) until
/// `shutdown`. rmcp's default `Host` check (loopback names only) and the
/// `Origin` check (loopback origins and `opts.allowed_origins`; a request
/// without `Origin`, from a client that is no browser, passes) guard
/// against DNS rebinding; connections are bounded as on the other HTTP
/// ports (`engram_common::conn::serve_http`).
pub async fn serve_http_with(
    server: EngramMcp,
    listener: tokio::net::TcpListener,
    opts: HttpOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        anyhow::bail!(
            "--http {addr}: the MCP HTTP transport has no authentication of its own (every client acts with this server's API key); serve it on a loopback address"
        );
    }
    let extra: Vec<String> = (opts.allowed_origins.iter())
        .map(|o| allowed_origin(o))
        .collect::<anyhow::Result<_>>()?;
    let origins = LOOPBACK_ORIGINS.iter().map(|o| o.to_string());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_origins(origins.chain(extra))
        .enforce_origin_validation();
    let stop = config.cancellation_token.clone();
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    eprintln!("engram mcp: streamable HTTP at http://{addr}/mcp");
    let shutdown = async move {
        shutdown.await;
        stop.cancel();
    };
    engram_common::conn::serve_http(listener, router, opts.header_read, shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An MCP server on a loopback port (its gateway never called: an
    /// `initialize` needs none), stopped when the sender is dropped.
    async fn start(opts: HttpOptions) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = EngramMcp::new("http://127.0.0.1:9", "k").expect("server");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_http_with(server, listener, opts, async move {
            let _ = stopped.await;
        }));
        (addr, stop)
    }

    /// The status of an `initialize` POST carrying `origin_opt`.
    async fn initialize(addr: SocketAddr, origin_opt: Option<&str>) -> u16 {
        let body = json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "0"}}
        })
        .to_string();
        let origin = origin_opt.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
        let req = format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\n{origin}\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(req.as_bytes()).await.expect("write");
        let mut head = [0u8; 12];
        tcp.read_exact(&mut head).await.expect("status line");
        let line = String::from_utf8_lossy(&head).to_string();
        line[9..12].parse().expect("status")
    }

    #[tokio::test]
    async fn a_foreign_origin_is_refused_and_loopback_or_none_is_served() {
        let opts = HttpOptions {
            allowed_origins: vec!["https://app.example.com".into()],
            ..HttpOptions::default()
        };
        let (addr, _stop) = start(opts).await;
        for origin in [
            "http://evil.example",
            "http://localhost.evil.example",
            "http://app.example.com",
            "https://app.example.com:8443",
            "null",
        ] {
            assert_eq!(initialize(addr, Some(origin)).await, 403, "{origin}");
        }
        for origin_opt in [
            None,
            Some("http://localhost"),
            Some("http://localhost:5173"),
            Some("http://127.0.0.1:8080"),
            Some("http://[::1]:3000"),
            Some("https://localhost:3000"),
            Some("https://app.example.com"),
            Some("https://app.example.com:443"),
        ] {
            assert_eq!(initialize(addr, origin_opt).await, 200, "{origin_opt:?}");
        }
    }

    #[tokio::test]
    async fn a_connection_without_a_header_in_time_is_closed() {
        let opts = HttpOptions {
            header_read: Duration::from_millis(200),
            ..HttpOptions::default()
        };
        let (addr, _stop) = start(opts).await;
        let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127")
            .await
            .expect("write");
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "still open after 5 s");
    }

    #[test]
    fn an_allowed_origin_must_be_scheme_host_and_port() {
        for (given, kept) in [
            ("https://app.example.com", "https://app.example.com:443"),
            ("http://host", "http://host:80"),
            ("http://host:8080", "http://host:8080"),
            ("http://host:*", "http://host:*"),
            ("http://[::1]", "http://[::1]:80"),
            ("http://[::1]:3000", "http://[::1]:3000"),
        ] {
            assert_eq!(allowed_origin(given).expect(given), kept);
        }
        for bad in [
            "app.example.com",
            "ftp://x",
            "https://",
            "https://x/path",
            "http://:80",
            "https://u@x",
        ] {
            let e = allowed_origin(bad).expect_err(bad).to_string();
            assert!(e.contains("--allow-origin"), "{e}");
        }
    }
}
