//! HyDE for conversation windows. Agents often hold a transcript rather
//! than a crisp question, and a chatty window is a poor search query, so
//! with the optional LLM configured the window also gets hypotheses
//! (hypothetical answer passages, searched and fused with the query) within
//! a short budget, skipped on any failure. A plain step before the pipeline:
//! the API adapter runs it, then the pipeline with the time that is left.

use engram_common::Identity;
use engram_proto::{RetrievalMode, RetrieveRequest};
use tokio::time::Instant;

use crate::gateway::Gateway;
use crate::query::query_text;
use crate::surfaces::llm;

/// Whether HyDE may help this request: a conversation window standing in
/// for the text, no hypotheses of the caller's own, and a mode whose plan
/// runs the vector search the hypotheses feed.
pub fn wants_hyde(r: &RetrieveRequest) -> bool {
    r.text.trim().is_empty()
        && !r.conversation.is_empty()
        && r.hypotheses.is_empty()
        && !r.context_sufficient
        && !matches!(
            RetrievalMode::try_from(r.mode),
            Ok(RetrievalMode::Keyword | RetrievalMode::Graph)
        )
}

/// Hypotheses for a conversation-window request when an LLM is configured
/// and the request [`wants_hyde`]. Never fails the request: `None` on any
/// error or timeout, and the request goes on as it was. It takes at most
/// half of the time left before the request's `deadline`, so the pipeline
/// keeps the other half.
pub async fn hypotheses(
    gw: &Gateway,
    identity: &Identity,
    req: &RetrieveRequest,
    deadline: Instant,
) -> Option<Vec<String>> {
    let client = gw.llm()?;
    if !wants_hyde(req) {
        return None;
    }
    // Only a valid window spends an LLM call; the query reports a bad one.
    let text = query_text(&req.conversation).ok()?;
    let left = deadline.saturating_duration_since(Instant::now());
    let budget = client.hyde_budget(left / 2);
    let t = Instant::now();
    let r = client.hypotheses(&text, client.hyde_count(), budget).await;
    llm::observe(gw.metrics(), &r, t);
    let ms = t.elapsed().as_millis() as u64;
    match r {
        Ok(reply) => {
            tracing::debug!(
                tenant = %identity.tenant,
                count = reply.value.len(),
                tokens = reply.tokens,
                ms,
                "hyde hypotheses added"
            );
            Some(reply.value)
        }
        Err(e) => {
            tracing::warn!(tenant = %identity.tenant, error = %e, ms, "hyde skipped");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use engram_proto::ConversationMessage;

    use super::*;

    fn msg(role: &str, content: &str) -> ConversationMessage {
        ConversationMessage {
            role: role.into(),
            content: content.into(),
            summary_marker: false,
        }
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
}
