//! Stage 1: the validated query and its route. Routing is a cheap heuristic
//! over indicator phrases (no model): relational / comparative wording or
//! several named entities suggest multi-hop; "tell me everything"-style
//! wording suggests exploratory; greetings and meta questions need no
//! retrieval at all.

use engram_proto::{Filters, QueryRoute, RetrievalMode, RetrieveRequest, TimeRange};

use crate::error::Error;

pub const MAX_TEXT_CHARS: usize = 4096;
pub const MAX_LIMIT: u32 = 100;
pub const DEFAULT_LIMIT: u32 = 10;
pub const MAX_TOKEN_BUDGET: u32 = 100_000;
pub const MAX_HYPOTHESES: usize = 8;

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
        let text = if text.trim().is_empty() && !conversation.is_empty() {
            crate::conversation::query_text(&conversation)?
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
        let mode = match RetrievalMode::try_from(mode) {
            Ok(RetrievalMode::Auto) => Mode::Auto,
            Ok(RetrievalMode::Simple) => Mode::Route(Route::Simple),
            Ok(RetrievalMode::MultiHop) => Mode::Route(Route::MultiHop),
            Ok(RetrievalMode::Exploratory) => Mode::Route(Route::Exploratory),
            Ok(RetrievalMode::Vector) => Mode::Raw(Raw::Vector),
            Ok(RetrievalMode::Keyword) => Mode::Raw(Raw::Keyword),
            Ok(RetrievalMode::Graph) => Mode::Raw(Raw::Graph),
            Ok(RetrievalMode::Hybrid) => Mode::Raw(Raw::Hybrid),
            Err(_) => return Err(Error::invalid("mode", format!("unknown value {mode}"))),
        };
        Ok(Self {
            text,
            filters: Filters {
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
            },
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

const EXPLORATORY: &[&str] = &[
    "everything",
    "all about",
    "overview",
    "summarize",
    "summarise",
    "summary of",
    "tell me about",
    "what do we know",
    "what do i know",
    "what do you know",
    "list all",
    "list every",
    "history of",
    "explore",
    "anything about",
    "any information",
    "all the",
    "brainstorm",
];

const MULTI_HOP: &[&str] = &[
    "both",
    "same",
    "compare",
    "compared",
    "comparison",
    "difference between",
    "relationship between",
    "related to",
    "connected to",
    "which came first",
    "who was born first",
    "older",
    "younger",
    "earlier",
    "later than",
    "before",
    "after",
    "father of",
    "mother of",
    "son of",
    "daughter of",
    "spouse of",
    "wife of",
    "husband of",
    "director of",
    "founder of",
    "paternal",
    "maternal",
    "grandfather",
    "grandmother",
    "led to",
    "caused",
    "because of",
    "why did",
    "how did",
];

const GREETINGS: &[&str] = &[
    "hi",
    "hello",
    "hey",
    "hiya",
    "yo",
    "thanks",
    "thank you",
    "thx",
    "ok",
    "okay",
    "cool",
    "great",
    "bye",
    "goodbye",
    "good morning",
    "good afternoon",
    "good evening",
    "good night",
    "how are you",
    "who are you",
    "what are you",
    "what can you do",
    "help",
];

fn normalise(text: &str) -> String {
    let lower: String = text
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '\'' {
                c.to_ascii_lowercase()
            } else {
                ' '
            }
        })
        .collect();
    lower.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn has_phrase(norm: &str, phrase: &str) -> bool {
    // Word-boundary match on the space-normalised text.
    format!(" {norm} ").contains(&format!(" {phrase} "))
}

/// Greetings, thanks and questions about the assistant itself.
pub fn no_retrieval_needed(text: &str) -> bool {
    let norm = normalise(text);
    if norm.is_empty() {
        return true;
    }
    let words = norm.split(' ').count();
    GREETINGS.iter().any(|g| {
        norm == *g || (words <= g.split(' ').count() + 2 && norm.starts_with(&format!("{g} ")))
    })
}

/// Capitalised spans not at the start of the text: a cheap entity count.
fn named_entities(text: &str) -> usize {
    let mut count = 0;
    let mut in_span = false;
    for (i, w) in text.split_whitespace().enumerate() {
        let cap = w.chars().next().is_some_and(char::is_uppercase);
        if cap && i > 0 {
            if !in_span {
                count += 1;
            }
            in_span = true;
        } else {
            in_span = false;
        }
    }
    count
}

/// A wh-question whose subject is defined by a relative clause ("who leads
/// the project that migrates billing?") needs one hop to find the project
/// and another to find its lead.
fn bridge_clause(norm: &str) -> bool {
    let words: Vec<&str> = norm.split_whitespace().collect();
    let wh = [
        "who", "what", "when", "where", "which", "how", "whom", "whose",
    ];
    words.first().is_some_and(|w| wh.contains(w))
        && words
            .iter()
            .skip(2)
            .any(|w| matches!(*w, "that" | "whose" | "which" | "who"))
}

pub fn classify(text: &str) -> Route {
    let norm = normalise(text);
    if EXPLORATORY.iter().any(|p| has_phrase(&norm, p)) {
        return Route::Exploratory;
    }
    let indicators = MULTI_HOP.iter().filter(|p| has_phrase(&norm, p)).count();
    // Possessive chains ("the director of X's film") are a classic bridge.
    let possessive = text.contains("'s ") && norm.contains(" of ");
    if indicators >= 1 || possessive || named_entities(text) >= 2 || bridge_clause(&norm) {
        Route::MultiHop
    } else {
        Route::Simple
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_clauses_are_bridges() {
        assert_eq!(
            classify("Who leads the project that migrates the billing system?"),
            Route::MultiHop
        );
        assert_eq!(
            classify("What is the deadline for the migration?"),
            Route::Simple
        );
    }

    #[test]
    fn routes_by_indicators() {
        assert_eq!(classify("what is my favourite colour"), Route::Simple);
        assert_eq!(
            classify("Who was born first, Alan Turing or John von Neumann?"),
            Route::MultiHop
        );
        assert_eq!(
            classify("Where was the director of film Inception born?"),
            Route::MultiHop
        );
        assert_eq!(
            classify("tell me about the project history"),
            Route::Exploratory
        );
        assert_eq!(Route::Simple.next_up(), Route::MultiHop);
        assert_eq!(Route::Exploratory.next_up(), Route::Exploratory);
    }

    #[test]
    fn greetings_need_no_retrieval() {
        assert!(no_retrieval_needed("Hello!"));
        assert!(no_retrieval_needed("thanks a lot"));
        assert!(no_retrieval_needed("Who are you?"));
        assert!(!no_retrieval_needed(
            "hello, what did Alice say about the budget?"
        ));
        assert!(!no_retrieval_needed("what is the deploy procedure"));
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
        let q = Query::try_from(RetrieveRequest {
            mode: RetrievalMode::Hybrid as i32,
            ..req("ok")
        })
        .expect("valid");
        assert_eq!(q.limit, DEFAULT_LIMIT);
        assert_eq!(q.mode, Mode::Raw(Raw::Hybrid));
    }
}
