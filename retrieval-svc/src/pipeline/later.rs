//! What the stages after Stage 2 ask of the downstreams, and by when: a
//! later keyword search (the next hop, a chain's next fact), the stored
//! vectors of candidates, the embedding of a clause. Stage 2 keeps back a
//! reserve of the request's deadline for validation and assembly
//! ([`stage_deadline`]); every later call is made within it. A leaf over
//! the request's context and the downstream stacks: it names no stage, so
//! the stages that call it borrow nothing from each other's files.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use engram_proto::{EmbedRequest, GetRequest, KeywordSearchRequest, SearchResponse};
use tokio::time::Instant;

use super::ctx::{Ctx, StageTrace};
use crate::downstream::call_until;

/// Whether Stage 2 read the fused candidates' vectors (multi-hop plans
/// that Stage 4b may reorder).
#[derive(Debug, Default)]
pub enum Vectors {
    /// Not asked for: Stage 4b reads them itself if it runs.
    #[default]
    NotRead,
    /// By memory id; a memory deleted meanwhile has none.
    Read(HashMap<String, Vec<f32>>),
    /// The read failed: Stage 4b keeps Stage 4's order, degraded.
    Failed,
}

/// Time kept back from Stage 2 so a partial answer can still be validated
/// and assembled; it shrinks with short client deadlines.
const ASSEMBLY_RESERVE: Duration = Duration::from_millis(100);

/// When Stage 2 must be done by.
pub fn stage_deadline(deadline: Instant) -> Instant {
    let left = deadline.saturating_duration_since(Instant::now());
    deadline
        .checked_sub(ASSEMBLY_RESERVE.min(left / 5))
        .unwrap_or(deadline)
}

/// One keyword search by a later stage (the next hop, a chain's next
/// fact), within Stage 2's deadline; a failure reports `stage` degraded and
/// finds nothing.
pub async fn later_keyword(
    ctx: &Ctx<'_>,
    trace: &mut StageTrace,
    stage: &'static str,
    req: KeywordSearchRequest,
) -> Option<SearchResponse> {
    let deadline = stage_deadline(ctx.deadline);
    match call_until(&ctx.ds.keyword, &ctx.identity, deadline, req).await {
        Ok(resp) => Some(resp),
        Err(e) => {
            tracing::warn!(error = %e, stage, "a later keyword search failed");
            trace.degraded.push(stage.into());
            None
        }
    }
}

/// Whether another attempt can still start before `deadline`.
pub fn time_for_another(deadline: Instant) -> bool {
    Instant::now() + ASSEMBLY_RESERVE < deadline
}

/// The stored vectors of `ids` (id and vector only, under the caller's
/// tenant and trust level: the internal vectors-only Get). No ids, no call:
/// search-svc refuses an empty Get ("ids: must not be empty"), and an
/// empty candidate list (a new tenant, a question nothing matches) is no
/// failure.
pub async fn read_vectors(ctx: &Ctx<'_>, ids: Vec<String>, deadline: Instant) -> Vectors {
    if ids.is_empty() {
        return Vectors::Read(HashMap::new());
    }
    let req = GetRequest {
        ids,
        include_embedding: true,
        omit_entities: true,
        vectors_only: true,
        ..Default::default()
    };
    match call_until(&ctx.ds.get, &ctx.identity, deadline, req).await {
        Ok(resp) => Vectors::Read(
            (resp.memories.into_iter())
                .map(|m| (m.id, m.embedding))
                .collect(),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "reading the candidates' vectors failed");
            Vectors::Failed
        }
    }
}

/// The embedding of `text` (a clause, for the stages that start a hop or
/// a chain from the memory closest to it) and the vectors of `ids`: one
/// embed unless this request already embedded the text (`Ctx::embedded`),
/// and a vectors read unless `prefetched` holds them. None when either
/// call fails.
pub async fn text_and_vectors<'v>(
    ctx: &Ctx<'_>,
    text: String,
    ids: Vec<String>,
    prefetched: &'v Vectors,
    deadline: Instant,
) -> Option<(Vec<f32>, Cow<'v, HashMap<String, Vec<f32>>>)> {
    let asked = match ctx.embedded.get(&text) {
        Some(asked) => asked,
        None => {
            let req = EmbedRequest {
                texts: vec![text.clone()],
            };
            let resp = call_until(&ctx.ds.embed, &ctx.identity, deadline, req)
                .await
                .ok()?;
            let asked = resp.embeddings.into_iter().next()?.values;
            ctx.embedded.put(text, asked.clone());
            asked
        }
    };
    let vectors = match prefetched {
        Vectors::Read(v) => Cow::Borrowed(v),
        _ => match read_vectors(ctx, ids, deadline).await {
            Vectors::Read(v) => Cow::Owned(v),
            _ => return None,
        },
    };
    Some((asked, vectors))
}
