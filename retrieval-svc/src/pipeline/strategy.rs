//! Where a candidate came from: the strategies of Stage 2 and the later
//! searches that add candidates (the next hop, a chain's next fact). An
//! enum everywhere in the pipeline; its name only on the wire
//! (`StrategyHit.strategy`), in metrics and in stage traces (a leaf).
//!
//! Adding one: a variant here, its name, its slot (which per-strategy
//! weight and ranker feature it shares), then the stage that produces it.

use engram_proto::StrategyHit;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Dense search (pgvector HNSW) on the query's embedding.
    Vector,
    /// Keyword search (BM25 over tantivy, SQL full-text while it catches up).
    Keyword,
    /// Personalized PageRank over the memory graph (graph-svc).
    Graph,
    /// Dense search on a hypothetical answer's embedding (HyDE).
    Hyde,
    /// Stage 3b's second keyword search, for the next hop.
    Hop,
    /// Stage 4d's keyword search for a chain's next fact.
    Chain,
}

/// Every strategy, in the order of [`Strategy::name`]'s table.
pub const ALL: [Strategy; 6] = [
    Strategy::Vector,
    Strategy::Keyword,
    Strategy::Graph,
    Strategy::Hyde,
    Strategy::Hop,
    Strategy::Chain,
];

/// How many per-strategy slots a fusion weight triple or ranker row has.
pub const SLOTS: usize = 3;

impl Strategy {
    /// The name on the wire, in metrics and in traces.
    pub const fn name(self) -> &'static str {
        match self {
            Strategy::Vector => "vector",
            Strategy::Keyword => "keyword",
            Strategy::Graph => "graph",
            Strategy::Hyde => "hyde",
            Strategy::Hop => "hop",
            Strategy::Chain => "chain",
        }
    }

    /// The strategy a wire name stands for.
    pub fn of(name: &str) -> Option<Self> {
        ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether `hit` is credited to this strategy.
    pub fn credited(self, hit: &StrategyHit) -> bool {
        hit.strategy == self.name()
    }

    /// Its per-strategy slot (dense, keyword, graph): the fusion weight it
    /// takes and the ranker feature it fills. HyDE is a dense list; the
    /// later searches are not fused, so they have none.
    pub const fn slot(self) -> Option<usize> {
        match self {
            Strategy::Vector | Strategy::Hyde => Some(0),
            Strategy::Keyword => Some(1),
            Strategy::Graph => Some(2),
            Strategy::Hop | Strategy::Chain => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_slots_cover_the_fused_strategies() {
        for s in ALL {
            assert_eq!(Strategy::of(s.name()), Some(s));
        }
        assert_eq!(Strategy::of("nope"), None);
        let slots: Vec<usize> = ALL.into_iter().filter_map(Strategy::slot).collect();
        assert!(slots.iter().all(|&i| i < SLOTS));
        assert_eq!(Strategy::Hyde.slot(), Strategy::Vector.slot());
    }
}
