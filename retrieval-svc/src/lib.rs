//! The public gateway: RetrievalService (the six-stage pipeline), the
//! Knowledge Foundry, working memory and MemoryService (the write front),
//! talking to search-, graph- and rerank-svc only over gRPC through one
//! resilience stack per RPC.
//!
//! Layers, each depending only on those below it (docs/architecture.md):
//! `api` (wire adapters) → `surfaces` (working memory, Foundry, HyDE,
//! writes) → `gateway` (shared state) → `pipeline` (the stages) →
//! `downstream` (stacks); `query`, `error`, `auth`, `metrics` and
//! `own_writes` are leaves.

mod admission;
mod api;
mod auth;
mod downstream;
mod error;
mod fair;
mod gateway;
mod metrics;
mod own_writes;
mod pipeline;
mod query;
mod receipt;
mod surfaces;

/// The small surface the lab (`engram tune`, `engram eval`, the benches)
/// replays offline: the gateway's own fusion, evidence routing,
/// cross-encoder blend and passage format, so what is fitted is exactly what
/// runs.
pub mod lab {
    pub use crate::pipeline::abstain::{Calibration, Features, features, nothing_relevant, score};
    pub use crate::pipeline::distill::blend;
    pub use crate::pipeline::evidence::{Evidence, route as route_by_evidence};
    pub use crate::pipeline::fusion::{StrategyList, rank_fusion, rrf, weights_for};
    pub use crate::pipeline::ranker::{
        Model, NAMES as RANK_FEATURES, Ranker, Row as RankRow, Signals as RankSignals,
        features as rank_features, load_file as load_ranker, shipped as shipped_ranker,
    };
    pub use crate::pipeline::route::classify;
    pub use crate::pipeline::strategy::Strategy;
    pub use crate::pipeline::validate::passage;
    pub use crate::query::Route;
}

use std::future::Future;

use engram_common::Settings;
use engram_proto::knowledge_foundry_service_server::KnowledgeFoundryServiceServer;
use engram_proto::memory_service_server::MemoryServiceServer;
use engram_proto::retrieval_service_server::RetrievalServiceServer;
use engram_proto::working_memory_service_server::WorkingMemoryServiceServer;
use tokio::net::TcpListener;
use tonic::service::Routes;

pub use api::http;
pub use gateway::Gateway;

use api::foundry::Foundry;
use api::memory::Memory;
use api::retrieval::Retrieval;
use api::working::Working;

/// Serves the gateway on `listener` until `shutdown`. Downstream channels
/// connect lazily, so a downstream that is not up yet is not an error here.
pub async fn run(
    listener: TcpListener,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if settings
        .auth
        .internal_token_opt
        .as_deref()
        .is_none_or(str::is_empty)
    {
        tracing::warn!("no internal token configured: downstream calls will be refused");
    }
    serve_gateway(listener, Gateway::new(settings)?, shutdown).await
}

/// How long whoever starts a gateway waits for its change feed to speak
/// ([`Gateway::feed_heard`]); serving never waits for it.
pub const FEED_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// [`run`] with a gateway built by the caller, so the same instance can also
/// back the HTTP JSON API and the admin `/metrics` ([`Gateway::metrics_text`]).
pub async fn serve_gateway(
    listener: TcpListener,
    gateway: Gateway,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let opts = engram_common::server::ServeOptions {
        reflect: vec![
            "engram.v1.RetrievalService",
            "engram.v1.MemoryService",
            "engram.v1.WorkingMemoryService",
            "engram.v1.KnowledgeFoundryService",
        ],
        ..engram_common::server::ServeOptions::from(&gateway.settings().listen)
    };
    let (reporter, health) = engram_common::server::health();
    reporter
        .set_serving::<RetrievalServiceServer<Retrieval>>()
        .await;
    reporter.set_serving::<MemoryServiceServer<Memory>>().await;
    reporter
        .set_serving::<WorkingMemoryServiceServer<Working>>()
        .await;
    reporter
        .set_serving::<KnowledgeFoundryServiceServer<Foundry>>()
        .await;
    let routes = Routes::new(RetrievalServiceServer::new(Retrieval(gateway.clone())))
        .add_service(KnowledgeFoundryServiceServer::new(Foundry(gateway.clone())))
        .add_service(WorkingMemoryServiceServer::new(Working(gateway.clone())))
        .add_service(MemoryServiceServer::new(Memory(gateway)));
    tracing::info!(addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), "retrieval gateway listening");
    engram_common::server::serve_with(listener, routes, health, opts, shutdown).await?;
    Ok(())
}

/// The layering, checked on the source: a newcomer can trust that a stage
/// reads alone and that data flows one way.
#[cfg(test)]
mod layering {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    /// Module path (`pipeline::search`) → source text, for every file.
    fn modules() -> BTreeMap<String, String> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut out = BTreeMap::new();
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("src dir") {
                let path: PathBuf = entry.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let rel = path.strip_prefix(&root).expect("under src");
                let mut parts: Vec<String> = rel
                    .with_extension("")
                    .iter()
                    .map(|p| p.to_string_lossy().into_owned())
                    .collect();
                if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                    parts.pop();
                }
                let text = std::fs::read_to_string(&path).expect("source");
                out.insert(parts.join("::"), text);
            }
        }
        out
    }

    /// The modules a file refers to by path (`crate::x::y`, `super::y`,
    /// `self::y`), each resolved to the longest known module prefix; module
    /// declarations and a file's own inline tests are not dependencies.
    fn references(module: &str, text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
        let code = text.split("#[cfg(test)]").next().unwrap_or(text);
        let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
        let mut out = BTreeSet::new();
        for (prefix, base) in [("crate::", ""), ("super::", parent), ("self::", module)] {
            for (i, _) in code.match_indices(prefix) {
                let rest = &code[i + prefix.len()..];
                let path: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                let mut candidate = base.to_string();
                let mut best_opt = None;
                for seg in path.split("::").filter(|s| !s.is_empty()) {
                    if !candidate.is_empty() {
                        candidate.push_str("::");
                    }
                    candidate.push_str(seg);
                    if known.contains(&candidate) {
                        best_opt = Some(candidate.clone());
                    }
                }
                if let Some(best) = best_opt.filter(|b| b != module) {
                    out.insert(best);
                }
            }
        }
        out
    }

    fn graph() -> BTreeMap<String, BTreeSet<String>> {
        let mods = modules();
        let known: BTreeSet<String> = mods.keys().cloned().collect();
        mods.iter()
            .map(|(m, text)| (m.clone(), references(m, text, &known)))
            .collect()
    }

    #[test]
    fn dependencies_point_one_way() {
        for (module, text) in modules() {
            if !module.starts_with("pipeline") {
                continue;
            }
            let code = text.split("#[cfg(test)]").next().unwrap_or(&text);
            for banned in ["Gateway", "crate::gateway", "crate::surfaces", "crate::api"] {
                assert!(
                    !code.contains(banned),
                    "{module} names {banned}: the pipeline must not know its callers"
                );
            }
        }
    }

    /// The leaves every stage may use stand on no stage: the strategy
    /// enum and the text helpers on nothing of the pipeline, Stage 1's
    /// `Plan` on the fusion weights and the session's lifts alone.
    #[test]
    fn leaves_stand_on_no_stage() {
        let g = graph();
        let inside = |m: &str| -> Vec<String> {
            (g[m].iter())
                .filter(|d| d.starts_with("pipeline::"))
                .cloned()
                .collect()
        };
        assert!(inside("pipeline::strategy").is_empty(), "{g:?}");
        assert!(inside("pipeline::text").is_empty(), "{g:?}");
        assert_eq!(
            inside("pipeline::plan"),
            ["pipeline::fusion", "pipeline::session"]
        );
        // The later stages' downstream calls stand on the request's context
        // alone, not on Stage 2's file.
        assert_eq!(inside("pipeline::later"), ["pipeline::ctx"]);
    }

    /// The stages after Stage 2 take what they share from leaves (`later`
    /// for their downstream calls, `text` for question wording), not from
    /// the files of Stage 1 (route) and Stage 2 (search): Stage 2's output
    /// type, `Candidate`, is the one thing a hop or a chain takes from it.
    #[test]
    fn later_stages_borrow_no_earlier_stages_helpers() {
        let g = graph();
        for stage in [
            "pipeline::complement",
            "pipeline::previous",
            "pipeline::history",
            "pipeline::hop",
            "pipeline::chain",
        ] {
            assert!(!g[stage].contains("pipeline::route"), "{stage}: {g:?}");
        }
        for stage in [
            "pipeline::complement",
            "pipeline::previous",
            "pipeline::history",
        ] {
            assert!(!g[stage].contains("pipeline::search"), "{stage}: {g:?}");
        }
        let mods = modules();
        for file in ["pipeline::hop", "pipeline::chain"] {
            let text = &mods[file];
            let code = text.split("#[cfg(test)]").next().unwrap_or(text);
            let uses: Vec<&str> = (code.lines()).filter(|l| l.contains("search::")).collect();
            assert_eq!(uses, ["use super::search::Candidate;"], "{file}");
        }
    }

    #[test]
    fn no_import_cycle_among_modules() {
        let g = graph();
        // The parser sees references (else the check would pass vacuously).
        assert!(g["gateway"].contains("pipeline"), "{g:?}");
        assert!(g["pipeline::validate"].contains("pipeline::ctx"), "{g:?}");
        // Depth-first search with colours; a grey node met again is a cycle.
        fn visit<'a>(
            m: &'a str,
            g: &'a BTreeMap<String, BTreeSet<String>>,
            state: &mut BTreeMap<&'a str, bool>,
            stack: &mut Vec<&'a str>,
        ) {
            match state.get(m) {
                Some(true) => return,
                Some(false) => panic!("import cycle: {} -> {m}", stack.join(" -> ")),
                None => {}
            }
            state.insert(m, false);
            stack.push(m);
            for dep in g.get(m).into_iter().flatten() {
                visit(dep, g, state, stack);
            }
            stack.pop();
            state.insert(m, true);
        }
        let mut state = BTreeMap::new();
        for m in g.keys() {
            visit(m, &g, &mut state, &mut Vec::new());
        }
    }
}
