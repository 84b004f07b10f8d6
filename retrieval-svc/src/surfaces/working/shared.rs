//! Working memory every gateway replica sees (issue 48, check 1): a note
//! written through one replica is found through another. Each write goes
//! to Postgres (search-svc's `GatewayStateService`) before this replica's
//! store takes it, with the version Postgres gives it; each read of a
//! session first makes this replica's copy what Postgres holds (store.rs
//! `sync`), so a note deleted, rewritten or expired elsewhere is seen
//! here too. This replica's store stays the bounded, ranked view it was.
//!
//! When search-svc cannot be reached, working memory goes on as it did
//! before it was shared: writes are kept by this replica alone and reads
//! answer from it (a session then continues only on the replica that holds
//! it).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use engram_common::Identity;
use engram_proto::{DeleteNotesRequest, GetNotesRequest, PutNotesRequest};

use super::store::{SessionKey, WorkingWrite, fragment_from_note, note_of};
use crate::downstream::{DownstreamError, call_shared};
use crate::gateway::Gateway;

/// What the shared copy made of a batch of writes.
pub enum Shared {
    /// Stored: each write's version and whether it was created.
    Stored(Vec<(i32, bool)>),
    /// Write `i` names a note stored above the caller's trust; nothing was
    /// stored.
    Refused(usize),
    /// search-svc did not answer: this replica keeps the writes alone.
    Unreachable,
}

/// Stores the writes in the shared copy, all or none.
pub async fn put(
    gw: &Gateway,
    identity: &Arc<Identity>,
    writes: &[WorkingWrite],
    now: DateTime<Utc>,
) -> Shared {
    let req = PutNotesRequest {
        notes: writes.iter().map(|w| note_of(w, now)).collect(),
        max_per_session: u32::try_from(gw.settings().working.max_per_session)
            .unwrap_or(u32::MAX)
            .max(1),
    };
    let ds = gw.downstreams();
    match call_shared(&ds.put_notes, &ds.state_gate, identity, None, req).await {
        Ok(r) if r.refused > 0 => Shared::Refused(r.refused as usize - 1),
        Ok(r) if r.notes.len() == writes.len() => {
            Shared::Stored(r.notes.iter().map(|n| (n.version, n.created)).collect())
        }
        Ok(_) => Shared::Unreachable,
        Err(e) => {
            tracing::warn!(error = %e, "working memory not shared: kept by this gateway alone");
            Shared::Unreachable
        }
    }
}

/// Makes this replica's copy of the session what the shared copy holds;
/// leaves it as it is when search-svc does not answer.
pub async fn refresh(gw: &Gateway, identity: &Arc<Identity>, key: &SessionKey, now: DateTime<Utc>) {
    let req = GetNotesRequest {
        session_id: key.session.clone(),
    };
    let ds = gw.downstreams();
    match call_shared(&ds.get_notes, &ds.state_gate, identity, None, req).await {
        Ok(r) => {
            let notes = r.notes.iter().filter_map(fragment_from_note).collect();
            gw.working().sync(key, identity.trust, notes, now);
        }
        Err(e) => {
            tracing::debug!(error = %e, "shared working memory unreachable; this gateway's copy answers")
        }
    }
}

/// Deletes the caller's notes with these ids from the shared copy; how
/// many it held. An error when search-svc does not answer: the delete is
/// not acknowledged, since the next session read on any replica would
/// bring the note back from the shared copy.
pub async fn delete(
    gw: &Gateway,
    identity: &Arc<Identity>,
    ids: &[String],
) -> Result<u32, DownstreamError> {
    let req = DeleteNotesRequest { ids: ids.to_vec() };
    let ds = gw.downstreams();
    let r = call_shared(&ds.delete_notes, &ds.state_gate, identity, None, req).await;
    if let Err(e) = &r {
        tracing::warn!(error = %e, "working memory not deleted from the shared copy");
    }
    Ok(r?.deleted)
}
