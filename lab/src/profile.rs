//! `engram bench --in-process --profile FILE`: where a query's CPU goes.
//!
//! Issue 22 asks to profile before cutting. Every service runs in this
//! process (`--in-process`), so one sampling profiler (pprof-rs: SIGPROF
//! at [`HZ`], stacks unwound in-process, no perf events needed) sees the
//! gateway, search-svc, graph-svc and the embedding model together;
//! Postgres is another process, so its CPU is read from `/proc` instead.
//! The profiled pass is the bench's no-rerank query mix at the requested
//! concurrency on the bench corpus. Each sample is charged twice: to the
//! innermost stage it ran under ([`STAGES`], e.g. keyword search, the
//! graph walk) and to the innermost crate by source path (e.g. sqlx, prost),
//! and the folded stacks go to FILE for a flame graph (`inferno-flamegraph
//! < FILE > profile.svg`).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::Context as _;
use engram_proto::{RetrievalMode, RetrieveRequest};
use engram_stack::client::Client;
use futures::StreamExt as _;

/// Samples per second of CPU time (a prime, so it does not beat with
/// periodic work).
const HZ: i32 = 499;

/// Stage of a sample: the innermost frame whose source path (or symbol)
/// contains one of these. Release builds carry line tables only, so a
/// frame's file is known while its symbol is often a bare function name.
const STAGES: &[(&str, &str)] = &[
    ("/models/src/", "embed the query (tokenizer + MiniLM)"),
    ("/search-svc/src/keyword.rs", "search-svc: keyword (BM25)"),
    ("/search-svc/src/dense.rs", "search-svc: dense (pgvector)"),
    ("/search-svc/src/", "search-svc: handlers, other"),
    ("/graph-svc/src/", "graph-svc: PPR and handlers"),
    (
        "/retrieval-svc/src/pipeline/search.rs",
        "gateway: Stage 2 (fan-out, fusion)",
    ),
    (
        "/retrieval-svc/src/pipeline/fusion.rs",
        "gateway: Stage 2 (fan-out, fusion)",
    ),
    ("/retrieval-svc/src/pipeline/", "gateway: other stages"),
    (
        "/retrieval-svc/src/downstream/",
        "gateway: downstream stacks",
    ),
    ("/retrieval-svc/src/", "gateway: handlers, auth, admission"),
    ("engram.v1.rs", "generated gRPC code (all services)"),
    ("/common/src/", "common (server layers, telemetry)"),
    ("/lab/src/", "the bench's own client"),
    ("/stack/src/", "the bench's own client"),
];

/// Where a crate's sources live: the registry (`<crate>-<version>/`), the
/// workspace, or the standard library.
const REGISTRY: &str = "/registry/src/";
/// One process's parent and CPU ticks (user + system).
#[derive(Debug, PartialEq)]
struct Ticks {
    parent: u32,
    ticks: u64,
}

/// The command name and [`Ticks`] of one process from `/proc/<pid>/stat`.
fn process_ticks(stat: &str) -> Option<(String, Ticks)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    let fields: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    // After "pid (comm) ": state is field 0, ppid 1, utime 11, stime 12.
    let parent: u32 = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((
        comm,
        Ticks {
            parent,
            ticks: utime + stime,
        },
    ))
}

/// CPU seconds of this process and of the stack's Postgres.
fn cpu_seconds(pg_data_dir_opt: Option<&Path>) -> (f64, f64) {
    (
        process_cpu_seconds("self"),
        postgres_cpu_seconds(pg_data_dir_opt),
    )
}

/// CPU seconds (user + system) of one process (`pid` or "self"); 0 when
/// it is gone.
pub fn process_cpu_seconds(pid: &str) -> f64 {
    process_cpu_seconds_opt(pid).unwrap_or(0.0)
}

/// [`process_cpu_seconds`], none when the process is gone.
pub fn process_cpu_seconds_opt(pid: &str) -> Option<f64> {
    let tick = rustix::param::clock_ticks_per_second() as f64;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, t) = process_ticks(&stat)?;
    Some(t.ticks as f64 / tick)
}

/// CPU seconds of one Postgres cluster: the postmaster named in
/// `<data dir>/postmaster.pid` and its children (backends, background
/// workers), so other clusters on the machine are not counted. Without a
/// running postmaster there (an external database), every `postgres`
/// process on the machine.
pub fn postgres_cpu_seconds(pg_data_dir_opt: Option<&Path>) -> f64 {
    let tick = rustix::param::clock_ticks_per_second() as f64;
    let postmaster_opt: Option<u32> = pg_data_dir_opt
        .and_then(|d| std::fs::read_to_string(d.join("postmaster.pid")).ok())
        .and_then(|s| s.lines().next()?.trim().parse().ok())
        // A stale pid file (the cluster stopped, an external database in
        // use) names no running postmaster.
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        });
    let postgres: u64 = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            Some((pid, process_ticks(&stat)?))
        })
        .filter(|(pid, (comm, t))| match postmaster_opt {
            Some(pm) => *pid == pm || t.parent == pm,
            None => comm == "postgres",
        })
        .map(|(_, (_, t))| t.ticks)
        .sum();
    postgres as f64 / tick
}

/// One frame as "symbol file" for matching.
fn frame_key(symbol: &pprof::Symbol) -> String {
    format!("{} {}", symbol.name(), symbol.filename())
}

/// The label of the innermost frame matching a rule, else `fallback`.
fn classify<'a>(frames: &[String], rules: &[(&str, &'a str)], fallback: &'a str) -> &'a str {
    frames
        .iter()
        .find_map(|f| {
            rules
                .iter()
                .find(|(needle, _)| f.contains(needle))
                .map(|(_, label)| *label)
        })
        .unwrap_or(fallback)
}

/// The crate of the innermost frame whose source is a registry crate or a
/// workspace crate (`<crate>-<version>` → `<crate>`); standard-library
/// frames pass the sample on to their caller. Frames without a file are
/// code without debug info: ONNX Runtime and libc, named by symbol.
fn crate_of(frames: &[String]) -> String {
    for f in frames {
        if let Some(i) = f.find(REGISTRY) {
            let rest = &f[i + REGISTRY.len()..];
            let dir = rest.split('/').nth(1).unwrap_or(rest);
            // The version starts at the first "-<digit>" ("ort-2.0.0-rc.15").
            let cut = (dir.char_indices())
                .find(|&(i, c)| c == '-' && dir[i + 1..].starts_with(|d: char| d.is_ascii_digit()))
                .map_or(dir.len(), |(i, _)| i);
            return dir[..cut].to_string();
        }
        if f.contains("/rustc/") {
            continue;
        }
        for (needle, name) in WORKSPACE {
            if f.contains(needle) {
                return (*name).to_string();
            }
        }
    }
    match frames.first() {
        Some(f) if f.contains("Unknown") => "no symbol (onnx runtime, libc)".into(),
        Some(f) => format!("no source: {}", f.split(' ').next().unwrap_or("")),
        // The unwinder stops at once in code without unwind tables: ONNX
        // Runtime's hand-written MLAS kernels (the model's matrix work).
        None => NO_FRAMES.into(),
    }
}

/// A sample the unwinder could not walk at all.
const NO_FRAMES: &str = "not unwound (code without unwind tables: onnx runtime's kernels)";

/// Workspace crates by source directory.
const WORKSPACE: &[(&str, &str)] = &[
    ("/models/src/", "engram-models"),
    ("/search-svc/src/", "search-svc"),
    ("/graph-svc/src/", "graph-svc"),
    ("/retrieval-svc/src/", "retrieval-svc"),
    ("/rerank-svc/src/", "rerank-svc"),
    ("/common/src/", "engram-common"),
    ("engram.v1.rs", "engram-proto (generated)"),
    ("/lab/src/", "engram-lab"),
    ("/stack/src/", "engram-stack"),
];

/// Shares of `counts` in percent, largest first.
fn shares(counts: BTreeMap<String, isize>, total: isize) -> serde_json::Value {
    let mut rows: Vec<(String, isize)> = counts.into_iter().collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let pct = |c: isize| (c as f64 * 1000.0 / total.max(1) as f64).round() / 10.0;
    serde_json::Value::Array(
        rows.into_iter()
            .map(|(label, c)| serde_json::json!({"what": label, "percent": pct(c), "samples": c}))
            .collect(),
    )
}

/// Runs `queries` no-rerank queries, `concurrency` at a time, under the
/// profiler; writes the folded stacks to `out` and returns the summary.
pub async fn profile_queries(
    client: &Client,
    questions: &[String],
    queries: usize,
    concurrency: usize,
    out: &Path,
    pg_data_dir_opt: Option<&Path>,
) -> anyhow::Result<serde_json::Value> {
    let routes = [
        RetrievalMode::Simple,
        RetrievalMode::MultiHop,
        RetrievalMode::Exploratory,
    ];
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(HZ)
        .build()
        .context("starting the profiler")?;
    let (own_before, pg_before) = cpu_seconds(pg_data_dir_opt);
    let t = Instant::now();
    let failed = futures::stream::iter(0..queries)
        .map(|i| {
            let mut c = client.clone();
            let req = RetrieveRequest {
                text: questions[i % questions.len()].clone(),
                limit: Some(10),
                mode: routes[i % routes.len()] as i32,
                skip_rerank: true,
                no_cache: true,
                ..Default::default()
            };
            async move { c.retrieval.retrieve(req).await.is_err() }
        })
        .buffer_unordered(concurrency.max(1))
        .filter(|failed| std::future::ready(*failed))
        .count()
        .await;
    let wall = t.elapsed().as_secs_f64();
    let (own_after, pg_after) = cpu_seconds(pg_data_dir_opt);
    let report = guard.report().build().context("building the profile")?;
    drop(guard);

    let mut by_stage: BTreeMap<String, isize> = BTreeMap::new();
    let mut by_crate: BTreeMap<String, isize> = BTreeMap::new();
    let mut folded = std::io::BufWriter::new(
        std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?,
    );
    let (mut total, mut depth) = (0isize, 0isize);
    for (frames, count) in &report.data {
        let keys: Vec<String> = frames.frames.iter().flatten().map(frame_key).collect();
        let stage = match keys.is_empty() {
            true => NO_FRAMES,
            false => classify(&keys, STAGES, "runtime, transport, other"),
        };
        *by_stage.entry(stage.to_string()).or_default() += count;
        *by_crate.entry(crate_of(&keys)).or_default() += count;
        total += count;
        depth += count * keys.len() as isize;
        let names: Vec<String> = (frames.frames.iter().flatten().rev())
            .map(|s| s.name().replace(';', ":"))
            .collect();
        writeln!(
            folded,
            "{};{} {count}",
            frames.thread_name_or_id(),
            names.join(";")
        )?;
    }
    folded.flush()?;
    let per_query = |secs: f64| (secs * 1000.0 / queries.max(1) as f64 * 10.0).round() / 10.0;
    Ok(serde_json::json!({
        "queries": queries,
        "concurrency": concurrency,
        "failed": failed,
        "qps": (queries as f64 / wall.max(1e-9) * 10.0).round() / 10.0,
        "cpu_ms_per_query": {
            "engram_process": per_query(own_after - own_before),
            "postgres": per_query(pg_after - pg_before),
        },
        "samples": total,
        "mean_frames_per_sample": (depth as f64 / total.max(1) as f64 * 10.0).round() / 10.0,
        "by_stage": shares(by_stage, total),
        "by_crate": shares(by_crate, total),
        "folded_stacks": out.display().to_string(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_spaces_in_the_name_parse() {
        let line = "42 (tokio runtime) S 1 2 3 4 5 6 7 8 9 10 120 30 0 0";
        let parsed = Some((
            "tokio runtime".to_string(),
            Ticks {
                parent: 1,
                ticks: 150,
            },
        ));
        assert_eq!(process_ticks(line), parsed);
        assert_eq!(process_ticks("garbage"), None);
    }

    #[test]
    fn the_innermost_matching_frame_decides() {
        let frames: Vec<String> = [
            "Unknown Unknown",
            "read /rustc/abc/library/std/src/io.rs",
            "fetch /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/sqlx-postgres-0.8.6/src/connection.rs",
            "search /work/main/search-svc/src/keyword.rs",
            "unary /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/tonic-0.14.2/src/server/grpc.rs",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            classify(&frames, STAGES, "none"),
            "search-svc: keyword (BM25)"
        );
        assert_eq!(crate_of(&frames[1..]), "sqlx-postgres");
        assert_eq!(crate_of(&frames[3..]), "search-svc");
        let ort = "run /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ort-2.0.0-rc.15/src/session.rs";
        assert_eq!(crate_of(&[ort.into()]), "ort");
        assert_eq!(crate_of(&frames[..1]), "no symbol (onnx runtime, libc)");
        assert_eq!(classify(&["x".into()], STAGES, "none"), "none");
    }
}
