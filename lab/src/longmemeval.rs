//! `engram eval longmemeval`: LongMemEval's format (issue 20 item 5), so a
//! user can measure turn-level recall on their own copy of the full set
//! (only one record ships, under `<shared>/data/longmemeval`).
//!
//! Each record is one question over its own haystack of dated chat
//! sessions, so each record becomes its own tenant (as each LoCoMo
//! conversation does): one question's haystack must not answer another's.

use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::eval::{Doc, Part, Question, hash_files};

/// The fields of a LongMemEval record the eval needs.
#[derive(Deserialize)]
struct Record {
    question: String,
    haystack_sessions: Vec<Vec<RawTurn>>,
    haystack_session_ids: Vec<String>,
    haystack_dates: Vec<String>,
    #[serde(default)]
    answer_session_ids: Vec<String>,
    #[serde(default)]
    question_date: String,
}

#[derive(Deserialize)]
struct RawTurn {
    role: String,
    content: String,
    /// Absent on most turns; `null` is read as false too.
    #[serde(default)]
    has_answer: Option<bool>,
}

/// search-svc refuses content over 64 KiB; a longer turn keeps its start.
const MAX_CONTENT_BYTES: usize = 64 * 1024;

/// One tenant per record (the first `limit_opt` records), one memory per
/// non-empty turn: `turn` = (haystack session id, index in the session,
/// role), `event_time` = the session's date plus the turn's index in
/// seconds, so turns keep their order inside a session.
///
/// Gold is the turns marked `has_answer: true`. A record with none falls
/// back to every turn of its `answer_session_ids` sessions (the set's
/// session-level evidence), so such a question is still measured, at the
/// coarser unit; a record with neither is skipped.
pub fn load(data: &Path, limit_opt: Option<usize>) -> anyhow::Result<Vec<Part>> {
    let text =
        std::fs::read_to_string(data).with_context(|| format!("cannot read {}", data.display()))?;
    let records: Vec<Record> = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}:{}: {e}", data.display(), e.line()))?;
    let hash = hash_files(&[data])?;
    let mut parts = Vec::new();
    for (i, r) in records
        .iter()
        .enumerate()
        .take(limit_opt.unwrap_or(usize::MAX))
    {
        let part = record_part(r, &format!("eval-longmemeval-{hash}-{i}"))
            .with_context(|| format!("{}: record {i}", data.display()))?;
        parts.extend(part);
    }
    Ok(parts)
}

/// The record's tenant, or None when it has no gold turn at all.
fn record_part(r: &Record, tenant: &str) -> anyhow::Result<Option<Part>> {
    let n = r.haystack_sessions.len();
    if r.haystack_session_ids.len() != n || r.haystack_dates.len() != n {
        bail!(
            "{n} haystack_sessions but {} haystack_session_ids and {} haystack_dates",
            r.haystack_session_ids.len(),
            r.haystack_dates.len()
        );
    }
    let mut docs = Vec::new();
    let mut marked = Vec::new();
    let mut in_answer_sessions = Vec::new();
    for (s, turns) in r.haystack_sessions.iter().enumerate() {
        let raw_id = &r.haystack_session_ids[s];
        let date = parse_date(&r.haystack_dates[s])
            .with_context(|| format!("haystack_dates[{s}] {:?}", r.haystack_dates[s]))?;
        let answer_session = r.answer_session_ids.contains(raw_id);
        for (ti, t) in turns.iter().enumerate() {
            let content = clean(&t.content);
            if content.trim().is_empty() {
                continue;
            }
            if t.has_answer == Some(true) {
                marked.push(docs.len());
            }
            if answer_session {
                in_answer_sessions.push(docs.len());
            }
            docs.push(turn_doc(raw_id, ti, t, content, date));
        }
    }
    let gold = if marked.is_empty() {
        in_answer_sessions
    } else {
        marked
    };
    if gold.is_empty() {
        return Ok(None);
    }
    let question = Question {
        text: r.question.clone(),
        gold,
        category: None,
        asked_at_opt: parse_date(&r.question_date),
    };
    Ok(Some(Part {
        tenant: tenant.to_string(),
        docs,
        questions: vec![question],
    }))
}

fn turn_doc(
    session: &str,
    index: usize,
    t: &RawTurn,
    content: String,
    date: chrono::DateTime<chrono::Utc>,
) -> Doc {
    Doc {
        text: content,
        event_time_opt: Some(date + chrono::Duration::seconds(index as i64)),
        turn_opt: Some(engram_proto::Turn {
            session_id: session_key(session),
            turn_index: index as u32,
            speaker: t.role.clone(),
            caption: String::new(),
        }),
        ..Default::default()
    }
}

/// "2023/05/20 (Sat) 02:21" → UTC. The weekday is dropped rather than
/// checked, so a record whose weekday disagrees with its date still loads.
pub fn parse_date(s: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    let (day, rest) = s.trim().split_once('(')?;
    let (_, time) = rest.split_once(')')?;
    let joined = format!("{} {}", day.trim(), time.trim());
    let naive = chrono::NaiveDateTime::parse_from_str(&joined, "%Y/%m/%d %H:%M").ok()?;
    Some(naive.and_utc())
}

/// A session id as search-svc accepts it (1..=128 of [A-Za-z0-9._:-]):
/// LongMemEval's ids already are; anything else becomes '_' rather than
/// failing the whole ingest of a user's copy.
fn session_key(id: &str) -> String {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
    let key: String = id
        .chars()
        .take(128)
        .map(|c| if ok(c) { c } else { '_' })
        .collect();
    if key.is_empty() { "_".into() } else { key }
}

/// Content as search-svc accepts it: no control characters but tab and
/// newlines, at most 64 KiB (cut at a character boundary).
fn clean(s: &str) -> String {
    let mut out: String = s
        .chars()
        .filter(|c| !c.is_control() || matches!(c, '\t' | '\n' | '\r'))
        .collect();
    if out.len() > MAX_CONTENT_BYTES {
        let mut cut = MAX_CONTENT_BYTES;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dev data sets, in `shared/data` beside the checkout.
    fn shared(rel: &str) -> std::path::PathBuf {
        crate::eval::data_path(rel)
    }

    #[test]
    fn loads_the_shipped_sample_record() {
        if !engram_common::bootstrap::present_or_skip(&shared(""), "the dev data sets") {
            return;
        }
        let parts = load(&shared("longmemeval/longmemeval_single.json"), None).expect("load");
        assert_eq!(parts.len(), 1);
        let p = &parts[0];
        assert!(p.tenant.starts_with("eval-longmemeval-"), "{}", p.tenant);
        assert_eq!(p.docs.len(), 550);
        assert_eq!(p.questions.len(), 1);
        let q = &p.questions[0];
        assert_eq!(q.text, "What degree did I graduate with?");
        assert_eq!(q.category, None);
        // Asked at its question_date, "2023/05/30 (Tue) 23:40".
        assert_eq!(
            q.asked_at_opt.map(|t| t.to_rfc3339()),
            Some("2023-05-30T23:40:00+00:00".to_string())
        );
        // The two has_answer turns, both in session answer_280352e9.
        assert_eq!(q.gold.len(), 2);
        for &g in &q.gold {
            let turn = p.docs[g].turn_opt.as_ref().expect("turn");
            assert_eq!(turn.session_id, "answer_280352e9");
        }
        assert!(p.docs[q.gold[0]].text.contains("Business Administration"));
        let first = &p.docs[0];
        let turn = first.turn_opt.as_ref().expect("turn");
        assert_eq!(
            (
                turn.session_id.as_str(),
                turn.turn_index,
                turn.speaker.as_str()
            ),
            ("sharegpt_yywfIrx_0", 0, "user")
        );
        let second_time = p.docs[1].event_time_opt.expect("time");
        assert_eq!(second_time.to_rfc3339(), "2023-05-20T02:21:01+00:00");
    }

    #[test]
    fn without_has_answer_gold_is_the_answer_sessions() {
        let turn = |has_answer| RawTurn {
            role: "user".into(),
            content: "hi".into(),
            has_answer,
        };
        let mut r = Record {
            question: "q".into(),
            haystack_sessions: vec![vec![turn(None)], vec![turn(Some(false)), turn(None)]],
            haystack_session_ids: vec!["a".into(), "b".into()],
            haystack_dates: vec!["2023/05/20 (Sat) 02:21".into(); 2],
            answer_session_ids: vec!["b".into()],
            question_date: "2023/05/30 (Tue) 23:40".into(),
        };
        let p = record_part(&r, "t").expect("part").expect("some gold");
        assert_eq!(p.questions[0].gold, vec![1, 2]);
        r.answer_session_ids.clear();
        assert!(record_part(&r, "t").expect("part").is_none());
        r.haystack_dates.pop();
        assert!(record_part(&r, "t").is_err());
    }

    #[test]
    fn dates_sessions_and_content_are_made_acceptable() {
        let d = parse_date("2023/05/20 (Sat) 02:21").expect("date");
        assert_eq!(d.to_rfc3339(), "2023-05-20T02:21:00+00:00");
        assert!(parse_date("2023-05-20 02:21").is_none());
        assert_eq!(session_key("answer_280352e9"), "answer_280352e9");
        assert_eq!(session_key("a b/c"), "a_b_c");
        assert_eq!(session_key(""), "_");
        assert_eq!(clean("a\u{0}b\nc"), "ab\nc");
        assert_eq!(clean(&"é".repeat(40_000)).len(), MAX_CONTENT_BYTES);
    }
}
