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
use engram_common::text::check_text;
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
    check_text(s).map_err(|rule| Error::invalid(field, rule))?;
    if s.chars().count() > max_chars {
        return Err(Error::invalid(
            field,
            format!("must be at most {max_chars} characters"),
        ));
    }
    Ok(())
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
/// caller's tenant in Postgres (same namespace and session, live rows).
/// Runs inside the write's transaction.
pub async fn contexts(
    tx: &mut Transaction<'_, Postgres>,
    tenant: &str,
    batch: &[Written<'_>],
) -> Result<Vec<String>> {
    let mut in_batch: HashMap<(&str, &str), Vec<Neighbour>> = HashMap::new();
    for w in batch {
        in_batch
            .entry((w.namespace, w.turn.session_id.as_str()))
            .or_default()
            .push(Neighbour {
                turn_index: w.turn.turn_index as i32,
                access_level: w.access.as_i16(),
                speaker: w.turn.speaker.clone(),
                content: w.content.to_string(),
            });
    }
    let mut out = Vec::with_capacity(batch.len());
    for w in batch {
        let key = (w.namespace, w.turn.session_id.as_str());
        let mut neighbours = in_batch.get(&key).cloned().unwrap_or_default();
        // A batch that holds the turns before this one (the usual case:
        // a conversation written in order) needs no lookup.
        let first = w.turn.turn_index.saturating_sub(CONTEXT_TURNS) as i32;
        let wanted = first..w.turn.turn_index as i32;
        let held = wanted
            .clone()
            .all(|i| neighbours.iter().any(|n| n.turn_index == i));
        if !held {
            neighbours.extend(stored_before(tx, tenant, w).await?);
        }
        out.push(context_text(
            w.turn,
            w.access,
            w.event_time_opt,
            &neighbours,
        ));
    }
    Ok(out)
}

/// The stored turns just before `w` in its session that it may see.
async fn stored_before(
    tx: &mut Transaction<'_, Postgres>,
    tenant: &str,
    w: &Written<'_>,
) -> Result<Vec<Neighbour>> {
    if w.turn.turn_index == 0 {
        return Ok(Vec::new());
    }
    let from = w.turn.turn_index.saturating_sub(CONTEXT_TURNS) as i32;
    Ok(sqlx::query_as::<_, Neighbour>(
        "SELECT turn_index, access_level, speaker, content FROM memories \
         WHERE tenant_id = $1 AND session_id = $2 AND namespace = $3 \
           AND turn_index >= $4 AND turn_index < $5 AND access_level <= $6 \
           AND id <> $7 AND retracted_at IS NULL",
    )
    .bind(tenant)
    .bind(&w.turn.session_id)
    .bind(w.namespace)
    .bind(from)
    .bind(w.turn.turn_index as i32)
    .bind(w.access.as_i16())
    .bind(w.id)
    .fetch_all(&mut **tx)
    .await?)
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
