//! Demand tracking: which *shapes* of retrieval agents keep asking for.
//! A shape is the set of properties a request asked for plus the memory
//! types it actually got back; shapes asked for often enough are concept
//! candidates (something worth consolidating into its own memory type or
//! view). Counts are per tenant and bounded; the Prometheus families only
//! carry closed-set labels, the shapes themselves are read through
//! `WorkingMemoryService.GetDemand`.

use std::collections::{BTreeSet, HashMap};

use engram_common::AccessLevel;
use engram_proto::{DemandShape, Filters, GetDemandResponse, ScoredMemory};
use parking_lot::Mutex;
use prometheus::{IntCounterVec, IntGauge, Opts};
use sha2::Digest;

use crate::query::{Mode, Query};

/// Tenants tracked; observations for further tenants are only counted in
/// the metrics, so a flood of tenants cannot grow the table without bound.
const MAX_TENANTS: usize = 10_000;
/// A shape keeps at most this many properties per side, each at most
/// [`MAX_PROP_CHARS`] long: memory types and metadata keys are caller
/// strings, and a shape must not be a way to park unbounded text in the
/// gateway's memory.
const MAX_PROPS: usize = 32;
const MAX_PROP_CHARS: usize = 64;
pub const DEFAULT_DEMAND_LIMIT: u32 = 100;
pub const MAX_DEMAND_LIMIT: u32 = 1000;

/// Which surface a shape was observed on; a closed set for the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    Retrieve,
    GetMemory,
}

impl Surface {
    fn label(self) -> &'static str {
        match self {
            Self::Retrieve => "retrieve",
            Self::GetMemory => "get_memory",
        }
    }
}

/// A normalised retrieval shape: sorted, de-duplicated, order-insensitive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shape {
    pub requested: BTreeSet<String>,
    pub observed: BTreeSet<String>,
}

impl Shape {
    /// The shape with its caller strings cut to the bounds above.
    fn bounded(self) -> Self {
        let cut = |set: BTreeSet<String>| {
            set.into_iter()
                .map(|p| p.chars().take(MAX_PROP_CHARS).collect::<String>())
                .take(MAX_PROPS)
                .collect()
        };
        Self {
            requested: cut(self.requested),
            observed: cut(self.observed),
        }
    }

    /// The map key: a hash of the bounded shape, so the table's keys are
    /// fixed-size whatever the caller sends.
    fn digest(&self) -> [u8; 32] {
        sha2::Sha256::digest(self.key().as_bytes()).into()
    }

    pub fn key(&self) -> String {
        let join = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(",");
        format!(
            "props={};types={}",
            join(&self.requested),
            join(&self.observed)
        )
    }

    /// The properties a `Retrieve` asked for: which filters and options were
    /// set, never their values, except memory types and metadata keys, which
    /// are labels, not user text.
    pub fn requested_of_retrieve(q: &Query) -> BTreeSet<String> {
        let mut requested = filter_props(&q.filters);
        requested.insert("surface:retrieve".into());
        match q.mode {
            Mode::Auto => {}
            Mode::Route(route) => {
                requested.insert(format!("mode:{}", route_name(route.to_proto())));
            }
            Mode::Raw(_) => {
                requested.insert("mode:raw".into());
            }
        }
        if !q.hypotheses.is_empty() {
            requested.insert("hypotheses".into());
        }
        if q.token_budget > 0 {
            requested.insert("context_block".into());
        }
        requested
    }

    /// The memory types an answer held.
    pub fn observed_of(records: &[ScoredMemory]) -> BTreeSet<String> {
        records
            .iter()
            .filter_map(|s| s.memory.as_ref())
            .map(|m| m.memory_type.clone())
            .collect()
    }
}

fn route_name(r: engram_proto::QueryRoute) -> &'static str {
    match r {
        engram_proto::QueryRoute::Simple => "simple",
        engram_proto::QueryRoute::MultiHop => "multi_hop",
        engram_proto::QueryRoute::Exploratory => "exploratory",
        engram_proto::QueryRoute::Skip => "skip",
        engram_proto::QueryRoute::Unspecified => "auto",
    }
}

fn filter_props(f: &Filters) -> BTreeSet<String> {
    let mut p = BTreeSet::new();
    for t in &f.memory_types {
        p.insert(format!("memory_type:{t}"));
    }
    if f.time_range.is_some() {
        p.insert("time_range".into());
    }
    if !f.agent_scope.is_empty() {
        p.insert("agent_scope".into());
    }
    if !f.namespace.is_empty() {
        p.insert("namespace".into());
    }
    if f.include_consolidated {
        p.insert("include_consolidated".into());
    }
    if f.include_historical {
        p.insert("include_historical".into());
    }
    if f.min_confidence > 0.0 {
        p.insert("min_confidence".into());
    }
    if f.as_of_event.is_some() {
        p.insert("as_of_event".into());
    }
    if f.as_of_ingestion.is_some() {
        p.insert("as_of_ingestion".into());
    }
    if let Some(m) = &f.metadata {
        for k in m.fields.keys() {
            p.insert(format!("metadata:{k}"));
        }
    }
    p
}

struct Counted {
    shape: Shape,
    count: u64,
}

/// Shapes are kept per trust level of the caller that produced them: the
/// observed memory types of a sensitive caller's retrievals are themselves
/// information, so a caller only ever sees shapes counted at its level or
/// below (summed over those levels).
#[derive(Default)]
struct TenantDemand {
    shapes: HashMap<(i16, [u8; 32]), Counted>,
    observations: HashMap<i16, u64>,
}

pub struct Demand {
    tenants: Mutex<HashMap<String, TenantDemand>>,
    threshold: u64,
    max_shapes: usize,
    observed: IntCounterVec,
    shapes: IntGauge,
    candidates: IntGauge,
    dropped: IntCounterVec,
}

impl Demand {
    pub fn new(threshold: u64, max_shapes: usize) -> prometheus::Result<Self> {
        Ok(Self {
            tenants: Mutex::new(HashMap::new()),
            threshold: threshold.max(1),
            max_shapes: max_shapes.max(1),
            observed: IntCounterVec::new(
                Opts::new(
                    "engram_demand_shape_total",
                    "Retrievals whose shape was counted, by surface (retrieve, get_memory).",
                ),
                &["surface"],
            )?,
            shapes: IntGauge::new(
                "engram_demand_shapes",
                "Distinct retrieval shapes counted, all tenants.",
            )?,
            candidates: IntGauge::new(
                "engram_demand_concept_candidates",
                "Shapes whose count reached the demand threshold (concept candidates), all tenants.",
            )?,
            dropped: IntCounterVec::new(
                Opts::new(
                    "engram_demand_dropped_total",
                    "Observations not tracked per shape because a bound was reached (shapes, tenants).",
                ),
                &["bound"],
            )?,
        })
    }

    /// Adds the families to the gateway's registry.
    pub fn register(&self, m: &crate::metrics::Metrics) -> prometheus::Result<()> {
        m.register(Box::new(self.observed.clone()))?;
        m.register(Box::new(self.shapes.clone()))?;
        m.register(Box::new(self.candidates.clone()))?;
        m.register(Box::new(self.dropped.clone()))?;
        Ok(())
    }

    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    /// Counts one retrieval; cheap (one short lock), so it runs inline on
    /// the request path.
    pub fn observe(&self, tenant: &str, trust: AccessLevel, surface: Surface, shape: Shape) {
        self.observed.with_label_values(&[surface.label()]).inc();
        let shape = shape.bounded();
        let key = (trust.as_i16(), shape.digest());
        let mut tenants = self.tenants.lock();
        if !tenants.contains_key(tenant) && tenants.len() >= MAX_TENANTS {
            self.dropped.with_label_values(&["tenants"]).inc();
            return;
        }
        let t = tenants.entry(tenant.to_string()).or_default();
        *t.observations.entry(trust.as_i16()).or_default() += 1;
        let n = t.shapes.len();
        let c = match t.shapes.get_mut(&key) {
            Some(c) => c,
            None if n >= self.max_shapes => {
                self.dropped.with_label_values(&["shapes"]).inc();
                return;
            }
            None => {
                self.shapes.inc();
                t.shapes.entry(key).or_insert(Counted { shape, count: 0 })
            }
        };
        c.count += 1;
        if c.count == self.threshold {
            self.candidates.inc();
            tracing::info!(
                tenant = %tenant,
                count = c.count,
                types = c.shape.observed.len(),
                "retrieval shape became a concept candidate"
            );
        }
    }

    /// The tenant's shapes counted at `trust` or below, most requested first
    /// (ties by shape key).
    pub fn snapshot(&self, tenant: &str, trust: AccessLevel, limit: usize) -> GetDemandResponse {
        let tenants = self.tenants.lock();
        let Some(t) = tenants.get(tenant) else {
            return GetDemandResponse {
                threshold: self.threshold,
                ..Default::default()
            };
        };
        let level = trust.as_i16();
        let mut merged: HashMap<&[u8; 32], (&Shape, u64)> = HashMap::new();
        for ((l, k), c) in &t.shapes {
            if *l <= level {
                merged.entry(k).or_insert((&c.shape, 0)).1 += c.count;
            }
        }
        let mut shapes: Vec<DemandShape> = merged
            .into_values()
            .map(|(shape, count)| DemandShape {
                shape: shape.key(),
                requested: shape.requested.iter().cloned().collect(),
                observed_types: shape.observed.iter().cloned().collect(),
                count,
                concept_candidate: count >= self.threshold,
            })
            .collect();
        let candidates = shapes.iter().filter(|s| s.concept_candidate).count();
        shapes.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.shape.cmp(&b.shape)));
        shapes.truncate(limit);
        GetDemandResponse {
            shapes,
            observations: t
                .observations
                .iter()
                .filter(|(l, _)| **l <= level)
                .map(|(_, n)| n)
                .sum(),
            concept_candidates: u32::try_from(candidates).unwrap_or(u32::MAX),
            threshold: self.threshold,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(req: &[&str], obs: &[&str]) -> Shape {
        Shape {
            requested: req.iter().map(|s| s.to_string()).collect(),
            observed: obs.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn shapes_are_order_insensitive() {
        assert_eq!(
            shape(&["b", "a"], &["x", "y"]).key(),
            shape(&["a", "b", "a"], &["y", "x"]).key()
        );
        assert_eq!(shape(&["a"], &[]).key(), "props=a;types=");
    }

    #[test]
    fn threshold_makes_a_candidate_per_tenant() {
        let d = Demand::new(3, 10).expect("metrics");
        for _ in 0..2 {
            d.observe(
                "t1",
                AccessLevel::Internal,
                Surface::Retrieve,
                shape(&["a"], &["episodic"]),
            );
        }
        d.observe(
            "t2",
            AccessLevel::Internal,
            Surface::Retrieve,
            shape(&["a"], &["episodic"]),
        );
        let s = d.snapshot("t1", AccessLevel::Internal, 10);
        assert_eq!(s.concept_candidates, 0);
        assert_eq!(s.shapes[0].count, 2);
        d.observe(
            "t1",
            AccessLevel::Internal,
            Surface::GetMemory,
            shape(&["a"], &["episodic"]),
        );
        d.observe(
            "t1",
            AccessLevel::Internal,
            Surface::GetMemory,
            shape(&["a"], &["episodic"]),
        );
        let s = d.snapshot("t1", AccessLevel::Internal, 10);
        assert_eq!(s.concept_candidates, 1);
        assert_eq!(s.observations, 4);
        assert!(s.shapes[0].concept_candidate);
        assert_eq!(
            d.snapshot("t2", AccessLevel::Internal, 10).shapes[0].count,
            1
        );
        assert!(
            d.snapshot("t3", AccessLevel::Internal, 10)
                .shapes
                .is_empty()
        );
        assert_eq!(d.candidates.get(), 1);
    }

    #[test]
    fn shape_table_is_bounded() {
        let d = Demand::new(5, 2).expect("metrics");
        for i in 0..5 {
            d.observe(
                "t",
                AccessLevel::Internal,
                Surface::Retrieve,
                shape(&[&i.to_string()], &[]),
            );
        }
        let s = d.snapshot("t", AccessLevel::Internal, 10);
        assert_eq!(s.shapes.len(), 2);
        assert_eq!(s.observations, 5);
        assert_eq!(d.dropped.with_label_values(&["shapes"]).get(), 3);
    }

    #[test]
    fn a_caller_sees_only_shapes_counted_at_its_level_or_below() {
        let d = Demand::new(2, 10).expect("metrics");
        d.observe(
            "t",
            AccessLevel::Sensitive,
            Surface::Retrieve,
            shape(&["a"], &["secret"]),
        );
        d.observe(
            "t",
            AccessLevel::Public,
            Surface::Retrieve,
            shape(&["a"], &["note"]),
        );
        d.observe(
            "t",
            AccessLevel::Internal,
            Surface::Retrieve,
            shape(&["a"], &["note"]),
        );
        let low = d.snapshot("t", AccessLevel::Public, 10);
        assert_eq!(low.shapes.len(), 1);
        assert_eq!(low.shapes[0].observed_types, vec!["note".to_string()]);
        assert_eq!((low.shapes[0].count, low.observations), (1, 1));
        let mid = d.snapshot("t", AccessLevel::Internal, 10);
        assert_eq!((mid.shapes[0].count, mid.concept_candidates), (2, 1));
        let high = d.snapshot("t", AccessLevel::Sensitive, 10);
        assert_eq!((high.shapes.len(), high.observations), (2, 3));
    }

    #[test]
    fn caller_strings_in_a_shape_are_bounded() {
        let d = Demand::new(5, 10).expect("metrics");
        let long: Vec<String> = (0..100)
            .map(|i| format!("{i}{}", "x".repeat(500)))
            .collect();
        let refs: Vec<&str> = long.iter().map(String::as_str).collect();
        d.observe(
            "t",
            AccessLevel::Public,
            Surface::Retrieve,
            shape(&refs, &refs),
        );
        let snap = d.snapshot("t", AccessLevel::Public, 10);
        let s = &snap.shapes[0];
        assert_eq!(s.requested.len(), MAX_PROPS);
        assert!(
            s.requested
                .iter()
                .all(|p| p.chars().count() <= MAX_PROP_CHARS)
        );
        assert_eq!(s.observed_types.len(), MAX_PROPS);
    }
}
