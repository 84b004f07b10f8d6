//! Stage 1, second half: routing by evidence. Indicator phrases alone do not
//! mark "When did Lothair II's mother die?" as multi-hop, and a fixed fusion
//! recipe loses on one data set or another (shared/notes/graph-probe.md):
//! on Wikipedia-style questions a walk from the named entity beats every
//! fusion, on chat logs only the fused list wins. What separates them is
//! whether the query names something the memory holds a memory *about*.
//!
//! The evidence is the graph's entity linking of the query (names, document
//! frequency, whether a memory is about the entity), which graph-svc returns
//! with every walk, so it costs no extra round trip: every strategy runs in
//! parallel and the route picks the fusion weights once the lists are in.
//!
//! Rules (first match wins; the seed's four routes stay the contract):
//! 1. exploratory wording ("everything about", "history of", …) → exploratory;
//! 2. the graph did not answer → the indicator route (no evidence);
//! 3. an *anchor*: a linked entity that some memory is about (title / home
//!    entity) and that at most `anchor_max_df_ratio` of the visible memories
//!    mention → multi_hop, graph-led: the walk from it reaches both the
//!    entity's own memory and the memories one relation away;
//! 4. otherwise → simple: dense and keyword lead and the graph is a minor
//!    voice (its simple-route weight). Relation wording without an anchor
//!    is not enough: on the dev halves the unanchored "multi-hop" questions
//!    (mostly chat logs) were served best by the simple weights.

use engram_proto::LinkedEntity;

use crate::query::Route;

/// In a small tenant a share of the memories is a handful; up to this many
/// mentions still count as specific (the dev corpora have hundreds to
/// thousands of memories, where the share decides).
pub const MIN_SPECIFIC_DF: f64 = 5.0;

/// What the query's entity linking says, reduced to counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evidence {
    /// graph-svc answered, so the counts mean something.
    pub available: bool,
    pub linked: u32,
    /// Linked entities mentioned by at most the anchor share of memories.
    pub specific: u32,
    /// Specific linked entities that some memory is about.
    pub anchors: u32,
}

impl Evidence {
    pub fn from_linked(linked: &[LinkedEntity], memory_count: u32, max_df_ratio: f32) -> Self {
        let cap = (f64::from(max_df_ratio) * f64::from(memory_count)).max(MIN_SPECIFIC_DF);
        let specific: Vec<&LinkedEntity> = linked
            .iter()
            .filter(|l| l.df > 0 && f64::from(l.df) <= cap)
            .collect();
        Self {
            available: true,
            linked: linked.len() as u32,
            specific: specific.len() as u32,
            anchors: specific.iter().filter(|l| l.has_home).count() as u32,
        }
    }
}

/// The route of an `AUTO` request once the evidence is in.
pub fn route(indicator: Route, ev: &Evidence) -> Route {
    match indicator {
        Route::Exploratory => Route::Exploratory,
        _ if !ev.available => indicator,
        _ if ev.anchors > 0 => Route::MultiHop,
        _ => Route::Simple,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::route::classify;

    fn ent(name: &str, df: u32, has_home: bool) -> LinkedEntity {
        LinkedEntity {
            name: name.into(),
            df,
            has_home,
        }
    }

    #[test]
    fn anchors_need_a_home_and_a_small_share() {
        let ev = Evidence::from_linked(
            &[
                ent("lothair ii", 3, true),
                ent("mother", 40, false),
                ent("france", 900, true),
            ],
            6000,
            0.02,
        );
        assert_eq!(
            ev,
            Evidence {
                available: true,
                linked: 3,
                specific: 2,
                anchors: 1
            }
        );
        // A common entity with a home page is not an anchor.
        let ev = Evidence::from_linked(&[ent("france", 900, true)], 6000, 0.02);
        assert_eq!(ev.anchors, 0);
        assert_eq!(ev.specific, 0);
        // In a tiny tenant a few mentions are still specific.
        let ev = Evidence::from_linked(&[ent("alice", 3, true)], 21, 0.02);
        assert_eq!(ev.anchors, 1);
        let ev = Evidence::from_linked(&[ent("alice", 6, true)], 21, 0.02);
        assert_eq!(ev.anchors, 0);
    }

    #[test]
    fn entity_rich_relation_questions_are_graph_led() {
        let q = "When did Lothair II's mother die?";
        let ev = Evidence::from_linked(&[ent("lothair ii", 2, true)], 6000, 0.02);
        assert_eq!(route(classify(q), &ev), Route::MultiHop);
        // The same words with nothing linked: dense and keyword lead.
        let none = Evidence::from_linked(&[], 6000, 0.02);
        assert_eq!(
            route(classify("what did we decide about the budget"), &none),
            Route::Simple
        );
        // No evidence (graph down): the indicator route stands.
        assert_eq!(
            route(
                classify("Who was born first, Alan Turing or John von Neumann?"),
                &Evidence::default()
            ),
            Route::MultiHop
        );
        // Exploratory wording wins over anchors.
        assert_eq!(
            route(classify("tell me everything about Alice"), &ev),
            Route::Exploratory
        );
        // Specific but unanchored entities: relation wording alone does
        // not make the graph lead.
        let loose = Evidence::from_linked(&[ent("pottery", 4, false)], 600, 0.02);
        assert_eq!(
            route(
                classify("Who was born first, Alan Turing or John von Neumann?"),
                &loose
            ),
            Route::Simple
        );
    }
}
