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
//! another tenant's or namespace's), current (not retracted, no valid_to).
//! A pair is an update when it talks about the same slot (cosine and shared
//! wording), a value changed on both sides, and the score clears
//! `search.update_threshold`; update wording in the new text ("now",
//! "moved", "no longer", "changed", "instead", …) adds to the score.
//!
//! Best effort and after the write's commit: detection never fails or
//! delays an acknowledged write beyond one bounded query.

use std::collections::BTreeSet;

use engram_common::Identity;
use sqlx::PgPool;
use uuid::Uuid;

use crate::bounds;
use crate::error::Result;

/// What a pair's score is made of.
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
    pub score: f32,
    /// Update wording in the new memory.
    pub cue: bool,
    /// For people: what changed, old → new.
    pub reason: String,
}

const STOPWORDS: &[&str] = &[
    "a", "an", "the", "is", "are", "was", "were", "be", "been", "to", "in", "at", "on", "of",
    "for", "and", "or", "our", "we", "my", "i", "it", "its", "has", "have", "had", "with", "from",
    "by", "as", "that", "this", "will", "still", "now", "new", "no", "longer", "moved", "since",
    "changed", "instead", "anymore", "switched", "starting", "happen", "happens", "every",
];

/// Content words a memory may have and still be judged (a fact, not a
/// passage).
const MAX_WORDS: usize = 30;

/// Words that say the new memory replaces something.
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
    " not anymore",
];

fn tokens(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .filter(|w| !STOPWORDS.contains(&w.as_str()))
        .collect()
}

/// Capitalised words, lowercased, but for the function words a sentence
/// may start with ("The standup", "Our team").
fn names(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().next().is_some_and(char::is_uppercase))
        .map(str::to_lowercase)
        .filter(|w| !STOPWORDS.contains(&w.as_str()) && !STARTERS.contains(&w.as_str()))
        .collect()
}

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

fn has_cue(text: &str) -> bool {
    let padded = format!(
        " {} ",
        text.to_lowercase().replace(['.', ',', ';', '!'], " ")
    );
    CUES.iter().any(|c| padded.contains(c))
}

/// Whether `p` is an update of the old memory by the new one, and how sure.
pub fn judge(p: Pair<'_>, threshold: f32) -> Option<Verdict> {
    let (new, old) = (tokens(p.new), tokens(p.old));
    // Updates are short statements of a fact; passages and documents that
    // share a topic differ in many words without replacing each other.
    if new.len() > MAX_WORDS || old.len() > MAX_WORDS {
        return None;
    }
    let shared = new.intersection(&old).count();
    let new_only: Vec<&String> = new.difference(&old).collect();
    let old_only: Vec<&String> = old.difference(&new).collect();
    // A restatement (nothing changed) or an addition (nothing replaced) is
    // not an update.
    if new_only.is_empty() || old_only.is_empty() || shared == 0 {
        return None;
    }
    // Two statements that both name someone or something are about the
    // same subject only if they share a name ("Nolan was born in London"
    // does not update "von Neumann was born in Budapest").
    let (new_names, old_names) = (names(p.new), names(p.old));
    if !new_names.is_empty() && !old_names.is_empty() && new_names.is_disjoint(&old_names) {
        return None;
    }
    let overlap = shared as f32 / new.len().min(old.len()).max(1) as f32;
    let cue = has_cue(p.new);
    let score = 0.6 * p.cosine + 0.4 * overlap + if cue { 0.1 } else { 0.0 };
    if score < threshold {
        return None;
    }
    let join = |w: &[&String]| {
        w.iter()
            .take(6)
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    };
    Some(Verdict {
        score,
        cue,
        reason: format!(
            "update detected (score {score:.2}): \"{}\" → \"{}\"",
            join(&old_only),
            join(&new_only)
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

/// The nearest older memories each new one may update.
const CANDIDATES_SQL: &str = r#"
SELECT n.id AS new_id, o.id AS old_id,
       n.title || ' ' || n.content AS new_text, o.title || ' ' || o.content AS old_text,
       (1 - (n.embedding <=> o.embedding))::real AS cosine
FROM memories n
CROSS JOIN LATERAL (
    SELECT o.id, o.title, o.content, o.embedding
    FROM memories o
    WHERE o.tenant_id = n.tenant_id AND o.namespace = n.namespace AND o.id <> n.id
      AND o.embedding IS NOT NULL AND o.retracted_at IS NULL AND o.valid_to IS NULL
      AND o.access_level <= $3
      AND (o.event_time < n.event_time
           OR (o.event_time = n.event_time AND o.ingestion_time < n.ingestion_time))
      AND o.memory_type = n.memory_type
      AND (n.supersedes IS NULL OR n.supersedes <> o.id)
    ORDER BY o.embedding <=> n.embedding
    LIMIT 5
) o
WHERE n.tenant_id = $1 AND n.id = ANY($2) AND n.embedding IS NOT NULL
  AND n.memory_type = ANY($4)
"#;

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
        crate::writes::notify(&mut tx, &identity.tenant, "edges", &ends).await?;
        if !closed.is_empty() {
            crate::writes::notify(&mut tx, &identity.tenant, "upsert", &closed).await?;
        }
        tracing::info!(tenant = %identity.tenant, count = edges.len(), closed = closed.len(), "updates detected");
    }
    tx.commit().await?;
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

    const T: f32 = 0.55;

    fn pair<'a>(new: &'a str, old: &'a str, cosine: f32) -> Pair<'a> {
        Pair { new, old, cosine }
    }

    #[test]
    fn a_changed_value_in_the_same_slot_is_an_update() {
        let v = judge(
            pair("Priya moved to Amsterdam.", "Priya lives in Berlin.", 0.6),
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
}
