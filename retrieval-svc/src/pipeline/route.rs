//! Stage 1: route. A cheap heuristic over indicator phrases (no model):
//! relational / comparative wording or several named entities suggest
//! multi-hop; "tell me everything"-style wording suggests exploratory;
//! greetings and meta questions need no retrieval at all. The route picks
//! the plan of the first attempt ([`plan`]); in AUTO mode the graph's entity
//! evidence may still move it (evidence.rs).

use engram_common::settings::PipelineSettings;

use super::plan::Plan;
use super::text::{AUXILIARIES, RELATION_LINKS, has_phrase, normalise};
use crate::query::{Mode, Query, Raw, Route};

/// What one attempt runs. Stage 1 makes the first; a retry makes the next
/// from the best answer so far (retry.rs).
#[derive(Debug, Clone)]
pub struct Step {
    /// The route the attempt starts from (AUTO's evidence may move it).
    pub route: Route,
    /// AUTO: the graph's entity evidence picks the fusion weights.
    pub by_evidence: bool,
    /// A raw mode: the fusion stage alone, in the strategies' own order and
    /// scores: no HyDE, cross-encoder, contradictions or retries.
    pub raw_opt: Option<Raw>,
}

impl Step {
    /// Stage 1: the first attempt of `q`.
    pub fn first(q: &Query) -> Self {
        let (route, by_evidence, raw_opt) = match q.mode {
            Mode::Auto => (classify(&q.text), true, None),
            Mode::Route(r) => (r, false, None),
            Mode::Raw(raw @ Raw::Graph) => (Route::MultiHop, false, Some(raw)),
            Mode::Raw(raw @ Raw::Hybrid) => (Route::Exploratory, false, Some(raw)),
            Mode::Raw(raw) => (Route::Simple, false, Some(raw)),
        };
        Self {
            route,
            by_evidence,
            raw_opt,
        }
    }

    /// Stage 2's plan. HYBRID is all three strategies weighted by the
    /// evidence route (indicated by the wording, whatever the step's route).
    pub fn plan(&self, q: &Query, p: &PipelineSettings) -> Plan {
        // The wording is read first, then plan.rs builds from it: one
        // visit to each file.
        let worded_opt = matches!(self.raw_opt, Some(Raw::Hybrid)).then(|| classify(&q.text));
        let chained = chained(&q.text);
        let plan = match (self.raw_opt, worded_opt) {
            (Some(Raw::Hybrid), Some(worded)) => Plan {
                complement: false,
                ..Plan::by_evidence(worded, p, q.limit)
            },
            (Some(raw), _) => Plan::raw(raw, q.limit, p.rrf_k),
            (None, _) if self.by_evidence => Plan::by_evidence(self.route, p, q.limit),
            (None, _) => Plan::for_route(self.route, p, q.limit),
        };
        Plan { chained, ..plan }
    }

    /// The caller's HyDE hypotheses join the dense search (not in raw modes,
    /// which are the single strategy).
    pub fn hypotheses<'q>(&self, q: &'q Query) -> &'q [String] {
        match self.raw_opt {
            Some(_) => &[],
            None => &q.hypotheses,
        }
    }

    pub fn reranks(&self, q: &Query) -> bool {
        self.raw_opt.is_none() && !q.skip_rerank
    }

    pub fn is_raw(&self) -> bool {
        self.raw_opt.is_some()
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

/// Words that may follow a greeting without making it a question ("hello
/// there", "thanks a lot", "how are you doing today"). A greeting phrase
/// followed by any other word ("who are you meeting tomorrow", "help with
/// billing") is a question and is retrieved for.
const GREETING_TAIL: &[&str] = &[
    "there",
    "all",
    "everyone",
    "everybody",
    "folks",
    "team",
    "friend",
    "buddy",
    "mate",
    "again",
    "so",
    "very",
    "much",
    "a",
    "lot",
    "lots",
    "today",
    "doing",
    "tonight",
    "then",
    "now",
    "please",
    "bot",
    "assistant",
    "engram",
    "too",
];

/// Greetings, thanks and questions about the assistant itself: a greeting
/// phrase alone, or followed by at most two words that are filler or
/// greetings themselves ("ok thanks").
pub fn no_retrieval_needed(text: &str) -> bool {
    let norm = normalise(text);
    if norm.is_empty() {
        return true;
    }
    let words = norm.split(' ').count();
    let filler = |w: &str| GREETING_TAIL.contains(&w) || GREETINGS.contains(&w);
    GREETINGS.iter().any(|g| {
        norm == *g
            || (words <= g.split(' ').count() + 2
                && norm
                    .strip_prefix(&format!("{g} "))
                    .is_some_and(|tail| tail.split(' ').all(filler)))
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

/// Head nouns that name an attribute, not a thing a chain passes through
/// ("the name of the pet that…", "the kind of…"): chat questions use them
/// without any hop.
const ATTRIBUTE_HEADS: &[&str] = &[
    "name",
    "kind",
    "type",
    "sort",
    "photo",
    "picture",
    "title",
    "number",
    "date",
    "year",
    "time",
    "main",
    "part",
    "process",
    "color",
    "colour",
    "amount",
    "end",
    "rest",
    "start",
    "beginning",
    "middle",
    "top",
    "bottom",
    "status",
    "cost",
    "price",
    "size",
];

/// The longest text read as one question for [`chained`]: a conversation
/// window (several messages joined by newlines, up to 4,096 characters) is
/// prose, where "the end of the meeting that…" is no chain. The longest
/// dev question is 224 characters.
const MAX_CHAIN_QUESTION_CHARS: usize = 300;

/// Words after "who / what / which" that are not a verb ("which of the
/// projects that…", "what about the owner of…").
const NOT_VERBS: &[&str] = &[
    "of", "about", "in", "from", "among", "else", "for", "with", "to", "on", "at", "by", "kind",
    "type", "sort",
];

/// Whether the question is a chain of at least two relations ("the
/// country where the composer of X was a citizen", "the manager of the
/// owner of Project Falcon"): each link is "the", a noun that is not an
/// attribute head, and a relation word; a question that opens with a verb
/// on such a link ("who manages the person who owns…") counts its verb as
/// a link too. Such a question needs Stage 4b's bridges even when the
/// graph's evidence routed it simple (its entity has no titled home
/// memory, or is misspelt): on the dev sets it matched seven
/// simple-routed questions (six MuSiQue, one HotpotQA) and none of
/// LoCoMo's or 2Wiki's (docs/benchmarks.md, "Chains of relations").
pub fn chained(text: &str) -> bool {
    if text.contains('\n') || text.chars().count() > MAX_CHAIN_QUESTION_CHARS {
        return false;
    }
    let norm = normalise(text);
    let words: Vec<&str> = norm.split(' ').collect();
    let is_link = |w: &[&str]| {
        w[0] == "the"
            && w[1].len() > 1
            && w[1].chars().all(char::is_alphabetic)
            && !ATTRIBUTE_HEADS.contains(&w[1])
            && RELATION_LINKS.contains(&w[2])
    };
    let links = words.windows(3).filter(|w| is_link(w)).count();
    let opening_verb = words.len() >= 5
        && matches!(words[0], "who" | "what" | "which")
        && !AUXILIARIES.contains(&words[1])
        && !NOT_VERBS.contains(&words[1])
        && !words[1].contains('\'')
        && is_link(&words[2..5]);
    links + usize::from(opening_verb) >= 2
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
    use crate::pipeline::text::comparative;

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
    fn comparisons_are_told_from_chains() {
        for q in [
            "Who was born first, Ada Lovelace or Alan Turing?",
            "Are both films from the same country?",
            "What role did Ed Roland and Adam Duritz perform in their respective bands?",
            "Compare Project Falcon with Atlas",
        ] {
            assert!(comparative(q), "{q}");
        }
        for q in [
            "What currency predated the Euro in the country Signmark is from?",
            "Who manages the person who owns Project Falcon?",
            "Where was the director of film Do You Believe? born?",
        ] {
            assert!(!comparative(q), "{q}");
        }
    }

    #[test]
    fn chains_of_relations_are_told_from_chat_wording() {
        for q in [
            "Who was in charge of the country where the composer of Aschenbrodel was a citizen?",
            "Who is the manager of the owner of Project Falcon?",
            "Who manages the person who owns Project Falcon?",
            "Who formed and first arrived to the colony that became the state whose official sport is jousting?",
        ] {
            assert!(chained(q), "{q}");
        }
        for q in [
            "What was the name of the pet that John had to say goodbye to on 3 June, 2023?",
            "How does Gina describe the studio that Jon has opened?",
            "What kind of university did the author of Alexander attend?",
            "Where was the place of burial of Osthryth's father?",
            "Who is the person who owns Project Falcon?",
            "Who manages Project Falcon?",
            "Which of the projects that Priya owns is late?",
            "Who doesn't know the owner of Project Falcon?",
            "What did Priya say at the end of the meeting that we had?",
            "Priya owns Project Falcon.\nWho is the manager of the owner of Project Falcon?",
            "",
        ] {
            assert!(!chained(q), "{q}");
        }
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

    #[test]
    fn plain_greetings_short_circuit() {
        for g in [
            "hi",
            "Hi!",
            "hello there",
            "thanks!",
            "thank you so much",
            "ok thanks",
            "good morning everyone",
            "how are you doing today?",
            "who are you?",
            "what can you do?",
            "help",
            "bye then",
        ] {
            assert!(no_retrieval_needed(g), "{g}");
        }
    }

    #[test]
    fn questions_that_open_like_greetings_are_retrieved_for() {
        for q in [
            "Who are you meeting tomorrow?",
            "What are you working on?",
            "help with billing",
            "How are you handling the migration?",
            "thanks, who leads billing?",
            "hey where is the deploy doc",
            "ok what changed",
        ] {
            assert!(!no_retrieval_needed(q), "{q}");
        }
    }
}
