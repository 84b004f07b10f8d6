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
//!
//! A question about someone the tenant knows well whose answer no memory
//! holds ("What's Kai's phone number?") finds its names and words; when
//! its form says what the answer looks like (shape.rs) and no memory
//! about its subject holds that, nothing is relevant whatever the score.

use std::collections::HashSet;

use engram_proto::ScoredMemory;

use super::shape;
use super::strategy::Strategy;
use super::text::{collect_words, coverage, query_words, said};

/// Records whose text counts as "what the answer holds".
const TOP: usize = 10;

/// Words of motion before "to", "for" or "from": "fly out to Portugal",
/// "leave for Mexico", "move to Seattle" name a place; "important to
/// Caroline", "a gift for Jon" name a person.
const MOTION: &[&str] = &[
    "fly",
    "flies",
    "flying",
    "flew",
    "out",
    "go",
    "goes",
    "going",
    "went",
    "travel",
    "travels",
    "travelling",
    "traveling",
    "traveled",
    "travelled",
    "trip",
    "move",
    "moves",
    "moving",
    "moved",
    "leave",
    "leaves",
    "leaving",
    "left",
    "head",
    "heads",
    "heading",
    "drive",
    "drives",
    "driving",
    "flight",
    "flights",
    "back",
];

/// The query's names that place or qualify what is asked rather than name
/// whom it is about: after a word of motion and "to", "for" or "from", or
/// after "besides" ("Which languages besides English?"), and not owning
/// anything ("to Melanie's house" is about Melanie). A tenant may answer
/// "when does she fly to Portugal?" from a note about Lisbon.
fn qualifiers(query: &str) -> HashSet<String> {
    let words: Vec<String> = (query.split(|c: char| !c.is_alphanumeric()))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect();
    let lower = |i: usize| words.get(i).map(|w| w.to_lowercase()).unwrap_or_default();
    let placed = |i: usize| {
        let before = lower(i.wrapping_sub(1));
        let moved = ["to", "for", "from"].contains(&before.as_str())
            && MOTION.contains(&lower(i.wrapping_sub(2)).as_str());
        (moved || before == "besides") && lower(i + 1) != "s"
    };
    (1..words.len())
        .filter(|&i| words[i].chars().next().is_some_and(char::is_uppercase))
        .filter(|&i| placed(i))
        .map(|i| words[i].to_lowercase())
        .collect()
}

/// What the score is made of, each in 0..=1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Features {
    /// Share of the query's names found in the top records (1 without names).
    pub names: f32,
    /// Share of the query's content words found there (1 without any).
    pub terms: f32,
    /// The best dense cosine among the records (0 when dense did not run).
    pub cosine: f32,
    /// The question's form says what its answer looks like, and no record
    /// about its subject holds that (shape.rs).
    pub shape_missing: bool,
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
    let (mut names, terms) = query_words(query);
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
    let shape_missing = shape_missing(query, &names, records);
    let qualifying = qualifiers(query);
    if names.iter().all(|n| qualifying.contains(n)) {
        names.retain(|n| have.contains(n));
    }
    Features {
        names: coverage(&names, &have),
        terms: coverage(&terms, &have),
        cosine: cosine.clamp(0.0, 1.0),
        shape_missing,
    }
}

/// Whether the question expects an answer of some shape that no record
/// about its subject holds. Its subject: the records naming a name of the
/// question that some record names; all records when none does (a name
/// the tenant never wrote, "Portugal" for a trip to Lisbon, says nothing).
fn shape_missing(query: &str, names: &HashSet<String>, records: &[ScoredMemory]) -> bool {
    let Some(want) = shape::expected(query) else {
        return false;
    };
    // Read the records' words only for the questions that ask a shape.
    let texts: Vec<(String, HashSet<String>)> = (records.iter().take(TOP))
        .filter_map(|r| r.memory.as_ref())
        .map(|m| {
            let text = format!("{}\n{}", m.title, said(m));
            let mut own = HashSet::new();
            collect_words(&text, &mut own);
            (text, own)
        })
        .collect();
    let about = |own: &HashSet<String>| names.iter().any(|n| own.contains(n));
    let known = texts.iter().any(|(_, own)| about(own));
    !(texts.iter())
        .filter(|(_, own)| !known || about(own))
        .any(|(text, _)| shape::holds(want, text))
}

/// The evidence score in 0..=1 (weights normalised).
pub fn score(f: &Features, c: &Calibration) -> f32 {
    let total = (c.names + c.terms + c.cosine).max(f32::EPSILON);
    (c.names * f.names + c.terms * f.terms + c.cosine * f.cosine) / total
}

/// The verdict: an empty answer holds nothing relevant by definition, and
/// an answer whose shape no record about the subject holds holds none.
pub fn nothing_relevant(f: &Features, score: f32, records: usize, c: &Calibration) -> bool {
    records == 0 || score < c.threshold || f.shape_missing
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
        assert!(!nothing_relevant(&f_own, score(&f_own, &c), 1, &c));
        assert!(nothing_relevant(&f_foreign, score(&f_foreign, &c), 1, &c));
        assert!(nothing_relevant(&f_own, 1.0, 0, &c));
    }

    #[test]
    fn a_place_the_tenant_never_wrote_is_no_missing_subject() {
        let own = [rec(
            "",
            "Offsite slipped a week: Lisbon outbound is Sept 19.",
            0.5,
        )];
        let to = features(
            "What day does she fly out to Portugal for the offsite?",
            &own,
        );
        assert_eq!(to.names, 1.0);
        let foreign = features("What day does Caroline fly out for the offsite?", &own);
        assert_eq!(foreign.names, 0.0);
        let both = features("What did Caroline give to Melanie?", &own);
        assert_eq!(both.names, 0.0);
        let person = features("Why are flowers important to Melanie?", &own);
        assert_eq!(person.names, 0.0);
        let owner = features("When did she go to Melanie's house?", &own);
        assert_eq!(owner.names, 0.0);
    }

    #[test]
    fn an_answer_of_the_wrong_shape_is_nothing_relevant() {
        let own = [
            rec("", "Kai owns the billing service (Kestrel).", 0.5),
            rec("", "Landlord: Gary Pruitt, (312) 555-0147.", 0.3),
        ];
        let f = features("What's Kai's phone number?", &own);
        assert!(f.shape_missing);
        let c = calibration(&Default::default());
        assert!(nothing_relevant(&f, 1.0, 2, &c));
        let gary = features("What's Gary's phone number?", &own);
        assert!(!gary.shape_missing);
    }
}
