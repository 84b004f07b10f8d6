//! `engram eval updates`: precision and recall of write-time update
//! detection (`search_svc::updates::judge`, issue 21) on the labelled pairs
//! of `lab/data/updates_dev.jsonl` (written by `make_updates_dev.py`). Every
//! text is embedded with the real embedder search-svc uses, the pair's
//! cosine goes to `judge` exactly as the write path passes it, at
//! `search.update_threshold` and over a sweep.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::Context;
use engram_common::Settings;
use search_svc::embed::Embeddings;
use search_svc::updates::{Pair, judge};
use serde::Deserialize;

/// The committed dev set, used when no `--data` is given.
const DEV_SET: &str = include_str!("../data/updates_dev.jsonl");

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
const ERRORS_SHOWN: usize = 4;

/// The sweep's thresholds: 0.50, 0.55, …, 0.80.
fn sweep() -> Vec<f32> {
    (0..=6).map(|i| 0.5 + 0.05 * i as f32).collect()
}

/// Scores every pair (cosine given) at `threshold`: overall, per domain and
/// per kind.
pub fn tally(
    pairs: &[Labelled],
    cosines: &[f32],
    threshold: f32,
) -> (Counts, BTreeMap<String, Counts>, BTreeMap<String, Counts>) {
    let mut all = Counts::default();
    let mut domains: BTreeMap<String, Counts> = BTreeMap::new();
    let mut kinds: BTreeMap<String, Counts> = BTreeMap::new();
    for (p, &cosine) in pairs.iter().zip(cosines) {
        let pair = Pair {
            new: &p.new,
            old: &p.old,
            cosine,
        };
        let detected = judge(pair, threshold).is_some();
        all.add(p.update, detected);
        domains
            .entry(p.domain.clone())
            .or_default()
            .add(p.update, detected);
        kinds
            .entry(p.kind.clone())
            .or_default()
            .add(p.update, detected);
    }
    (all, domains, kinds)
}

pub fn report(pairs: &[Labelled], cosines: &[f32], threshold: f32) -> serde_json::Value {
    let (all, domains, kinds) = tally(pairs, cosines, threshold);
    let map = |m: &BTreeMap<String, Counts>| {
        m.iter()
            .map(|(k, c)| (k.clone(), c.json()))
            .collect::<serde_json::Map<_, _>>()
    };
    let sweep: Vec<serde_json::Value> = sweep()
        .into_iter()
        .map(|t| {
            let (c, d, _) = tally(pairs, cosines, t);
            let mut row = c.json();
            row["threshold"] = serde_json::json!((f64::from(t) * 100.0).round() / 100.0);
            row["by_domain"] = serde_json::Value::Object(
                d.iter()
                    .map(|(k, c)| {
                        let r3 = |x: Option<f64>| x.map(|v| (v * 1000.0).round() / 1000.0);
                        (
                            k.clone(),
                            serde_json::json!({"precision": r3(c.precision()), "recall": r3(c.recall())}),
                        )
                    })
                    .collect(),
            );
            row
        })
        .collect();
    let mean = |f: &dyn Fn(&Labelled) -> bool| {
        let v: Vec<f32> = pairs
            .iter()
            .zip(cosines)
            .filter(|(p, _)| f(p))
            .map(|(_, c)| *c)
            .collect();
        (f64::from(v.iter().sum::<f32>()) / v.len().max(1) as f64 * 1000.0).round() / 1000.0
    };
    // A few wrong verdicts per kind at the configured threshold, to read.
    let mut errors: BTreeMap<&str, Vec<serde_json::Value>> = BTreeMap::new();
    for (p, &cosine) in pairs.iter().zip(cosines) {
        let pair = Pair {
            new: &p.new,
            old: &p.old,
            cosine,
        };
        let verdict = judge(pair, threshold);
        let shown = errors.entry(p.kind.as_str()).or_default();
        if verdict.is_some() != p.update && shown.len() < ERRORS_SHOWN {
            shown.push(serde_json::json!({
                "old": p.old, "new": p.new, "update": p.update,
                "cosine": (f64::from(cosine) * 1000.0).round() / 1000.0,
                "score": verdict.map(|v| (f64::from(v.score) * 1000.0).round() / 1000.0),
            }));
        }
    }
    errors.retain(|_, v| !v.is_empty());
    serde_json::json!({
        "dataset": "updates",
        "threshold": (f64::from(threshold) * 1000.0).round() / 1000.0,
        "overall": all.json(),
        "by_domain": map(&domains),
        "by_kind": map(&kinds),
        "mean_cosine": {"updates": mean(&|p| p.update), "non_updates": mean(&|p| !p.update)},
        "sweep": sweep,
        "errors": errors,
    })
}

/// `engram eval updates [--data F] [--json]`.
pub async fn run(settings: Settings, data_opt: Option<&Path>, json: bool) -> anyhow::Result<()> {
    let pairs = match data_opt {
        Some(path) => parse(
            &std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
        )?,
        None => parse(DEV_SET)?,
    };
    let threshold = settings.search.update_threshold;
    let embeddings = tokio::task::spawn_blocking(move || Embeddings::load_blocking(&settings))
        .await
        .context("loading the embedder")?;
    anyhow::ensure!(
        embeddings.is_ready(),
        "the embedding model is not available"
    );
    let mut texts: Vec<String> = pairs
        .iter()
        .flat_map(|p| [p.old.clone(), p.new.clone()])
        .collect();
    texts.sort();
    texts.dedup();
    // The text the write path embeds for a memory without a title.
    let inputs = texts
        .iter()
        .map(|t| search_svc::validate::embedding_text("", t))
        .collect();
    let vectors = embeddings.embed(inputs).await?;
    let by_text: HashMap<&str, &[f32]> = texts
        .iter()
        .map(String::as_str)
        .zip(vectors.iter().map(Vec::as_slice))
        .collect();
    let cosines: Vec<f32> = pairs
        .iter()
        .map(|p| cosine(by_text[p.old.as_str()], by_text[p.new.as_str()]))
        .collect();
    let report = report(&pairs, &cosines, threshold);
    if json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
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
        let (all, domains, _) = tally(&pairs, &[0.6, 0.99], 0.55);
        assert_eq!(
            all,
            Counts {
                tp: 1,
                tn: 1,
                ..Default::default()
            }
        );
        assert_eq!(domains["places"], all);
        assert_eq!(sweep().len(), 7);
    }
}
