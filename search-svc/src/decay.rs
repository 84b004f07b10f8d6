//! The decay job: keeps `memories.decay_score`, which the proto calls
//! "maintained by the decay job; 1.0 when fresh", and which reads compare
//! with the decay floor (`filters.rs`) and the gateway weighs answers by.
//!
//! The function ([`decay_score`]): exponential forgetting with a half-life
//! per memory type,
//!
//! ```text
//! decay_score = 0.5 ^ (age / half_life(memory_type)),   age = now − last touch
//! last touch  = the later of ingestion_time and the last feedback that
//!               marked the memory `used` or `helpful` (value true)
//! ```
//!
//! so a memory loses half its weight per half-life without use, and using it
//! makes it fresh again (Generative Agents' recency, MemoryBank's forgetting
//! curve). Half-lives come from `search.decay_half_life_days` (episodic 30
//! days, conversation 14, semantic 180, procedural 365) and
//! `search.decay_default_half_life_days` for every other type (0: documents
//! and imported corpora never fade). A half-life of 0 means "never decays".
//! With the default floor of 0.1 a memory is hidden from default reads
//! after about 3.3 half-lives without use; `include_historical` still
//! finds it.
//!
//! Why ingestion time and not event_time: event_time says when the
//! remembered thing happened. A corpus imported today about 2019 (LoCoMo
//! sessions, a company history) would be born decayed, and a caller asking
//! for March 2019 by `time_range` would find nothing, because the floor
//! applies before the window. Age since engram learned or last used a
//! memory is what forgetting is about; the event's own time stays a filter.
//!
//! The job runs inside search-svc every `search.decay_interval_secs` (first
//! pass one interval after start; 0 disables it) and `engram decay --once`
//! runs one pass by hand. A pass walks every memory in id order, in batches
//! of `search.decay_batch_size`: each batch is one short transaction (one
//! SELECT, one UPDATE of the rows whose score moved enough, [`moved`])
//! bounded by `search.statement_timeout_decay_ms`, so it never
//! holds many row locks or a long snapshot. Passes are idempotent, so two
//! replicas running one at the same time only repeat work. The score is
//! computed here, not in SQL, so the one function above is the one tested.

use std::collections::BTreeMap;
use std::time::Duration;

use engram_common::settings::SearchSettings;
use sqlx::PgPool;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::bounds;
use crate::error::Result;

/// Scores that moved less than this are left alone: with a 30-day
/// half-life a score falls ~0.0002 in ten minutes, so rewriting every row
/// on every pass would be all churn and no information.
pub const EPSILON: f32 = 0.001;

/// ...nor are scores that moved less than this share of themselves. Why:
/// a decay UPDATE is not a cheap write. `memories` pages are full (rows of
/// ~2.6 KB), so almost no update is HOT and each one adds an entry to every
/// index, the HNSW one included: 10,000 decay-style updates on the bench's
/// 100K tenant took 17.9 s of Postgres (1.8 ms a row; 39 HOT), and left
/// dead rows whose vacuum walks the HNSW index (docs/operability.md). At
/// [`EPSILON`] alone a memory is rewritten 820-890 times between 1.0 and
/// the 0.1 floor at half-lives of 14 to 180 days (every 1.4 h near 1.0 at
/// 30 days), at 2 % of its score 113 times whatever the half-life (about
/// daily at 30 days, twice a day at 14). The
/// stored score then trails the exact one by under 2 % of itself: the
/// gateway's weighting cannot see it, and a memory crosses the floor at
/// most ~0.03 half-lives late (a day at 30 days).
pub const RELATIVE_STEP: f32 = 0.02;

/// Whether a stored score `old` is rewritten as `new`.
pub fn moved(old: f32, new: f32) -> bool {
    let change = (new - old).abs();
    change >= EPSILON && change >= RELATIVE_STEP * old.max(new)
}

const SECONDS_PER_DAY: f64 = 86_400.0;

/// `0.5 ^ (age / half-life)` in [0, 1]. A half-life that is not a positive
/// finite number means the type never decays (1.0); a negative age (a clock
/// ahead of the database) counts as fresh.
pub fn decay_score(age_secs: f64, half_life_days: f64) -> f32 {
    if !(half_life_days > 0.0 && half_life_days.is_finite()) {
        return 1.0;
    }
    let age = if age_secs.is_nan() {
        0.0
    } else {
        age_secs.max(0.0)
    };
    let score = 0.5f64.powf(age / (half_life_days * SECONDS_PER_DAY));
    score.clamp(0.0, 1.0) as f32
}

/// Half-lives per memory type, batch size and statement bound of a pass.
#[derive(Debug, Clone)]
pub struct Policy {
    half_lives: BTreeMap<String, f64>,
    default_half_life_days: f64,
    batch_size: u32,
    timeout_ms: u64,
    /// Stage 4 training examples older than this are deleted by the pass.
    examples_days: u32,
}

impl Policy {
    /// The configured half-lives laid over the defaults of
    /// [`SearchSettings::default`], so overriding one type keeps the rest.
    pub fn from_settings(s: &SearchSettings) -> Self {
        let mut half_lives: BTreeMap<String, f64> = SearchSettings::default()
            .decay_half_life_days
            .into_iter()
            .map(|(t, d)| (t, f64::from(d)))
            .collect();
        for (t, d) in &s.decay_half_life_days {
            half_lives.insert(t.clone(), f64::from(*d));
        }
        Self {
            half_lives,
            default_half_life_days: f64::from(s.decay_default_half_life_days),
            batch_size: s.decay_batch_size.max(1),
            timeout_ms: s.statement_timeout_decay_ms,
            examples_days: s.ranker_examples_days,
        }
    }

    pub fn half_life_days(&self, memory_type: &str) -> f64 {
        self.half_lives
            .get(memory_type)
            .copied()
            .unwrap_or(self.default_half_life_days)
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassReport {
    pub scanned: u64,
    pub updated: u64,
}

#[derive(Debug, sqlx::FromRow)]
struct Row {
    id: Uuid,
    memory_type: String,
    decay_score: f32,
    age_secs: f64,
}

/// One batch after `$1` in id order; age on the database's clock.
const BATCH_SQL: &str = "SELECT m.id, m.memory_type, m.decay_score, \
       extract(epoch FROM now() - greatest(m.ingestion_time, coalesce(u.at, m.ingestion_time)))::float8 AS age_secs \
     FROM memories m LEFT JOIN LATERAL ( \
       SELECT max(f.created_at) AS at FROM feedback f \
       WHERE f.tenant_id = m.tenant_id AND f.memory_id = m.id AND f.value \
         AND f.signal IN ('used', 'helpful')) u ON true \
     WHERE $1::uuid IS NULL OR m.id > $1 ORDER BY m.id LIMIT $2";

const UPDATE_SQL: &str = "UPDATE memories m SET decay_score = t.s \
     FROM unnest($1::uuid[], $2::real[]) AS t(id, s) WHERE m.id = t.id";

/// One full pass over every memory of every tenant.
pub async fn run_pass(pool: &PgPool, policy: &Policy) -> Result<PassReport> {
    pass(pool, policy, None).await
}

/// A pass that ends early, between batches, once `stop_opt` says so.
async fn pass(
    pool: &PgPool,
    policy: &Policy,
    stop_opt: Option<&watch::Receiver<bool>>,
) -> Result<PassReport> {
    let mut report = PassReport::default();
    let mut after = None;
    while !stop_opt.is_some_and(|s| *s.borrow()) {
        let (scanned, updated, last) = batch(pool, policy, after).await?;
        report.scanned += scanned;
        report.updated += updated;
        match last {
            Some(id) if scanned == u64::from(policy.batch_size) => after = Some(id),
            _ => break,
        }
    }
    expire_examples(pool, policy).await?;
    compact_feedback(pool, policy).await?;
    Ok(report)
}

/// All decay reads of feedback is the newest `used` or `helpful` vote per
/// memory ([`BATCH_SQL`]), so older votes of the same kind on the same
/// memory are deleted: the table stays within a few rows per memory, not
/// one per call (issue 47, item 5: a flood wrote 1.34 M rows and nothing
/// ever deleted one).
const COMPACT_FEEDBACK_SQL: &str = "DELETE FROM feedback WHERE id IN ( \
       SELECT id FROM ( \
         SELECT id, row_number() OVER ( \
           PARTITION BY tenant_id, memory_id, signal, value \
           ORDER BY created_at DESC, id DESC) AS newer \
         FROM feedback) ranked \
       WHERE ranked.newer > 1)";

async fn compact_feedback(pool: &PgPool, policy: &Policy) -> Result<()> {
    let mut tx = bounds::begin(pool, policy.timeout_ms).await?;
    sqlx::query(COMPACT_FEEDBACK_SQL).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(())
}

/// Keeps the ranker's training examples bounded in time
/// (migrations/0003_ranker_examples.sql).
async fn expire_examples(pool: &PgPool, policy: &Policy) -> Result<()> {
    let mut tx = bounds::begin(pool, policy.timeout_ms).await?;
    sqlx::query("DELETE FROM ranker_examples WHERE created_at < now() - make_interval(days => $1)")
        .bind(i32::try_from(policy.examples_days).unwrap_or(i32::MAX))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Scores one batch; returns (rows read, rows updated, last id read).
async fn batch(
    pool: &PgPool,
    policy: &Policy,
    after: Option<Uuid>,
) -> Result<(u64, u64, Option<Uuid>)> {
    let mut tx = bounds::begin(pool, policy.timeout_ms).await?;
    let rows: Vec<Row> = sqlx::query_as(BATCH_SQL)
        .bind(after)
        .bind(i64::from(policy.batch_size))
        .fetch_all(&mut *tx)
        .await?;
    let (mut ids, mut scores) = (Vec::new(), Vec::new());
    for r in &rows {
        let s = decay_score(r.age_secs, policy.half_life_days(&r.memory_type));
        if moved(r.decay_score, s) {
            ids.push(r.id);
            scores.push(s);
        }
    }
    if !ids.is_empty() {
        sqlx::query(UPDATE_SQL)
            .bind(&ids)
            .bind(&scores)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok((
        rows.len() as u64,
        ids.len() as u64,
        rows.last().map(|r| r.id),
    ))
}

/// The scheduled job; stopping it lets the batch in flight finish.
#[derive(Debug)]
pub struct Job {
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
}

impl Job {
    /// Starts the schedule, or nothing when `decay_interval_secs` is 0.
    pub fn spawn(pool: PgPool, settings: &SearchSettings) -> Option<Self> {
        if settings.decay_interval_secs == 0 {
            return None;
        }
        let every = Duration::from_secs(settings.decay_interval_secs);
        let policy = Policy::from_settings(settings);
        let (stop, rx) = watch::channel(false);
        let handle = tokio::spawn(schedule(pool, policy, every, rx));
        Some(Self { stop, handle })
    }

    /// Signals the job and waits for it (at most one batch, bounded by its
    /// statement_timeout), so the pool can close under no running query.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.handle.await {
            tracing::warn!(error = %e, "decay job ended abnormally");
        }
    }
}

async fn schedule(pool: PgPool, policy: Policy, every: Duration, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        match pass(&pool, &policy, Some(&stop)).await {
            Ok(r) => tracing::info!(
                scanned = r.scanned,
                updated = r.updated,
                "decay pass finished"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "decay pass failed; next one at the next interval")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: f64 = SECONDS_PER_DAY;

    #[test]
    fn the_score_halves_per_half_life_and_stays_in_the_unit_interval() {
        assert_eq!(decay_score(0.0, 30.0), 1.0);
        assert!((decay_score(30.0 * DAY, 30.0) - 0.5).abs() < 1e-6);
        assert!((decay_score(60.0 * DAY, 30.0) - 0.25).abs() < 1e-6);
        // Below the default floor of 0.1 after ~3.32 half-lives.
        assert!(decay_score(3.4 * 30.0 * DAY, 30.0) < 0.1);
        assert!(decay_score(3.2 * 30.0 * DAY, 30.0) > 0.1);
        for age in [0.0, 1.0, DAY, 1e6 * DAY, f64::MAX, f64::INFINITY] {
            let s = decay_score(age, 14.0);
            assert!((0.0..=1.0).contains(&s), "{age}: {s}");
        }
        assert_eq!(decay_score(f64::INFINITY, 14.0), 0.0);
    }

    #[test]
    fn no_half_life_never_decays_and_odd_ages_count_as_fresh() {
        for hl in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(decay_score(1e9, hl), 1.0, "{hl}");
        }
        assert_eq!(decay_score(-5.0 * DAY, 30.0), 1.0);
        assert_eq!(decay_score(f64::NAN, 30.0), 1.0);
    }

    #[test]
    fn the_score_only_falls_with_age() {
        let mut last = 1.0;
        for d in 0..400 {
            let s = decay_score(f64::from(d) * DAY, 30.0);
            assert!(s <= last);
            last = s;
        }
    }

    /// Replays a memory's life at a 30-day half-life, one pass every ten
    /// minutes, from fresh to the 0.1 floor: how often the job rewrites it,
    /// and how far the stored score ever trails the exact one.
    #[test]
    fn a_memory_is_rewritten_about_daily_and_never_trails_by_more_than_the_step() {
        let (mut stored, mut writes, mut worst) = (1.0f32, 0, 0.0f32);
        let pass = 600.0;
        let mut age = 0.0;
        loop {
            age += pass;
            let exact = decay_score(age, 30.0);
            if exact < 0.1 {
                break;
            }
            if moved(stored, exact) {
                stored = exact;
                writes += 1;
            }
            worst = worst.max((stored - exact) / exact);
        }
        assert!((100..=130).contains(&writes), "{writes} rewrites");
        assert!(worst < 0.021, "trails by {worst}");
        // Use makes a memory fresh again at once, and a big jump always
        // counts.
        assert!(moved(0.12, 1.0));
        assert!(moved(0.5, 0.0));
        assert!(!moved(1.0, 0.99));
        assert!(!moved(0.02, 0.0195), "under the absolute step");
    }

    #[test]
    fn configured_half_lives_lie_over_the_defaults() {
        let s = SearchSettings {
            decay_half_life_days: [("episodic".to_string(), 7.0)].into_iter().collect(),
            decay_default_half_life_days: 2.0,
            ..Default::default()
        };
        let p = Policy::from_settings(&s);
        assert_eq!(p.half_life_days("episodic"), 7.0);
        assert_eq!(p.half_life_days("semantic"), 180.0);
        assert_eq!(p.half_life_days("document"), 2.0);
        let d = Policy::from_settings(&SearchSettings::default());
        assert_eq!(d.half_life_days("episodic"), 30.0);
        assert_eq!(d.half_life_days("document"), 0.0);
        assert!(d.half_life_days("conversation") < d.half_life_days("semantic"));
    }
}
