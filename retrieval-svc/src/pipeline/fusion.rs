//! Weighted reciprocal-rank fusion: score = Σ_s w_s / (k + rank_s). Ranks,
//! not raw scores, are fused because cosine, text rank and PPR mass live on
//! unrelated scales; weights per route let the graph dominate multi-hop
//! questions without drowning the dense list elsewhere (notes/graph-probe.md).

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use engram_common::settings::{FusionWeights, StrategyWeights};
use engram_proto::StrategyHit;

use super::strategy::Strategy;
use crate::query::Route;

/// One strategy's candidates, best first.
#[derive(Debug, Clone)]
pub struct StrategyList {
    pub strategy: Strategy,
    pub weight: f32,
    /// (memory id, strategy score).
    pub hits: Vec<(String, f32)>,
}

#[derive(Debug, Clone)]
pub struct Fused {
    pub id: String,
    pub rrf: f32,
    /// Per contributing list: strategy, 1-based rank, score.
    pub hits: Vec<StrategyHit>,
}

pub fn weights_for(w: &FusionWeights, route: Route) -> &StrategyWeights {
    match route {
        Route::Simple => &w.simple,
        Route::MultiHop => &w.multi_hop,
        Route::Exploratory => &w.exploratory,
    }
}

/// The largest score a memory can reach (rank 1 everywhere), for turning an
/// RRF score into a 0..1 confidence.
pub fn max_score(lists: &[StrategyList], k: f32) -> f32 {
    lists
        .iter()
        .filter(|l| l.weight > 0.0)
        .map(|l| l.weight / (k + 1.0))
        .sum()
}

/// The fusion itself over weighted ranked id lists: every id once with its
/// score and best 1-based rank, best first (score, then best rank, then
/// id); a duplicate inside one list counts once, at its best rank.
/// `engram tune` replays this very function offline, so the weights it fits
/// are fitted for what the gateway runs.
pub fn rank_fusion<T, L>(lists: impl IntoIterator<Item = (f32, L)>, k: f32) -> Vec<(T, f32, u32)>
where
    T: Copy + Eq + Hash + Ord,
    L: IntoIterator<Item = T>,
{
    let mut by_id: HashMap<T, (f32, u32)> = HashMap::new();
    for (weight, ids) in lists {
        if weight <= 0.0 {
            continue;
        }
        let mut seen = HashSet::new();
        for (i, id) in ids.into_iter().enumerate() {
            if !seen.insert(id) {
                continue;
            }
            let rank = i as u32 + 1;
            let e = by_id.entry(id).or_insert((0.0, u32::MAX));
            e.0 += weight / (k + rank as f32);
            e.1 = e.1.min(rank);
        }
    }
    let mut out: Vec<(T, f32, u32)> = by_id.into_iter().map(|(id, (s, r))| (id, s, r)).collect();
    out.sort_by(|a, b| {
        b.1.total_cmp(&a.1)
            .then_with(|| a.2.cmp(&b.2))
            .then_with(|| a.0.cmp(&b.0))
    });
    out
}

pub fn rrf(lists: &[StrategyList], k: f32) -> Vec<Fused> {
    let ranked = rank_fusion(
        lists
            .iter()
            .map(|l| (l.weight, l.hits.iter().map(|(id, _)| id.as_str()))),
        k,
    );
    let mut hits: HashMap<&str, Vec<StrategyHit>> = HashMap::new();
    for list in lists.iter().filter(|l| l.weight > 0.0) {
        let mut seen = HashSet::new();
        for (i, (id, score)) in list.hits.iter().enumerate() {
            if seen.insert(id.as_str()) {
                hits.entry(id.as_str()).or_default().push(StrategyHit {
                    strategy: list.strategy.name().to_string(),
                    rank: i as u32 + 1,
                    score: *score,
                });
            }
        }
    }
    ranked
        .into_iter()
        .map(|(id, rrf, _)| Fused {
            id: id.to_string(),
            rrf,
            hits: hits.remove(id).unwrap_or_default(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(strategy: Strategy, weight: f32, ids: &[&str]) -> StrategyList {
        StrategyList {
            strategy,
            weight,
            hits: ids.iter().map(|i| (i.to_string(), 1.0)).collect(),
        }
    }

    #[test]
    fn rrf_sums_weighted_reciprocal_ranks() {
        let fused = rrf(
            &[
                list(Strategy::Vector, 1.0, &["a", "b", "c"]),
                list(Strategy::Keyword, 1.0, &["b", "a", "d"]),
            ],
            60.0,
        );
        let ids: Vec<&str> = fused.iter().map(|f| f.id.as_str()).collect();
        // a and b tie (ranks 1+2 each) and break the tie on id.
        assert_eq!(ids, ["a", "b", "c", "d"]);
        let expected = 1.0 / 61.0 + 1.0 / 62.0;
        assert!((fused[0].rrf - expected).abs() < 1e-6);
        assert_eq!(fused[0].hits.len(), 2);
    }

    #[test]
    fn weights_let_one_strategy_dominate() {
        let fused = rrf(
            &[
                list(Strategy::Vector, 0.5, &["a", "b"]),
                list(Strategy::Graph, 2.0, &["b", "c"]),
            ],
            60.0,
        );
        assert_eq!(fused[0].id, "b");
        assert_eq!(fused[1].id, "c");
        // A zero-weight list contributes nothing, not even provenance.
        let fused = rrf(&[list(Strategy::Keyword, 0.0, &["z"])], 60.0);
        assert!(fused.is_empty());
        assert!(
            (max_score(
                &[
                    list(Strategy::Vector, 1.0, &[]),
                    list(Strategy::Graph, 2.0, &[])
                ],
                60.0
            ) - 3.0 / 61.0)
                .abs()
                < 1e-6
        );
    }
}
