//! Stage 2's second hop, on the answers Stage 4b reorders (multi-hop, and
//! a chain of relations on the simple route): one more keyword search, for
//! the question and the names its first memory adds. A chain's next
//! memory is named by the one before it ("Brand is a play by the Norwegian
//! playwright Henrik Ibsen"), not by the question ("What country was the
//! author of Brand a citizen of?"), so no list of the first fan-out needs
//! to rank it; with the first memory's names beside the question's words,
//! the keyword index does. No model runs: the keyword index is in memory,
//! and the names are read from the row Stage 2 already holds. What it
//! finds takes the place after Stage 4b's slots (complement.rs).
//!
//! Chosen leave-one-dataset-out on the dev sets (docs/benchmarks.md,
//! "The next hop by name"): MuSiQue R@5 +3.5, HotpotQA +0.5, 2Wiki +0.2.

use engram_common::settings::ComplementSettings;
use engram_proto::Memory;

use super::text::{lower_words, names};
use crate::query::MAX_TEXT_CHARS;

/// The strategy a second-hop find is credited to in its provenance.
pub const HOP: &str = "hop";

/// How a plan searches for the next hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HopPlan {
    /// Names of the first memory added to the question.
    pub names: usize,
    /// Memories asked of the keyword index.
    pub depth: u32,
}

impl HopPlan {
    /// None when the settings turn Stage 4b or the second search off.
    pub fn of(c: &ComplementSettings) -> Option<Self> {
        (c.pool > 0 && c.hop_names > 0).then(|| Self {
            names: c.hop_names,
            depth: u32::try_from(c.hop_depth).unwrap_or(1).max(1),
        })
    }
}

/// The second search's text: the question, then up to `max_names` of
/// `first`'s names that the question does not say, in the order `first`
/// says them. None when `first` adds no name, or the text would pass the
/// query limit (search-svc would refuse it).
pub fn query_text(question: &str, first: &Memory, max_names: usize) -> Option<String> {
    let asked = lower_words(question);
    let added: Vec<String> = names(first, &asked).take(max_names).collect();
    if added.is_empty() {
        return None;
    }
    let text = format!("{question} {}", added.join(" "));
    (text.chars().count() <= MAX_TEXT_CHARS).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(title: &str, content: &str) -> Memory {
        Memory {
            title: title.into(),
            content: content.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_question_gains_the_names_its_first_memory_adds_in_order() {
        let first = memory(
            "Brand (play)",
            "Brand is a play by the Norwegian playwright Henrik Ibsen. Brand was \
             written in Rome.",
        );
        let q = "What country was the author of Brand a citizen of?";
        assert_eq!(
            query_text(q, &first, 3).as_deref(),
            Some("What country was the author of Brand a citizen of? norwegian henrik ibsen")
        );
        assert_eq!(
            query_text(q, &first, 10).as_deref(),
            Some("What country was the author of Brand a citizen of? norwegian henrik ibsen rome")
        );
    }

    #[test]
    fn no_new_name_or_a_text_past_the_limit_means_no_second_search() {
        let q = "Where is Brand set?";
        assert_eq!(query_text(q, &memory("Brand", "brand is a play."), 4), None);
        let long = format!("{} Brand?", "word ".repeat(MAX_TEXT_CHARS / 5));
        assert_eq!(query_text(&long, &memory("Ibsen", ""), 4), None);
    }

    #[test]
    fn off_when_stage_4b_or_the_names_are_off() {
        let c = ComplementSettings::default();
        assert_eq!(HopPlan::of(&c), Some(HopPlan { names: 4, depth: 2 }));
        let no_pool = ComplementSettings {
            pool: 0,
            ..c.clone()
        };
        assert_eq!(HopPlan::of(&no_pool), None);
        let no_names = ComplementSettings { hop_names: 0, ..c };
        assert_eq!(HopPlan::of(&no_names), None);
    }
}
