//! `engram eval abstain`: calibrates `nothing_relevant` on dev data. Every
//! question is asked of its own tenant (answerable) and of a tenant that
//! does not hold its answer (foreign: a LoCoMo question of the next
//! conversation, a 2Wiki question of a LoCoMo conversation). The features
//! come from `retrieval_svc::lab::features`, the function the gateway runs;
//! the weights and threshold are fitted so that at most 5 % of answerable
//! questions are flagged, and judged leave-one-dataset-out (fitted on
//! LoCoMo, scored on 2Wiki, and the other way round).

use engram_proto::RetrieveRequest;
use engram_stack::client::Client;
use futures::StreamExt;
use retrieval_svc::lab::{Calibration, Features, features, nothing_relevant, score};

/// Most answerable questions a calibration may flag.
pub const MAX_ANSWERABLE_FLAGGED: f64 = 0.05;
const GRID: [f32; 4] = [0.0, 0.5, 1.0, 2.0];

/// One question asked of one tenant.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub dataset: &'static str,
    pub answerable: bool,
    pub features: Features,
    pub records: usize,
}

/// Asks `questions` of the tenant behind `client`; one row each.
pub async fn collect(
    client: &Client,
    dataset: &'static str,
    answerable: bool,
    questions: &[String],
) -> anyhow::Result<Vec<Row>> {
    let rows: Vec<anyhow::Result<Row>> = futures::stream::iter(questions)
        .map(|q| {
            let mut c = client.clone();
            async move {
                let req = RetrieveRequest {
                    text: q.clone(),
                    limit: Some(10),
                    no_cache: true,
                    ..Default::default()
                };
                let r = c.retrieval.retrieve(req).await?.into_inner();
                anyhow::Ok(Row {
                    dataset,
                    answerable,
                    features: features(q, &r.records),
                    records: r.records.len(),
                })
            }
        })
        .buffered(4)
        .collect()
        .await;
    rows.into_iter().collect()
}

fn flagged(rows: &[&Row], c: &Calibration) -> f64 {
    let n = rows
        .iter()
        .filter(|r| nothing_relevant(&r.features, score(&r.features, c), r.records, c))
        .count();
    n as f64 / rows.len().max(1) as f64
}

/// The threshold that flags at most 5 % of the answerable rows under these
/// weights: just at their 5th-percentile score.
fn threshold_for(answerable: &[&Row], w: [f32; 3]) -> f32 {
    let c = Calibration {
        names: w[0],
        terms: w[1],
        cosine: w[2],
        threshold: 0.0,
    };
    let mut scores: Vec<f32> = answerable.iter().map(|r| score(&r.features, &c)).collect();
    scores.sort_by(f32::total_cmp);
    let allowed = (scores.len() as f64 * MAX_ANSWERABLE_FLAGGED).floor() as usize;
    scores.get(allowed).copied().unwrap_or(0.0)
}

/// Weights and threshold that flag the most foreign rows while flagging at
/// most 5 % of answerable ones; ties keep the earlier grid point.
pub fn fit(rows: &[&Row]) -> Calibration {
    let answerable: Vec<&Row> = rows.iter().copied().filter(|r| r.answerable).collect();
    let foreign: Vec<&Row> = rows.iter().copied().filter(|r| !r.answerable).collect();
    let mut best = (
        f64::NEG_INFINITY,
        Calibration {
            names: 1.0,
            terms: 1.0,
            cosine: 1.0,
            threshold: 0.0,
        },
    );
    for &names in &GRID {
        for &terms in &GRID {
            for &cosine in &GRID {
                if names + terms + cosine == 0.0 {
                    continue;
                }
                let w = [names, terms, cosine];
                let c = Calibration {
                    names,
                    terms,
                    cosine,
                    threshold: threshold_for(&answerable, w),
                };
                let caught = flagged(&foreign, &c);
                if caught > best.0 + 1e-12 {
                    best = (caught, c);
                }
            }
        }
    }
    best.1
}

fn rates(rows: &[&Row], c: &Calibration) -> serde_json::Value {
    let answerable: Vec<&Row> = rows.iter().copied().filter(|r| r.answerable).collect();
    let foreign: Vec<&Row> = rows.iter().copied().filter(|r| !r.answerable).collect();
    let pct = |x: f64| (x * 1000.0).round() / 10.0;
    serde_json::json!({
        "answerable": answerable.len(),
        "foreign": foreign.len(),
        "answerable_flagged_pct": pct(flagged(&answerable, c)),
        "foreign_flagged_pct": pct(flagged(&foreign, c)),
    })
}

fn calibration_json(c: &Calibration) -> serde_json::Value {
    serde_json::json!({
        "names_weight": c.names, "terms_weight": c.terms,
        "cosine_weight": c.cosine, "threshold": (c.threshold * 1000.0).round() / 1000.0,
    })
}

/// In-sample and leave-one-dataset-out rates, the configured calibration's
/// rates, and the calibration fitted on everything (what to ship).
pub fn report(rows: &[Row], configured: &Calibration) -> serde_json::Value {
    let all: Vec<&Row> = rows.iter().collect();
    let fitted = fit(&all);
    let mut sets: Vec<&'static str> = rows.iter().map(|r| r.dataset).collect();
    sets.sort_unstable();
    sets.dedup();
    let mut cross = serde_json::Map::new();
    let mut configured_by = serde_json::Map::new();
    for name in &sets {
        let train: Vec<&Row> = rows.iter().filter(|r| r.dataset != *name).collect();
        let test: Vec<&Row> = rows.iter().filter(|r| r.dataset == *name).collect();
        let fold = fit(&train);
        cross.insert(
            name.to_string(),
            serde_json::json!({"fit_on_others": calibration_json(&fold), "rates": rates(&test, &fold)}),
        );
        configured_by.insert(name.to_string(), rates(&test, configured));
    }
    serde_json::json!({
        "fitted_on_all": calibration_json(&fitted),
        "in_sample": rates(&all, &fitted),
        "cross_fitted": cross,
        "configured": {"calibration": calibration_json(configured), "by_dataset": configured_by},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(dataset: &'static str, answerable: bool, names: f32) -> Row {
        Row {
            dataset,
            answerable,
            features: Features {
                names,
                terms: 0.5,
                cosine: 0.4,
                shape_missing: false,
            },
            records: 10,
        }
    }

    #[test]
    fn the_fit_keeps_answerable_flags_at_five_percent_and_separates_by_names() {
        let mut rows: Vec<Row> = (0..100).map(|_| row("a", true, 1.0)).collect();
        rows.extend((0..100).map(|_| row("a", false, 0.0)));
        let all: Vec<&Row> = rows.iter().collect();
        let c = fit(&all);
        let r = rates(&all, &c);
        assert!(
            r["answerable_flagged_pct"].as_f64().unwrap_or(100.0) <= 5.0,
            "{r}"
        );
        assert_eq!(r["foreign_flagged_pct"].as_f64(), Some(100.0), "{r}");
        // Deterministic.
        assert_eq!(fit(&all), c);
    }
}
