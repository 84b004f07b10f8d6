//! Conversation structure in Stage 2 (issue 20): after fusion, a turn is
//! lifted by how strongly its session as a whole matched the question (the
//! fused scores of the session's turns among the candidates), and by
//! whether the question names its speaker. An event is told over several
//! turns, so a session many candidates come from is likely the one asked
//! about; and "When did Caroline go to the support group?" is about what
//! Caroline said. Memories that are not turns are left as they are, so
//! Wikipedia-style data is untouched. The LoCoMo probe
//! (shared/notes/locomo-probe.md) measured both signals before any code.
//! Pure, over the fused list and the memories Stage 2 already holds.

use std::collections::{HashMap, HashSet};

use engram_proto::Memory;

use super::fusion::Fused;
use super::text::{collect_words, query_words};

/// How much each signal lifts a turn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lift {
    /// × (1 + session · the session's score relative to the best session).
    pub session: f32,
    /// × (1 + speaker) when the question names the turn's speaker.
    pub speaker: f32,
    /// × (1 + time) for any memory whose event time falls in the time the
    /// question names (pipeline/when.rs).
    pub time: f32,
}

impl Lift {
    fn is_off(&self) -> bool {
        self.session <= 0.0 && self.speaker <= 0.0
    }

    pub const OFF: Lift = Lift {
        session: 0.0,
        speaker: 0.0,
        time: 0.0,
    };
}

/// How many of a session's best turns make its score: a long session must
/// not win by the number of its weak matches.
const SESSION_TURNS: usize = 3;

/// Reorders `fused` in place; a no-op when no candidate is a turn.
pub fn lift(fused: &mut [Fused], memories: &HashMap<String, Memory>, query: &str, l: Lift) {
    if l.is_off() {
        return;
    }
    let turn_of = |f: &Fused| {
        memories
            .get(&f.id)
            .and_then(|m| Some((m, m.turn.as_ref()?)))
    };
    let mut sessions: HashMap<(&str, &str), Vec<f32>> = HashMap::new();
    for f in fused.iter() {
        if let Some((m, t)) = turn_of(f) {
            let key = (m.namespace.as_str(), t.session_id.as_str());
            sessions.entry(key).or_default().push(f.rrf);
        }
    }
    if sessions.is_empty() {
        return;
    }
    let score = |scores: &Vec<f32>| scores.iter().take(SESSION_TURNS).sum::<f32>();
    let best = sessions.values().map(score).fold(0.0f32, f32::max);
    let (names, _) = query_words(query);
    let mut lifted: Vec<f32> = Vec::with_capacity(fused.len());
    for f in fused.iter() {
        let Some((m, t)) = turn_of(f) else {
            lifted.push(f.rrf);
            continue;
        };
        let session = sessions
            .get(&(m.namespace.as_str(), t.session_id.as_str()))
            .map_or(0.0, score);
        let mut speaker = HashSet::new();
        collect_words(&t.speaker, &mut speaker);
        let named = !names.is_disjoint(&speaker);
        let by_session = 1.0 + l.session * if best > 0.0 { session / best } else { 0.0 };
        let by_speaker = if named { 1.0 + l.speaker } else { 1.0 };
        lifted.push(f.rrf * by_session * by_speaker);
    }
    for (f, s) in fused.iter_mut().zip(lifted) {
        f.rrf = s;
    }
    fused.sort_by(|a, b| b.rrf.total_cmp(&a.rrf).then_with(|| a.id.cmp(&b.id)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use engram_proto::Turn;

    fn fused(id: &str, rrf: f32) -> Fused {
        Fused {
            id: id.into(),
            rrf,
            hits: Vec::new(),
        }
    }

    fn turn(id: &str, session: &str, speaker: &str) -> (String, Memory) {
        let m = Memory {
            id: id.into(),
            namespace: "default".into(),
            turn: Some(Turn {
                session_id: session.into(),
                speaker: speaker.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        (id.to_string(), m)
    }

    fn ids(f: &[Fused]) -> Vec<&str> {
        f.iter().map(|x| x.id.as_str()).collect()
    }

    const ON: Lift = Lift {
        session: 2.0,
        speaker: 0.3,
        time: 0.0,
    };

    #[test]
    fn a_turn_of_the_session_that_matched_most_rises() {
        let memories: HashMap<String, Memory> = [
            turn("lone", "s1", "Mel"),
            turn("a", "s2", "Mel"),
            turn("b", "s2", "Mel"),
            turn("c", "s2", "Mel"),
        ]
        .into_iter()
        .collect();
        let mut f = vec![
            fused("lone", 0.50),
            fused("a", 0.45),
            fused("b", 0.40),
            fused("c", 0.35),
        ];
        lift(&mut f, &memories, "what did they cook?", ON);
        assert_eq!(ids(&f), ["a", "b", "c", "lone"]);
    }

    #[test]
    fn the_speaker_a_question_names_counts_and_other_memories_stay() {
        let mut memories: HashMap<String, Memory> =
            [turn("mel", "s1", "Melanie"), turn("car", "s2", "Caroline")]
                .into_iter()
                .collect();
        memories.insert("doc".into(), Memory::default());
        let mut f = vec![fused("doc", 0.6), fused("mel", 0.5), fused("car", 0.48)];
        let speaker_only = Lift {
            speaker: 0.3,
            ..Lift::OFF
        };
        lift(
            &mut f,
            &memories,
            "When did Caroline go hiking?",
            speaker_only,
        );
        assert_eq!(ids(&f), ["car", "doc", "mel"]);
        assert_eq!(f[1].rrf, 0.6);
    }

    #[test]
    fn without_turns_or_when_off_nothing_moves() {
        let memories: HashMap<String, Memory> = HashMap::new();
        let mut f = vec![fused("x", 0.2), fused("y", 0.5)];
        lift(&mut f, &memories, "anything", ON);
        assert_eq!(ids(&f), ["x", "y"]);
        let memories: HashMap<String, Memory> = [turn("x", "s", "A"), turn("y", "s", "B")]
            .into_iter()
            .collect();
        lift(&mut f, &memories, "A said", Lift::OFF);
        assert_eq!(ids(&f), ["x", "y"]);
    }
}
