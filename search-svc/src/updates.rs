//! Update detection at write time, without an LLM (issue 21): when a new
//! memory says something that an older one of the same tenant and
//! namespace said differently ("Priya lives in Berlin" → "Priya moved to
//! Amsterdam"), a `contradicts` edge is written between them, marked as
//! system-detected (`edges.origin = 'detected'`) with its score and reason.
//! Stage 5 then resolves the pair like any contradiction (the more recent
//! wins unless the older one is much more confident), so the default answer
//! is what is true now and the older version is reported in `conflicts`.
//!
//! Only memories of `search.update_types` (semantic, episodic, procedural
//! by default) of at most 30 content words are judged: facts, not
//! passages or chat turns.
//!
//! Candidates: the five nearest older memories by embedding that the
//! writer may read (never a memory above the writer's trust level, never
//! another tenant's or namespace's), current (not retracted, no valid_to),
//! and not a pair a reviewer rejected (`rejected_updates`).
//! Each pair is scored by a small logistic model ([`MODEL`]) over generic
//! features ([`FEATURES`]): the cosine, shared wording, update wording
//! ("now", "moved", "no longer", "switched", …), what a word alignment of
//! the two texts changed (one value swapped, the subject, only predicate
//! words, a number), whether the shared predicate holds one value
//! ("lives in", "is") or several ("likes", "has visited"), and whether the
//! values that changed are of kinds that cannot replace each other (a time
//! against a weekday: values.rs). A pair scoring at
//! least `search.update_threshold` is an update. The model is fitted by
//! `engram eval updates --fit` on lab/data/updates_dev.jsonl and reported
//! leave-one-domain-out and on an independent held-out set
//! (docs/benchmarks.md).
//!
//! Best effort and after the write's commit: detection never fails a
//! write, and by default runs after the acknowledgement (detection.rs).

use std::collections::BTreeSet;

use engram_common::Identity;
use sqlx::PgPool;
use uuid::Uuid;

use crate::bounds;
use crate::dense::half_cast;
use crate::error::Result;
use crate::values;

/// What a pair is judged on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pair<'a> {
    pub new: &'a str,
    pub old: &'a str,
    /// Cosine of the two embeddings.
    pub cosine: f32,
}

/// A detected update.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The model's probability that the new memory replaces the old one.
    pub score: f32,
    /// Update wording in the new memory.
    pub cue: bool,
    /// For people: what changed, old → new.
    pub reason: String,
}

/// Words that carry no value of their own (and the update wording, which
/// `CUES` scores separately).
const STOPWORDS: &[&str] = &[
    "a", "an", "the", "is", "are", "was", "were", "be", "been", "to", "in", "at", "on", "of",
    "for", "and", "or", "our", "we", "my", "i", "it", "its", "has", "have", "had", "with", "from",
    "by", "as", "that", "this", "will", "still", "now", "new", "no", "longer", "moved", "since",
    "changed", "instead", "anymore", "switched", "starting", "happen", "happens", "every",
];

/// Content words a memory may have and still be judged (a fact, not a
/// passage).
const MAX_WORDS: usize = 30;

/// Phrases that say the new memory replaces something (matched on the
/// lowercased text padded with spaces).
const CUES: &[&str] = &[
    " now ",
    " moved ",
    " no longer ",
    " since ",
    " changed ",
    " instead",
    " anymore",
    " switched ",
    " from now on",
    " starting ",
    " new ",
    " promoted ",
    " relocated ",
    " grew ",
    " raised ",
    " lowered ",
    " reduced ",
    " increased ",
    " decreased ",
    " dropped ",
    " became ",
    " replaced ",
    " upgraded ",
    " downgraded ",
    " cancelled ",
    " canceled ",
    " stopped ",
    " quit ",
    " rescheduled ",
    " postponed ",
    " these days",
    " as of ",
    " nowadays",
    " left ",
    " joined ",
    " transferred ",
    " renamed ",
    " updated ",
];

/// Update wording, left out when the two texts are aligned, so that "Priya
/// moved to Amsterdam" aligns with "Priya lives in Berlin" on its value.
const CUE_WORDS: &[&str] = &[
    "now",
    "moved",
    "no",
    "longer",
    "since",
    "changed",
    "instead",
    "anymore",
    "switched",
    "starting",
    "new",
    "not",
    "promoted",
    "relocated",
    "grew",
    "raised",
    "lowered",
    "reduced",
    "increased",
    "decreased",
    "dropped",
    "became",
    "replaced",
    "upgraded",
    "downgraded",
    "cancelled",
    "canceled",
    "stopped",
    "quit",
    "rescheduled",
    "postponed",
    "these",
    "days",
    "nowadays",
    "transferred",
    "renamed",
    "updated",
];

/// Stems of predicates that hold several values at once ("likes tea" and
/// "likes cake", "has visited Peru" and "has visited Chile"): a second
/// value adds, it does not replace.
const MANY_VALUED: &[&str] = &[
    "like",
    "love",
    "enjoy",
    "visit",
    "speak",
    "play",
    "depend",
    "pair",
    "expose",
    "block",
    "allerg",
    "collect",
    "read",
    "watch",
    "listen",
    "follow",
    "attend",
    "know",
    "friend",
    "member",
    "support",
    "integrat",
    "contain",
    "include",
    "studi",
    "learn",
    "subscrib",
    "volunteer",
    "fan",
    "hobb",
    "interest",
    "been",
];

/// Predicates of one value at a time (where someone lives, what something
/// is, when it starts, who owns it); the possessive "'s" counts too.
const SINGLE_VALUED: &[&str] = &[
    "is",
    "are",
    "was",
    "lives",
    "live",
    "works",
    "work",
    "reports",
    "lasts",
    "starts",
    "begins",
    "ends",
    "costs",
    "pays",
    "earns",
    "owned",
    "located",
    "based",
    "preferred",
    "favorite",
    "favourite",
    "main",
    "primary",
    "current",
    "usual",
];

/// Predicate words: a pair that differs only in these says the same thing
/// in other words ("lasts 20 minutes" / "takes 20 minutes").
const PREDICATES: &[&str] = &[
    "is",
    "are",
    "was",
    "lives",
    "live",
    "works",
    "work",
    "reports",
    "lasts",
    "takes",
    "starts",
    "begins",
    "ends",
    "costs",
    "pays",
    "earns",
    "owned",
    "owns",
    "located",
    "based",
    "preferred",
    "prefers",
    "favorite",
    "favourite",
    "main",
    "primary",
    "current",
    "usual",
    "likes",
    "like",
    "loves",
    "enjoys",
    "enjoy",
    "fan",
    "belongs",
    "sits",
    "keeps",
    "home",
    "uses",
    "has",
    "have",
    "holds",
    "runs",
    "happens",
    "occurs",
    "scheduled",
    "planned",
    "set",
];

/// Capitalised at a sentence's start without naming anything.
const STARTERS: &[&str] = &[
    "she",
    "he",
    "they",
    "you",
    "her",
    "his",
    "their",
    "your",
    "there",
    "here",
    "when",
    "after",
    "before",
    "every",
    "each",
    "all",
    "some",
    "today",
    "yesterday",
    "tomorrow",
];

/// The features the detector's model weighs, in the order of
/// [`Model::weights`]. Each is generic English structure, not a template:
/// how similar the two texts are, whether the new one uses update wording,
/// what the word-level alignment changed (one value swapped, the subject,
/// only predicate words, a number), and whether the shared predicate holds
/// one value or several.
pub const FEATURES: [&str; 20] = [
    "cosine",
    "overlap",
    "cue",
    "names_disjoint",
    "hunks",
    "removed",
    "added",
    "swap",
    "subject_changed",
    "nothing_removed",
    "nothing_added",
    "cue_keeps_old",
    "many_valued",
    "single_valued",
    "predicate_only",
    "number_swap",
    "cue_cosine",
    "kept_after_change",
    "cue_kept",
    "kinds_differ",
];

/// A logistic model over [`FEATURES`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Model {
    pub weights: [f32; FEATURES.len()],
    pub intercept: f32,
}

/// The shipped detector, fitted on every pair of lab/data/updates_dev.jsonl
/// by `engram eval updates --fit` (which also reports it cross-fitted,
/// leave-one-domain-out, and on the held-out set; docs/benchmarks.md).
pub const MODEL: Model = Model {
    weights: [
        9.135, 4.588, -1.277, 0.432, 1.290, 0.380, -0.395, 1.758, -2.281, -5.427, -4.366, 7.368,
        -3.222, 1.741, -4.809, -0.026, 5.361, -1.138, 2.049, -6.155,
    ],
    intercept: -12.412,
};

impl Model {
    /// The probability that the pair is an update.
    pub fn probability(&self, x: &[f32; FEATURES.len()]) -> f32 {
        let z: f32 = self.intercept + self.weights.iter().zip(x).map(|(w, v)| w * v).sum::<f32>();
        1.0 / (1.0 + (-z).exp())
    }
}

fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
}

fn is_stopword(w: &str) -> bool {
    STOPWORDS.contains(&w)
}

/// A crude stem, so that "owns" / "owned" and "editor" / "editors" count as
/// the same word: a final "s" (not "ss", "us", "is") off words of 4+
/// letters, then "ing" or "ed" where 3+ letters remain.
fn stem(word: &str) -> String {
    let mut w = word;
    if w.len() >= 4 && w.ends_with('s') && !["ss", "us", "is"].iter().any(|e| w.ends_with(e)) {
        w = &w[..w.len() - 1];
    }
    for suffix in ["ing", "ed"] {
        if w.len() >= 3 + suffix.len() && w.ends_with(suffix) {
            w = &w[..w.len() - suffix.len()];
            break;
        }
    }
    w.to_string()
}

/// A word as the detector compares it: lowercased, and stemmed unless it
/// is a stopword.
fn norm(word: &str) -> String {
    let lower = word.to_lowercase();
    if is_stopword(&lower) {
        lower
    } else {
        stem(&lower)
    }
}

/// Whether `w` (normalised) is one of `lexicon`'s words.
fn in_lexicon(lexicon: &[&str], w: &str) -> bool {
    lexicon.iter().any(|l| norm(l) == w)
}

fn tokens(text: &str) -> BTreeSet<String> {
    words(text)
        .filter(|w| !is_stopword(&w.to_lowercase()))
        .map(norm)
        .collect()
}

fn is_name(w: &str) -> bool {
    let lower = w.to_lowercase();
    w.chars().next().is_some_and(char::is_uppercase)
        && !is_stopword(&lower)
        && !STARTERS.contains(&lower.as_str())
}

/// Capitalised words, lowercased, but for the function words a sentence
/// may start with ("The standup", "Our team").
fn names(text: &str) -> BTreeSet<String> {
    words(text)
        .filter(|w| is_name(w))
        .map(str::to_lowercase)
        .collect()
}

fn has_cue(text: &str) -> bool {
    let padded = format!(
        " {} ",
        text.to_lowercase().replace(['.', ',', ';', '!'], " ")
    );
    CUES.iter().any(|c| padded.contains(c))
}

/// A stretch where the two word sequences differ: the content words it
/// removes from the old text and adds in the new one, and where it starts
/// and ends in the old text.
#[derive(Debug, Default)]
struct Hunk {
    start: usize,
    end: usize,
    removed: Vec<String>,
    added: Vec<String>,
}

/// The differing stretches of two word sequences along their longest
/// common subsequence; stretches of stopwords only are dropped.
fn hunks(old: &[String], new: &[String]) -> Vec<Hunk> {
    let (n, m) = (old.len(), new.len());
    // lcs[i][j]: the longest common subsequence of old[i..] and new[j..].
    let mut lcs = vec![vec![0u16; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if old[i] == new[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut out = Vec::new();
    let mut open: Option<Hunk> = None;
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && old[i] == new[j] {
            out.extend(open.take());
            i += 1;
            j += 1;
            continue;
        }
        let hunk = open.get_or_insert_with(|| Hunk {
            start: i,
            end: i,
            ..Hunk::default()
        });
        if j >= m || (i < n && lcs[i + 1][j] >= lcs[i][j + 1]) {
            if !is_stopword(&old[i]) {
                hunk.removed.push(old[i].clone());
            }
            i += 1;
            hunk.end = i;
        } else {
            if !is_stopword(&new[j]) {
                hunk.added.push(new[j].clone());
            }
            j += 1;
        }
    }
    out.extend(open);
    out.retain(|h| !h.removed.is_empty() || !h.added.is_empty());
    out
}

fn flag(b: bool) -> f32 {
    if b { 1.0 } else { 0.0 }
}

fn has_digit(w: &str) -> bool {
    w.chars().any(|c| c.is_ascii_digit())
}

/// The pair's [`FEATURES`], or None when it cannot be an update at all: a
/// text too long to be one fact, or nothing said in common.
pub fn features(p: Pair<'_>) -> Option<[f32; FEATURES.len()]> {
    let (new, old) = (tokens(p.new), tokens(p.old));
    let shared = new.intersection(&old).count();
    if new.len() > MAX_WORDS || old.len() > MAX_WORDS || shared == 0 {
        return None;
    }
    let cue = has_cue(p.new);
    let (new_names, old_names) = (names(p.new), names(p.old));
    let old_words: Vec<String> = words(p.old).map(norm).collect();
    let new_words: Vec<String> = (words(p.new))
        .filter(|w| !CUE_WORDS.contains(&w.to_lowercase().as_str()))
        .map(norm)
        .collect();
    let changes = hunks(&old_words, &new_words);
    let first_content = old_words.iter().position(|w| !is_stopword(w));
    // The subject changed: the first change replaces the old text's first
    // content word with another (dropping a modifier, "the team standup" →
    // "the standup", is not a new subject), or a name among its first three
    // words is gone.
    let subject_changed = (changes.first().zip(first_content))
        .is_some_and(|(h, f)| h.start <= f && f < h.end && !h.added.is_empty())
        || (words(p.old).take(3))
            .filter(|w| is_name(w))
            .any(|w| !new_words.contains(&norm(w)));
    let shared_words: Vec<&String> = old_words.iter().filter(|w| new_words.contains(w)).collect();
    // What either side says that the other does not, in any order.
    let changed: Vec<&String> = old.symmetric_difference(&new).collect();
    let single = |h: &Hunk, f: fn(&str) -> bool| {
        changes.len() == 1 && h.removed.iter().any(|w| f(w)) && h.added.iter().any(|w| f(w))
    };
    let swap = changes.first().is_some_and(|h| single(h, |_| true));
    let number_swap = changes.first().is_some_and(|h| single(h, has_digit));
    let removed: usize = changes.iter().map(|h| h.removed.len()).sum();
    let added: usize = changes.iter().map(|h| h.added.len()).sum();
    let nothing_removed = old.is_subset(&new);
    // Old content words after the first change that the new text repeats:
    // "Sofia moved from Helix to Zed" names the value it replaces.
    let kept_after_change = changes.first().map_or(0, |h| {
        (old_words[h.start..].iter())
            .filter(|w| !is_stopword(w) && new_words.contains(w))
            .count()
            .min(2)
    });
    Some([
        p.cosine,
        shared as f32 / new.len().min(old.len()).max(1) as f32,
        flag(cue),
        flag(!new_names.is_empty() && !old_names.is_empty() && new_names.is_disjoint(&old_names)),
        changes.len().min(3) as f32,
        removed.min(4) as f32,
        added.min(4) as f32,
        flag(swap),
        flag(subject_changed),
        flag(nothing_removed),
        flag(new.is_subset(&old)),
        flag(cue && nothing_removed),
        flag(
            shared_words
                .iter()
                .any(|w| MANY_VALUED.iter().any(|m| w.starts_with(m))),
        ),
        flag(
            shared_words
                .iter()
                .any(|w| w.as_str() == "s" || in_lexicon(SINGLE_VALUED, w)),
        ),
        flag(!changed.is_empty() && changed.iter().all(|w| in_lexicon(PREDICATES, w))),
        flag(number_swap),
        if cue { p.cosine } else { 0.0 },
        kept_after_change as f32,
        if cue { kept_after_change as f32 } else { 0.0 },
        flag(values::kinds_differ(
            &values::values(p.old, is_name),
            &values::values(p.new, is_name),
        )),
    ])
}

/// Whether `p` is an update of the old memory by the new one, and how sure
/// (the shipped [`MODEL`]'s probability, at least `threshold`).
pub fn judge(p: Pair<'_>, threshold: f32) -> Option<Verdict> {
    judge_with(&MODEL, p, threshold)
}

/// [`judge`] with another model (the lab's cross-fitting).
pub fn judge_with(model: &Model, p: Pair<'_>, threshold: f32) -> Option<Verdict> {
    let x = features(p)?;
    let score = model.probability(&x);
    if score < threshold {
        return None;
    }
    let (new, old) = (tokens(p.new), tokens(p.old));
    let join = |w: Vec<&String>| {
        w.iter()
            .take(6)
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    };
    Some(Verdict {
        score,
        cue: has_cue(p.new),
        reason: format!(
            "update detected (score {score:.2}): \"{}\" → \"{}\"",
            join(old.difference(&new).collect()),
            join(new.difference(&old).collect())
        ),
    })
}

#[derive(Debug, sqlx::FromRow)]
struct Candidate {
    new_id: Uuid,
    old_id: Uuid,
    new_text: String,
    old_text: String,
    cosine: f32,
}

/// The nearest older memories each new one may update (ordered by the
/// index's half-precision expression, `dense::HALF`).
const CANDIDATES_SQL: &str = concat!(
    r#"
SELECT n.id AS new_id, o.id AS old_id,
       n.title || ' ' || n.content AS new_text, o.title || ' ' || o.content AS old_text,
       (1 - (n.embedding <=> o.embedding))::real AS cosine
FROM memories n
CROSS JOIN LATERAL (
    SELECT o.id, o.title, o.content, o.embedding
    FROM memories o
    WHERE o.tenant_id = $1 AND o.namespace = n.namespace AND o.id <> n.id
      AND o.embedding IS NOT NULL AND o.retracted_at IS NULL AND o.valid_to IS NULL
      AND o.access_level <= $3
      -- A memory only updates one whose every reader can read it: a
      -- sensitive write never closes a public memory that public readers
      -- would then lose without seeing why (issue 47, item 15).
      AND o.access_level >= n.access_level
      AND (o.event_time < n.event_time
           OR (o.event_time = n.event_time AND o.ingestion_time < n.ingestion_time))
      AND o.memory_type = n.memory_type
      AND (n.supersedes IS NULL OR n.supersedes <> o.id)
      AND NOT EXISTS (SELECT 1 FROM rejected_updates r WHERE r.new_id = n.id AND r.old_id = o.id)
    ORDER BY o.embedding"#,
    half_cast!(),
    " <=> n.embedding",
    half_cast!(),
    r#"
    LIMIT 5
) o
WHERE n.tenant_id = $1 AND n.id = ANY($2) AND n.embedding IS NOT NULL
  AND n.memory_type = ANY($4)
"#
);

/// How the candidate query is planned, for this transaction only. The
/// tenant is a constant ($1, not the new row's column) and every run is
/// planned for its value (`force_custom_plan`: a cached generic plan would
/// forget it), so Postgres knows the tenant's size: a small tenant is
/// scanned exactly, a large one walks the HNSW index. The correlated form
/// scanned every older memory of the tenant once per new memory, ~0.9 s per
/// 32 facts at 6K memories, growing with the tenant. Five neighbours need
/// far less than search's `ef_search` (iterative scans go on past it when
/// filters drop rows).
const CANDIDATES_PLAN: &str =
    "SET LOCAL plan_cache_mode = force_custom_plan; SET LOCAL hnsw.ef_search = 40";

/// How detection runs (`search.update_detection`, `update_threshold`,
/// `update_types`).
#[derive(Debug, Clone)]
pub struct Policy {
    pub enabled: bool,
    pub threshold: f32,
    /// Memory types whose memories can update each other: facts and
    /// events about the user, not documents (passages on a shared topic)
    /// nor conversation turns (each is its own event) nor working memory.
    pub types: Vec<String>,
    /// A clear update (update wording) scoring at least this closes the
    /// old memory's validity at the new one's event time, as `supersedes`
    /// would; 0 = detect only (`search.update_auto_supersede`).
    pub auto_supersede: f32,
    pub timeout_ms: u64,
}

impl Policy {
    /// Whether a memory of this type and text is judged at all: detection
    /// on, one of `types`, and short enough to be one fact (the same word
    /// count [`features`] allows, over the text the candidate query reads).
    pub fn judges(&self, memory_type: &str, title: &str, content: &str) -> bool {
        self.enabled
            && self.types.iter().any(|t| t == memory_type)
            && tokens(&format!("{title} {content}")).len() <= MAX_WORDS
    }
}

/// Detects updates among the memories `created` by `identity`'s write and
/// records each as a system-detected `contradicts` edge (new → old).
/// Returns the edges written.
pub async fn detect(
    pool: &PgPool,
    identity: &Identity,
    created: &[Uuid],
    policy: &Policy,
) -> Result<usize> {
    if !policy.enabled || created.is_empty() {
        return Ok(0);
    }
    let mut tx = bounds::begin(pool, policy.timeout_ms).await?;
    sqlx::raw_sql(CANDIDATES_PLAN).execute(&mut *tx).await?;
    let candidates: Vec<Candidate> = sqlx::query_as(CANDIDATES_SQL)
        .bind(&identity.tenant)
        .bind(created)
        .bind(identity.trust.as_i16())
        .bind(&policy.types)
        .fetch_all(&mut *tx)
        .await?;
    let mut edges = Vec::new();
    for c in &candidates {
        let pair = Pair {
            new: &c.new_text,
            old: &c.old_text,
            cosine: c.cosine,
        };
        if let Some(v) = judge(pair, policy.threshold) {
            edges.push((c.new_id, c.old_id, v));
        }
    }
    if !edges.is_empty() {
        let mut q = sqlx::QueryBuilder::<sqlx::Postgres>::new(
            "INSERT INTO edges (tenant_id, src_id, dst_id, edge_type, weight, origin, reason) ",
        );
        q.push_values(&edges, |mut row, (src, dst, v)| {
            row.push_bind(&identity.tenant)
                .push_bind(*src)
                .push_bind(*dst)
                .push_bind("contradicts")
                .push_bind(v.score)
                .push_bind("detected")
                .push_bind(&v.reason);
        });
        q.push(" ON CONFLICT (src_id, dst_id, edge_type) DO NOTHING");
        q.build().execute(&mut *tx).await?;
    }
    let closed = close_replaced(&mut tx, &edges, policy.auto_supersede).await?;
    if !edges.is_empty() {
        let ends: Vec<Uuid> = edges.iter().flat_map(|(s, d, _)| [*s, *d]).collect();
        crate::writes::notify(&mut tx, (&identity.tenant, ""), "edges", &ends).await?;
        if !closed.is_empty() {
            crate::writes::notify(&mut tx, (&identity.tenant, ""), "upsert", &closed).await?;
        }
        tracing::info!(tenant = %identity.tenant, count = edges.len(), closed = closed.len(), "updates detected");
    }
    crate::bounds::commit(tx).await?;
    Ok(edges.len())
}

/// Auto-supersede: the old memory of each clear, high-scoring update stops
/// being valid when the new one's event happened (kept, as history).
async fn close_replaced(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    edges: &[(Uuid, Uuid, Verdict)],
    at_least: f32,
) -> Result<Vec<Uuid>> {
    let mut closed = Vec::new();
    if at_least <= 0.0 {
        return Ok(closed);
    }
    for (new, old, v) in edges {
        if !v.cue || v.score < at_least {
            continue;
        }
        let done = sqlx::query(
            "UPDATE memories o SET valid_to = n.event_time FROM memories n \
             WHERE o.id = $1 AND n.id = $2 AND o.valid_to IS NULL",
        )
        .bind(old)
        .bind(new)
        .execute(&mut **tx)
        .await?
        .rows_affected();
        if done > 0 {
            closed.push(*old);
        }
    }
    Ok(closed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_candidate_query_can_walk_the_half_precision_index() {
        // With scans and sorts off, Postgres orders the nearest older
        // memories by the HNSW index, which it can only when the ORDER BY
        // is the index's expression (`dense::HALF`).
        let pool = engram_common::db::test_database()
            .await
            .expect("test database");
        let mut tx = pool.begin().await.expect("begin");
        sqlx::raw_sql("SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off")
            .execute(&mut *tx)
            .await
            .expect("set");
        let explain = format!("EXPLAIN {CANDIDATES_SQL}");
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
            .persistent(false)
            .bind("tenant")
            .bind(vec![Uuid::nil()])
            .bind(4i16)
            .bind(vec!["semantic".to_string()])
            .fetch_all(&mut *tx)
            .await
            .expect("explain");
        assert!(
            plan.iter().any(|l| l.contains("memories_embedding_hnsw")),
            "{plan:#?}"
        );
    }

    /// `search.update_threshold`'s default.
    const T: f32 = 0.65;

    // The cosines below are the embedder's for these texts (measured with
    // `engram eval updates --dump`).
    fn pair<'a>(new: &'a str, old: &'a str, cosine: f32) -> Pair<'a> {
        Pair { new, old, cosine }
    }

    #[test]
    fn a_changed_value_in_the_same_slot_is_an_update() {
        let v = judge(
            pair("Priya moved to Amsterdam.", "Priya lives in Berlin.", 0.73),
            T,
        )
        .expect("update");
        assert!(v.cue);
        assert!(
            v.reason.contains("berlin") && v.reason.contains("amsterdam"),
            "{}",
            v.reason
        );
    }

    #[test]
    fn a_restatement_or_an_addition_is_not() {
        assert_eq!(
            judge(
                pair("Priya lives in Berlin", "Priya lives in Berlin.", 0.99),
                T
            ),
            None
        );
        assert_eq!(
            judge(
                pair(
                    "Priya lives in Berlin with her cat",
                    "Priya lives in Berlin",
                    0.9
                ),
                T
            ),
            None,
            "nothing of the old one is replaced"
        );
        assert_eq!(
            judge(
                pair("The cafeteria serves soup", "Priya lives in Berlin", 0.1),
                T
            ),
            None,
            "nothing shared"
        );
    }

    #[test]
    fn the_same_slot_of_another_named_subject_is_not() {
        assert_eq!(
            judge(
                pair(
                    "Christopher Nolan was born in London in 1970.",
                    "John von Neumann was born in Budapest in 1903.",
                    0.7
                ),
                T
            ),
            None
        );
    }

    #[test]
    fn another_fact_about_the_same_person_is_not() {
        assert_eq!(
            judge(
                pair(
                    "Priya likes hiking on weekends",
                    "Priya lives in Berlin",
                    0.35
                ),
                T
            ),
            None
        );
    }

    #[test]
    fn update_wording_about_another_slot_is_not() {
        assert_eq!(
            judge(
                pair(
                    "Priya moved to Amsterdam.",
                    "Priya likes hiking on weekends.",
                    0.44
                ),
                T
            ),
            None
        );
    }

    #[test]
    fn the_same_fact_in_other_words_changes_no_value() {
        let x = features(pair(
            "Omar owns project Atlas.",
            "Project Atlas is owned by Omar.",
            0.9,
        ))
        .expect("shares words");
        let at = |name: &str| x[FEATURES.iter().position(|f| *f == name).expect("feature")];
        assert_eq!(
            (at("nothing_removed"), at("nothing_added")),
            (1.0, 1.0),
            "owns / owned differ only in form"
        );
        assert_eq!(at("subject_changed"), 0.0);
        let x = features(pair(
            "The standup takes 20 minutes.",
            "The standup lasts 20 minutes.",
            0.95,
        ))
        .expect("shares words");
        let at = |name: &str| x[FEATURES.iter().position(|f| *f == name).expect("feature")];
        assert_eq!(at("predicate_only"), 1.0, "only the verb changed");
    }

    #[test]
    fn the_alignment_finds_the_swapped_value() {
        let old: Vec<String> = words("The standup is at 9:30 daily").map(norm).collect();
        let new: Vec<String> = words("The standup is at 10:00 daily").map(norm).collect();
        let h = hunks(&old, &new);
        assert_eq!(h.len(), 1);
        assert_eq!(
            (h[0].removed.clone(), h[0].added.clone()),
            (
                vec!["9".to_string(), "30".to_string()],
                vec!["10".to_string(), "00".to_string()]
            )
        );
        assert_eq!((h[0].start, h[0].end), (4, 6));
    }

    #[test]
    fn only_short_facts_of_the_judged_types_are_judged() {
        let policy = Policy {
            enabled: true,
            threshold: T,
            types: vec!["semantic".into()],
            auto_supersede: 0.0,
            timeout_ms: 1000,
        };
        assert!(policy.judges("semantic", "", "Priya lives in Berlin."));
        assert!(!policy.judges("document", "", "Priya lives in Berlin."));
        let passage: Vec<String> = (0..=MAX_WORDS).map(|i| format!("word{i}")).collect();
        let passage = passage.join(" ");
        assert!(!policy.judges("semantic", "A title", &passage));
        let off = Policy {
            enabled: false,
            ..policy
        };
        assert!(!off.judges("semantic", "", "Priya lives in Berlin."));
    }

    #[test]
    fn stems_join_forms_of_one_word() {
        assert_eq!(stem("owns"), stem("owned"));
        assert_eq!(stem("editors"), "editor");
        assert_eq!(stem("mornings"), stem("morning"));
        assert_eq!(stem("is"), "is");
    }

    proptest::proptest! {
        /// Any pair of texts a tenant's writes can put side by side is
        /// judged without a panic (multi-byte words, 1-3 letter stems,
        /// texts over the word limit), and judging is deterministic.
        #[test]
        fn any_pair_is_judged(
            new in "\\PC{0,120}",
            old in "[A-Za-zé ':0-9$€.,]{0,120}",
            cosine in -1.0f32..1.0,
        ) {
            let p = pair(&new, &old, cosine);
            proptest::prop_assert_eq!(judge(p, T), judge(p, T));
        }
    }
}
