//! `engram eval updates`: precision and recall of write-time update
//! detection (`search_svc::updates`, issue 21) on labelled pairs. Every text
//! is embedded with the real embedder search-svc uses and the pair's
//! features are computed exactly as on the write path, at
//! `search.update_threshold` and over a sweep.
//!
//! Three figures, because the detector is fitted: the shipped model on the
//! dev set it was fitted on (`lab/data/updates_dev.jsonl`, in-sample),
//! models fitted without each dev domain and scored on it
//! (leave-one-domain-out), and the shipped model on the held-out set
//! (`lab/data/updates_holdout.jsonl`: other domains, written by someone who
//! saw neither the detector nor the dev templates). `--fit` prints a model
//! fitted on the dev set as the Rust source of `updates::MODEL`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use anyhow::Context;
use engram_common::Settings;
use engram_stack::outln;
use linfa::prelude::*;
use linfa_logistic::LogisticRegression;
use ndarray_linfa::{Array1, Array2};
use search_svc::embed::Embeddings;
use search_svc::updates::{FEATURES, MODEL, Model, Pair, features};
use serde::Deserialize;

/// The committed dev set, used when no `--data` is given.
const DEV_SET: &str = include_str!("../data/updates_dev.jsonl");

/// Pairs written apart from the dev set and the detector (other domains,
/// other wording; `make_updates_holdout.py`), never fitted on: the
/// detector's honest figure. Keep it out of every fit.
const HELD_OUT_SET: &str = include_str!("../data/updates_holdout.jsonl");

/// One labelled pair.
#[derive(Debug, Clone, Deserialize)]
pub struct Labelled {
    pub domain: String,
    #[serde(default)]
    pub kind: String,
    pub old: String,
    pub new: String,
    pub update: bool,
}

/// Detection outcomes against the labels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub tp: usize,
    pub fp: usize,
    pub fn_: usize,
    pub tn: usize,
}

impl Counts {
    pub fn add(&mut self, label: bool, detected: bool) {
        match (label, detected) {
            (true, true) => self.tp += 1,
            (false, true) => self.fp += 1,
            (true, false) => self.fn_ += 1,
            (false, false) => self.tn += 1,
        }
    }

    /// Of the detected pairs, the share that are updates (None: none detected).
    pub fn precision(&self) -> Option<f64> {
        ratio(self.tp, self.tp + self.fp)
    }

    /// Of the updates, the share detected (None: no updates).
    pub fn recall(&self) -> Option<f64> {
        ratio(self.tp, self.tp + self.fn_)
    }

    pub fn f1(&self) -> Option<f64> {
        let (p, r) = (self.precision()?, self.recall()?);
        (p + r > 0.0).then(|| 2.0 * p * r / (p + r))
    }

    fn json(&self) -> serde_json::Value {
        let r3 = |x: Option<f64>| x.map(|v| (v * 1000.0).round() / 1000.0);
        serde_json::json!({
            "pairs": self.tp + self.fp + self.fn_ + self.tn,
            "updates": self.tp + self.fn_,
            "precision": r3(self.precision()),
            "recall": r3(self.recall()),
            "f1": r3(self.f1()),
            "tp": self.tp, "fp": self.fp, "fn": self.fn_, "tn": self.tn,
        })
    }
}

fn ratio(num: usize, den: usize) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

pub fn parse(text: &str) -> anyhow::Result<Vec<Labelled>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("line {}", i + 1)))
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

/// Wrong verdicts shown per kind.
const ERRORS_SHOWN: usize = 8;

/// The L2 penalty of the detector's logistic fit (on standardised features).
const ALPHA: f64 = 1.0;

/// The sweep's probability thresholds: 0.30, 0.35, …, 0.80.
fn sweep() -> Vec<f32> {
    (0..=10).map(|i| 0.3 + 0.05 * i as f32).collect()
}

/// Every pair's features (None: it cannot be an update, see `features`).
pub fn feature_rows(pairs: &[Labelled], cosines: &[f32]) -> Vec<Option<[f32; FEATURES.len()]>> {
    (pairs.iter().zip(cosines))
        .map(|(p, &cosine)| {
            features(Pair {
                new: &p.new,
                old: &p.old,
                cosine,
            })
        })
        .collect()
}

/// Fits the detector's logistic model on the pairs `train` selects.
pub fn fit(
    pairs: &[Labelled],
    rows: &[Option<[f32; FEATURES.len()]>],
    train: impl Fn(&Labelled) -> bool,
) -> anyhow::Result<Model> {
    let chosen: Vec<(&[f32; FEATURES.len()], bool)> = (pairs.iter().zip(rows))
        .filter(|(p, _)| train(p))
        .filter_map(|(p, r)| r.as_ref().map(|r| (r, p.update)))
        .collect();
    anyhow::ensure!(
        chosen.iter().any(|c| c.1) && chosen.iter().any(|c| !c.1),
        "the detector needs updates and non-updates to fit on"
    );
    let n = FEATURES.len();
    let count = chosen.len() as f64;
    let mean: Vec<f64> = (0..n)
        .map(|j| chosen.iter().map(|c| f64::from(c.0[j])).sum::<f64>() / count)
        .collect();
    let scale: Vec<f64> = (0..n)
        .map(|j| {
            let var = chosen
                .iter()
                .map(|c| (f64::from(c.0[j]) - mean[j]).powi(2))
                .sum::<f64>();
            (var / count).sqrt().max(1e-6)
        })
        .collect();
    let x = Array2::from_shape_fn((chosen.len(), n), |(i, j)| {
        (f64::from(chosen[i].0[j]) - mean[j]) / scale[j]
    });
    let y = Array1::from_iter(chosen.iter().map(|c| if c.1 { "update" } else { "other" }));
    let fitted = LogisticRegression::default()
        .alpha(ALPHA)
        .max_iterations(500)
        .fit(&Dataset::new(x, y))
        .context("logistic regression did not fit")?;
    // linfa's positive class is the label it sorted second; orient the
    // weights so that a higher score means "update".
    let sign = if fitted.labels().pos.class == "update" {
        1.0
    } else {
        -1.0
    };
    // Fold the standardisation into the weights: the write path scores raw
    // features.
    let mut weights = [0.0f32; FEATURES.len()];
    let mut intercept = sign * fitted.intercept();
    for (j, w) in fitted.params().iter().enumerate() {
        weights[j] = (sign * w / scale[j]) as f32;
        intercept -= sign * w * mean[j] / scale[j];
    }
    Ok(Model {
        weights,
        intercept: intercept as f32,
    })
}

/// Each pair's probability under `model` (0 for a pair that cannot be one).
fn scores_of(model: &Model, rows: &[Option<[f32; FEATURES.len()]>]) -> Vec<f32> {
    rows.iter()
        .map(|r| r.as_ref().map_or(0.0, |x| model.probability(x)))
        .collect()
}

/// Cross-fitted scores: each domain's pairs scored by a model fitted on the
/// other domains only (leave-one-domain-out).
pub fn cross_fitted_scores(
    pairs: &[Labelled],
    rows: &[Option<[f32; FEATURES.len()]>],
) -> anyhow::Result<Vec<f32>> {
    let domains: BTreeSet<&str> = pairs.iter().map(|p| p.domain.as_str()).collect();
    let mut scores = vec![0.0; pairs.len()];
    for domain in domains {
        let model = fit(pairs, rows, |p| p.domain != domain)?;
        let held_out = scores_of(&model, rows);
        for (i, p) in pairs.iter().enumerate() {
            if p.domain == domain {
                scores[i] = held_out[i];
            }
        }
    }
    Ok(scores)
}

/// Outcomes at `threshold`: overall, per domain and per kind.
pub fn tally(
    pairs: &[Labelled],
    scores: &[f32],
    threshold: f32,
) -> (Counts, BTreeMap<String, Counts>, BTreeMap<String, Counts>) {
    let mut all = Counts::default();
    let mut domains: BTreeMap<String, Counts> = BTreeMap::new();
    let mut kinds: BTreeMap<String, Counts> = BTreeMap::new();
    for (p, &score) in pairs.iter().zip(scores) {
        let detected = score >= threshold;
        all.add(p.update, detected);
        (domains.entry(p.domain.clone()).or_default()).add(p.update, detected);
        (kinds.entry(p.kind.clone()).or_default()).add(p.update, detected);
    }
    (all, domains, kinds)
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// One way of scoring the pairs, at `threshold` and over the sweep, with a
/// few wrong verdicts per kind to read.
pub fn scored_report(pairs: &[Labelled], scores: &[f32], threshold: f32) -> serde_json::Value {
    let (all, domains, kinds) = tally(pairs, scores, threshold);
    let map = |m: &BTreeMap<String, Counts>| {
        (m.iter().map(|(k, c)| (k.clone(), c.json()))).collect::<serde_json::Map<_, _>>()
    };
    let sweep: Vec<serde_json::Value> = (sweep().into_iter())
        .map(|t| {
            let (c, d, _) = tally(pairs, scores, t);
            let mut row = c.json();
            row["threshold"] = serde_json::json!(r3(f64::from(t)));
            row["by_domain"] = serde_json::Value::Object(
                (d.iter())
                    .map(|(k, c)| {
                        let p = c.precision().map(r3);
                        let r = c.recall().map(r3);
                        (k.clone(), serde_json::json!({"precision": p, "recall": r}))
                    })
                    .collect(),
            );
            row
        })
        .collect();
    let mut errors: BTreeMap<&str, Vec<serde_json::Value>> = BTreeMap::new();
    for (p, &score) in pairs.iter().zip(scores) {
        let shown = errors.entry(p.kind.as_str()).or_default();
        if (score >= threshold) != p.update && shown.len() < ERRORS_SHOWN {
            shown.push(serde_json::json!({
                "old": p.old, "new": p.new, "update": p.update, "score": r3(f64::from(score)),
            }));
        }
    }
    errors.retain(|_, v| !v.is_empty());
    serde_json::json!({
        "overall": all.json(),
        "by_domain": map(&domains),
        "by_kind": map(&kinds),
        "sweep": sweep,
        "errors": errors,
    })
}

/// The shipped model on every pair, and (when the pairs span several
/// domains) models fitted without each pair's domain.
pub fn report(
    pairs: &[Labelled],
    cosines: &[f32],
    threshold: f32,
) -> anyhow::Result<serde_json::Value> {
    let rows = feature_rows(pairs, cosines);
    let shipped = scores_of(&MODEL, &rows);
    let mean = |f: &dyn Fn(&Labelled) -> bool| {
        let v: Vec<f32> = (pairs.iter().zip(cosines))
            .filter(|(p, _)| f(p))
            .map(|(_, c)| *c)
            .collect();
        r3(f64::from(v.iter().sum::<f32>()) / v.len().max(1) as f64)
    };
    let domains: BTreeSet<&str> = pairs.iter().map(|p| p.domain.as_str()).collect();
    let cross = if domains.len() > 1 {
        scored_report(pairs, &cross_fitted_scores(pairs, &rows)?, threshold)
    } else {
        serde_json::Value::Null
    };
    Ok(serde_json::json!({
        "dataset": "updates",
        "threshold": r3(f64::from(threshold)),
        "shipped_model": scored_report(pairs, &shipped, threshold),
        "leave_one_domain_out": cross,
        "mean_cosine": {"updates": mean(&|p| p.update), "non_updates": mean(&|p| !p.update)},
    }))
}

/// The Rust source of a fitted model, to paste over `updates::MODEL`.
pub fn model_source(model: &Model) -> String {
    let weights: Vec<String> = model.weights.iter().map(|w| format!("{w:.3}")).collect();
    format!(
        "pub const MODEL: Model = Model {{\n    weights: [{}],\n    intercept: {:.3},\n}};",
        weights.join(", "),
        model.intercept
    )
}

/// Every distinct text of the dev and held-out pairs, in file order: short
/// facts for `engram bench`'s fact ingest figure.
pub fn fact_texts() -> anyhow::Result<Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for p in parse(DEV_SET)?.into_iter().chain(parse(HELD_OUT_SET)?) {
        for text in [p.old, p.new] {
            if seen.insert(text.clone()) {
                out.push(text);
            }
        }
    }
    Ok(out)
}

/// Every pair's cosine, embedded as the write path embeds a memory
/// without a title.
async fn cosines_of(embeddings: &Embeddings, pairs: &[Labelled]) -> anyhow::Result<Vec<f32>> {
    let mut texts: Vec<String> = (pairs.iter())
        .flat_map(|p| [p.old.clone(), p.new.clone()])
        .collect();
    texts.sort();
    texts.dedup();
    let inputs = (texts.iter())
        .map(|t| search_svc::validate::embedding_text("", t))
        .collect();
    let vectors = embeddings.embed_batch("(lab)", inputs).await?;
    let by_text: HashMap<&str, &[f32]> = (texts.iter().map(String::as_str))
        .zip(vectors.iter().map(Vec::as_slice))
        .collect();
    Ok((pairs.iter())
        .map(|p| cosine(by_text[p.old.as_str()], by_text[p.new.as_str()]))
        .collect())
}

fn dump(path: &Path, pairs: &[Labelled], cosines: &[f32]) -> anyhow::Result<()> {
    let lines: Vec<String> = (pairs.iter().zip(cosines))
        .map(|(p, c)| {
            serde_json::json!({"domain": p.domain, "kind": p.kind, "old": p.old,
                "new": p.new, "update": p.update, "cosine": c})
            .to_string()
        })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n")
        .with_context(|| format!("cannot write {}", path.display()))
}

/// `engram eval updates [--data F] [--json] [--dump F] [--fit]`: without
/// `--data`, the dev set (shipped model and leave-one-domain-out) and the
/// shipped model on the held-out set, which no fit has seen.
pub async fn run(
    settings: Settings,
    data_opt: Option<&Path>,
    json: bool,
    dump_opt: Option<&Path>,
    fit_out: bool,
) -> anyhow::Result<()> {
    let pairs = match data_opt {
        Some(path) => parse(
            &std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
        )?,
        None => parse(DEV_SET)?,
    };
    let held_out = match data_opt {
        Some(_) => Vec::new(),
        None => parse(HELD_OUT_SET)?,
    };
    let threshold = settings.search.update_threshold;
    let embeddings = tokio::task::spawn_blocking(move || Embeddings::load_blocking(&settings))
        .await
        .context("loading the embedder")?;
    anyhow::ensure!(
        embeddings.is_ready(),
        "the embedding model is not available"
    );
    let cosines = cosines_of(&embeddings, &pairs).await?;
    if let Some(path) = dump_opt {
        dump(path, &pairs, &cosines)?;
    }
    if fit_out {
        let model = fit(&pairs, &feature_rows(&pairs, &cosines), |_| true)?;
        eprintln!("{}", model_source(&model));
    }
    let mut report = report(&pairs, &cosines, threshold)?;
    if !held_out.is_empty() {
        let held_out_cosines = cosines_of(&embeddings, &held_out).await?;
        let scores = scores_of(&MODEL, &feature_rows(&held_out, &held_out_cosines));
        report["held_out"] = scored_report(&held_out, &scores, threshold);
    }
    if json {
        outln!("{report}")?;
    } else {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precision_and_recall_count_the_right_cells() {
        let mut c = Counts::default();
        for (label, detected) in [
            (true, true),
            (true, true),
            (true, true),
            (true, false),
            (false, true),
            (false, false),
            (false, false),
        ] {
            c.add(label, detected);
        }
        assert_eq!(
            c,
            Counts {
                tp: 3,
                fp: 1,
                fn_: 1,
                tn: 2
            }
        );
        assert_eq!(c.precision(), Some(0.75));
        assert_eq!(c.recall(), Some(0.75));
        assert_eq!(c.f1(), Some(0.75));
        assert_eq!(Counts::default().precision(), None, "nothing detected");
        let only_negatives = Counts {
            tn: 4,
            ..Default::default()
        };
        assert_eq!(only_negatives.recall(), None, "no updates to find");
    }

    #[test]
    fn the_committed_dev_set_parses_and_has_both_labels_per_domain() {
        let pairs = parse(DEV_SET).expect("parses");
        assert!(pairs.len() >= 300);
        let mut seen: BTreeMap<&str, (bool, bool)> = BTreeMap::new();
        for p in &pairs {
            let e = seen.entry(p.domain.as_str()).or_default();
            if p.update {
                e.0 = true;
            } else {
                e.1 = true;
            }
        }
        assert!(seen.len() >= 6);
        assert!(seen.values().all(|&(pos, neg)| pos && neg));
    }

    #[test]
    fn the_report_tallies_judge_verdicts() {
        let pairs = parse(
            r#"{"domain":"places","kind":"cue","old":"Priya lives in Berlin.","new":"Priya moved to Amsterdam.","update":true}
{"domain":"places","kind":"restate","old":"Priya lives in Berlin.","new":"Priya lives in Berlin.","update":false}"#,
        )
        .expect("parses");
        let rows = feature_rows(&pairs, &[0.73, 0.99]);
        assert!(
            rows[1].is_some_and(|x| x[9] == 1.0 && x[10] == 1.0),
            "nothing changed"
        );
        let (all, domains, _) = tally(&pairs, &scores_of(&MODEL, &rows), 0.6);
        assert_eq!(
            all,
            Counts {
                tp: 1,
                tn: 1,
                ..Default::default()
            }
        );
        assert_eq!(domains["places"], all);
        assert_eq!(sweep().len(), 11);
    }
}
