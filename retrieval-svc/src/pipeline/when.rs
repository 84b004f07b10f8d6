//! Time in questions (issue 20 item 4). "What did Maria donate in December
//! 2023?", "the painting shown on October 13, 2023", "camping in June",
//! "a road trip last year": a seventh of the LoCoMo dev questions name a
//! time, and the turns that answer them were said then (their event time
//! is the session's date). The expression becomes a [`Span`]; Stage 2 then
//! lifts the candidates whose event time falls in it. Soft, never a filter:
//! people say "in June" of a trip they told about in July.
//!
//! Relative expressions ("last year", "three weeks ago") count from the
//! request's `as_of_event` when it has one, else from now. A bare month
//! ("in June") is the latest such month before that reference when the
//! request gives one, and any year's June when it does not (a question put
//! to an old conversation has no "now" of its own). Pure, with unit tests
//! at fixed reference dates.

use std::collections::HashMap;

use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Utc};
use engram_proto::Memory;

use super::fusion::Fused;

/// When a question is about.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Span {
    /// From `start` (inclusive) to `end` (exclusive).
    Between(DateTime<Utc>, DateTime<Utc>),
    /// This month (1..=12) of any year.
    Month(u32),
}

impl Span {
    pub fn contains(&self, t: DateTime<Utc>) -> bool {
        match *self {
            Span::Between(start, end) => start <= t && t < end,
            Span::Month(m) => t.month() == m,
        }
    }
}

/// Words after which a bare month or year is a time ("may" alone is a verb).
const LEADS: [&str; 10] = [
    "in", "on", "during", "since", "of", "last", "early", "late", "mid", "around",
];

fn month_of(word: &str) -> Option<u32> {
    engram_common::text::MONTHS
        .iter()
        .position(|m| *m == word || (word.len() == 3 && m.starts_with(word) && word != "may"))
        .map(|i| i as u32 + 1)
}

fn year_of(word: &str) -> Option<i32> {
    let y: i32 = word.parse().ok()?;
    (word.len() == 4 && (1900..=2100).contains(&y)).then_some(y)
}

fn day_of(word: &str) -> Option<u32> {
    let digits = word.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let d: u32 = digits.parse().ok()?;
    (digits.len() <= 2 && (1..=31).contains(&d)).then_some(d)
}

fn at(y: i32, m: u32, d: u32) -> Option<DateTime<Utc>> {
    let date = NaiveDate::from_ymd_opt(y, m, d)?;
    Some(Utc.from_utc_datetime(&date.and_hms_opt(0, 0, 0)?))
}

fn month_span(y: i32, m: u32) -> Option<Span> {
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    Some(Span::Between(at(y, m, 1)?, at(ny, nm, 1)?))
}

/// The time `text` is about, if it names one; `ref_opt` is the request's
/// own "now" (`as_of_event`), `now` the clock.
pub fn parse(text: &str, ref_opt: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<Span> {
    let lower = text.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let reference = ref_opt.unwrap_or(now);
    let span = absolute(&words, ref_opt).or_else(|| relative(&words, reference))?;
    Some(shifted(&words, span))
}

/// A date, a month (with or without its year) or a year.
fn absolute(words: &[&str], ref_opt: Option<DateTime<Utc>>) -> Option<Span> {
    for (i, w) in words.iter().enumerate() {
        let Some(m) = month_of(w) else { continue };
        let before = i.checked_sub(1).map(|j| words[j]);
        let next = words.get(i + 1).copied();
        let after_next = words.get(i + 2).copied();
        let day_opt = before.and_then(day_of).or_else(|| next.and_then(day_of));
        let year_opt = next
            .and_then(year_of)
            .or_else(|| after_next.and_then(year_of));
        let led = before.is_some_and(|b| LEADS.contains(&b));
        if *w == "may" && day_opt.is_none() && year_opt.is_none() && !led {
            continue;
        }
        return match (day_opt, year_opt) {
            (Some(d), Some(y)) => {
                let start = at(y, m, d)?;
                Some(Span::Between(start, start + Duration::days(1)))
            }
            (None, Some(y)) => month_span(y, m),
            _ if !led && day_opt.is_none() => continue,
            _ => Some(match ref_opt {
                Some(r) => {
                    let y = if m <= r.month() {
                        r.year()
                    } else {
                        r.year() - 1
                    };
                    month_span(y, m)?
                }
                None => Span::Month(m),
            }),
        };
    }
    let year = words.iter().find_map(|w| year_of(w))?;
    Some(Span::Between(at(year, 1, 1)?, at(year + 1, 1, 1)?))
}

/// "yesterday", "last week / month / year", "N days / weeks / months /
/// years ago", "recently", counted back from `reference`.
fn relative(words: &[&str], reference: DateTime<Utc>) -> Option<Span> {
    let back = |days: i64, width: i64| {
        let start = reference - Duration::days(days);
        Span::Between(start, start + Duration::days(width))
    };
    for (i, w) in words.iter().enumerate() {
        let next = words.get(i + 1).copied().unwrap_or("");
        match (*w, next) {
            ("yesterday", _) => return Some(back(1, 1)),
            ("last", "week" | "weekend") => return Some(back(10, 10)),
            ("last", "month") => return Some(back(45, 45)),
            ("last", "year") => {
                let y = reference.year() - 1;
                return Some(Span::Between(at(y, 1, 1)?, at(y + 1, 1, 1)?));
            }
            ("recently", _) => return Some(back(30, 31)),
            _ => {}
        }
        if words.get(i + 2) == Some(&"ago") {
            let n: i64 = match *w {
                "a" | "one" => 1,
                "two" => 2,
                "three" => 3,
                "four" => 4,
                "five" => 5,
                other => match other.parse() {
                    Ok(n) => n,
                    Err(_) => continue,
                },
            };
            let unit = match next.trim_end_matches('s') {
                "day" => 1,
                "week" => 7,
                "month" => 30,
                "year" => 365,
                _ => continue,
            };
            let days = n * unit;
            return Some(back(days + unit / 2, unit.max(2)));
        }
    }
    None
}

/// "before D" / "after D" / "the week before D": the span next to D.
fn shifted(words: &[&str], span: Span) -> Span {
    let Span::Between(start, end) = span else {
        return span;
    };
    if words.contains(&"before") {
        let width = if words.contains(&"week") { 8 } else { 31 };
        return Span::Between(start - Duration::days(width), end);
    }
    if words.contains(&"after") {
        return Span::Between(start, end + Duration::days(31));
    }
    span
}

/// Multiplies by (1 + `lift`) the fused score of every candidate whose
/// event time falls in `span`, and reorders; candidates Stage 2 holds no
/// memory for (graph hits not fetched yet) stay as they are.
pub fn lift(fused: &mut [Fused], memories: &HashMap<String, Memory>, span: Span, lift: f32) {
    if lift <= 0.0 {
        return;
    }
    for f in fused.iter_mut() {
        let when = (memories.get(&f.id))
            .and_then(|m| m.event_time.as_ref())
            .and_then(|t| DateTime::from_timestamp(t.seconds, 0));
        if when.is_some_and(|t| span.contains(t)) {
            f.rrf *= 1.0 + lift;
        }
    }
    fused.sort_by(|a, b| b.rrf.total_cmp(&a.rrf).then_with(|| a.id.cmp(&b.id)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(y: i32, m: u32, d: u32) -> DateTime<Utc> {
        at(y, m, d).expect("date")
    }

    fn now() -> DateTime<Utc> {
        day(2026, 11, 24)
    }

    fn between(a: DateTime<Utc>, b: DateTime<Utc>) -> Option<Span> {
        Some(Span::Between(a, b))
    }

    #[test]
    fn dates_months_and_years() {
        let p = |t: &str| parse(t, None, now());
        assert_eq!(
            p("What painting did Melanie show on October 13, 2023?"),
            between(day(2023, 10, 13), day(2023, 10, 14))
        );
        assert_eq!(
            p("What did Gina find on 1 February, 2023?"),
            between(day(2023, 2, 1), day(2023, 2, 2))
        );
        assert_eq!(
            p("What did Maria donate in December 2023?"),
            between(day(2023, 12, 1), day(2024, 1, 1))
        );
        assert_eq!(
            p("How many times has Melanie gone to the beach in 2023?"),
            between(day(2023, 1, 1), day(2024, 1, 1))
        );
        assert_eq!(
            p("When did Melanie go camping in June?"),
            Some(Span::Month(6))
        );
        assert_eq!(p("What may I bring to the party?"), None);
        assert_eq!(p("Who leads the billing migration?"), None);
    }

    #[test]
    fn a_bare_month_is_the_latest_before_the_requests_own_date() {
        let r = Some(day(2024, 3, 10));
        assert_eq!(
            parse("camping in June", r, now()),
            between(day(2023, 6, 1), day(2023, 7, 1))
        );
        assert_eq!(
            parse("the party in March", r, now()),
            between(day(2024, 3, 1), day(2024, 4, 1))
        );
    }

    #[test]
    fn relative_times_count_back_from_the_reference() {
        let r = Some(day(2023, 8, 11));
        let Some(Span::Between(a, b)) = parse("a road trip last year", r, now()) else {
            panic!("no span");
        };
        assert!(a <= day(2022, 6, 1) && day(2022, 6, 1) < b && b <= day(2023, 1, 1));
        let Some(Span::Between(a, b)) = parse("the puppy she got two weeks ago", r, now()) else {
            panic!("no span");
        };
        assert!(a <= day(2023, 7, 28) && day(2023, 7, 28) < b && b <= day(2023, 8, 11));
        assert_eq!(
            parse("what happened yesterday?", None, now()),
            between(day(2026, 11, 23), day(2026, 11, 24))
        );
    }

    #[test]
    fn before_and_after_a_date_look_beside_it() {
        let p = |t: &str| parse(t, None, now());
        assert_eq!(
            p("What did John do the week before August 3, 2023?"),
            between(day(2023, 7, 26), day(2023, 8, 4))
        );
        let Some(Span::Between(a, _)) = p("last weekend before April 10, 2023") else {
            panic!("no span");
        };
        assert!(a < day(2023, 4, 10));
    }

    #[test]
    fn candidates_said_then_rise() {
        let mem = |id: &str, t: DateTime<Utc>| {
            let m = Memory {
                id: id.into(),
                event_time: Some(prost_types::Timestamp {
                    seconds: t.timestamp(),
                    nanos: 0,
                }),
                ..Default::default()
            };
            (id.to_string(), m)
        };
        let memories: HashMap<String, Memory> =
            [mem("may", day(2023, 5, 8)), mem("june", day(2023, 6, 9))]
                .into_iter()
                .collect();
        let fused = |id: &str, rrf: f32| Fused {
            id: id.into(),
            rrf,
            hits: Vec::new(),
        };
        let mut f = vec![fused("may", 0.5), fused("june", 0.4), fused("none", 0.45)];
        lift(&mut f, &memories, Span::Month(6), 1.0);
        let ids: Vec<&str> = f.iter().map(|x| x.id.as_str()).collect();
        assert_eq!(ids, ["june", "may", "none"]);
    }
}
