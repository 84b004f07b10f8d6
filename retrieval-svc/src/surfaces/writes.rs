//! The write front behind `MemoryService`: batches bounded, trust checked,
//! working-scope memories kept in this process and the rest written through
//! search-svc, and every write invalidating the tenant's cached answers.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use engram_common::{AccessLevel, Identity};
use engram_proto::{
    AddEdgesRequest, AddEdgesResponse, DeleteEdgesRequest, DeleteEdgesResponse, DeleteRequest,
    DeleteResponse, GetRequest, GetResponse, UpsertRequest, UpsertResponse,
};

use crate::downstream::{DownstreamError, call};
use crate::error::Error;
use crate::fair::{FairGate, Slot};
use crate::gateway::Gateway;
use crate::surfaces::working::{self, WorkingWrite};

const MAX_WRITE_BATCH: usize = 1000;
const MAX_EDGE_BATCH: usize = 10_000;
/// A write never waits longer than this for its slot (the gate's own
/// `tenant.slot_wait_ms` is usually shorter).
const WRITE_SLOT_WAIT_CAP: Duration = Duration::from_secs(30);

/// A write's downstream failure as the caller sees it.
fn ds_err(service: &'static str, e: DownstreamError) -> Error {
    match e {
        DownstreamError::Status(status) => Error::Downstream { service, status },
        other => Error::DownstreamUnavailable {
            service,
            reason: other.to_string(),
        },
    }
}

/// The tenant's share of a write stack (downstream::WriteGates), held for
/// the call: waits while the tenant holds its share, at most
/// `tenant.slot_wait_ms`, then RESOURCE_EXHAUSTED.
async fn write_slot(gate: &FairGate, tenant: &str) -> Result<Slot, Error> {
    gate.acquire(tenant, Instant::now() + WRITE_SLOT_WAIT_CAP)
        .await
}

/// `field` must hold 1..=`max` items.
fn check_batch(field: &'static str, len: usize, max: usize) -> Result<(), Error> {
    if len == 0 || len > max {
        return Err(Error::invalid(
            field,
            format!("must hold 1..={max} {field}"),
        ));
    }
    Ok(())
}

fn check_write_trust(identity: &Identity, level: i32, field: &'static str) -> Result<(), Error> {
    let level = AccessLevel::from_proto(level)
        .ok_or_else(|| Error::invalid(field, format!("unknown access level {level}")))?;
    if level > identity.trust {
        return Err(Error::PermissionDenied(format!(
            "cannot write {} memories with trust level {}",
            level.name(),
            identity.trust.name()
        )));
    }
    Ok(())
}

/// Working-scope memories stay in this process; the rest go to search-svc.
/// Every working one is validated before anything is written.
pub async fn upsert(
    gw: &Gateway,
    identity: Identity,
    req: UpsertRequest,
) -> Result<UpsertResponse, Error> {
    check_batch("memories", req.memories.len(), MAX_WRITE_BATCH)?;
    for m in &req.memories {
        check_write_trust(&identity, m.access_level, "memories.access_level")?;
    }
    let mut working_at = Vec::new();
    let mut writes = Vec::new();
    let mut stored = Vec::with_capacity(req.memories.len());
    for (i, m) in req.memories.into_iter().enumerate() {
        if working::is_working(&m) {
            working_at.push(i);
            writes.push(WorkingWrite::from_memory(m, &gw.settings().working)?);
        } else {
            stored.push(m);
        }
    }
    let unwritable = |i: usize| -> Error {
        let at = working_at.get(i).copied().unwrap_or(i);
        Error::PermissionDenied(format!(
            "memories[{at}].id: a working-memory fragment above the caller's trust level has this id"
        ))
    };
    if let Some(i) = gw.working().first_unwritable(&identity, &writes) {
        return Err(unwritable(i));
    }
    let tenant = identity.tenant.clone();
    let identity = Arc::new(identity);
    let mut results = Vec::new();
    if !stored.is_empty() {
        let req = UpsertRequest { memories: stored };
        let _slot = write_slot(&gw.downstreams().write_gates.upsert, &tenant).await?;
        let r = gw.write(&gw.downstreams().upsert, &identity, req).await;
        results = r.map_err(|e| ds_err("search", e))?.results;
        tracing::info!(tenant = %tenant, count = results.len(), "upserted memories");
    }
    if !writes.is_empty() {
        let wm = working::write_working(gw, &identity, writes)
            .await
            .map_err(unwritable)?;
        for (i, r) in working_at.into_iter().zip(wm) {
            results.insert(i.min(results.len()), r);
        }
    }
    Ok(UpsertResponse { results })
}

pub async fn delete(
    gw: &Gateway,
    identity: Identity,
    req: DeleteRequest,
) -> Result<DeleteResponse, Error> {
    check_batch("ids", req.ids.len(), MAX_WRITE_BATCH)?;
    // Before anything is deleted anywhere: a bad id would otherwise fail
    // the call after this replica's working notes were already gone.
    if let Some(i) = req
        .ids
        .iter()
        .position(|id| uuid::Uuid::parse_str(id).is_err())
    {
        return Err(Error::invalid("ids", format!("ids[{i}] must be a UUID")));
    }
    let tenant = identity.tenant.clone();
    let _slot = write_slot(&gw.downstreams().write_gates.delete, &tenant).await?;
    let identity = Arc::new(identity);
    let here = gw.working().delete(&identity, &req.ids);
    let shared = working::shared::delete(gw, &identity, &req.ids).await;
    let from_working = here.max(shared.map_err(|e| ds_err("search", e))?);
    let r = gw.write(&gw.downstreams().delete, &identity, req).await;
    let mut r = r.map_err(|e| ds_err("search", e))?;
    r.deleted += from_working;
    tracing::info!(tenant = %tenant, count = r.deleted, "deleted memories");
    Ok(r)
}

/// Only the caller's own tenant and trust, whatever search-svc returned,
/// and never an embedding: raw vectors do not leave the service (they can
/// be inverted into the text they encode), so `include_embedding` is
/// ignored on the public API, and entity names and whole rows are always
/// returned (`omit_entities` and `vectors_only` are the pipeline's,
/// internal).
pub async fn get(
    gw: &Gateway,
    identity: Identity,
    mut req: GetRequest,
) -> Result<GetResponse, Error> {
    check_batch("ids", req.ids.len(), MAX_WRITE_BATCH)?;
    req.include_embedding = false;
    req.omit_entities = false;
    req.vectors_only = false;
    let identity = Arc::new(identity);
    let mut r = call(&gw.downstreams().get, &identity, req)
        .await
        .map_err(|e| ds_err("search", e))?;
    r.memories
        .retain(|m| m.tenant_id == identity.tenant && m.access_level <= identity.trust.to_proto());
    Ok(r)
}

pub async fn add_edges(
    gw: &Gateway,
    identity: Identity,
    req: AddEdgesRequest,
) -> Result<AddEdgesResponse, Error> {
    check_batch("edges", req.edges.len(), MAX_EDGE_BATCH)?;
    let tenant = identity.tenant.clone();
    let _slot = write_slot(&gw.downstreams().write_gates.add_edges, &tenant).await?;
    let r = gw
        .write(&gw.downstreams().add_edges, &Arc::new(identity), req)
        .await;
    let r = r.map_err(|e| ds_err("search", e))?;
    tracing::info!(tenant = %tenant, count = r.added, "added edges");
    Ok(r)
}

/// Removes edges the caller added; shares AddEdges' write gate.
pub async fn delete_edges(
    gw: &Gateway,
    identity: Identity,
    req: DeleteEdgesRequest,
) -> Result<DeleteEdgesResponse, Error> {
    check_batch("edges", req.edges.len(), MAX_EDGE_BATCH)?;
    let tenant = identity.tenant.clone();
    let _slot = write_slot(&gw.downstreams().write_gates.add_edges, &tenant).await?;
    let r = gw
        .write(&gw.downstreams().delete_edges, &Arc::new(identity), req)
        .await;
    let r = r.map_err(|e| ds_err("search", e))?;
    tracing::info!(tenant = %tenant, count = r.deleted, "deleted edges");
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_over_the_maximum_names_the_field_and_the_max() {
        let err =
            check_batch("memories", MAX_WRITE_BATCH + 1, MAX_WRITE_BATCH).expect_err("too many");
        assert!(
            matches!(
                err,
                Error::InvalidArgument {
                    field: "memories",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("memories: must hold 1..=1000"),
            "{err}"
        );
        assert!(check_batch("memories", MAX_WRITE_BATCH, MAX_WRITE_BATCH).is_ok());
    }
}
