//! How the workspace's crates depend on each other, read from their
//! manifests: one way only (no cycle), and the product binary links no lab
//! code — `engram`'s dependencies never reach `engram-lab`, whose commands
//! run as a binary of their own (docs/decisions.md, "The lab, a binary of
//! its own").

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace root (this crate sits one below it).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("engram/ has a parent")
        .to_path_buf()
}

/// The lines of one `[section]` of a manifest.
fn section<'t>(text: &'t str, name: &str) -> Vec<&'t str> {
    let header = format!("[{name}]");
    (text.lines())
        .skip_while(|l| l.trim() != header)
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// The key of a dependency line: `engram-lab.workspace = true` → engram-lab.
fn key(line: &str) -> &str {
    line.split(['.', '=', ' ']).next().unwrap_or_default()
}

/// Each workspace crate and the workspace crates it depends on (normal
/// dependencies only: tests and benches may use anything).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let read = |p: PathBuf| std::fs::read_to_string(&p).expect("a manifest");
    let top = read(root().join("Cargo.toml"));
    let crates: BTreeMap<String, String> = section(&top, "workspace.dependencies")
        .into_iter()
        .filter_map(|l| {
            let path = l.split("path = \"").nth(1)?.split('"').next()?;
            Some((key(l).to_string(), path.to_string()))
        })
        .collect();
    (crates.iter())
        .map(|(name, dir)| {
            let text = read(root().join(dir).join("Cargo.toml"));
            let deps = (section(&text, "dependencies").into_iter())
                .map(key)
                .filter(|k| crates.contains_key(*k))
                .map(str::to_string)
                .collect();
            (name.clone(), deps)
        })
        .collect()
}

/// Every crate `from` reaches; panics on a cycle.
fn reach(g: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        m: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        assert!(
            !path.iter().any(|p| p == m),
            "dependency cycle: {path:?} -> {m}"
        );
        if !done.insert(m.to_string()) {
            return;
        }
        path.push(m.to_string());
        for d in g.get(m).into_iter().flatten() {
            visit(g, d, path, done);
        }
        path.pop();
    }
    let mut done = BTreeSet::new();
    visit(g, from, &mut Vec::new(), &mut done);
    done
}

#[test]
fn the_product_binary_links_no_lab_code() {
    let g = graph();
    // The parser sees the manifests (else the check would pass vacuously).
    assert!(g["engram-lab"].contains("retrieval-svc"), "{g:?}");
    let product = reach(&g, "engram");
    assert!(product.contains("engram-common"), "{product:?}");
    assert!(
        !product.contains("engram-lab"),
        "engram reaches the lab: {product:?}"
    );
}

#[test]
fn crates_depend_one_way() {
    let g = graph();
    for name in g.keys() {
        reach(&g, name);
    }
}
