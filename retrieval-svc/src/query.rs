//! The validated query: every rule a `RetrieveRequest` must meet, checked
//! once at the boundary ([`Query::try_from`]), including the conversation
//! window that may stand in for the text. Also the route and mode types the
//! pipeline plans with. A leaf: it imports nothing else of the gateway but
//! the error type.

use engram_proto::{
    ConversationMessage, Filters, QueryRoute, RetrievalMode, RetrieveRequest, TimeRange,
};

use engram_common::text::{
    MAX_NAMESPACE_CHARS, check_short_text, check_struct_depth, check_struct_text, check_text,
    check_timestamp,
};

use crate::error::Error;

pub const MAX_TEXT_CHARS: usize = 4096;
pub const MAX_LIMIT: u32 = 100;
pub const DEFAULT_LIMIT: u32 = 10;
pub const MAX_TOKEN_BUDGET: u32 = 100_000;
pub const MAX_HYPOTHESES: usize = 8;

/// The most rate cells one read costs (see [`read_cost`]).
pub const MAX_READ_COST: u32 = 8;

/// What a `Retrieve` costs its tenant's rate and places in flight, in
/// ordinary requests: one,
/// plus one per 25 records asked for past the default, one per 25,000
/// tokens of context budget, and one per KiB of query text (or of the
/// conversation window it is made from), at most
/// [`MAX_READ_COST`]. A read of 100 records with a 100,000-token
/// budget costs the gateway and search-svc many times an ordinary one
/// (issue 47, High 3); counted as one, a tenant within its rate could take
/// the cores every other tenant shares. Read from the raw request before
/// validation, so every value is clamped to what validation allows.
pub fn read_cost(req: &RetrieveRequest) -> u32 {
    let limit = req.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT);
    let extra_records = limit.saturating_sub(DEFAULT_LIMIT) / 25;
    let budget = req.token_budget.min(MAX_TOKEN_BUDGET) / 25_000;
    let kib = (query_bytes(req).min(MAX_TEXT_CHARS * 4) / 1024) as u32;
    (1 + extra_records + budget + kib).min(MAX_READ_COST)
}

/// The bytes a read's query is made from: its `text`, or its conversation
/// window when [`window_is_query`] (the window's messages become the query,
/// and validation reads every one of them).
fn query_bytes(req: &RetrieveRequest) -> usize {
    match window_is_query(&req.text, &req.conversation) {
        true => (req.conversation.iter()).fold(0, |n, m| n.saturating_add(m.content.len())),
        false => req.text.len(),
    }
}

/// Whether a read's query is made from its conversation window: its text
/// is blank and it has one. Shared by validation and [`read_cost`], so a
/// read is charged for the query it is answered with.
fn window_is_query(text: &str, conversation: &[ConversationMessage]) -> bool {
    text.trim().is_empty() && !conversation.is_empty()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    Simple,
    MultiHop,
    Exploratory,
}

impl Route {
    pub fn to_proto(self) -> QueryRoute {
        match self {
            Self::Simple => QueryRoute::Simple,
            Self::MultiHop => QueryRoute::MultiHop,
            Self::Exploratory => QueryRoute::Exploratory,
        }
    }

    /// The escalation step used by the last retry.
    pub fn next_up(self) -> Self {
        match self {
            Self::Simple => Self::MultiHop,
            Self::MultiHop | Self::Exploratory => Self::Exploratory,
        }
    }
}

/// A single raw strategy (eval / debugging modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Raw {
    Vector,
    Keyword,
    Graph,
    Hybrid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    Auto,
    Route(Route),
    Raw(Raw),
}

/// A `RetrieveRequest` that passed boundary validation.
#[derive(Debug, Clone)]
pub struct Query {
    pub text: String,
    pub filters: Filters,
    pub limit: u32,
    pub mode: Mode,
    pub hypotheses: Vec<String>,
    pub turn_id_opt: Option<String>,
    pub token_budget: u32,
    pub explain: bool,
    pub context_sufficient: bool,
    pub skip_rerank: bool,
    pub no_cache: bool,
    pub fail_open: bool,
}

impl TryFrom<RetrieveRequest> for Query {
    type Error = Error;

    fn try_from(r: RetrieveRequest) -> Result<Self, Error> {
        let RetrieveRequest {
            text,
            memory_types,
            time_range,
            agent_scope,
            limit,
            include_consolidated,
            include_historical,
            min_confidence,
            as_of_event,
            as_of_ingestion,
            namespace,
            metadata_filter,
            mode,
            hypotheses,
            turn_id,
            token_budget,
            explain,
            context_sufficient,
            skip_rerank,
            no_cache,
            conversation,
            fail_open,
        } = r;
        let text = checked_text(text, &conversation)?;
        let limit = limit.unwrap_or(DEFAULT_LIMIT);
        if limit == 0 || limit > MAX_LIMIT {
            return Err(Error::invalid(
                "limit",
                format!("must be in 1..={MAX_LIMIT}"),
            ));
        }
        let min_confidence = min_confidence.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&min_confidence) {
            return Err(Error::invalid("min_confidence", "must be in 0..=1"));
        }
        if token_budget > MAX_TOKEN_BUDGET {
            return Err(Error::invalid(
                "token_budget",
                format!("must be at most {MAX_TOKEN_BUDGET}"),
            ));
        }
        check_hypotheses(&hypotheses)?;
        if memory_types.len() > 32 || agent_scope.len() > 256 {
            return Err(Error::invalid(
                "memory_types",
                "at most 32 memory types and 256 agents",
            ));
        }
        if turn_id.len() > 256 {
            return Err(Error::invalid("turn_id", "must be at most 256 characters"));
        }
        if let Some(TimeRange {
            start: Some(s),
            end: Some(e),
        }) = &time_range
            && (e.seconds, e.nanos) < (s.seconds, s.nanos)
        {
            return Err(Error::invalid("time_range", "end must not be before start"));
        }
        let mode = Mode::try_from(mode)?;
        let filters = Filters {
            memory_types,
            time_range,
            agent_scope,
            namespace,
            include_consolidated,
            include_historical,
            min_confidence,
            as_of_event,
            as_of_ingestion,
            metadata: metadata_filter,
            decay_floor: 0.0,
        };
        check_storable(&text, &hypotheses, &turn_id, &filters)?;
        Ok(Self {
            text,
            filters,
            limit,
            mode,
            hypotheses,
            turn_id_opt: Some(turn_id).filter(|t| !t.is_empty()),
            token_budget,
            explain,
            context_sufficient,
            skip_rerank,
            no_cache,
            fail_open,
        })
    }
}

impl TryFrom<i32> for Mode {
    type Error = Error;

    fn try_from(mode: i32) -> Result<Self, Error> {
        Ok(match RetrievalMode::try_from(mode) {
            Ok(RetrievalMode::Auto) => Mode::Auto,
            Ok(RetrievalMode::Simple) => Mode::Route(Route::Simple),
            Ok(RetrievalMode::MultiHop) => Mode::Route(Route::MultiHop),
            Ok(RetrievalMode::Exploratory) => Mode::Route(Route::Exploratory),
            Ok(RetrievalMode::Vector) => Mode::Raw(Raw::Vector),
            Ok(RetrievalMode::Keyword) => Mode::Raw(Raw::Keyword),
            Ok(RetrievalMode::Graph) => Mode::Raw(Raw::Graph),
            Ok(RetrievalMode::Hybrid) => Mode::Raw(Raw::Hybrid),
            Err(_) => return Err(Error::invalid("mode", format!("unknown value {mode}"))),
        })
    }
}

/// The query text: the request's, or the conversation window's when the
/// text is empty; non-empty and at most `MAX_TEXT_CHARS` either way.
fn checked_text(text: String, conversation: &[ConversationMessage]) -> Result<String, Error> {
    let text = if window_is_query(&text, conversation) {
        query_text(conversation)?
    } else {
        text
    };
    if text.trim().is_empty() {
        return Err(Error::invalid("text", "must not be empty"));
    }
    if text.chars().count() > MAX_TEXT_CHARS {
        return Err(Error::invalid(
            "text",
            format!("must be at most {MAX_TEXT_CHARS} characters"),
        ));
    }
    Ok(text)
}

/// Every caller string free of control characters and every time one
/// Postgres can store (engram_common::text): a NUL byte or the year 300000
/// is the caller's mistake, named here, not a database error downstream.
fn check_storable(
    text: &str,
    hypotheses: &[String],
    turn_id: &str,
    f: &Filters,
) -> Result<(), Error> {
    for (field, s) in [("text", text), ("turn_id", turn_id)] {
        check_text(s).map_err(|rule| Error::invalid(field, rule))?;
    }
    // The write rule: a namespace no write could have stored is the
    // caller's mistake, not a search for nothing.
    check_short_text(&f.namespace, MAX_NAMESPACE_CHARS)
        .map_err(|rule| Error::invalid("namespace", rule))?;
    let lists = [("hypotheses", hypotheses), ("agent_scope", &f.agent_scope)];
    for (field, list) in lists {
        for s in list {
            check_text(s).map_err(|rule| Error::invalid(field, rule))?;
        }
    }
    for t in &f.memory_types {
        engram_common::text::check_label(t).map_err(|rule| Error::invalid("memory_types", rule))?;
    }
    if let Some(m) = &f.metadata {
        // Depth first: the text check walks the whole struct.
        check_struct_depth(m).map_err(|rule| Error::invalid("metadata_filter", rule))?;
        check_struct_text(m).map_err(|rule| Error::invalid("metadata_filter", rule))?;
    }
    let range = f.time_range.as_ref();
    let times = [
        ("time_range.start", range.and_then(|r| r.start.as_ref())),
        ("time_range.end", range.and_then(|r| r.end.as_ref())),
        ("as_of_event", f.as_of_event.as_ref()),
        ("as_of_ingestion", f.as_of_ingestion.as_ref()),
    ];
    for (field, ts_opt) in times {
        if let Some(ts) = ts_opt {
            check_timestamp(ts).map_err(|rule| Error::invalid(field, rule))?;
        }
    }
    Ok(())
}

fn check_hypotheses(hypotheses: &[String]) -> Result<(), Error> {
    if hypotheses.len() > MAX_HYPOTHESES {
        return Err(Error::invalid(
            "hypotheses",
            format!("at most {MAX_HYPOTHESES} allowed"),
        ));
    }
    if hypotheses
        .iter()
        .any(|h| h.trim().is_empty() || h.chars().count() > MAX_TEXT_CHARS)
    {
        return Err(Error::invalid(
            "hypotheses",
            format!("each must be non-empty and at most {MAX_TEXT_CHARS} characters"),
        ));
    }
    Ok(())
}

pub const MAX_MESSAGES: usize = 200;
/// Per message; the query keeps only the most recent text anyway.
pub const MAX_MESSAGE_CHARS: usize = 65_536;

/// The query text of a conversation window: user and assistant text after
/// the last summary marker, oldest first, keeping the most recent
/// `MAX_TEXT_CHARS` characters. System and tool messages are dropped: tool
/// output is bulky and its facts belong in memory through writes, not reads.
pub fn query_text(messages: &[ConversationMessage]) -> Result<String, Error> {
    if messages.len() > MAX_MESSAGES {
        return Err(Error::invalid(
            "conversation",
            format!("at most {MAX_MESSAGES} messages"),
        ));
    }
    for m in messages {
        if !matches!(m.role.as_str(), "user" | "assistant" | "system" | "tool") {
            return Err(Error::invalid(
                "conversation.role",
                "must be user, assistant, system or tool",
            ));
        }
        check_text(&m.content).map_err(|rule| Error::invalid("conversation.content", rule))?;
        if m.content.chars().count() > MAX_MESSAGE_CHARS {
            return Err(Error::invalid(
                "conversation.content",
                format!("must be at most {MAX_MESSAGE_CHARS} characters"),
            ));
        }
    }
    let since = messages
        .iter()
        .rposition(|m| m.summary_marker)
        .map_or(0, |i| i + 1);
    let kept: Vec<&str> = messages[since..]
        .iter()
        .filter(|m| matches!(m.role.as_str(), "user" | "assistant"))
        .map(|m| m.content.trim())
        .filter(|c| !c.is_empty())
        .collect();
    if kept.is_empty() {
        return Err(Error::invalid(
            "conversation",
            "holds no user or assistant text after the last summary marker",
        ));
    }
    let joined = kept.join("\n");
    let n = joined.chars().count();
    Ok(if n > MAX_TEXT_CHARS {
        joined.chars().skip(n - MAX_TEXT_CHARS).collect()
    } else {
        joined
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_costs_its_tenant_by_what_it_asks_for() {
        let plain = RetrieveRequest {
            text: "Where does Mira work?".into(),
            ..Default::default()
        };
        assert_eq!(read_cost(&plain), 1);
        let default_ish = RetrieveRequest {
            limit: Some(20),
            token_budget: 4_000,
            ..plain.clone()
        };
        assert_eq!(read_cost(&default_ish), 1);
        let most = RetrieveRequest {
            limit: Some(100),
            token_budget: 100_000,
            ..plain.clone()
        };
        assert_eq!(read_cost(&most), MAX_READ_COST, "1 + 3 + 4, capped");
        let long = RetrieveRequest {
            text: "x".repeat(MAX_TEXT_CHARS),
            ..Default::default()
        };
        assert_eq!(read_cost(&long), 5);
        let invalid = RetrieveRequest {
            limit: Some(u32::MAX),
            token_budget: u32::MAX,
            text: "x".repeat(1 << 20),
            ..Default::default()
        };
        assert_eq!(read_cost(&invalid), MAX_READ_COST, "clamped, no overflow");
    }

    #[test]
    fn a_conversation_window_costs_like_the_text_it_becomes() {
        let window = |n: usize, each: usize| RetrieveRequest {
            conversation: (0..n).map(|_| msg("user", &"x".repeat(each))).collect(),
            ..Default::default()
        };
        assert_eq!(read_cost(&window(2, 100)), 1);
        assert_eq!(read_cost(&window(4, 1024)), 5, "4 KiB of messages");
        let most = window(MAX_MESSAGES, MAX_MESSAGE_CHARS);
        assert_eq!(read_cost(&most), MAX_READ_COST, "clamped, no overflow");
        let both = RetrieveRequest {
            text: "Where does Mira work?".into(),
            ..window(4, 1024)
        };
        assert_eq!(read_cost(&both), 1, "the text wins; the window is ignored");
        let blank = RetrieveRequest {
            text: "   ".into(),
            ..window(4, 1024)
        };
        assert_eq!(read_cost(&blank), 5, "blank text: the window is the query");
    }

    fn msg(role: &str, content: &str) -> ConversationMessage {
        ConversationMessage {
            role: role.into(),
            content: content.into(),
            summary_marker: false,
        }
    }

    #[test]
    fn keeps_user_and_assistant_after_the_last_summary() {
        let mut summary = msg("system", "summary of earlier turns");
        summary.summary_marker = true;
        let window = vec![
            msg("user", "old question about billing"),
            summary,
            msg("user", "who leads the migration?"),
            msg("tool", "{\"rows\": 5000}"),
            msg("system", "be terse"),
            msg("assistant", "Alice, I think."),
            msg("user", "  "),
        ];
        assert_eq!(
            query_text(&window).expect("valid"),
            "who leads the migration?\nAlice, I think."
        );
    }

    #[test]
    fn keeps_the_most_recent_text_when_long() {
        let window = vec![
            msg("user", &"a".repeat(MAX_TEXT_CHARS)),
            msg("assistant", "tail"),
        ];
        let q = query_text(&window).expect("valid");
        assert_eq!(q.chars().count(), MAX_TEXT_CHARS);
        assert!(q.ends_with("\ntail"));
    }

    #[test]
    fn rejects_bad_windows_naming_the_field() {
        let field = |w: Vec<ConversationMessage>| match query_text(&w) {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("expected invalid argument, got {other:?}"),
        };
        assert_eq!(field(vec![msg("robot", "x")]), "conversation.role");
        assert_eq!(field(vec![msg("tool", "only tools")]), "conversation");
        assert_eq!(field(vec![msg("user", "x"); 201]), "conversation");
    }

    /// A metadata filter `levels` structs deep: `{"k": {"k": ... "v"}}`.
    fn nested_filter(levels: usize) -> prost_types::Struct {
        let json = format!("{}\"v\"{}", r#"{"k": "#.repeat(levels), "}".repeat(levels));
        engram_common::convert::json_to_struct(&serde_json::from_str(&json).expect("json"))
    }

    #[test]
    fn metadata_filters_nest_at_most_eight_levels() {
        let with = |levels| RetrieveRequest {
            metadata_filter: Some(nested_filter(levels)),
            ..req("q")
        };
        assert!(Query::try_from(with(8)).is_ok());
        assert_eq!(field_of(with(40)), "metadata_filter");
        let e = Query::try_from(with(40)).expect_err("too deep");
        assert!(e.to_string().contains("at most 8 levels deep"), "{e}");
    }

    fn req(text: &str) -> RetrieveRequest {
        RetrieveRequest {
            text: text.into(),
            ..Default::default()
        }
    }

    fn field_of(r: RetrieveRequest) -> &'static str {
        match Query::try_from(r) {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("expected invalid argument, got {other:?}"),
        }
    }

    #[test]
    fn request_validation_names_the_field() {
        assert_eq!(field_of(req("  ")), "text");
        assert_eq!(field_of(req(&"x".repeat(4097))), "text");
        assert_eq!(
            field_of(RetrieveRequest {
                limit: Some(0),
                ..req("q")
            }),
            "limit"
        );
        assert_eq!(
            field_of(RetrieveRequest {
                limit: Some(101),
                ..req("q")
            }),
            "limit"
        );
        assert_eq!(
            field_of(RetrieveRequest {
                min_confidence: Some(1.5),
                ..req("q")
            }),
            "min_confidence"
        );
        assert_eq!(
            field_of(RetrieveRequest {
                mode: 42,
                ..req("q")
            }),
            "mode"
        );
        assert_eq!(
            field_of(RetrieveRequest {
                token_budget: 100_001,
                ..req("q")
            }),
            "token_budget"
        );
        assert_eq!(field_of(req("a\0b")), "text");
        assert_eq!(
            field_of(RetrieveRequest {
                namespace: "ns\0".into(),
                ..req("q")
            }),
            "namespace"
        );
        assert_eq!(
            field_of(RetrieveRequest {
                namespace: "n".repeat(MAX_NAMESPACE_CHARS + 1),
                ..req("q")
            }),
            "namespace"
        );
        let longest = RetrieveRequest {
            namespace: "n".repeat(MAX_NAMESPACE_CHARS),
            ..req("q")
        };
        assert!(Query::try_from(longest).is_ok());
        assert_eq!(
            field_of(RetrieveRequest {
                agent_scope: vec!["ok".into(), "a\u{7}".into()],
                ..req("q")
            }),
            "agent_scope"
        );
        assert_eq!(
            field_of(RetrieveRequest {
                as_of_event: Some(prost_types::Timestamp {
                    seconds: -1_000_000_000_000,
                    nanos: 0,
                }),
                ..req("q")
            }),
            "as_of_event"
        );
        let q = Query::try_from(RetrieveRequest {
            mode: RetrievalMode::Hybrid as i32,
            ..req("ok")
        })
        .expect("valid");
        assert_eq!(q.limit, DEFAULT_LIMIT);
        assert_eq!(q.mode, Mode::Raw(Raw::Hybrid));
    }
}
