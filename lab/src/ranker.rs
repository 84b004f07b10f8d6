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
    Model, RANK_FEATURES, RankRow, RankSignals, Ranker, load_ranker, rank_features, rank_fusion,
    shipped_ranker, weights_for,
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
    /// Answers with both a helpful and an unhelpful memory, trained on
    /// or held out.
    pub answers: usize,
    pub examples: usize,
    pub identities: usize,
    /// Answers left out by the per-identity cap.
    pub capped: usize,
    /// Answers the new model was fitted on (the rest are `check.held_out`).
    pub trained: usize,
    pub version: String,
    pub weights: Vec<f32>,
    /// The new model against the live one; `opts.out` was written only
    /// when the new one won.
    pub check: Check,
}

/// One answer in this many is held out of training to check the new model.
const HELD_OUT_ONE_IN: u64 = 5;

/// Which model serves after a training run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Winner {
    /// The new model was written to `opts.out`.
    New,
    /// The file was left as it was: the live model keeps serving.
    Live,
}

/// A new model against the live one on held-out answers, by the mean of
/// R@2, R@5 and R@10 (`tune::quality`, what `engram tune` judges by).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    pub held_out: usize,
    pub new_quality: f64,
    /// The live model's version, or "fusion order" when there is none.
    pub live: String,
    pub live_quality: f64,
    pub winner: Winner,
}

/// Judges `new` against the live model (`live_opt`; the fusion order when
/// none) on answers the new one was not fitted on. It wins only when
/// strictly better: a tie, or nothing to judge on, keeps the live one.
pub fn check(new: &Ranker, live_opt: Option<&Ranker>, held: &[&Labelled]) -> Check {
    let new_quality = mean_quality(held, |l| order(l, new));
    let (live, live_quality) = match live_opt {
        Some(r) => (r.version().to_string(), mean_quality(held, |l| order(l, r))),
        None => (
            "fusion order".to_string(),
            mean_quality(held, |l| l.docs.clone()),
        ),
    };
    let winner = if !held.is_empty() && new_quality > live_quality {
        Winner::New
    } else {
        Winner::Live
    };
    Check {
        held_out: held.len(),
        new_quality,
        live,
        live_quality,
        winner,
    }
}

/// Which answers are held out, given their split hashes: those in one
/// bucket of [`HELD_OUT_ONE_IN`] (the same answer in every run, so a model
/// this trainer wrote was never fitted on the answers it is judged on),
/// and with two or more answers never none or all of them: the lowest hash
/// is held out when none is, the highest trained on when all are.
fn held_out(hashes: &[u64]) -> Vec<bool> {
    let mut out: Vec<bool> = hashes.iter().map(|h| h % HELD_OUT_ONE_IN == 0).collect();
    if hashes.len() < 2 {
        return out;
    }
    let by_hash = |i: &usize| hashes[*i];
    if !out.contains(&true)
        && let Some(i) = (0..hashes.len()).min_by_key(by_hash)
    {
        out[i] = true;
    }
    if !out.contains(&false)
        && let Some(i) = (0..hashes.len()).max_by_key(by_hash)
    {
        out[i] = false;
    }
    out
}

/// An answer's split hash: of its tenant and query id, stable across runs.
fn split_hash(tenant: &str, query_id: &str) -> u64 {
    use sha2::Digest;
    let d = sha2::Sha256::new()
        .chain_update(tenant.as_bytes())
        .chain_update([0u8])
        .chain_update(query_id.as_bytes())
        .finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_le_bytes(b)
}

/// Fits a model on the answers not held out and checks it on the rest
/// against `live_opt`. Needs two informative answers: one to fit, one to
/// judge by.
fn fit_checked(
    informative: &[&Answer],
    live_opt: Option<&Ranker>,
    spec: &FitSpec<'_>,
) -> anyhow::Result<(Ranker, Check, usize)> {
    anyhow::ensure!(
        informative.len() >= 2,
        "too little feedback to learn from: {} answer(s) with both a helpful and an unhelpful \
         memory, and a new model needs one to fit on and one to be checked on",
        informative.len()
    );
    let hashes: Vec<u64> = informative.iter().map(|a| a.split_hash).collect();
    let mut train = Vec::new();
    let mut held = Vec::new();
    for (a, out) in informative.iter().zip(held_out(&hashes)) {
        if out { &mut held } else { &mut train }.push(to_labelled(a));
    }
    let train_refs: Vec<&Labelled> = train.iter().collect();
    let held_refs: Vec<&Labelled> = held.iter().collect();
    let model = fit(&train_refs, spec)?;
    let checked = check(&model, live_opt, &held_refs);
    Ok((model, checked, train.len()))
}

/// The model the gateway serves from `out` now: the file when it loads,
/// else the shipped one (what a gateway uses without a model file); none
/// only when not even that loads, and then the fusion order serves.
fn live_model(out: &std::path::Path) -> Option<Ranker> {
    let file_opt = out.exists().then(|| load_ranker(out)).and_then(|r| {
        r.map_err(|e| tracing::warn!(error = %e, "the live ranker does not load; judging against the shipped one"))
            .ok()
    });
    file_opt.or_else(|| shipped_ranker().ok())
}

/// One answer's stored examples.
struct Answer {
    identity: (String, String),
    /// Of tenant and query id: picks the held-out answers ([`held_out`]).
    split_hash: u64,
    rows: Vec<RankRow>,
    relevant: Vec<bool>,
}

impl Answer {
    /// Both a helpful and an unhelpful memory: something to learn.
    fn informative(&self) -> bool {
        self.relevant.contains(&true) && self.relevant.contains(&false)
    }
}

type ExampleRow = (String, String, String, Vec<f32>, bool);

/// Trains the Stage 4 ranker from the feedback examples in Postgres
/// (migrations/0003_ranker_examples.sql), checks it on held-out answers
/// against the model in `opts.out` (the shipped one when there is none)
/// and, only when it is better there, writes it to `opts.out` atomically
/// (a gateway polling the file never reads half of it).
pub async fn train_from_feedback(
    pool: &sqlx::PgPool,
    opts: &TrainOptions,
) -> anyhow::Result<TrainReport> {
    let rows = read_examples(pool, opts).await?;
    let answers = group_answers(rows);
    let (kept, capped) = cap_per_identity(answers, opts.identity_share);
    let informative: Vec<&Answer> = kept.iter().filter(|a| a.informative()).collect();
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
    let live_opt = live_model(&opts.out);
    let (model, check, trained) = fit_checked(&informative, live_opt.as_ref(), &spec)?;
    tracing::info!(
        winner = ?check.winner, new = check.new_quality, live = %check.live,
        live_quality = check.live_quality, held_out = check.held_out, "ranker checked"
    );
    if check.winner == Winner::New {
        write_model(&model, &opts.out)?;
    }
    let identities: std::collections::HashSet<_> = kept.iter().map(|a| &a.identity).collect();
    Ok(TrainReport {
        answers: informative.len(),
        examples: informative.iter().map(|a| a.rows.len()).sum(),
        identities: identities.len(),
        capped,
        trained,
        version,
        weights: model.model().weights.clone(),
        check,
    })
}

async fn read_examples(
    pool: &sqlx::PgPool,
    opts: &TrainOptions,
) -> anyhow::Result<Vec<ExampleRow>> {
    sqlx::query_as(
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
    .context("cannot read ranker_examples")
}

/// Writes through a temporary file and a rename.
fn write_model(model: &Ranker, out: &std::path::Path) -> anyhow::Result<()> {
    let tmp = out.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(model.model())? + "\n")
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, out).with_context(|| format!("cannot write {}", out.display()))
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
        let split_hash = split_hash(&tenant, &query_id);
        let key = (tenant.clone(), query_id);
        let a = by.entry(key.clone()).or_insert_with(|| {
            order.push(key);
            Answer {
                identity: (tenant, agent),
                split_hash,
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

/// The answer as Stage 4 got it, in fused order (stored rows come newest
/// first): the live model's rule for the fusion's #1 and the fusion order
/// itself are judged on the right candidate.
fn to_labelled(a: &Answer) -> Labelled {
    let mut idx: Vec<usize> = (0..a.rows.len()).collect();
    if let Some(c) = RANK_FEATURES.iter().position(|n| *n == "fused_rr") {
        idx.sort_by(|&i, &j| a.rows[j][c].total_cmp(&a.rows[i][c]));
    }
    Labelled {
        dataset: "feedback",
        docs: (0..idx.len()).collect(),
        rows: idx.iter().map(|&i| a.rows[i]).collect(),
        gold: (idx.iter().enumerate())
            .filter(|(_, i)| a.relevant.get(**i).copied().unwrap_or(false))
            .map(|(pos, _)| pos)
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
            split_hash: 0,
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

    /// Three candidates stored newest first (the reverse of fused order),
    /// `cover` the term coverage of the fused #1, #2 and #3.
    fn three(split_hash: u64, gold_pos: usize, cover: [f32; 3]) -> Answer {
        let row = |pos: usize| {
            let mut r = [0.0; RANK_FEATURES.len()];
            r[6] = 1.0 / (pos + 1) as f32;
            r[8] = cover[pos];
            r
        };
        Answer {
            identity: ("t".into(), "a".into()),
            split_hash,
            rows: (0..3).rev().map(row).collect(),
            relevant: (0..3).rev().map(|p| p == gold_pos).collect(),
        }
    }

    fn fusion_model() -> Ranker {
        Ranker::new(Model {
            version: "live".into(),
            features: vec!["fused_rr".into()],
            mean: vec![0.0],
            scale: vec![1.0],
            weights: vec![1.0],
            intercept: 0.0,
            trained_on: String::new(),
            keep_fused_first: false,
        })
        .expect("model")
    }

    const SPEC: FitSpec<'static> = FitSpec {
        features: &["fused_rr", "term_cover"],
        version: "new",
        trained_on: "",
        keep_fused_first: false,
    };

    /// Twenty answers: hashes 1..=20, so 5, 10, 15 and 20 are held out.
    fn answers(train_gold: (usize, [f32; 3]), held_gold: (usize, [f32; 3])) -> Vec<Answer> {
        (1..=20u64)
            .map(|h| {
                let (pos, cover) = if h % HELD_OUT_ONE_IN == 0 {
                    held_gold
                } else {
                    train_gold
                };
                three(h, pos, cover)
            })
            .collect()
    }

    #[test]
    fn a_new_model_that_loses_on_held_out_answers_keeps_the_live_one() {
        // Trained on: gold is the fused #3 that covers the question's terms;
        // held out: gold is the fused #1 that covers none of them.
        let data = answers((2, [0.0, 0.5, 1.0]), (0, [0.0, 0.5, 1.0]));
        let refs: Vec<&Answer> = data.iter().collect();
        let live = fusion_model();
        let (_, c, trained) = fit_checked(&refs, Some(&live), &SPEC).expect("fit");
        assert_eq!((trained, c.held_out), (16, 4));
        assert!(c.new_quality < c.live_quality, "{c:?}");
        assert_eq!(c.winner, Winner::Live);
        assert_eq!(c.live, "live");
    }

    #[test]
    fn a_new_model_better_on_held_out_answers_wins_and_a_tie_does_not() {
        let data = answers((2, [0.0, 0.5, 1.0]), (2, [0.0, 0.5, 1.0]));
        let refs: Vec<&Answer> = data.iter().collect();
        let live = fusion_model();
        let (_, c, _) = fit_checked(&refs, Some(&live), &SPEC).expect("fit");
        assert!(c.new_quality > c.live_quality, "{c:?}");
        assert_eq!(c.winner, Winner::New);
        let (_, c, _) = fit_checked(&refs, None, &SPEC).expect("fit");
        assert_eq!((c.live.as_str(), c.winner), ("fusion order", Winner::New));
        // Gold at the fused #1 everywhere: both rank it first, a tie.
        let data = answers((0, [1.0, 0.5, 0.0]), (0, [1.0, 0.5, 0.0]));
        let refs: Vec<&Answer> = data.iter().collect();
        let (_, c, _) = fit_checked(&refs, Some(&live), &SPEC).expect("fit");
        assert_eq!(c.new_quality, c.live_quality);
        assert_eq!(c.winner, Winner::Live);
        let none = check(&live, Some(&live), &[]);
        assert_eq!(none.winner, Winner::Live, "nothing to judge on");
    }

    #[test]
    fn one_answer_in_five_is_held_out_the_same_in_every_run() {
        let hashes: Vec<u64> = (0..1000)
            .map(|i| split_hash("t", &format!("q{i}")))
            .collect();
        let again: Vec<u64> = (0..1000)
            .map(|i| split_hash("t", &format!("q{i}")))
            .collect();
        assert_eq!(hashes, again);
        let held = held_out(&hashes).iter().filter(|h| **h).count();
        assert!((150..250).contains(&held), "{held} of 1000");
        assert_eq!(held_out(&[1, 2, 3]), vec![true, false, false], "never none");
        assert_eq!(held_out(&[5, 10]), vec![true, false], "never all");
        assert_eq!(held_out(&[5]), vec![true]);
        let one = [three(1, 0, [0.0; 3])];
        let refs: Vec<&Answer> = one.iter().collect();
        assert!(
            fit_checked(&refs, None, &SPEC).is_err(),
            "one answer cannot be checked"
        );
    }

    #[test]
    fn stored_rows_are_judged_in_fused_order() {
        let l = to_labelled(&three(1, 0, [0.0, 0.5, 1.0]));
        assert_eq!(l.rows[0][6], 1.0);
        assert_eq!(l.gold, vec![0]);
    }
}
