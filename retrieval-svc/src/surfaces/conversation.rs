//! Conversation-window input and fail-open for `Retrieve`. Agents often hold
//! a transcript rather than a crisp question, and some must never block on
//! memory: they would rather act without it than wait on an error. A chatty
//! window is a poor search query, so with the optional LLM configured the
//! window also gets HyDE hypotheses (hypothetical answer passages, searched
//! and fused with the query) within a short budget, skipped on any failure.

use std::time::{Duration, Instant};

use engram_proto::retrieval_service_server::RetrievalService;
use engram_proto::{
    ConversationMessage, FeedbackRequest, FeedbackResponse, RetrievalMode, RetrieveRequest,
    RetrieveResponse,
};
use tonic::{Code, Request, Response, Status};

use crate::error::Error;
use crate::llm;
use crate::router::MAX_TEXT_CHARS;
use crate::service::Gateway;

pub const MAX_MESSAGES: usize = 200;
/// Per message; the query keeps only the most recent text anyway.
pub const MAX_MESSAGE_CHARS: usize = 65_536;

/// The query text of a conversation window: user and assistant text after
/// the last summary marker, oldest first, keeping the most recent
/// `MAX_TEXT_CHARS` characters. System and tool messages are dropped: tool
/// output is bulky and its facts belong in memory through writes, not reads.
pub fn query_text(messages: &[ConversationMessage]) -> Result<String, Error> {
    if messages.len() > MAX_MESSAGES {
        return Err(Error::invalid(
            "conversation",
            format!("at most {MAX_MESSAGES} messages"),
        ));
    }
    for m in messages {
        if !matches!(m.role.as_str(), "user" | "assistant" | "system" | "tool") {
            return Err(Error::invalid(
                "conversation.role",
                "must be user, assistant, system or tool",
            ));
        }
        if m.content.chars().count() > MAX_MESSAGE_CHARS {
            return Err(Error::invalid(
                "conversation.content",
                format!("must be at most {MAX_MESSAGE_CHARS} characters"),
            ));
        }
    }
    let since = messages
        .iter()
        .rposition(|m| m.summary_marker)
        .map_or(0, |i| i + 1);
    let kept: Vec<&str> = messages[since..]
        .iter()
        .filter(|m| matches!(m.role.as_str(), "user" | "assistant"))
        .map(|m| m.content.trim())
        .filter(|c| !c.is_empty())
        .collect();
    if kept.is_empty() {
        return Err(Error::invalid(
            "conversation",
            "holds no user or assistant text after the last summary marker",
        ));
    }
    let joined = kept.join("\n");
    let n = joined.chars().count();
    Ok(if n > MAX_TEXT_CHARS {
        joined.chars().skip(n - MAX_TEXT_CHARS).collect()
    } else {
        joined
    })
}

/// Failures the caller cannot fix by changing the request: these are the
/// ones `fail_open` turns into an empty answer.
fn is_runtime_failure(code: Code) -> bool {
    !matches!(
        code,
        Code::InvalidArgument | Code::Unauthenticated | Code::PermissionDenied
    )
}

/// Whether HyDE may help this request: a conversation window standing in
/// for the text, no hypotheses of the caller's own, and a mode whose plan
/// runs the vector search the hypotheses feed.
fn wants_hyde(r: &RetrieveRequest) -> bool {
    r.text.trim().is_empty()
        && !r.conversation.is_empty()
        && r.hypotheses.is_empty()
        && !r.context_sufficient
        && !matches!(
            RetrievalMode::try_from(r.mode),
            Ok(RetrievalMode::Keyword | RetrievalMode::Graph)
        )
}

/// The public `RetrievalService`: the gateway plus HyDE for conversation
/// windows and `fail_open`. A wrapper rather than a branch inside the
/// pipeline so every failure path, including ones added later, is covered.
#[derive(Clone)]
pub struct FailOpen(pub Gateway);

impl FailOpen {
    /// Adds LLM hypotheses to a conversation-window request when an LLM is
    /// configured. Never fails the request: on error or timeout it leaves
    /// the request as it was.
    async fn add_hypotheses(&self, request: &mut Request<RetrieveRequest>, start: Instant) {
        let gw = &self.0;
        let Some(client) = gw.llm() else {
            return;
        };
        if !wants_hyde(request.get_ref()) {
            return;
        }
        // Only callers the gateway will serve, with a valid window, spend
        // an LLM call; the gateway reports anything else itself.
        let Ok(identity) = gw.authenticate(request.metadata()) else {
            return;
        };
        let Ok(text) = query_text(&request.get_ref().conversation) else {
            return;
        };
        let client_timeout_opt = engram_common::server::grpc_timeout(request.metadata());
        // A caller's own deadline leaves at least half for the pipeline.
        let left =
            client_timeout_opt.map_or(Duration::MAX, |t| t.saturating_sub(start.elapsed()) / 2);
        let budget = client.hyde_budget(left);
        let t = tokio::time::Instant::now();
        let r = client.hypotheses(&text, client.hyde_count(), budget).await;
        llm::observe(&gw.downstreams().metrics, &r, t);
        match r {
            Ok(reply) => {
                tracing::debug!(
                    tenant = %identity.tenant,
                    count = reply.value.len(),
                    tokens = reply.tokens,
                    ms = t.elapsed().as_millis() as u64,
                    "hyde hypotheses added"
                );
                request.get_mut().hypotheses = reply.value;
            }
            Err(e) => {
                tracing::warn!(
                    tenant = %identity.tenant,
                    error = %e,
                    ms = t.elapsed().as_millis() as u64,
                    "hyde skipped"
                );
            }
        }
        // The gateway reads the caller's deadline from this header when it
        // starts; the time HyDE took is no longer the pipeline's.
        if let Some(total) = client_timeout_opt {
            let rest = total.saturating_sub(start.elapsed()).as_millis().max(1);
            if let Ok(v) = format!("{rest}m").parse() {
                request.metadata_mut().insert("grpc-timeout", v);
            }
        }
    }
}

#[tonic::async_trait]
impl RetrievalService for FailOpen {
    async fn retrieve(
        &self,
        mut request: Request<RetrieveRequest>,
    ) -> Result<Response<RetrieveResponse>, Status> {
        let fail_open = request.get_ref().fail_open;
        let start = Instant::now();
        self.add_hypotheses(&mut request, start).await;
        match RetrievalService::retrieve(&self.0, request).await {
            Err(status) if fail_open && is_runtime_failure(status.code()) => {
                tracing::warn!(code = ?status.code(), "retrieval failed open");
                Ok(Response::new(RetrieveResponse {
                    query_id: uuid::Uuid::new_v4().to_string(),
                    degraded_stages: vec!["fail_open".into()],
                    latency_ms: start.elapsed().as_secs_f64() * 1000.0,
                    ..Default::default()
                }))
            }
            other => other,
        }
    }

    async fn feedback(
        &self,
        request: Request<FeedbackRequest>,
    ) -> Result<Response<FeedbackResponse>, Status> {
        RetrievalService::feedback(&self.0, request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> ConversationMessage {
        ConversationMessage {
            role: role.into(),
            content: content.into(),
            summary_marker: false,
        }
    }

    #[test]
    fn keeps_user_and_assistant_after_the_last_summary() {
        let mut summary = msg("system", "summary of earlier turns");
        summary.summary_marker = true;
        let window = vec![
            msg("user", "old question about billing"),
            summary,
            msg("user", "who leads the migration?"),
            msg("tool", "{\"rows\": 5000}"),
            msg("system", "be terse"),
            msg("assistant", "Alice, I think."),
            msg("user", "  "),
        ];
        assert_eq!(
            query_text(&window).expect("valid"),
            "who leads the migration?\nAlice, I think."
        );
    }

    #[test]
    fn keeps_the_most_recent_text_when_long() {
        let window = vec![
            msg("user", &"a".repeat(MAX_TEXT_CHARS)),
            msg("assistant", "tail"),
        ];
        let q = query_text(&window).expect("valid");
        assert_eq!(q.chars().count(), MAX_TEXT_CHARS);
        assert!(q.ends_with("\ntail"));
    }

    #[test]
    fn rejects_bad_windows_naming_the_field() {
        let field = |w: Vec<ConversationMessage>| match query_text(&w) {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("expected invalid argument, got {other:?}"),
        };
        assert_eq!(field(vec![msg("robot", "x")]), "conversation.role");
        assert_eq!(field(vec![msg("tool", "only tools")]), "conversation");
        assert_eq!(field(vec![msg("user", "x"); 201]), "conversation");
    }

    #[test]
    fn hyde_only_for_windows_without_hypotheses() {
        let window = RetrieveRequest {
            conversation: vec![msg("user", "who leads billing?")],
            ..Default::default()
        };
        assert!(wants_hyde(&window));
        let with = |f: fn(&mut RetrieveRequest)| {
            let mut r = window.clone();
            f(&mut r);
            wants_hyde(&r)
        };
        assert!(!with(|r| r.text = "who leads billing?".into()));
        assert!(!with(|r| r.hypotheses = vec!["Alice does.".into()]));
        assert!(!with(|r| r.context_sufficient = true));
        assert!(!with(|r| r.mode = RetrievalMode::Keyword as i32));
        assert!(with(|r| r.mode = RetrievalMode::Hybrid as i32));
        assert!(!with(|r| r.conversation.clear()));
    }

    #[test]
    fn only_runtime_failures_fail_open() {
        assert!(is_runtime_failure(Code::Unavailable));
        assert!(is_runtime_failure(Code::DeadlineExceeded));
        assert!(is_runtime_failure(Code::Internal));
        assert!(!is_runtime_failure(Code::InvalidArgument));
        assert!(!is_runtime_failure(Code::Unauthenticated));
    }
}
