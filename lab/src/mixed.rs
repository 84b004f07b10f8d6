//! `engram bench --corpus mixed`: a bench tenant whose words look like
//! real memory.
//!
//! The repeated corpus writes ~2,000 2Wiki passages 50 times over at 100K:
//! every entity is a hub 50 times its real size and every term's document
//! frequency is 50× too, which flatters neither the keyword nor the graph
//! stage. This one starts from every dev corpus (2Wiki's passages,
//! MuSiQue's and HotpotQA's paragraphs, LoCoMo 0–4's turns), each used
//! once as written; every later copy has its names and numbers replaced
//! (each capitalised word inside a sentence by another name of the corpus,
//! consistently within the copy; each number by another of the same
//! length), so entities and terms spread the way a large memory's do.
//! Vectors stay the base text's embedding plus noise (see bench.rs): the
//! point is the keyword and entity statistics, and embedding 100K texts
//! would take most of an hour on two cores.

use std::collections::{BTreeSet, HashMap};

use rand::Rng;
use rand::SeedableRng;

use crate::eval::{data_path, load_2wiki, load_hotpotqa, load_locomo, load_musique};

/// The base texts and the names a copy may take.
pub(crate) struct MixedBase {
    /// (title, text), each base text once, the corpora interleaved.
    pub docs: Vec<(String, String)>,
    names: Vec<String>,
}

impl MixedBase {
    /// Every dev corpus, deduplicated, interleaved by a fixed shuffle.
    pub(crate) fn load() -> anyhow::Result<Self> {
        let mut parts = vec![
            load_2wiki(
                &data_path("hipporag/2wikimultihopqa_corpus.json"),
                &data_path("hipporag/2wiki_dev.jsonl"),
                None,
            )?,
            load_musique(&data_path("hipporag/musique_train.json"), None, None)?,
            load_hotpotqa(
                &data_path("hipporag/hotpotqa_train_corpus.json"),
                &data_path("hipporag/hotpotqa_train.json"),
                None,
            )?,
        ];
        parts.extend(load_locomo(&data_path("locomo/locomo10.json"), 0, 4, None)?);
        let mut seen = BTreeSet::new();
        let mut docs: Vec<(String, String)> = parts
            .iter()
            .flat_map(|p| p.docs.iter())
            .map(|d| {
                let text = match &d.turn_opt {
                    Some(t) => format!("{}: {}", t.speaker, d.text),
                    None => d.text.clone(),
                };
                (d.title.clone(), text)
            })
            .filter(|(_, text)| seen.insert(text.clone()))
            .collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x6d_6978_6564);
        rand::seq::SliceRandom::shuffle(docs.as_mut_slice(), &mut rng);
        let names = inner_names(docs.iter().map(|(_, t)| t.as_str()));
        anyhow::ensure!(!names.is_empty(), "the dev corpora hold no names");
        Ok(Self { docs, names })
    }

    /// Memory `j`'s title and text: base text `j mod n`, as written the
    /// first time, with its names and numbers replaced every later time.
    pub(crate) fn text(&self, j: usize) -> (String, String) {
        let n = self.docs.len();
        let (title, text) = &self.docs[j % n];
        if j < n {
            return (title.clone(), text.clone());
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(j as u64 ^ 0x0bad_cafe);
        let mut renamed = HashMap::new();
        let mut rewrite =
            |w: &str, inner: bool| replace_word(w, inner, &self.names, &mut renamed, &mut rng);
        (
            rewrite_words(title, &mut rewrite),
            rewrite_words(text, &mut rewrite),
        )
    }
}

/// Capitalised words that some sentence holds past its first word: names,
/// mostly. Sorted, so the pool is the same on every run.
fn inner_names<'a>(texts: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut names = BTreeSet::new();
    for text in texts {
        rewrite_words(text, &mut |w, inner| {
            if inner && is_capitalised(w) {
                names.insert(w.to_string());
            }
            w.to_string()
        });
    }
    names.into_iter().collect()
}

fn is_capitalised(w: &str) -> bool {
    let mut chars = w.chars();
    chars.next().is_some_and(char::is_uppercase)
        && w.chars().count() >= 2
        && chars.all(char::is_lowercase)
}

/// One word of a copy: an inner capitalised word becomes the name this
/// copy gave it (a new one drawn the first time), a number another of the
/// same length; anything else stays.
fn replace_word(
    w: &str,
    inner: bool,
    names: &[String],
    renamed: &mut HashMap<String, String>,
    rng: &mut rand::rngs::StdRng,
) -> String {
    if inner && is_capitalised(w) {
        let name = renamed
            .entry(w.to_string())
            .or_insert_with(|| names[rng.random_range(0..names.len())].clone());
        return name.clone();
    }
    if w.chars().all(|c| c.is_ascii_digit()) {
        return w
            .chars()
            .enumerate()
            .map(|(i, _)| {
                let lo = if i == 0 && w.len() > 1 { 1 } else { 0 };
                char::from(b'0' + rng.random_range(lo..10u8))
            })
            .collect();
    }
    w.to_string()
}

/// Rebuilds `text` with every alphanumeric word passed through `f`
/// (with whether it is inside its sentence); the rest is kept as is.
fn rewrite_words(text: &str, f: &mut dyn FnMut(&str, bool) -> String) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut word = String::new();
    let mut inner = false;
    for c in text.chars() {
        if c.is_alphanumeric() {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            out.push_str(&f(&word, inner));
            word.clear();
            inner = true;
        }
        if matches!(c, '.' | '!' | '?' | '\n' | ':') {
            inner = false;
        }
        out.push(c);
    }
    if !word.is_empty() {
        out.push_str(&f(&word, inner));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> MixedBase {
        let docs = vec![(
            "Ada Lovelace".to_string(),
            "Ada met Charles Babbage in 1833. She wrote notes on his Engine.".to_string(),
        )];
        let names = vec![
            "Grace".to_string(),
            "Hopper".to_string(),
            "Alan".to_string(),
        ];
        MixedBase { docs, names }
    }

    #[test]
    fn the_first_copy_is_the_text_as_written() {
        let b = base();
        assert_eq!(b.text(0), b.docs[0].clone());
    }

    #[test]
    fn later_copies_rename_inner_names_consistently_and_renumber() {
        let b = base();
        let (title, text) = b.text(7);
        // Sentence-initial words stay; inner names come from the pool.
        assert!(text.starts_with("Ada met "), "{text}");
        let year = text.split(" in ").nth(1).map(|r| &r[..4]).unwrap_or("");
        assert!(
            year.chars().all(|c| c.is_ascii_digit()) && year.len() == 4,
            "{text}"
        );
        assert!(!text.contains("Babbage"), "{text}");
        assert!(!text.contains("1833"), "{text}");
        assert!(text.contains("She wrote"), "{text}");
        // The title's inner name takes the same replacement as in the text
        // when the text has it; the title's first word stays.
        assert!(title.starts_with("Ada "), "{title}");
        // Same j, same copy.
        assert_eq!(b.text(7), (title, text));
    }

    #[test]
    fn names_are_capitalised_words_inside_sentences() {
        let names = inner_names(["The cat met Bob. Then Alice and BOB left."].into_iter());
        assert_eq!(names, vec!["Alice".to_string(), "Bob".to_string()]);
    }
}
