//! Stage 4: distil the validated candidates into answer order. The
//! cross-encoder is evidence, not the order: re-ordering purely by it
//! lowered R@2 in the probe (notes/graph-probe.md), while blending its rank
//! with the fused rank (RRF with a small k) raised it. Raw modes keep the
//! strategy's own order and scores.

use std::collections::HashMap;

use engram_common::settings::PipelineSettings;

use super::validate::Checked;

/// Stage 4 for one attempt: the candidates best first, each with the score
/// it is reported with.
pub fn run(checked: Vec<Checked>, p: &PipelineSettings, raw: bool) -> Vec<(Checked, f32)> {
    if raw {
        return checked
            .into_iter()
            .map(|c| {
                let s = c.cand.fused.rrf;
                (c, s)
            })
            .collect();
    }
    rank(checked, p.rerank_blend_k, p.rerank_weight)
}

/// The Stage 4 blend of one candidate: its fused position (0-based) and,
/// when the cross-encoder scored it, its position by relevance (0-based),
/// as RRF with a small k so the top ranks matter; `weight` is the
/// cross-encoder's vote relative to the fusion's (`engram tune` fits both).
pub fn blend(fused_pos: usize, rel_pos_opt: Option<usize>, k: f32, weight: f32) -> f32 {
    1.0 / (k + (fused_pos + 1) as f32) + rel_pos_opt.map_or(0.0, |r| weight / (k + (r + 1) as f32))
}

/// Composite score per candidate, sorted best first. The input is in fused
/// order, with relevance set on a prefix when the cross-encoder ran.
pub fn rank(checked: Vec<Checked>, blend_k: f32, weight: f32) -> Vec<(Checked, f32)> {
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
            let base = if rel_rank.is_empty() {
                c.cand.fused.rrf
            } else {
                blend(i, rel_rank.get(&i).copied(), blend_k, weight)
            };
            let score = base * c.temporal * c.confidence;
            (c, score)
        })
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    out
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
        );
        let ids: Vec<_> = ranked
            .iter()
            .map(|(c, _)| c.cand.memory.id.as_str())
            .collect();
        // a: 1/6 + 1/7, b: 1/7 + 1/6 → tie keeps fused order; c last.
        assert_eq!(ids, ["a", "b", "c"]);
    }
}
