//! Conversation turns (issue 20). A turn alone often means nothing
//! ("Yeah, it was amazing!"), so its keyword index also holds its session's
//! date and the turns just before it; the LoCoMo probe
//! (shared/notes/locomo-probe.md) measured +12 points of keyword R@5 from
//! that context, while dense search, which MiniLM dilutes over longer text,
//! keeps embedding the turn alone. A neighbour's words enter a turn's
//! index only when the neighbour is at the same or a lower access level, so
//! a public turn never leaks a sensitive turn's words to a public reader.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use engram_common::AccessLevel;
use engram_common::text::check_short_text;
use engram_proto as pb;
use sqlx::{Postgres, Transaction};

use crate::error::{Error, Result};

pub const MAX_SESSION_ID_CHARS: usize = 128;
pub const MAX_TURN_INDEX: u32 = 1_000_000;
pub const MAX_SPEAKER_CHARS: usize = 128;
pub const MAX_CAPTION_CHARS: usize = 2_000;
/// Turns before this one whose words join its keyword index: two measured
/// best of the write-time options (the probe's "date + 2 previous turns").
pub const CONTEXT_TURNS: u32 = 2;

/// A checked [`pb::Turn`].
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    pub session_id: String,
    pub turn_index: u32,
    pub speaker: String,
    pub caption: String,
}

impl Turn {
    /// Validates `t`; `field` is the turn's path in the request
    /// (`memories[3].turn`), so an error names the exact field.
    pub fn from_proto(field: &str, t: pb::Turn) -> Result<Self> {
        let pb::Turn {
            session_id,
            turn_index,
            speaker,
            caption,
        } = t;
        let f = |name: &str| format!("{field}.{name}");
        let id_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
        let chars = session_id.chars().count();
        if chars == 0 || chars > MAX_SESSION_ID_CHARS || !session_id.chars().all(id_ok) {
            return Err(Error::invalid(
                f("session_id"),
                format!("must be 1..={MAX_SESSION_ID_CHARS} characters of [A-Za-z0-9._:-]"),
            ));
        }
        if turn_index > MAX_TURN_INDEX {
            return Err(Error::invalid(
                f("turn_index"),
                format!("must be at most {MAX_TURN_INDEX}"),
            ));
        }
        check_short(&f("speaker"), &speaker, MAX_SPEAKER_CHARS)?;
        check_short(&f("caption"), &caption, MAX_CAPTION_CHARS)?;
        Ok(Self {
            session_id,
            turn_index,
            speaker: speaker.trim().to_string(),
            caption: caption.trim().to_string(),
        })
    }

    pub fn into_proto(self) -> pb::Turn {
        pb::Turn {
            session_id: self.session_id,
            turn_index: self.turn_index,
            speaker: self.speaker,
            caption: self.caption,
        }
    }

    /// The turn as said: "speaker: text" (what is embedded).
    pub fn said(&self, content: &str) -> String {
        if self.speaker.is_empty() {
            content.to_string()
        } else {
            format!("{}: {content}", self.speaker)
        }
    }
}

fn check_short(field: &str, s: &str, max_chars: usize) -> Result<()> {
    check_short_text(s, max_chars).map_err(|rule| Error::invalid(field, rule))
}

/// A turn of the same session that may lend its words to another's index.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Neighbour {
    pub turn_index: i32,
    pub access_level: i16,
    pub speaker: String,
    pub content: String,
}

/// The keyword context of a turn at `access` and `event_time_opt`: its
/// session's date, then the [`CONTEXT_TURNS`] turns before it, oldest
/// first, each only if at or below `access`. Pure, so the access rule is
/// property-tested.
pub fn context_text(
    turn: &Turn,
    access: AccessLevel,
    event_time_opt: Option<DateTime<Utc>>,
    neighbours: &[Neighbour],
) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(t) = event_time_opt {
        parts.push(t.format("%-d %B %Y").to_string());
    }
    let first = i64::from(turn.turn_index) - i64::from(CONTEXT_TURNS);
    let mut before: Vec<&Neighbour> = neighbours
        .iter()
        .filter(|n| (first..i64::from(turn.turn_index)).contains(&i64::from(n.turn_index)))
        .filter(|n| n.access_level <= access.as_i16())
        .collect();
    before.sort_by_key(|n| n.turn_index);
    before.dedup_by_key(|n| n.turn_index);
    for n in before {
        match n.speaker.is_empty() {
            true => parts.push(n.content.clone()),
            false => parts.push(format!("{}: {}", n.speaker, n.content)),
        }
    }
    parts.join("\n")
}

/// What [`contexts`] needs of one turn being written.
#[derive(Debug, Clone, Copy)]
pub struct Written<'a> {
    pub id: uuid::Uuid,
    pub namespace: &'a str,
    pub turn: &'a Turn,
    pub access: AccessLevel,
    pub event_time_opt: Option<DateTime<Utc>>,
    pub content: &'a str,
}

/// The keyword context of every turn of a batch, in order: neighbours
/// come from the batch itself and, for those it does not hold, from the
/// caller's tenant in Postgres (same namespace and session, live rows),
/// fetched in one query for the whole batch. Runs inside the write's
/// transaction.
pub async fn contexts(
    tx: &mut Transaction<'_, Postgres>,
    tenant: &str,
    batch: &[Written<'_>],
) -> Result<Vec<String>> {
    let mut by_session: HashMap<(String, String), Vec<Neighbour>> = HashMap::new();
    for w in batch {
        by_session
            .entry(session_key(w))
            .or_default()
            .push(Neighbour {
                turn_index: w.turn.turn_index as i32,
                access_level: w.access.as_i16(),
                speaker: w.turn.speaker.clone(),
                content: w.content.to_string(),
            });
    }
    // A batch that holds the turns before each of its turns (the usual
    // case: a conversation written in order) needs no lookup.
    let uncovered: Vec<&Written<'_>> = batch
        .iter()
        .filter(|w| {
            let held = by_session
                .get(&session_key(w))
                .map_or(&[][..], Vec::as_slice);
            !window(w).all(|i| held.iter().any(|n| n.turn_index == i))
        })
        .collect();
    for (key, n) in stored_before(tx, tenant, batch, &uncovered).await? {
        // Pushed after the batch's own rows: `context_text` keeps the first
        // of a turn index, so a turn rewritten in this batch wins.
        by_session.entry(key).or_default().push(n);
    }
    Ok(batch
        .iter()
        .map(|w| {
            let neighbours = by_session
                .get(&session_key(w))
                .map_or(&[][..], Vec::as_slice);
            context_text(w.turn, w.access, w.event_time_opt, neighbours)
        })
        .collect())
}

fn session_key(w: &Written<'_>) -> (String, String) {
    (w.namespace.to_string(), w.turn.session_id.clone())
}

/// The turn indexes whose words may join `w`'s context.
fn window(w: &Written<'_>) -> std::ops::Range<i32> {
    let first = w.turn.turn_index.saturating_sub(CONTEXT_TURNS) as i32;
    first..w.turn.turn_index as i32
}

/// A stored neighbour with the (namespace, session) it belongs to.
#[derive(sqlx::FromRow)]
struct StoredNeighbour {
    namespace: String,
    session_id: String,
    #[sqlx(flatten)]
    neighbour: Neighbour,
}

/// The stored turns just before each of `uncovered`, in one query; rows of
/// the batch itself are left out (the batch has their new text). Every
/// access level comes back: [`context_text`] keeps only what each turn may
/// see.
async fn stored_before(
    tx: &mut Transaction<'_, Postgres>,
    tenant: &str,
    batch: &[Written<'_>],
    uncovered: &[&Written<'_>],
) -> Result<Vec<((String, String), Neighbour)>> {
    let wanted: Vec<&&Written<'_>> = uncovered.iter().filter(|w| !window(w).is_empty()).collect();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let namespaces: Vec<&str> = wanted.iter().map(|w| w.namespace).collect();
    let sessions: Vec<&str> = wanted.iter().map(|w| w.turn.session_id.as_str()).collect();
    let firsts: Vec<i32> = wanted.iter().map(|w| window(w).start).collect();
    let ends: Vec<i32> = wanted.iter().map(|w| window(w).end).collect();
    let ids: Vec<uuid::Uuid> = batch.iter().map(|w| w.id).collect();
    let rows = sqlx::query_as::<_, StoredNeighbour>(
        "SELECT DISTINCT m.namespace, m.session_id, m.turn_index, m.access_level, m.speaker, m.content \
         FROM unnest($2::text[], $3::text[], $4::int[], $5::int[]) AS w(namespace, session_id, first, stop) \
         JOIN memories m ON m.tenant_id = $1 AND m.namespace = w.namespace \
           AND m.session_id = w.session_id \
           AND m.turn_index >= w.first AND m.turn_index < w.stop \
         WHERE m.retracted_at IS NULL AND m.id <> ALL($6::uuid[])",
    )
    .bind(tenant)
    .bind(&namespaces)
    .bind(&sessions)
    .bind(&firsts)
    .bind(&ends)
    .bind(&ids)
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| ((r.namespace, r.session_id), r.neighbour))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn turn(i: u32) -> Turn {
        Turn {
            session_id: "s1".into(),
            turn_index: i,
            speaker: "Mel".into(),
            caption: String::new(),
        }
    }

    fn said(i: i32, level: i16, text: &str) -> Neighbour {
        Neighbour {
            turn_index: i,
            access_level: level,
            speaker: "Caroline".into(),
            content: text.into(),
        }
    }

    #[test]
    fn the_context_is_the_date_and_the_two_turns_before() {
        let date = DateTime::parse_from_rfc3339("2023-05-08T13:56:00Z")
            .map(|d| d.with_timezone(&Utc))
            .ok();
        let n = [
            said(4, 1, "way back"),
            said(6, 1, "Did you see the northern lights?"),
            said(5, 1, "I went to Tromsø."),
            said(8, 1, "later"),
        ];
        let ctx = context_text(&turn(7), AccessLevel::Public, date, &n);
        assert_eq!(
            ctx,
            "8 May 2023\nCaroline: I went to Tromsø.\nCaroline: Did you see the northern lights?"
        );
    }

    #[test]
    fn bad_turns_name_their_field() {
        let bad = |t: pb::Turn| match Turn::from_proto("memories[2].turn", t) {
            Err(Error::InvalidArgument(m)) => m.split(':').next().unwrap_or("").to_string(),
            other => panic!("{other:?}"),
        };
        let ok = pb::Turn {
            session_id: "conv-1:session_3".into(),
            turn_index: 4,
            speaker: "Mel".into(),
            caption: "a photo of a dog".into(),
        };
        assert!(Turn::from_proto("t", ok.clone()).is_ok());
        let cases = [
            (
                "session_id",
                pb::Turn {
                    session_id: String::new(),
                    ..ok.clone()
                },
            ),
            (
                "session_id",
                pb::Turn {
                    session_id: "a b".into(),
                    ..ok.clone()
                },
            ),
            (
                "session_id",
                pb::Turn {
                    session_id: "x".repeat(129),
                    ..ok.clone()
                },
            ),
            (
                "turn_index",
                pb::Turn {
                    turn_index: MAX_TURN_INDEX + 1,
                    ..ok.clone()
                },
            ),
            (
                "speaker",
                pb::Turn {
                    speaker: "a\0b".into(),
                    ..ok.clone()
                },
            ),
            (
                "speaker",
                pb::Turn {
                    speaker: "s".repeat(129),
                    ..ok.clone()
                },
            ),
            (
                "caption",
                pb::Turn {
                    caption: "c".repeat(2001),
                    ..ok.clone()
                },
            ),
        ];
        for (field, t) in cases {
            assert_eq!(bad(t), format!("memories[2].turn.{field}"));
        }
    }

    proptest! {
        /// Whatever the session holds, a turn's context carries no words of
        /// a turn above its own access level.
        #[test]
        fn context_never_holds_words_from_above(
            own in 1i16..=4,
            levels in proptest::collection::vec(1i16..=4, 0..6),
        ) {
            let access = AccessLevel::from_i16(own).unwrap_or(AccessLevel::Public);
            let n: Vec<Neighbour> = levels
                .iter()
                .enumerate()
                .map(|(i, &l)| said(i as i32 + 3, l, &format!("secret{l}x{i}")))
                .collect();
            let ctx = context_text(&turn(5), access, None, &n);
            for (i, &l) in levels.iter().enumerate() {
                let word = format!("secret{l}x{i}");
                if l > own {
                    prop_assert!(!ctx.contains(&word), "{ctx}");
                }
            }
        }
    }
}
