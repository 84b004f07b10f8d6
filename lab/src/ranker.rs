//! Fitting the learned Stage 4 ranker (retrieval-svc `pipeline::ranker`) on
//! the dev halves, and judging it leave-one-dataset-out: a model is fitted
//! on three data sets and scored on the fourth, beside the routed fusion
//! it would replace. Candidates are the routed fusion's top [`POOL`], what
//! the gateway hands Stage 4 at the default limit; features come from the
//! gateway's own function.
//!
//! The model is an L2-regularised logistic regression (linfa-logistic)
//! over standardised features, every candidate a row labelled by whether
//! it is gold. Deterministic: L-BFGS from zero, no sampling.

use std::collections::{BTreeMap, HashMap};

use anyhow::Context;
use engram_common::settings::FusionWeights;
use linfa::prelude::*;
use linfa_logistic::LogisticRegression;
use ndarray_linfa::{Array1, Array2};
use retrieval_svc::lab::{
    Model, RANK_FEATURES, RankRow, RankSignals, Ranker, rank_features, rank_fusion, weights_for,
};

use crate::eval::Part;
use crate::tune::Sample;

/// Fused candidates per question that reach Stage 4 (the gateway's pool at
/// limit 10 with the default rerank_top_n 10: max(limit, rerank_top_n) × 2).
pub const POOL: usize = 20;
/// L2 strength; fixed rather than fitted (one more knob graded on itself).
const ALPHA: f64 = 1.0;
/// The features the shipped model uses: the fused rank and the multi-hop
/// bridge. Leave-one-dataset-out, adding per-strategy ranks, scores,
/// coverage or length cost recall on the held-out set (they fit how each
/// corpus looks, not what relevance is; docs/benchmarks.md, "Stage 4").
pub const SHIPPED: [&str; 2] = ["fused_rr", "linked_from_top"];

/// One question's candidates with their features and gold.
#[derive(Debug, Clone)]
pub struct Labelled {
    pub dataset: &'static str,
    /// Corpus indices, fused order.
    pub docs: Vec<usize>,
    pub rows: Vec<RankRow>,
    pub gold: Vec<usize>,
}

/// The routed fusion's top [`POOL`] of `s` with each candidate's signals,
/// built exactly as Stage 2 builds them (rank_fusion over the weighted lists).
pub fn label(s: &Sample, part: &Part, weights: &FusionWeights, default_k: f32) -> Labelled {
    let w = weights_for(weights, s.route);
    let k = w.rrf_k_opt.unwrap_or(default_k);
    let lists = [w.vector, w.keyword, w.graph]
        .into_iter()
        .zip(&s.lists)
        .map(|(wi, l)| (wi, l.iter().copied()));
    let fused: Vec<usize> = rank_fusion(lists, k)
        .into_iter()
        .take(POOL)
        .map(|(d, _, _)| d)
        .collect();
    let hit = |slot: usize, doc: usize| {
        let pos = s.lists[slot].iter().position(|&d| d == doc)?;
        Some((
            pos as u32 + 1,
            s.scores[slot].get(pos).copied().unwrap_or(0.0),
        ))
    };
    let empty = crate::eval::Doc::default();
    let signals: Vec<RankSignals<'_>> = fused
        .iter()
        .enumerate()
        .map(|(pos, &doc)| {
            let d = part.docs.get(doc).unwrap_or(&empty);
            RankSignals {
                hits: [hit(0, doc), hit(1, doc), hit(2, doc)],
                fused_pos: pos,
                title: &d.title,
                content: &d.text,
                speaker: d.turn_opt.as_ref().map_or("", |t| t.speaker.as_str()),
            }
        })
        .collect();
    Labelled {
        dataset: s.dataset,
        rows: rank_features(&s.question, &signals),
        docs: fused,
        gold: s.gold.clone(),
    }
}

/// Every sample labelled, each with its own part's corpus.
pub fn label_all(
    samples: &[Sample],
    parts: &[&Part],
    weights: &FusionWeights,
    default_k: f32,
) -> anyhow::Result<Vec<Labelled>> {
    let by_tenant: HashMap<&str, &Part> = parts.iter().map(|p| (p.tenant.as_str(), *p)).collect();
    samples
        .iter()
        .map(|s| {
            let part = by_tenant
                .get(s.tenant.as_str())
                .with_context(|| format!("no corpus for tenant {}", s.tenant))?;
            Ok(label(s, part, weights, default_k))
        })
        .collect()
}

/// What a fit is asked for: which features, and the model's name.
pub struct FitSpec<'a> {
    pub features: &'a [&'a str],
    pub version: &'a str,
    pub trained_on: &'a str,
    /// The model scores nothing above the fusion's #1 (the dev-fitted
    /// models; see `Model::keep_fused_first`).
    pub keep_fused_first: bool,
}

/// Fits a model on `train` over `spec.features`.
pub fn fit(train: &[&Labelled], spec: &FitSpec<'_>) -> anyhow::Result<Ranker> {
    let cols: Vec<usize> = (spec.features.iter())
        .map(|f| RANK_FEATURES.iter().position(|n| n == f))
        .collect::<Option<_>>()
        .context("unknown ranker feature")?;
    let n = cols.len();
    let rows: Vec<Vec<f32>> = (train.iter())
        .flat_map(|l| &l.rows)
        .map(|r| cols.iter().map(|&c| r[c]).collect())
        .collect();
    anyhow::ensure!(!rows.is_empty(), "nothing to fit the ranker on");
    let mut mean = vec![0.0f64; n];
    for r in &rows {
        for (m, x) in mean.iter_mut().zip(r.iter()) {
            *m += f64::from(*x);
        }
    }
    mean.iter_mut().for_each(|m| *m /= rows.len() as f64);
    let mut scale = vec![0.0f64; n];
    for r in &rows {
        for ((s, x), m) in scale.iter_mut().zip(r.iter()).zip(&mean) {
            *s += (f64::from(*x) - m).powi(2);
        }
    }
    scale
        .iter_mut()
        .for_each(|s| *s = (*s / rows.len() as f64).sqrt().max(1e-6));
    let x = Array2::from_shape_fn((rows.len(), n), |(i, j)| {
        (f64::from(rows[i][j]) - mean[j]) / scale[j]
    });
    let labels: Vec<&'static str> = train
        .iter()
        .flat_map(|l| {
            l.docs
                .iter()
                .map(|d| if l.gold.contains(d) { "gold" } else { "other" })
        })
        .collect();
    let y = Array1::from(labels);
    let data = Dataset::new(x, y);
    let fitted = LogisticRegression::default()
        .alpha(ALPHA)
        .max_iterations(200)
        .fit(&data)
        .context("logistic regression did not fit")?;
    // linfa's positive class is the label it sorted second; orient the
    // weights so a higher score means "gold".
    let sign = if fitted.labels().pos.class == "gold" {
        1.0
    } else {
        -1.0
    };
    let model = Model {
        version: spec.version.to_string(),
        features: spec.features.iter().map(|s| s.to_string()).collect(),
        mean: mean.iter().map(|&m| m as f32).collect(),
        scale: scale.iter().map(|&s| s as f32).collect(),
        weights: fitted.params().iter().map(|&w| (sign * w) as f32).collect(),
        intercept: (sign * fitted.intercept()) as f32,
        trained_on: spec.trained_on.to_string(),
        keep_fused_first: spec.keep_fused_first,
    };
    Ok(Ranker::new(model)?)
}

/// The candidates of `l` in the model's order (stable: ties keep fusion order).
pub fn order(l: &Labelled, model: &Ranker) -> Vec<usize> {
    let mut scored: Vec<(usize, f32)> = model.scores(&l.rows).into_iter().enumerate().collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scored.into_iter().map(|(i, _)| l.docs[i]).collect()
}

fn recall_json(ls: &[&Labelled], ranked: impl Fn(&Labelled) -> Vec<usize>) -> serde_json::Value {
    crate::tune::recall_json(ls, |l| l.gold.clone(), |l| ranked(l))
}

fn mean_quality(ls: &[&Labelled], ranked: impl Fn(&Labelled) -> Vec<usize>) -> f64 {
    let per = |l: &&Labelled| crate::tune::quality(&ranked(l), &l.gold);
    ls.iter().map(per).sum::<f64>() / ls.len().max(1) as f64
}

/// Leave-one-dataset-out: per data set, the fusion order and the model
/// over `features` fitted on the other three; `choice` is "learned" only
/// when the cross-fitted model is at least the fusion on every data set.
pub fn cross_fitted(labelled: &[Labelled], features: &[&str]) -> anyhow::Result<serde_json::Value> {
    let mut names: Vec<&'static str> = labelled.iter().map(|l| l.dataset).collect();
    names.sort_unstable();
    names.dedup();
    let mut out = BTreeMap::new();
    let mut wins = 0;
    for name in &names {
        let train: Vec<&Labelled> = labelled.iter().filter(|l| l.dataset != *name).collect();
        let test: Vec<&Labelled> = labelled.iter().filter(|l| l.dataset == *name).collect();
        let version = format!("lodo-{name}");
        let spec = FitSpec {
            features,
            version: &version,
            trained_on: "",
            keep_fused_first: true,
        };
        let model = fit(&train, &spec)?;
        let fused_q = mean_quality(&test, |l| l.docs.clone());
        let learned_q = mean_quality(&test, |l| order(l, &model));
        if learned_q >= fused_q {
            wins += 1;
        }
        out.insert(
            name.to_string(),
            serde_json::json!({
                "questions": test.len(),
                "fusion": recall_json(&test, |l| l.docs.clone()),
                "learned_cross": recall_json(&test, |l| order(l, &model)),
                "weights": model.model().weights,
            }),
        );
    }
    let choice = if wins == names.len() && wins > 0 {
        "learned"
    } else {
        "fusion"
    };
    let mut v = serde_json::to_value(out)?;
    if let Some(o) = v.as_object_mut() {
        o.insert("choice".into(), serde_json::json!(choice));
    }
    Ok(v)
}

/// Writes the model fitted on every dev set to `path` (what ships), and
/// beside it one per held-out set, fitted without it
/// (`<stem>.lodo-<set>.json`), so `engram eval <set>` with
/// `pipeline.ranker.model_path_opt` set to that file measures the whole
/// pipeline cross-fitted.
pub fn write_models(labelled: &[Labelled], path: &std::path::Path) -> anyhow::Result<()> {
    let mut names: Vec<&'static str> = labelled.iter().map(|l| l.dataset).collect();
    names.sort_unstable();
    names.dedup();
    let day = chrono::Utc::now().format("%Y%m%d");
    let mut folds: Vec<(Option<&str>, std::path::PathBuf)> = vec![(None, path.to_path_buf())];
    let stem = path.with_extension("");
    for name in &names {
        folds.push((Some(name), stem.with_extension(format!("lodo-{name}.json"))));
    }
    for (held_out_opt, file) in folds {
        let train: Vec<&Labelled> = (labelled.iter())
            .filter(|l| held_out_opt != Some(l.dataset))
            .collect();
        let version = match held_out_opt {
            None => format!("engram-ranker-{day}"),
            Some(h) => format!("engram-ranker-{day}-without-{h}"),
        };
        let sets: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| held_out_opt != Some(n))
            .collect();
        let trained_on = format!(
            "engram tune --ranker-out: logistic regression (linfa-logistic, alpha {ALPHA}) \
             over {:?} on the routed fusion's top {POOL} of {} dev questions from {}",
            SHIPPED,
            train.len(),
            sets.join(", ")
        );
        let spec = FitSpec {
            features: &SHIPPED,
            version: &version,
            trained_on: &trained_on,
            keep_fused_first: true,
        };
        let model = fit(&train, &spec)?;
        std::fs::write(&file, serde_json::to_string_pretty(model.model())? + "\n")
            .with_context(|| format!("cannot write {}", file.display()))?;
    }
    Ok(())
}

/// What `engram ranker train` is asked for.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// One tenant's examples only (a per-tenant model); all when unset.
    pub tenant_opt: Option<String>,
    /// Or these tenants' (empty: no such filter).
    pub tenants: Vec<String>,
    /// Only examples written since (an eval's own feedback, not an earlier run's).
    pub since_opt: Option<chrono::DateTime<chrono::Utc>>,
    pub out: std::path::PathBuf,
    /// Fit every feature the gateway computes, not only the two that
    /// transfer across corpora: for a model that serves the data it was
    /// trained on.
    pub all_features: bool,
    /// An identity's answers count at most this many times the median
    /// identity's (at least `MIN_CAP` answers each).
    pub identity_share: f64,
}

/// Answers an identity may always contribute, however few others did.
const MIN_CAP: usize = 50;
/// Examples read per training run, newest first.
const MAX_EXAMPLES: i64 = 500_000;

/// What a training run used and wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TrainReport {
    pub answers: usize,
    pub examples: usize,
    pub identities: usize,
    /// Answers left out by the per-identity cap.
    pub capped: usize,
    pub version: String,
    pub weights: Vec<f32>,
}

/// One answer's stored examples.
struct Answer {
    identity: (String, String),
    rows: Vec<RankRow>,
    relevant: Vec<bool>,
}

type ExampleRow = (String, String, String, Vec<f32>, bool);

/// Trains the Stage 4 ranker from the feedback examples in Postgres
/// (migrations/0003_ranker_examples.sql) and writes it to `opts.out`
/// atomically (a gateway polling the file never reads half of it).
pub async fn train_from_feedback(
    pool: &sqlx::PgPool,
    opts: &TrainOptions,
) -> anyhow::Result<TrainReport> {
    let rows: Vec<ExampleRow> = sqlx::query_as(
        "SELECT tenant_id, agent_id, query_id, features, relevant FROM ranker_examples \
         WHERE ($1::text IS NULL OR tenant_id = $1) \
           AND (cardinality($3::text[]) = 0 OR tenant_id = ANY($3)) \
           AND ($4::timestamptz IS NULL OR created_at >= $4) \
         ORDER BY created_at DESC, id DESC LIMIT $2",
    )
    .bind(&opts.tenant_opt)
    .bind(MAX_EXAMPLES)
    .bind(&opts.tenants)
    .bind(opts.since_opt)
    .fetch_all(pool)
    .await
    .context("cannot read ranker_examples")?;
    let answers = group_answers(rows);
    let (kept, capped) = cap_per_identity(answers, opts.identity_share);
    let labelled: Vec<Labelled> = kept.iter().map(to_labelled).collect();
    let informative: Vec<&Labelled> = (labelled.iter())
        .filter(|l| !l.gold.is_empty() && l.gold.len() < l.docs.len())
        .collect();
    anyhow::ensure!(
        !informative.is_empty(),
        "no feedback to learn from: no answer has both a helpful and an unhelpful memory"
    );
    let scope = opts.tenant_opt.as_deref().unwrap_or("all-tenants");
    let version = format!(
        "engram-ranker-feedback-{scope}-{}",
        chrono::Utc::now().format("%Y%m%dT%H%M%S")
    );
    let features: Vec<&str> = if opts.all_features {
        RANK_FEATURES.to_vec()
    } else {
        SHIPPED.to_vec()
    };
    let trained_on = format!(
        "engram ranker train: {} answers with feedback ({scope})",
        informative.len()
    );
    let spec = FitSpec {
        features: &features,
        version: &version,
        trained_on: &trained_on,
        keep_fused_first: false,
    };
    let model = fit(&informative, &spec)?;
    let tmp = opts.out.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(model.model())? + "\n")
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &opts.out)
        .with_context(|| format!("cannot write {}", opts.out.display()))?;
    let identities: std::collections::HashSet<_> = kept.iter().map(|a| &a.identity).collect();
    Ok(TrainReport {
        answers: informative.len(),
        examples: informative.iter().map(|l| l.docs.len()).sum(),
        identities: identities.len(),
        capped,
        version,
        weights: model.model().weights.clone(),
    })
}

/// Rows (newest first) grouped per answer; rows of another feature set
/// (another gateway version) are skipped.
fn group_answers(rows: Vec<ExampleRow>) -> Vec<Answer> {
    let mut order: Vec<(String, String)> = Vec::new();
    let mut by: HashMap<(String, String), Answer> = HashMap::new();
    for (tenant, agent, query_id, features, relevant) in rows {
        let Ok(row) = RankRow::try_from(features.as_slice()) else {
            continue;
        };
        let key = (tenant.clone(), query_id);
        let a = by.entry(key.clone()).or_insert_with(|| {
            order.push(key);
            Answer {
                identity: (tenant, agent),
                rows: Vec::new(),
                relevant: Vec::new(),
            }
        });
        a.rows.push(row);
        a.relevant.push(relevant);
    }
    order.into_iter().filter_map(|k| by.remove(&k)).collect()
}

/// One caller cannot outweigh the rest: each identity keeps at most
/// `share` × the median identity's answer count (and at least
/// [`MIN_CAP`]), newest first. Returns the kept answers and how many were cut.
fn cap_per_identity(answers: Vec<Answer>, share: f64) -> (Vec<Answer>, usize) {
    let mut counts: HashMap<(String, String), usize> = HashMap::new();
    for a in &answers {
        *counts.entry(a.identity.clone()).or_default() += 1;
    }
    let mut sizes: Vec<usize> = counts.values().copied().collect();
    sizes.sort_unstable();
    let median = sizes.get(sizes.len() / 2).copied().unwrap_or(0);
    let cap = ((median as f64 * share.max(1.0)).ceil() as usize).max(MIN_CAP);
    let mut used: HashMap<(String, String), usize> = HashMap::new();
    let total = answers.len();
    let kept: Vec<Answer> = answers
        .into_iter()
        .filter(|a| {
            let n = used.entry(a.identity.clone()).or_default();
            *n += 1;
            *n <= cap
        })
        .collect();
    let capped = total - kept.len();
    (kept, capped)
}

fn to_labelled(a: &Answer) -> Labelled {
    Labelled {
        dataset: "feedback",
        docs: (0..a.rows.len()).collect(),
        rows: a.rows.clone(),
        gold: (a.relevant.iter().enumerate())
            .filter(|(_, r)| **r)
            .map(|(i, _)| i)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(dataset: &'static str, good_first: bool) -> Labelled {
        // Two candidates; the gold one has full term coverage.
        let mut gold_row = [0.0; RANK_FEATURES.len()];
        gold_row[8] = 1.0;
        gold_row[6] = if good_first { 1.0 } else { 0.5 };
        let mut other = [0.0; RANK_FEATURES.len()];
        other[6] = if good_first { 0.5 } else { 1.0 };
        Labelled {
            dataset,
            docs: if good_first { vec![1, 2] } else { vec![2, 1] },
            rows: if good_first {
                vec![gold_row, other]
            } else {
                vec![other, gold_row]
            },
            gold: vec![1],
        }
    }

    #[test]
    fn fitting_is_deterministic_and_learns_the_informative_feature() {
        let data: Vec<Labelled> = (0..20).map(|i| labelled("a", i % 2 == 0)).collect();
        let refs: Vec<&Labelled> = data.iter().collect();
        let spec = FitSpec {
            features: &["fused_rr", "term_cover"],
            version: "v",
            trained_on: "",
            keep_fused_first: false,
        };
        let m1 = fit(&refs, &spec).expect("fit");
        let m2 = fit(&refs, &spec).expect("fit");
        assert_eq!(m1, m2);
        let w = &m1.model().weights;
        assert!(w[1] > 0.0, "term coverage marks gold: {w:?}");
        let swapped = labelled("a", false);
        assert_eq!(order(&swapped, &m1), vec![1, 2]);
    }

    fn answer(agent: &str) -> Answer {
        Answer {
            identity: ("t".into(), agent.into()),
            rows: vec![[0.0; RANK_FEATURES.len()]],
            relevant: vec![true],
        }
    }

    #[test]
    fn one_loud_identity_is_capped_near_the_median() {
        let mut answers: Vec<Answer> = (0..500).map(|_| answer("loud")).collect();
        for agent in ["a", "b", "c"] {
            answers.extend((0..60).map(|_| answer(agent)));
        }
        let (kept, capped) = cap_per_identity(answers, 2.0);
        let loud = kept.iter().filter(|a| a.identity.1 == "loud").count();
        assert_eq!(loud, 120, "2 × the median (60)");
        assert_eq!(capped, 380);
        let (alone, none_cut) = cap_per_identity((0..500).map(|_| answer("solo")).collect(), 2.0);
        assert_eq!(
            (alone.len(), none_cut),
            (500, 0),
            "a lone identity is its own median"
        );
    }

    #[test]
    fn rows_of_another_feature_set_are_skipped() {
        let n = RANK_FEATURES.len();
        let rows: Vec<ExampleRow> = vec![
            ("t".into(), "a".into(), "q1".into(), vec![0.5; n], true),
            ("t".into(), "a".into(), "q1".into(), vec![0.1; n], false),
            ("t".into(), "a".into(), "q2".into(), vec![0.5; n + 1], true),
        ];
        let answers = group_answers(rows);
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].relevant, vec![true, false]);
    }

    #[test]
    fn cross_fitting_scores_each_set_with_a_model_that_never_saw_it() {
        let mut data: Vec<Labelled> = (0..10).map(|i| labelled("a", i % 2 == 0)).collect();
        data.extend((0..10).map(|i| labelled("b", i % 2 == 0)));
        let report = cross_fitted(&data, &["fused_rr", "term_cover"]).expect("report");
        assert_eq!(report["a"]["questions"], 10);
        assert_eq!(report["choice"], "learned");
    }
}
