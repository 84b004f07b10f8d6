//! A turn's first answer, shared by every gateway replica (issue 48,
//! check 4): a client that sends the same `turn_id` again, through any
//! replica, gets the answer it got the first time. The answer is kept in
//! this replica's turn cache (cache.rs) and in Postgres through search-svc
//! (its shared-state service), where every write of the tenant drops it in
//! the write's own commit. A replica that misses its own cache asks there
//! and keeps what it finds. Either call failing only costs the sharing:
//! the turn is answered afresh, as on a replica that never saw it; both
//! end at the request's deadline, so a slow search-svc never fails the
//! answer.

use std::sync::Arc;
use std::time::Duration;

use engram_common::Identity;
use engram_proto::{GetTurnRequest, PutTurnRequest, RetrieveResponse};
use prost::Message;
use tokio::time::Instant;

use super::cache::{Caches, turn_key};
use crate::downstream::{Downstreams, call_shared};

/// How long a shared turn answer is kept: as long as this replica's own.
const KEEP: Duration = Duration::from_secs(600);
/// search-svc keeps answers of at most 1 MiB; a larger one stays local.
const MAX_SHARED_BYTES: usize = 1 << 20;

/// Whether this turn was answered, here or by another replica; an answer
/// found elsewhere joins this replica's turn cache under `generation`
/// (read before asking, so a write that lands meanwhile leaves it stale).
pub async fn recall(
    caches: &Caches,
    ds: &Downstreams,
    identity: &Arc<Identity>,
    turn_id: &str,
    generation: u64,
    deadline: Instant,
) -> bool {
    if caches.has_turn(identity, turn_id) {
        return true;
    }
    let req = GetTurnRequest {
        key: turn_key(identity, turn_id).to_vec(),
    };
    let found = match call_shared(&ds.get_turn, &ds.state_gate, identity, Some(deadline), req).await
    {
        Ok(r) if r.found => RetrieveResponse::decode(r.answer.as_slice()).ok(),
        Ok(_) => None,
        Err(e) => {
            tracing::debug!(error = %e, "shared turn answers unreachable");
            None
        }
    };
    let Some(answer) = found else {
        return false;
    };
    caches.put_turn(identity, turn_id, generation, &answer);
    true
}

/// Keeps `answer` as this turn's answer for every replica; the first
/// answer stays when two replicas answered the same turn at once.
pub async fn share(
    ds: &Downstreams,
    identity: &Arc<Identity>,
    turn_id: &str,
    answer: &RetrieveResponse,
    deadline: Instant,
) {
    if answer.encoded_len() > MAX_SHARED_BYTES {
        return;
    }
    let req = PutTurnRequest {
        key: turn_key(identity, turn_id).to_vec(),
        answer: answer.encode_to_vec(),
        ttl_ms: u32::try_from(KEEP.as_millis()).unwrap_or(u32::MAX),
    };
    if let Err(e) = call_shared(&ds.put_turn, &ds.state_gate, identity, Some(deadline), req).await {
        tracing::debug!(error = %e, "turn answer not shared");
    }
}
