//! The shared WHERE clause of every read: tenant and trust level first (a
//! record above the caller's level never leaves Postgres), then the request's
//! filters, all as bind parameters inside the SQL so the index scans see them.

use engram_common::Identity;
use sqlx::{Postgres, QueryBuilder};

use crate::validate::SearchFilters;

/// Pushes `m.tenant_id = .. AND m.access_level <= .. AND ...` (no leading
/// WHERE/AND) for the table aliased `m`.
pub fn push_where(
    qb: &mut QueryBuilder<Postgres>,
    identity: &Identity,
    f: &SearchFilters,
    default_decay_floor: f32,
) {
    qb.push("m.tenant_id = ")
        .push_bind(identity.tenant.clone())
        .push(" AND m.access_level <= ")
        .push_bind(identity.trust.as_i16());
    if !f.memory_types.is_empty() {
        qb.push(" AND m.memory_type = ANY(")
            .push_bind(f.memory_types.clone())
            .push(")");
    }
    if let Some(start) = f.time_start_opt {
        qb.push(" AND m.event_time >= ").push_bind(start);
    }
    if let Some(end) = f.time_end_opt {
        qb.push(" AND m.event_time < ").push_bind(end);
    }
    if !f.agent_scope.is_empty() {
        qb.push(" AND m.agent_id = ANY(")
            .push_bind(f.agent_scope.clone())
            .push(")");
    }
    if let Some(ns) = &f.namespace_opt {
        qb.push(" AND m.namespace = ").push_bind(ns.clone());
    }
    if !f.include_consolidated {
        qb.push(" AND NOT m.consolidated");
    }
    if let Some(md) = &f.metadata_opt {
        qb.push(" AND m.metadata @> ")
            .push_bind(md.clone())
            .push("::jsonb");
    }
    if f.min_confidence > 0.0 {
        qb.push(" AND m.source_confidence >= ")
            .push_bind(f.min_confidence);
    }
    // An as-of query asks for a past snapshot: the current-only rule would
    // hide exactly the superseded versions it is looking for.
    let current_only =
        !f.include_historical && f.as_of_event_opt.is_none() && f.as_of_ingestion_opt.is_none();
    match f.as_of_event_opt {
        Some(t) => {
            qb.push(" AND m.valid_from <= ")
                .push_bind(t)
                .push(" AND (m.valid_to IS NULL OR m.valid_to > ")
                .push_bind(t)
                .push(")");
        }
        None if current_only => {
            qb.push(" AND (m.valid_to IS NULL OR m.valid_to > now())");
        }
        None => {}
    }
    match f.as_of_ingestion_opt {
        Some(t) => {
            qb.push(" AND m.recorded_at <= ")
                .push_bind(t)
                .push(" AND (m.retracted_at IS NULL OR m.retracted_at > ")
                .push_bind(t)
                .push(")");
        }
        None if current_only => {
            qb.push(" AND m.retracted_at IS NULL");
        }
        None => {}
    }
    if !f.include_historical {
        let floor = f.decay_floor_opt.unwrap_or(default_decay_floor);
        if floor > 0.0 {
            qb.push(" AND m.decay_score >= ").push_bind(floor);
        }
    }
}
