//! Calibrated abstention: does an answer hold anything relevant at all?
//! Records always come back (the caller decides); `nothing_relevant` says
//! when the evidence for them is too weak to trust. Pure, so `engram eval
//! abstain` calibrates with the very function the gateway runs.
//!
//! The evidence is lexical and semantic: how many of the query's names
//! (capitalised words: the people, places and works a question is about)
//! and content words the top records contain, and the best dense cosine.
//! A question asked of a tenant that never heard of its subject misses its
//! names; an answerable one finds them.

use std::collections::HashSet;

use engram_proto::ScoredMemory;

use super::strategy::Strategy;
use super::text::{collect_words, coverage, query_words, said};

/// Records whose text counts as "what the answer holds".
const TOP: usize = 10;

/// What the score is made of, each in 0..=1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Features {
    /// Share of the query's names found in the top records (1 without names).
    pub names: f32,
    /// Share of the query's content words found there (1 without any).
    pub terms: f32,
    /// The best dense cosine among the records (0 when dense did not run).
    pub cosine: f32,
}

/// The weights of the score and the line below which nothing is relevant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    pub names: f32,
    pub terms: f32,
    pub cosine: f32,
    pub threshold: f32,
}

/// The configured calibration.
pub fn calibration(s: &engram_common::settings::AbstainSettings) -> Calibration {
    Calibration {
        names: s.names_weight,
        terms: s.terms_weight,
        cosine: s.cosine_weight,
        threshold: s.threshold,
    }
}

pub fn features(query: &str, records: &[ScoredMemory]) -> Features {
    let (names, terms) = query_words(query);
    let mut have: HashSet<String> = HashSet::new();
    let mut cosine = 0.0f32;
    for r in records.iter().take(TOP) {
        if let Some(m) = &r.memory {
            collect_words(&m.title, &mut have);
            collect_words(&said(m), &mut have);
        }
        let dense = (r.provenance.iter())
            .flat_map(|p| &p.strategies)
            .filter(|h| Strategy::Vector.credited(h))
            .map(|h| h.score);
        cosine = dense.fold(cosine, f32::max);
    }
    Features {
        names: coverage(&names, &have),
        terms: coverage(&terms, &have),
        cosine: cosine.clamp(0.0, 1.0),
    }
}

/// The evidence score in 0..=1 (weights normalised).
pub fn score(f: &Features, c: &Calibration) -> f32 {
    let total = (c.names + c.terms + c.cosine).max(f32::EPSILON);
    (c.names * f.names + c.terms * f.terms + c.cosine * f.cosine) / total
}

/// The verdict: an empty answer holds nothing relevant by definition.
pub fn nothing_relevant(score: f32, records: usize, c: &Calibration) -> bool {
    records == 0 || score < c.threshold
}

#[cfg(test)]
mod tests {
    use super::*;
    use engram_proto::{Memory, Provenance, StrategyHit};

    fn rec(title: &str, content: &str, cosine: f32) -> ScoredMemory {
        ScoredMemory {
            memory: Some(Memory {
                title: title.into(),
                content: content.into(),
                ..Default::default()
            }),
            provenance: Some(Provenance {
                strategies: vec![StrategyHit {
                    strategy: "vector".into(),
                    rank: 1,
                    score: cosine,
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn names_the_tenant_never_heard_of_are_missing_evidence() {
        let q = "When did Caroline go to the LGBTQ support group?";
        let own = [rec(
            "",
            "Caroline: I went to a LGBTQ support group yesterday.",
            0.6,
        )];
        let foreign = [rec("", "Jon: the dance studio opens next month.", 0.2)];
        let f_own = features(q, &own);
        let f_foreign = features(q, &foreign);
        assert_eq!(f_own.names, 1.0);
        assert_eq!(f_foreign.names, 0.0);
        assert!(f_own.terms > f_foreign.terms);
        assert_eq!(f_own.cosine, 0.6);
        let c = Calibration {
            names: 1.0,
            terms: 1.0,
            cosine: 1.0,
            threshold: 0.5,
        };
        assert!(!nothing_relevant(score(&f_own, &c), 1, &c));
        assert!(nothing_relevant(score(&f_foreign, &c), 1, &c));
        assert!(nothing_relevant(1.0, 0, &c));
    }
}
