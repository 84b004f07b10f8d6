//! The learned Stage 4 ranker: per-candidate features that mean the same on
//! any corpus (ranks, normalised scores, how much of the query a memory
//! covers), scored by a linear model. Pure, so `engram tune` and
//! `engram ranker` fit and judge the model with the very features the
//! gateway computes; the model is data (JSON), so a new one is loaded
//! without a restart, and the heuristic composite stays the fallback when
//! none is loaded or a model does not match these features.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, SystemTime};

use engram_common::settings::RankerSettings;
use serde::{Deserialize, Serialize};

use super::strategy::{SLOTS, Strategy};
use super::text::{collect_words, coverage, query_words};

/// Every feature the gateway computes, by name; a model names the ones it
/// uses, so a model asking for a feature this gateway does not compute is
/// refused, never misread.
///
/// `linked_from_top` is the multi-hop bridge: the candidate's title (an
/// entity's name, in wiki-like memories) appears in the text of the fused
/// #1, e.g. the director's page for "Where was the director of X born?"
/// when X's page is on top; weighted by how much of the question's names
/// the #1 covers. Leave-one-dataset-out it is the one feature
/// beside the fused rank that transfers (docs/benchmarks.md, "Stage 4").
pub const NAMES: [&str; 13] = [
    "vector_rr",
    "keyword_rr",
    "graph_rr",
    "vector_cosine",
    "keyword_rel",
    "graph_rel",
    "fused_rr",
    "lists",
    "term_cover",
    "name_cover",
    "title_cover",
    "log_len",
    "linked_from_top",
];
pub const N: usize = NAMES.len();

pub type Row = [f32; N];

/// What Stage 4 knows of one candidate, the same online and in the lab.
#[derive(Debug, Clone, Copy, Default)]
pub struct Signals<'a> {
    /// 1-based rank and score in each strategy's list: vector, keyword,
    /// graph (`Strategy::slot`).
    pub hits: [Option<(u32, f32)>; SLOTS],
    /// 0-based position in the fused list.
    pub fused_pos: usize,
    pub title: &'a str,
    pub content: &'a str,
    /// A conversation turn's speaker ("" otherwise): the people a question
    /// names are often who said it.
    pub speaker: &'a str,
}

/// The slot of a hit's strategy, by its name on the wire (HyDE is a dense
/// list: it fills the vector slot when the plain one did not run).
pub fn slot_of(strategy: &str) -> Option<usize> {
    Strategy::of(strategy).and_then(Strategy::slot)
}

/// One row per candidate. Keyword and graph scores live on scales that
/// depend on the corpus, so they enter relative to the best among these
/// candidates; dense cosines are comparable as they are.
pub fn features(query: &str, cands: &[Signals<'_>]) -> Vec<Row> {
    let (names, terms) = query_words(query);
    let best = |slot: usize| {
        cands
            .iter()
            .filter_map(|c| c.hits[slot].map(|(_, s)| s))
            .fold(0.0f32, f32::max)
    };
    let (kw_best, graph_best) = (best(1), best(2));
    let top_opt = cands.iter().find(|c| c.fused_pos == 0);
    let top_text = top_opt
        .map(|c| c.content.to_lowercase())
        .unwrap_or_default();
    let top_title = top_opt
        .map(|c| c.title.trim().to_lowercase())
        .unwrap_or_default();
    let mut rows: Vec<Row> = cands
        .iter()
        .map(|c| row(c, &names, &terms, kw_best, graph_best))
        .collect();
    // The bridge counts as much as the top passage covers the question's
    // names: a neighbour of a #1 that is not about the question's subject
    // is no second hop (LODO: this gate keeps MuSiQue's R@2).
    let top_names = (cands.iter().position(|c| c.fused_pos == 0)).map_or(0.0, |i| rows[i][9]);
    let mut linked_titles = HashSet::new();
    for i in by_fused_pos(cands) {
        let c = &cands[i];
        // One page per linked name: the #1 names an entity, not each of
        // its paragraphs (MuSiQue holds several passages titled "Africa";
        // lifting all of them pushed a gold memory out of the top 10).
        let title = c.title.trim().to_lowercase();
        let first_of_title = c.fused_pos != 0
            && linked(&title, &top_title, &top_text)
            && linked_titles.insert(title);
        rows[i][12] = f32::from(u8::from(first_of_title)) * top_names;
    }
    rows
}

/// The candidates' indices, best fused first.
fn by_fused_pos(cands: &[Signals<'_>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..cands.len()).collect();
    order.sort_by_key(|&i| cands[i].fused_pos);
    order
}

/// Whether the top candidate's text names another by its (lowercased) title.
fn linked(title: &str, top_title: &str, top_text: &str) -> bool {
    title.chars().count() >= 3 && title != top_title && top_text.contains(title)
}

fn row(
    c: &Signals<'_>,
    names: &HashSet<String>,
    terms: &HashSet<String>,
    kw_best: f32,
    graph_best: f32,
) -> Row {
    let rr = |slot: usize| c.hits[slot].map_or(0.0, |(r, _)| 1.0 / r.max(1) as f32);
    let rel = |slot: usize, top: f32| match c.hits[slot] {
        Some((_, s)) if top > 0.0 => (s / top).clamp(0.0, 1.0),
        _ => 0.0,
    };
    let mut body = HashSet::new();
    collect_words(c.content, &mut body);
    collect_words(c.speaker, &mut body);
    let mut title = HashSet::new();
    collect_words(c.title, &mut title);
    body.extend(title.iter().cloned());
    let words = c.content.split_whitespace().count() + c.title.split_whitespace().count();
    [
        rr(0),
        rr(1),
        rr(2),
        c.hits[0].map_or(0.0, |(_, s)| s.clamp(-1.0, 1.0)),
        rel(1, kw_best),
        rel(2, graph_best),
        1.0 / (c.fused_pos + 1) as f32,
        c.hits.iter().flatten().count() as f32 / 3.0,
        coverage(terms, &body),
        coverage(names, &body),
        if terms.is_empty() {
            0.0
        } else {
            coverage(terms, &title)
        },
        ((1 + words) as f32).ln() / 10.0,
        0.0,
    ]
}

/// A fitted linear model over standardised features, the ones it names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Model {
    /// Shown in `explain` and logs; a new fit gets a new version.
    pub version: String,
    /// The features it uses, each one of [`NAMES`], in the order of
    /// `mean`, `scale` and `weights`.
    pub features: Vec<String>,
    pub mean: Vec<f32>,
    pub scale: Vec<f32>,
    pub weights: Vec<f32>,
    pub intercept: f32,
    /// What it was fitted on and how (free text, for people).
    #[serde(default)]
    pub trained_on: String,
    /// It scores no candidate above the fusion's #1. Set on the models
    /// `engram tune` fits on the dev sets: their bridge feature lifts
    /// memories the #1 links to, which helps them into the top few but,
    /// over the #1 itself, cost R@1 against the fusion alone cross-fitted
    /// (docs/benchmarks.md, "Bridges between slots"). Not set on a model
    /// trained from a tenant's own feedback, which may learn that its #1
    /// is wrong.
    #[serde(default)]
    pub keep_fused_first: bool,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ModelError {
    #[error("model {0}: feature {1:?} is not one this gateway computes")]
    Features(String, String),
    #[error("model {0}: {1} has {2} values, expected one per feature ({3})")]
    Shape(String, &'static str, usize, usize),
    #[error("model {0}: a weight, mean or scale is not finite")]
    NotFinite(String),
}

/// A checked model with its features resolved to columns: the only way to
/// score, so an unchecked model never ranks anything.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranker {
    model: Model,
    cols: Vec<usize>,
}

impl Ranker {
    /// Refuses a model asking for unknown features or with broken numbers,
    /// so a bad file can only ever leave the fallback in place.
    pub fn new(model: Model) -> Result<Self, ModelError> {
        let cols = (model.features.iter())
            .map(|f| {
                NAMES
                    .iter()
                    .position(|n| n == f)
                    .ok_or_else(|| ModelError::Features(model.version.clone(), f.clone()))
            })
            .collect::<Result<Vec<usize>, _>>()?;
        for (what, v) in [
            ("mean", &model.mean),
            ("scale", &model.scale),
            ("weights", &model.weights),
        ] {
            if v.len() != cols.len() {
                return Err(ModelError::Shape(
                    model.version.clone(),
                    what,
                    v.len(),
                    cols.len(),
                ));
            }
        }
        let all = (model.mean.iter())
            .chain(&model.scale)
            .chain(&model.weights)
            .chain(std::iter::once(&model.intercept));
        if all.clone().any(|x| !x.is_finite()) {
            return Err(ModelError::NotFinite(model.version.clone()));
        }
        Ok(Self { model, cols })
    }

    pub fn version(&self) -> &str {
        &self.model.version
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The scores of candidates given in fused order, with the model's
    /// rule for the fusion's #1 applied.
    pub fn scores(&self, rows: &[Row]) -> Vec<f32> {
        let mut scores: Vec<f32> = rows.iter().map(|row| self.score(row)).collect();
        if self.model.keep_fused_first {
            keep_fused_first(&mut scores);
        }
        scores
    }

    /// The model's probability that the candidate is relevant.
    pub fn score(&self, x: &Row) -> f32 {
        let m = &self.model;
        let z = (self.cols.iter().zip(&m.mean).zip(&m.scale).zip(&m.weights))
            .map(|(((&c, mu), s), w)| w * (x[c] - mu) / if *s > 0.0 { *s } else { 1.0 })
            .sum::<f32>()
            + m.intercept;
        1.0 / (1.0 + (-z).exp())
    }
}

/// The model the repository ships (`models/ranker/`), fitted by
/// `engram ranker fit` on the dev halves.
pub fn shipped() -> Result<Ranker, String> {
    let m: Model = serde_json::from_str(include_str!("../../../models/ranker/default.json"))
        .map_err(|e| format!("shipped ranker model: {e}"))?;
    Ranker::new(m).map_err(|e| e.to_string())
}

/// Reads and checks a model file.
pub fn load_file(path: &Path) -> Result<Ranker, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read ranker model {}: {e}", path.display()))?;
    let m: Model =
        serde_json::from_str(&text).map_err(|e| format!("ranker model {}: {e}", path.display()))?;
    Ranker::new(m).map_err(|e| e.to_string())
}

/// The models Stage 4 uses now: the global one and any tenant's own. A
/// request takes its model once at its start, so a swap never mixes two
/// models in one answer.
#[derive(Debug, Default)]
pub struct Slot {
    global: RwLock<Option<Arc<Ranker>>>,
    /// By tenant, from `<tenant>.json` in `pipeline.ranker.tenant_models_dir_opt`.
    tenants: RwLock<HashMap<String, Arc<Ranker>>>,
}

fn read<T: Clone>(lock: &RwLock<T>) -> T {
    match lock.read() {
        Ok(g) => g.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    }
}

fn write<T>(lock: &RwLock<T>, f: impl FnOnce(&mut T)) {
    match lock.write() {
        Ok(mut g) => f(&mut g),
        Err(poisoned) => f(&mut poisoned.into_inner()),
    }
}

impl Slot {
    /// The global model.
    pub fn get(&self) -> Option<Arc<Ranker>> {
        read(&self.global)
    }

    /// `tenant`'s own model when it has one, else the global one.
    pub fn get_for(&self, tenant: &str) -> Option<Arc<Ranker>> {
        let own = match self.tenants.read() {
            Ok(g) => g.get(tenant).cloned(),
            Err(poisoned) => poisoned.into_inner().get(tenant).cloned(),
        };
        own.or_else(|| self.get())
    }

    pub fn set(&self, ranker_opt: Option<Arc<Ranker>>) {
        write(&self.global, |g| *g = ranker_opt);
    }

    fn set_tenant(&self, tenant: &str, ranker_opt: Option<Arc<Ranker>>) {
        write(&self.tenants, |m| match ranker_opt {
            Some(r) => {
                m.insert(tenant.to_string(), r);
            }
            None => {
                m.remove(tenant);
            }
        });
    }

    /// The configured model: the file when one is set (the shipped model
    /// when it does not load, said once), else the shipped one; none when
    /// the ranker is off. Tenant models arrive with the first reload.
    pub fn from_settings(s: &RankerSettings) -> Self {
        let slot = Self::default();
        if !s.enabled {
            return slot;
        }
        let loaded = match &s.model_path_opt {
            Some(path) => load_file(path).or_else(|e| {
                tracing::warn!(error = %e, "ranker model not loaded; using the shipped one");
                shipped()
            }),
            None => shipped(),
        };
        match loaded {
            Ok(r) => {
                tracing::info!(version = r.version(), "stage 4 ranker loaded");
                slot.set(Some(Arc::new(r)));
            }
            Err(e) => tracing::warn!(error = %e, "no stage 4 ranker; fusion order kept"),
        }
        slot
    }
}

fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Re-reads the model files whenever their modification times change,
/// until the slot is dropped: the global file, and in the tenant directory
/// each `<tenant>.json` (a removed file drops that tenant's model). A file
/// that does not load keeps the model in use.
pub fn spawn_reload(slot: Weak<Slot>, s: &RankerSettings) {
    let global_opt = s.model_path_opt.clone();
    let dir_opt = s.tenant_models_dir_opt.clone();
    if !s.enabled || (global_opt.is_none() && dir_opt.is_none()) {
        return;
    }
    let every = Duration::from_millis(s.reload_ms).max(Duration::from_millis(100));
    tokio::spawn(async move {
        let mut seen_global = global_opt.as_deref().and_then(modified);
        let mut seen_tenants: HashMap<String, Option<SystemTime>> = HashMap::new();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(slot) = slot.upgrade() else { return };
            if let Some(path) = &global_opt {
                let now = modified(path);
                if now != seen_global {
                    seen_global = now;
                    reload_one(path, |r| slot.set(Some(r)));
                }
            }
            if let Some(dir) = &dir_opt {
                reload_tenants(&slot, dir, &mut seen_tenants);
            }
        }
    });
}

fn reload_one(path: &Path, install: impl FnOnce(Arc<Ranker>)) {
    match load_file(path) {
        Ok(r) => {
            tracing::info!(version = r.version(), path = %path.display(), "stage 4 ranker reloaded");
            install(Arc::new(r));
        }
        Err(e) => tracing::warn!(error = %e, "ranker model change ignored"),
    }
}

/// One scan of the tenant directory.
fn reload_tenants(slot: &Slot, dir: &Path, seen: &mut HashMap<String, Option<SystemTime>>) {
    let mut present: HashMap<String, PathBuf> = HashMap::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            let tenant_opt = (path.extension().is_some_and(|e| e == "json"))
                .then(|| {
                    path.file_stem()
                        .and_then(|s| s.to_str())
                        .map(str::to_string)
                })
                .flatten();
            if let Some(tenant) = tenant_opt {
                present.insert(tenant, path);
            }
        }
    }
    for (tenant, path) in &present {
        let now = modified(path);
        if seen.get(tenant) != Some(&now) {
            seen.insert(tenant.clone(), now);
            reload_one(path, |r| slot.set_tenant(tenant, Some(r)));
        }
    }
    seen.retain(|tenant, _| {
        let keep = present.contains_key(tenant);
        if !keep {
            tracing::info!(%tenant, "tenant ranker removed; global model in use");
            slot.set_tenant(tenant, None);
        }
        keep
    });
}

/// Raises the first (the fusion's #1) to the best score; ties keep fused
/// order, so it stays first unless time or confidence lowers it.
fn keep_fused_first(scores: &mut [f32]) {
    let best = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if let Some(first) = scores.first_mut()
        && best.is_finite()
    {
        *first = best;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig<'a>(
        hits: [Option<(u32, f32)>; 3],
        pos: usize,
        title: &'a str,
        content: &'a str,
    ) -> Signals<'a> {
        Signals {
            hits,
            fused_pos: pos,
            title,
            content,
            speaker: "",
        }
    }

    #[test]
    fn features_are_ranks_relative_scores_coverage_and_the_bridge() {
        let q = "Where was the director of Inception born?";
        let rows = features(
            q,
            &[
                sig(
                    [Some((1, 0.62)), Some((2, 4.0)), None],
                    0,
                    "Inception",
                    "a film directed by Christopher Nolan",
                ),
                sig(
                    [None, Some((1, 8.0)), Some((3, 0.02))],
                    1,
                    "Christopher Nolan",
                    "born in London",
                ),
                sig([None, None, Some((1, 0.05))], 2, "Tenet", "another film"),
            ],
        );
        let (a, b, c) = (&rows[0], &rows[1], &rows[2]);
        assert_eq!((a[0], a[1], a[2]), (1.0, 0.5, 0.0));
        assert!((a[3] - 0.62).abs() < 1e-6);
        assert_eq!(a[4], 0.5, "keyword score relative to the best (8.0)");
        assert!(
            (b[5] - 0.4).abs() < 1e-6,
            "graph score relative to the best"
        );
        assert_eq!(b[6], 0.5);
        assert!((a[7] - 2.0 / 3.0).abs() < 1e-6);
        assert_eq!(a[9], 1.0, "the name Inception is covered");
        assert!(a[10] > 0.0 && b[10] == 0.0);
        assert!(b[8] > 0.0, "born");
        assert_eq!(
            (a[12], b[12], c[12]),
            (0.0, 1.0, 0.0),
            "only the page the top one names is linked"
        );
    }

    #[test]
    fn a_dev_fitted_model_scores_nothing_above_the_fused_first() {
        let mut scores = vec![0.2, 0.9, 0.5];
        keep_fused_first(&mut scores);
        assert_eq!(scores, vec![0.9, 0.9, 0.5]);
        let mut scores = vec![0.7, 0.1];
        keep_fused_first(&mut scores);
        assert_eq!(scores, vec![0.7, 0.1]);
        let mut empty: Vec<f32> = Vec::new();
        keep_fused_first(&mut empty);
        assert!(empty.is_empty());
        // Only when the model says so: a model that prefers the lower
        // fused rank puts the #2 above the #1 unless it keeps the #1.
        let col = NAMES
            .iter()
            .position(|n| *n == "fused_rr")
            .expect("feature");
        let mut rows = vec![[0.0; N]; 2];
        (rows[0][col], rows[1][col]) = (1.0, 0.5);
        let mut m = model(&["fused_rr"], &[-1.0]);
        let free = Ranker::new(m.clone()).expect("model").scores(&rows);
        assert!(free[1] > free[0]);
        m.keep_fused_first = true;
        let kept = Ranker::new(m).expect("model").scores(&rows);
        assert_eq!(kept[0], kept[1]);
    }

    #[test]
    fn of_several_pages_with_the_linked_title_only_the_best_fused_is_linked() {
        let q = "What is the southern tip of the continent where coffee comes from?";
        let rows = features(
            q,
            &[
                sig(
                    [Some((1, 0.6)), None, None],
                    0,
                    "Coffee",
                    "coffee comes from Africa",
                ),
                sig([Some((4, 0.3)), None, None], 2, "Africa", "a paragraph"),
                sig([Some((3, 0.4)), None, None], 1, "Africa", "another one"),
            ],
        );
        // Input order is not fused order: position 1 is the best "Africa".
        assert_eq!((rows[1][12], rows[2][12]), (0.0, rows[0][9]));
        assert!(rows[2][12] > 0.0);
    }

    #[test]
    fn the_bridge_counts_only_from_a_top_passage_about_the_question() {
        let q = "Where was the director of Inception born?";
        let rows = features(
            q,
            &[
                sig(
                    [Some((1, 0.6)), None, None],
                    0,
                    "Tenet",
                    "directed by Christopher Nolan",
                ),
                sig(
                    [Some((2, 0.5)), None, None],
                    1,
                    "Christopher Nolan",
                    "born in London",
                ),
            ],
        );
        assert_eq!(rows[1][12], 0.0, "the #1 is not about Inception");
    }

    fn model(features: &[&str], weights: &[f32]) -> Model {
        Model {
            version: "t".into(),
            features: features.iter().map(|s| s.to_string()).collect(),
            mean: vec![0.0; features.len()],
            scale: vec![1.0; features.len()],
            weights: weights.to_vec(),
            intercept: 0.0,
            trained_on: String::new(),
            keep_fused_first: false,
        }
    }

    #[test]
    fn a_model_for_unknown_features_or_broken_numbers_is_refused() {
        assert!(Ranker::new(model(&["fused_rr"], &[1.0])).is_ok());
        assert_eq!(
            Ranker::new(model(&["cosine"], &[1.0])),
            Err(ModelError::Features("t".into(), "cosine".into()))
        );
        assert!(matches!(
            Ranker::new(model(&["fused_rr", "lists"], &[1.0])),
            Err(ModelError::Shape(_, "mean", 2, 2) | ModelError::Shape(_, "weights", 1, 2))
        ));
        let mut m = model(&["fused_rr"], &[1.0]);
        m.intercept = f32::NAN;
        assert_eq!(Ranker::new(m), Err(ModelError::NotFinite("t".into())));
    }

    #[test]
    fn the_score_reads_only_the_models_features() {
        let r = Ranker::new(model(&["term_cover"], &[2.0])).expect("model");
        let mut lo = [0.0; N];
        let mut hi = [0.0; N];
        lo[8] = 0.1;
        hi[8] = 0.9;
        hi[0] = 100.0;
        assert!(r.score(&hi) > r.score(&lo));
        let zero = Ranker::new(model(&["term_cover"], &[0.0])).expect("model");
        assert!((zero.score(&hi) - 0.5).abs() < 1e-6);
    }

    #[test]
    fn the_shipped_model_loads() {
        assert!(shipped().is_ok());
    }

    #[test]
    fn an_unloadable_file_falls_back_to_the_shipped_model_and_off_means_none() {
        let dir = std::env::temp_dir().join(format!("engram-ranker-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("bad.json");
        std::fs::write(&path, "{not json").expect("write");
        let on = RankerSettings {
            model_path_opt: Some(path),
            ..Default::default()
        };
        let shipped_version = shipped().expect("shipped").version().to_string();
        let got = Slot::from_settings(&on).get().expect("a model");
        assert_eq!(got.version(), shipped_version);
        let off = RankerSettings {
            enabled: false,
            ..Default::default()
        };
        assert!(Slot::from_settings(&off).get().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_changed_file_is_swapped_in_and_a_broken_one_ignored() {
        let dir = std::env::temp_dir().join(format!("engram-ranker-swap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("m.json");
        let write = |version: &str| {
            let mut m = model(&["fused_rr"], &[1.0]);
            m.version = version.into();
            std::fs::write(&path, serde_json::to_string(&m).expect("json")).expect("write");
        };
        write("one");
        let settings = RankerSettings {
            model_path_opt: Some(path.clone()),
            reload_ms: 100,
            ..Default::default()
        };
        let slot = Arc::new(Slot::from_settings(&settings));
        assert_eq!(slot.get().expect("model").version(), "one");
        spawn_reload(Arc::downgrade(&slot), &settings);
        // Modification times can be coarse: wait until the change is seen.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        write("two");
        let mut version = String::new();
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            version = slot.get().expect("model").version().to_string();
            if version == "two" {
                break;
            }
        }
        assert_eq!(version, "two");
        tokio::time::sleep(Duration::from_millis(1100)).await;
        std::fs::write(&path, "{broken").expect("write");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(slot.get().expect("model").version(), "two");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_tenants_own_model_serves_only_that_tenant_until_removed() {
        let dir =
            std::env::temp_dir().join(format!("engram-ranker-tenants-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let mut m = model(&["fused_rr"], &[1.0]);
        m.version = "acme-own".into();
        let own = dir.join("acme.json");
        std::fs::write(&own, serde_json::to_string(&m).expect("json")).expect("write");
        let settings = RankerSettings {
            tenant_models_dir_opt: Some(dir.clone()),
            reload_ms: 100,
            ..Default::default()
        };
        let slot = Arc::new(Slot::from_settings(&settings));
        let global = slot.get().expect("shipped").version().to_string();
        spawn_reload(Arc::downgrade(&slot), &settings);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(slot.get_for("acme").expect("model").version(), "acme-own");
        assert_eq!(slot.get_for("other").expect("model").version(), global);
        std::fs::remove_file(&own).expect("remove");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(slot.get_for("acme").expect("model").version(), global);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
