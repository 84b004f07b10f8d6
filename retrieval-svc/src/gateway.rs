//! The gateway's shared state, built once per process: the pipeline and
//! what the surfaces keep beside it (working memory, demand counters, the
//! optional LLM client), plus the authenticator every API adapter uses.
//! Cloning is cheap (one `Arc`).

use std::sync::Arc;
use std::time::Duration;

use engram_common::server::grpc_timeout;
use engram_common::{Identity, Settings};
use engram_proto::{RetrieveResponse, SkipReason};
use tokio::time::Instant;
use tonic::metadata::MetadataMap;

use crate::admission::{Admission, Lane, Permit};
use crate::auth::Authenticator;
use crate::downstream::{Call, Down, DownstreamError, Downstreams, members, send};
use crate::error::Error;
use crate::metrics::{Metrics, Scrape};
use crate::own_writes::OwnWrites;
use crate::pipeline::Pipeline;
use crate::query::Query;
use crate::surfaces::changes;
use crate::surfaces::demand::{Demand, Shape, Surface};
use crate::surfaces::llm::LlmClient;
use crate::surfaces::working::store::WorkingMemory;

#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    pipeline: Pipeline,
    auth: Authenticator,
    admission: Admission,
    llm_opt: Option<LlmClient>,
    working: WorkingMemory,
    demand: Demand,
    own_writes: OwnWrites,
    /// Set once the change feed has said anything (its first resync, or
    /// that it is unavailable): see [`Gateway::feed_heard`].
    feed_heard: tokio::sync::watch::Sender<bool>,
}

impl Gateway {
    /// Connects the downstream stacks (lazily: a downstream that is not up
    /// yet only fails its calls). Must run inside a tokio runtime.
    pub fn new(settings: Settings) -> anyhow::Result<Self> {
        let metrics = Arc::new(Metrics::new()?);
        let ds = Downstreams::connect(&settings, &metrics)?;
        let auth = Authenticator::new(&settings.auth);
        let llm_opt = LlmClient::from_settings(&settings.llm).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "llm client unavailable, rule-based paths only");
            None
        });
        let working = WorkingMemory::new(&settings.working)?;
        working.register(&metrics)?;
        let w = &settings.working;
        let demand = Demand::new(w.demand_threshold, w.max_demand_shapes)?;
        demand.register(&metrics)?;
        let feed = (
            ds.search_channel.clone(),
            settings.auth.internal_token_opt.clone().unwrap_or_default(),
        );
        let gateway = Self {
            inner: Arc::new(Inner {
                admission: Admission::new(&settings.tenant),
                pipeline: Pipeline::new(settings, ds, metrics),
                auth,
                llm_opt,
                working,
                demand,
                own_writes: OwnWrites::default(),
                feed_heard: tokio::sync::watch::Sender::new(false),
            }),
        };
        let group = gateway.settings().tenant.replica_group.clone();
        gateway.follow_members(feed.clone(), group);
        gateway.follow_changes(feed);
        Ok(gateway)
    }

    /// Every write anywhere (another replica, `engram ingest`) makes this
    /// gateway's cached answers for its tenant stale. The task holds the
    /// gateway weakly and ends with it.
    fn follow_changes(&self, (channel, token): (tonic::transport::Channel, String)) {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(changes::follow(channel, token, move |event_opt| {
            let Some(inner) = weak.upgrade() else {
                return false;
            };
            let caches = inner.pipeline.caches();
            // Any word, even "no feed here", ends start-up's wait.
            inner.feed_heard.send_replace(true);
            match event_opt {
                Some(e) if e.resync => caches.invalidate_all(),
                // This replica's own write, already dropped (own_writes.rs).
                Some(e) if inner.own_writes.take(&e.write_id) => {}
                Some(e) => caches.wrote(&e.tenant, &e.write_id),
                None => {}
            }
            true
        }));
    }

    /// Heartbeats as one of the gateway replicas and takes its share of
    /// every tenant's limits from the live count. Ends with the gateway.
    fn follow_members(&self, (channel, token): (tonic::transport::Channel, String), group: String) {
        let weak = Arc::downgrade(&self.inner);
        let member = members::Member {
            id: uuid::Uuid::new_v4().to_string(),
            group,
        };
        tokio::spawn(members::follow(channel, token, member, move |live| {
            let Some(inner) = weak.upgrade() else {
                return false;
            };
            inner.admission.set_replicas(live);
            true
        }));
    }

    /// Waits, at most `max`, until the change feed has said anything. Its
    /// first word is a resync, which drops every cached answer: a turn
    /// answered before it stays on this replica instead of being shared.
    /// Start-up (`engram up`, the test stacks) ends once the feed has
    /// spoken; serving does not wait, so a slow search-svc delays no
    /// request.
    pub async fn feed_heard(&self, max: Duration) {
        let mut heard = self.inner.feed_heard.subscribe();
        let _ = tokio::time::timeout(max, heard.wait_for(|h| *h)).await;
    }

    pub fn pipeline(&self) -> &Pipeline {
        &self.inner.pipeline
    }

    /// One write call to search-svc under a fresh write id. Afterwards
    /// this replica's answers for the tenant are stale, even after a failed
    /// call (it may have written part), and an acknowledged call's change
    /// event is known as this replica's own when it comes back
    /// (own_writes.rs). Graph walks name the write until graph-svc has
    /// heard of it (pipeline/unheard.rs). Other replicas hear of it from
    /// search-svc's change feed (`follow_changes`); writers need not know
    /// how answers are cached.
    pub async fn write<T, R>(
        &self,
        svc: &Down<T, R>,
        identity: &Arc<Identity>,
        msg: T,
    ) -> Result<R, DownstreamError>
    where
        T: Send + 'static,
        R: Send + 'static,
    {
        let write_id = OwnWrites::new_id();
        let r = send(svc, Call::new(identity, msg).write(&write_id)).await;
        // Even a failed call may have written part.
        self.inner
            .pipeline
            .caches()
            .wrote(&identity.tenant, &write_id);
        if r.is_ok() {
            self.inner.own_writes.acknowledged(write_id);
        }
        r
    }

    pub fn settings(&self) -> &Settings {
        self.inner.pipeline.settings()
    }

    pub fn downstreams(&self) -> &Downstreams {
        self.inner.pipeline.downstreams()
    }

    pub fn metrics(&self) -> &Metrics {
        self.inner.pipeline.metrics()
    }

    /// Layer 6's in-process session store.
    pub fn working(&self) -> &WorkingMemory {
        &self.inner.working
    }

    /// Retrieval shape counters (every Retrieve and GetMemory).
    pub fn demand(&self) -> &Demand {
        &self.inner.demand
    }

    /// The optional LLM endpoint; `None` unless `[llm] endpoint_opt` is set.
    pub fn llm(&self) -> Option<&LlmClient> {
        self.inner.llm_opt.as_ref()
    }

    /// Prometheus text for the pipeline, the downstream stacks and the
    /// feedback queue. Labels come from closed sets: never query text or ids.
    pub fn metrics_text(&self) -> String {
        let phases: Vec<_> = (self.downstreams().breakers.iter())
            .map(|(n, b)| (*n, b.phase().gauge()))
            .collect();
        let pipeline = &self.inner.pipeline;
        self.metrics().render(&Scrape {
            breakers: &phases,
            feedback_dropped: pipeline.feedback_dropped(),
            cache_bytes: &pipeline.caches().weighed_bytes(),
        })
    }

    /// Every surface accepts exactly the same credentials.
    pub fn authenticate(&self, md: &MetadataMap) -> Result<Identity, Error> {
        self.inner.auth.authenticate(md)
    }

    /// The caller's share of the gateway for one request that may run
    /// `weight` pipelines at once; RESOURCE_EXHAUSTED with a retry hint
    /// when it is over its rate or in-flight cap. Counted per tenant and
    /// trust level: a public key's burst never refuses its tenant's
    /// sensitive key (issue 47, item 13); the tenant's share of the shared
    /// work slots and downstream stacks is still one (fair.rs).
    pub fn admit(&self, identity: &Identity, weight: u32) -> Result<Permit, Error> {
        (self.inner.admission).admit(&door_key(identity), Lane::Read, weight)
    }

    /// [`Gateway::admit`] for a read that costs `cost` ordinary requests of
    /// the rate (`query::read_cost`): what it asks for is charged to its
    /// tenant, not to the cores every tenant shares.
    pub fn admit_costing(&self, identity: &Identity, cost: u32) -> Result<Permit, Error> {
        (self.inner.admission).admit_costing(&door_key(identity), Lane::Read, 1, cost)
    }

    /// [`Gateway::admit`] for a request that changes stored memories: its
    /// in-flight count is apart from the reads', so writes waiting on
    /// Postgres never refuse the tenant's reads.
    pub fn admit_write(&self, identity: &Identity) -> Result<Permit, Error> {
        (self.inner.admission).admit(&door_key(identity), Lane::Write, 1)
    }

    /// The deadline of a request that arrived at `start` with `md`: the
    /// ceiling, or the caller's `grpc-timeout` when that is shorter, less a
    /// little for the answer to travel back.
    pub fn deadline(&self, md: &MetadataMap, start: Instant) -> Instant {
        let ceiling = Duration::from_millis(self.settings().pipeline.ceiling_ms);
        let budget = grpc_timeout(md)
            .map(|t| t.saturating_sub(Duration::from_millis(20)).min(ceiling))
            .unwrap_or(ceiling);
        start + budget
    }

    /// The pipeline for a `Retrieve` (or a surface answering like one),
    /// with its shape counted as demand unless no retrieval ran.
    pub async fn retrieve(
        &self,
        identity: Identity,
        q: Query,
        start: Instant,
        deadline: Instant,
    ) -> Result<RetrieveResponse, Error> {
        let tenant = identity.tenant.clone();
        let trust = identity.trust;
        let requested = Shape::requested_of_retrieve(&q);
        let r = self.pipeline().retrieve(identity, q, start, deadline).await;
        if let Ok(resp) = &r
            && resp.skip_reason != SkipReason::ContextSufficient as i32
            && resp.skip_reason != SkipReason::NoRetrievalNeeded as i32
        {
            let shape = Shape {
                requested,
                observed: Shape::observed_of(&resp.records),
            };
            self.demand()
                .observe(&tenant, trust, Surface::Retrieve, shape);
        }
        r
    }
}

/// Whose rate and in-flight count a request is charged to at the door: the
/// tenant and the key's trust level (a unit separator keeps the two apart).
fn door_key(identity: &Identity) -> String {
    format!("{}\u{1f}{}", identity.tenant, identity.trust.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn metrics_render_per_stack() {
        let g = Gateway::new(Settings::default()).expect("gateway");
        let t = g.metrics_text();
        assert!(
            t.contains("engram_retrieval_circuit_state{stage=\"search.vector\"} 0"),
            "{t}"
        );
        assert!(
            t.contains("# TYPE engram_downstream_latency_seconds histogram"),
            "{t}"
        );
        assert!(t.contains("engram_feedback_dropped_total 0"), "{t}");
    }

    #[tokio::test]
    async fn one_keys_burst_never_refuses_another_key_of_its_tenant() {
        let mut settings = Settings::default();
        settings.tenant.requests_per_second = 1;
        settings.tenant.burst = 2;
        let g = Gateway::new(settings).expect("gateway");
        let key = |trust| Identity {
            tenant: "t".into(),
            agent_id: "agent-1".into(),
            trust,
        };
        let low = key(engram_common::AccessLevel::Public);
        let held: Vec<_> = (0..2).map(|_| g.admit(&low, 1)).collect();
        assert!(held.iter().all(Result::is_ok));
        assert!(
            g.admit(&low, 1).is_err(),
            "the public key is over its burst"
        );
        let high = key(engram_common::AccessLevel::Sensitive);
        assert!(g.admit(&high, 1).is_ok(), "the sensitive key has its own");
        let other = Identity {
            tenant: "t2".into(),
            ..low
        };
        assert!(g.admit(&other, 1).is_ok(), "and so has another tenant");
    }

    #[test]
    fn grpc_timeout_parses() {
        let mut md = MetadataMap::new();
        md.insert("grpc-timeout", "250m".parse().expect("ascii"));
        assert_eq!(grpc_timeout(&md), Some(Duration::from_millis(250)));
        md.insert("grpc-timeout", "2S".parse().expect("ascii"));
        assert_eq!(grpc_timeout(&md), Some(Duration::from_secs(2)));
        md.insert("grpc-timeout", "x".parse().expect("ascii"));
        assert_eq!(grpc_timeout(&md), None);
    }
}
