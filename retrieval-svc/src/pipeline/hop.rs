//! Stage 3b, on the answers Stage 4b reorders (multi-hop, and a chain of
//! relations on the simple route): one more keyword search, for the
//! question and the names its first memory adds. A chain's next memory is
//! named by the one before it ("Brand is a play by the Norwegian
//! playwright Henrik Ibsen"), not by the question ("What country was the
//! author of Brand a citizen of?"), so no list of the first fan-out needs
//! to rank it; with the first memory's names beside the question's words,
//! the keyword index does. It runs after Stage 3, so the first memory is
//! one the request may return, and its finds pass the same checks. No
//! model runs: the keyword index is in memory and the names come from the
//! row already held. The first find the slots lack takes the place after
//! them (complement.rs `next_hop`).
//!
//! Cross-fitted on the dev sets, R@5: MuSiQue 77.2 → 78.8, 2Wiki 95.5 →
//! 95.7, HotpotQA and LoCoMo unchanged (docs/benchmarks.md, "The next hop
//! by name").

use std::collections::HashSet;

use engram_proto::{Filters, KeywordSearchRequest, Memory};
use tokio::time::Instant;

use super::cache::cosine;
use super::ctx::{Ctx, StageTrace};
use super::later::{Vectors, later_keyword, stage_deadline, text_and_vectors, time_for_another};
use super::plan::{HopPlan, Plan};
use super::search::Candidate;
use super::slots::is_statement;
use super::strategy::Strategy;
use super::text::{clause_of, collect_words, coverage, lower_words, names, query_words};
use super::validate::{Checked, best_fused, static_checks};
use crate::query::{MAX_TEXT_CHARS, Route};

/// The best fused candidates among which a clause question's first memory
/// is chosen.
const SEED_POOL: usize = 3;

/// The strategy a second-hop find is credited to in its provenance; its
/// name is the stage's label in traces.
pub const HOP: Strategy = Strategy::Hop;

/// What the second search found, best first (ids), for Stage 4b; `added`
/// of them were not candidates yet.
#[derive(Debug, Default)]
pub struct Found {
    pub ids: Vec<String>,
    pub added: usize,
    /// A clause question's memory of the clause ([`by_clause`]) when it is
    /// a short statement that says every word of the clause ("Project
    /// Atlas migrates the billing system …" for "Who leads the project
    /// that migrates the billing system?"): it opens Stage 4b's slots, and
    /// the find its name led to follows it. A passage, or a memory that
    /// says only part of the clause, leaves the fusion's #1 first: on the
    /// dev sets' pages, opening with every clause memory cost MuSiQue R@2
    /// 3.1 points (docs/benchmarks.md).
    pub opens_opt: Option<String>,
}

/// Stage 3b for one attempt: the second search, when the plan and the
/// route ask for it and there is time, its finds checked like every
/// candidate and appended to `checked`. A failed search reports `hop`
/// degraded and leaves the candidates as they were; it is skipped when the
/// keyword list already failed this attempt (its breaker may be open).
pub async fn run(
    ctx: &mut Ctx<'_>,
    trace: &mut StageTrace,
    checked: &mut Vec<Checked>,
    plan: &Plan,
    route: Route,
    filters: &Filters,
    prefetched: &Vectors,
) -> Found {
    let Some(hop_plan) = plan
        .hop_opt
        .filter(|h| plan.complements(route) && room(ctx, h))
    else {
        return Found::default();
    };
    if trace.is_degraded(Strategy::Keyword) || !time_for_another(ctx.deadline) {
        return Found::default();
    }
    // A clause's memory is the bridge, not a find: the search looks past
    // it, and it opens the slots (complement.rs).
    let (seed, bridge_opt, opens_opt) = match by_clause(ctx, checked, prefetched).await {
        Some((i, says)) => {
            let m = &checked[i].cand.memory;
            (
                Some(m),
                Some(m.id.clone()),
                opens(m, says).then(|| m.id.clone()),
            )
        }
        None => (first(checked), None, None),
    };
    // The clause's thing is named once ("Project Atlas"), not with every
    // name its memory holds ("MySQL", "PostgreSQL" lead to its other pages).
    let max_names = if bridge_opt.is_some() {
        1
    } else {
        hop_plan.names
    };
    let Some(text) = seed.and_then(|m| query_text(&ctx.query.text, m, max_names)) else {
        return Found::default();
    };
    let t = Instant::now();
    let req = KeywordSearchRequest {
        text,
        filters: Some(filters.clone()),
        k: hop_plan.depth,
    };
    let Some(resp) = later_keyword(ctx, trace, HOP.name(), req).await else {
        return Found::default();
    };
    let hits = (resp.hits.into_iter())
        .filter_map(|h| Some((h.memory?, h.score)))
        .filter(|(m, _)| bridge_opt.as_ref() != Some(&m.id));
    let (ids, new) = credit(checked, hits);
    let added = static_checks(
        new,
        &ctx.identity,
        filters,
        filters.decay_floor,
        &mut trace.dropped,
    );
    let found = Found {
        ids,
        added: added.len(),
        opens_opt,
    };
    checked.extend(added);
    ctx.timed(HOP.name(), t);
    found
}

/// Whether the answer asked for reaches past the place a find takes.
fn room(ctx: &Ctx<'_>, h: &HopPlan) -> bool {
    ctx.query.limit as usize > h.at
}

/// The memory the answer opens with (`validate::best_fused`).
fn first(checked: &[Checked]) -> Option<&Memory> {
    best_fused(checked.iter()).map(|i| &checked[i].cand.memory)
}

/// For a question that names its thing by a relative clause ("Who leads
/// the project that migrates the billing system?"), the memory the second
/// search starts from is the one among the [`SEED_POOL`] best fused whose
/// words say most of the clause's, then whose vector is closest to it
/// ("Project Atlas migrates the billing system …"), not the best fused
/// ("The billing system sends monthly invoices to Acme Corp and Globex",
/// as near the whole question and as near the clause, whose names lead to
/// the customers). One embed, and a vectors read unless Stage 2 read them;
/// any failure keeps the best fused. None when the question has no clause
/// or the best fused is the closest; else the memory and how much of the
/// clause it says.
async fn by_clause(
    ctx: &Ctx<'_>,
    checked: &[Checked],
    prefetched: &Vectors,
) -> Option<(usize, f32)> {
    let clause = clause_of(&ctx.query.text)?;
    let (_, wanted) = query_words(&clause);
    let mut pool: Vec<usize> = (0..checked.len()).collect();
    pool.sort_by(|&a, &b| (checked[b].cand.fused.rrf).total_cmp(&checked[a].cand.fused.rrf));
    pool.truncate(SEED_POOL);
    if pool.len() < 2 {
        return None;
    }
    let ids = pool
        .iter()
        .map(|&i| checked[i].cand.memory.id.clone())
        .collect();
    let deadline = stage_deadline(ctx.deadline);
    let (asked, vectors) = text_and_vectors(ctx, clause, ids, prefetched, deadline).await?;
    let near = |i: usize| {
        (vectors.get(&checked[i].cand.memory.id)).map_or(f32::MIN, |v| cosine(&asked, v))
    };
    // Each memory's (says, near), judged once; the pool's first is the
    // best fused.
    let keys: Vec<(usize, (f32, f32))> = (pool.iter())
        .map(|&i| (i, (says(&checked[i].cand.memory, &wanted), near(i))))
        .collect();
    let &(best, key) = keys
        .iter()
        .max_by(|(_, (sa, na)), (_, (sb, nb))| sa.total_cmp(sb).then(na.total_cmp(nb)))?;
    (best != pool[0] && key > keys[0].1).then_some((best, key.0))
}

/// Whether a clause's memory opens the slots ([`Found::opens_opt`]): it
/// says all of the clause (`says`, [`says`]) and is a statement of at most
/// slots.rs's bound on a fact ([`is_statement`]), not a passage.
fn opens(m: &Memory, says: f32) -> bool {
    says >= 1.0 && is_statement(&m.content)
}

/// How much of a clause's words (`wanted`) a memory says, its title
/// included: "migrates" is what tells the project's page from the billing
/// system's for "the project that migrates the billing system".
fn says(m: &Memory, wanted: &HashSet<String>) -> f32 {
    let mut have = HashSet::new();
    collect_words(&m.title, &mut have);
    collect_words(&m.content, &mut have);
    coverage(wanted, &have)
}

/// Credits the finds already among the candidates with a `hop` hit, and
/// makes candidates of the others; returns every find's id, best first.
fn credit(
    checked: &mut [Checked],
    hits: impl Iterator<Item = (Memory, f32)>,
) -> (Vec<String>, Vec<Candidate>) {
    let mut ids = Vec::new();
    let mut new = Vec::new();
    for (i, (memory, score)) in hits.enumerate() {
        ids.push(memory.id.clone());
        let found = Candidate::found(memory, HOP, i, score);
        match checked
            .iter_mut()
            .find(|c| c.cand.memory.id == found.memory.id)
        {
            Some(c) => c.cand.fused.hits.extend(found.fused.hits),
            None => new.push(found),
        }
    }
    (ids, new)
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
    use engram_common::settings::ComplementSettings;

    use super::super::text::page as memory;

    #[test]
    fn a_short_memory_that_says_the_whole_clause_opens_the_slots() {
        let m = |content: &str| Memory {
            content: content.into(),
            ..Default::default()
        };
        let atlas = m("Project Atlas migrates the billing system from MySQL to PostgreSQL 18.");
        assert!(opens(&atlas, 1.0));
        // Part of the clause said: the fusion's #1 keeps the first place.
        assert!(!opens(&atlas, 0.75));
        // A passage is led by the graph from its title.
        let passage = m(&"The port handled many containers in that year. ".repeat(8));
        assert!(!opens(&passage, 1.0));
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
    fn the_clauses_thing_says_all_of_the_clause() {
        let q = "Who leads the project that migrates the billing system?";
        let clause = clause_of(q).expect("a clause");
        let (_, wanted) = query_words(&clause);
        let atlas = memory(
            "Project Atlas",
            "Project Atlas migrates the billing system from MySQL to PostgreSQL 18.",
        );
        let billing = memory(
            "Billing system",
            "The billing system sends monthly invoices to Acme Corp and Globex.",
        );
        assert!(says(&atlas, &wanted) > says(&billing, &wanted));
        assert_eq!(
            query_text(q, &atlas, 1).as_deref(),
            Some("Who leads the project that migrates the billing system? atlas")
        );
    }

    #[test]
    fn no_new_name_or_a_text_past_the_limit_means_no_second_search() {
        let q = "Where is Brand set?";
        assert_eq!(query_text(q, &memory("Brand", "brand is a play."), 4), None);
        let long = format!("{} Brand?", "word ".repeat(MAX_TEXT_CHARS / 5));
        assert_eq!(query_text(&long, &memory("Ibsen", ""), 4), None);
    }

    fn checked(id: &str, rrf: f32) -> Checked {
        let m = Memory {
            id: id.into(),
            ..Default::default()
        };
        Checked::passed(m, rrf)
    }

    #[test]
    fn the_first_memory_is_the_best_fused_and_the_earliest_on_a_tie() {
        let c = [checked("a", 0.2), checked("b", 0.5), checked("c", 0.5)];
        assert_eq!(first(&c).map(|m| m.id.as_str()), Some("b"));
        assert!(first(&[]).is_none());
    }

    #[test]
    fn finds_among_the_candidates_are_credited_and_the_rest_become_candidates() {
        let mut c = vec![checked("a", 0.5), checked("b", 0.2)];
        let hits = ["a", "n"].map(|id| {
            let m = Memory {
                id: id.into(),
                ..Default::default()
            };
            (m, 3.0)
        });
        let (ids, new) = credit(&mut c, hits.into_iter());
        assert_eq!(ids, ["a", "n"]);
        let credited: Vec<(&str, u32)> = (c[0].cand.fused.hits.iter())
            .map(|h| (h.strategy.as_str(), h.rank))
            .collect();
        assert_eq!(credited, [(HOP.name(), 1)]);
        assert!(c[1].cand.fused.hits.is_empty());
        assert_eq!(new.len(), 1);
        assert_eq!(new[0].memory.id, "n");
        assert_eq!((new[0].fused.rrf, new[0].fused.hits[0].rank), (0.0, 2));
    }

    #[test]
    fn off_when_stage_4b_or_the_names_are_off() {
        let c = ComplementSettings::default();
        assert_eq!(
            HopPlan::of(&c),
            Some(HopPlan {
                names: 4,
                depth: 2,
                at: 3
            })
        );
        let no_pool = ComplementSettings {
            pool: 0,
            ..c.clone()
        };
        assert_eq!(HopPlan::of(&no_pool), None);
        let no_names = ComplementSettings { hop_names: 0, ..c };
        assert_eq!(HopPlan::of(&no_names), None);
    }
}
