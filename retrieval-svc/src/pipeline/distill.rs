//! Stage 4: distil the validated candidates into answer order. The learned
//! ranker (ranker.rs), when loaded, scores each candidate from its fused
//! rank and the features that transfer across corpora; without one the
//! fused order stands. The cross-encoder is evidence, not the order:
//! re-ordering purely by it lowered R@2 in the probe (notes/graph-probe.md),
//! while blending its rank with the base rank (RRF with a small k) raised
//! it. Raw modes keep the strategy's own order and scores.

use std::collections::HashMap;

use engram_common::settings::PipelineSettings;

use super::ranker::{Ranker, Row, Signals, features, slot_of};
use super::strategy::{SLOTS, Strategy};
use super::validate::Checked;

/// Stage 4's inputs beyond the candidates: the query, and the learned
/// ranker when one is loaded.
#[derive(Clone, Copy)]
pub struct Learned<'a> {
    pub ranker_opt: Option<&'a Ranker>,
    pub query: &'a str,
}

/// What Stage 4 hands on: the candidates best first, each with the score
/// it is reported with, and each candidate's feature row by memory id
/// (kept with the answer, so feedback on it becomes a training example).
pub struct Distilled {
    pub ranked: Vec<(Checked, f32)>,
    pub rows: Vec<(String, Row)>,
}

/// Stage 4 for one attempt.
pub fn run(checked: Vec<Checked>, p: &PipelineSettings, raw: bool, l: Learned<'_>) -> Distilled {
    if raw {
        let ranked = checked
            .into_iter()
            .map(|c| {
                let s = c.cand.fused.rrf;
                (c, s)
            })
            .collect();
        return Distilled {
            ranked,
            rows: Vec::new(),
        };
    }
    let rows = feature_rows(&checked, l.query);
    let scores_opt = l.ranker_opt.map(|r| r.scores(&rows));
    let ids = checked.iter().map(|c| c.cand.memory.id.clone());
    let rows = ids.zip(rows).collect();
    let ranked = rank(
        checked,
        p.rerank_blend_k,
        p.rerank_weight,
        scores_opt.as_deref(),
    );
    Distilled { ranked, rows }
}

/// Each candidate's features (input in fused order).
pub fn feature_rows(checked: &[Checked], query: &str) -> Vec<Row> {
    let signals: Vec<Signals<'_>> = checked
        .iter()
        .enumerate()
        .map(|(pos, c)| signals_of(pos, c))
        .collect();
    features(query, &signals)
}

/// What the ranker reads of one candidate: its rank and score in each
/// strategy's list (the plain dense list over HyDE's when both ran).
fn signals_of(pos: usize, c: &Checked) -> Signals<'_> {
    let mut hits = [None; SLOTS];
    for h in &c.cand.fused.hits {
        if let Some(slot) = slot_of(&h.strategy)
            && (hits[slot].is_none() || Strategy::Vector.credited(h))
        {
            hits[slot] = Some((h.rank, h.score));
        }
    }
    Signals {
        hits,
        fused_pos: pos,
        title: &c.cand.memory.title,
        content: &c.cand.memory.content,
        speaker: c
            .cand
            .memory
            .turn
            .as_ref()
            .map_or("", |t| t.speaker.as_str()),
    }
}

/// The Stage 4 blend of one candidate: its fused position (0-based) and,
/// when the cross-encoder scored it, its position by relevance (0-based),
/// as RRF with a small k so the top ranks matter; `weight` is the
/// cross-encoder's vote relative to the fusion's (`engram tune` fits both).
pub fn blend(fused_pos: usize, rel_pos_opt: Option<usize>, k: f32, weight: f32) -> f32 {
    1.0 / (k + (fused_pos + 1) as f32) + rel_pos_opt.map_or(0.0, |r| weight / (k + (r + 1) as f32))
}

/// Composite score per candidate, sorted best first (ties keep fused
/// order). The input is in fused order, with relevance set on a prefix when
/// the cross-encoder ran; `learned_opt` holds the ranker's scores, which
/// then replace the fused score and position.
pub fn rank(
    checked: Vec<Checked>,
    blend_k: f32,
    weight: f32,
    learned_opt: Option<&[f32]>,
) -> Vec<(Checked, f32)> {
    let base_pos = base_positions(checked.len(), learned_opt);
    let with_rel: Vec<(usize, f32)> = checked
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.relevance_opt.map(|r| (i, r)))
        .collect();
    let mut rel_rank: HashMap<usize, usize> = HashMap::new();
    if !with_rel.is_empty() {
        let mut order = with_rel.clone();
        order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for (r, (i, _)) in order.into_iter().enumerate() {
            rel_rank.insert(i, r);
        }
    }
    let mut out: Vec<(Checked, f32)> = checked
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let base = match (rel_rank.is_empty(), learned_opt) {
                (true, Some(scores)) => scores.get(i).copied().unwrap_or(0.0),
                (true, None) => c.cand.fused.rrf,
                (false, _) => blend(base_pos[i], rel_rank.get(&i).copied(), blend_k, weight),
            };
            let score = base * c.temporal * c.confidence;
            (c, score)
        })
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    out
}

/// Each candidate's 0-based position in the base order: by learned score
/// when there is one (ties by fused order), else the fused position.
fn base_positions(n: usize, learned_opt: Option<&[f32]>) -> Vec<usize> {
    let Some(scores) = learned_opt else {
        return (0..n).collect();
    };
    let mut order: Vec<usize> = (0..n).collect();
    let at = |i: usize| scores.get(i).copied().unwrap_or(0.0);
    order.sort_by(|&a, &b| at(b).total_cmp(&at(a)).then(a.cmp(&b)));
    let mut pos = vec![0; n];
    for (p, i) in order.into_iter().enumerate() {
        pos[i] = p;
    }
    pos
}

#[cfg(test)]
mod tests {
    use engram_proto::Memory;

    use super::*;
    use crate::pipeline::fusion::Fused;
    use crate::pipeline::search::Candidate;

    fn mem(id: &str, secs: i64, conf: f32) -> Memory {
        Memory {
            id: id.into(),
            event_time: Some(prost_types::Timestamp {
                seconds: secs,
                nanos: 0,
            }),
            source_confidence: Some(conf),
            content: format!("content of {id}"),
            version: 1,
            ..Default::default()
        }
    }

    #[test]
    fn blend_keeps_reranked_prefix_on_top() {
        let mk = |id: &str, rel: Option<f32>, rrf: f32| Checked {
            cand: Candidate {
                memory: mem(id, 0, 1.0),
                fused: Fused {
                    id: id.into(),
                    rrf,
                    hits: vec![],
                },
                via_entities: vec![],
            },
            temporal: 1.0,
            confidence: 1.0,
            relevance_opt: rel,
            checks: vec![],
        };
        let ranked = rank(
            vec![
                mk("a", Some(0.4), 0.05),
                mk("b", Some(0.9), 0.04),
                mk("c", None, 0.03),
            ],
            5.0,
            1.0,
            None,
        );
        let ids: Vec<_> = ranked
            .iter()
            .map(|(c, _)| c.cand.memory.id.as_str())
            .collect();
        // a: 1/6 + 1/7, b: 1/7 + 1/6 → tie keeps fused order; c last.
        assert_eq!(ids, ["a", "b", "c"]);
    }

    fn page(id: &str, title: &str, content: &str, rrf: f32) -> Checked {
        let m = Memory {
            title: title.into(),
            content: content.into(),
            ..mem(id, 0, 1.0)
        };
        Checked::passed(m, rrf)
    }

    fn pages() -> Vec<Checked> {
        vec![
            page("film", "Inception", "directed by Christopher Nolan", 0.05),
            page("other", "Tenet", "a 2020 film", 0.04),
            page("nolan", "Christopher Nolan", "born in London", 0.03),
        ]
    }

    fn ids(ranked: &[(Checked, f32)]) -> Vec<&str> {
        ranked
            .iter()
            .map(|(c, _)| c.cand.memory.id.as_str())
            .collect()
    }

    #[test]
    fn the_learned_ranker_lifts_the_page_the_top_one_names() {
        let model = crate::pipeline::ranker::Model {
            version: "t".into(),
            features: vec!["fused_rr".into(), "linked_from_top".into()],
            mean: vec![0.0, 0.0],
            scale: vec![1.0, 1.0],
            weights: vec![2.0, 1.0],
            intercept: 0.0,
            trained_on: String::new(),
            keep_fused_first: false,
        };
        let ranker = Ranker::new(model).expect("model");
        let p = PipelineSettings::default();
        let learned = Learned {
            ranker_opt: Some(&ranker),
            query: "Where was the director of Inception born?",
        };
        let out = run(pages(), &p, false, learned);
        assert_eq!(ids(&out.ranked), ["film", "nolan", "other"]);
        assert_eq!(out.rows.len(), 3, "every candidate keeps its features");
    }

    #[test]
    fn without_a_model_the_fused_order_stands() {
        let p = PipelineSettings::default();
        let learned = Learned {
            ranker_opt: None,
            query: "Where was the director of Inception born?",
        };
        let out = run(pages(), &p, false, learned);
        assert_eq!(ids(&out.ranked), ["film", "other", "nolan"]);
    }
}
