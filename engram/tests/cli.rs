//! The `engram` binary as a user runs it (cargo builds it for this test:
//! `CARGO_BIN_EXE_engram`), against a real stack on port 0 and the test
//! Postgres: a reader that stops early (`engram memories list | head`)
//! ends every printing command quietly and with success, a missing id
//! fails naming it, and `engram query` shows conflicts and cache hits as
//! they are (issue 50, item 5).

use std::process::{Output, Stdio};

use engram::stack::{Service, Stack, StackOptions};
use engram_proto::{Memory, UpsertRequest};
use engram_stack::client::Client;

/// A stack with one key of a fresh tenant.
struct Cli {
    stack: Stack,
    uri: String,
    key: String,
    tenant: String,
}

impl Cli {
    async fn start() -> anyhow::Result<Self> {
        let mut settings = engram_common::db::patient_test_settings();
        settings.database.url_opt = Some(engram_common::db::test_database_url().await?);
        settings.database.max_connections = 8;
        let key = format!("k-cli-{}", uuid::Uuid::new_v4().simple());
        let tenant = format!("t-cli-{}", uuid::Uuid::new_v4().simple());
        let opts = StackOptions {
            services: Service::ALL.into_iter().collect(),
            ephemeral_ports: true,
            dev_api_key: false,
            extra_keys: vec![(
                key.clone(),
                tenant.clone(),
                "agent-1".into(),
                "sensitive".into(),
            )],
        };
        let stack = Stack::start(settings, opts).await?;
        let uri = (stack.gateway_uri()).ok_or_else(|| anyhow::anyhow!("no gateway"))?;
        Ok(Self {
            stack,
            uri,
            key,
            tenant,
        })
    }

    async fn client(&self) -> anyhow::Result<Client> {
        Client::connect(&self.uri, &self.key).await
    }

    /// `engram ARGS --addr <gateway> --api-key <key>`, run from a scratch
    /// folder (no engram.toml, no dev key), stdout and stderr piped.
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_engram"));
        c.args(args)
            .args(["--addr", &self.uri, "--api-key", &self.key])
            .env_remove("ENGRAM_API_KEY")
            .current_dir(std::env::temp_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    async fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        Ok(self.command(args).output().await?)
    }

    /// As `engram ARGS | head -0`: the reader closes the pipe before the
    /// command prints anything, so every write fails with EPIPE.
    async fn run_unread(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut child = self.command(args).spawn()?;
        drop(child.stdout.take());
        Ok(child.wait_with_output().await?)
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn notes(n: usize) -> Vec<Memory> {
    (0..n)
        .map(|i| Memory {
            id: uuid::Uuid::new_v4().to_string(),
            content: format!("Note {i}: Ada reviewed the billing ledger on day {i}."),
            ..Default::default()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reader_that_stops_early_ends_every_printing_command_quietly() -> anyhow::Result<()> {
    let cli = Cli::start().await?;
    let stored = notes(40);
    let mut client = cli.client().await?;
    (client.memories)
        .upsert(UpsertRequest {
            memories: stored.clone(),
        })
        .await?;
    let commands: [&[&str]; 7] = [
        &["memories", "list", "--all"],
        &["memories", "list", "--json"],
        &["memories", "export"],
        &["memories", "get", &stored[0].id],
        &["conflicts", "list"],
        &["query", "who reviewed the billing ledger?"],
        &["query", "who reviewed the billing ledger?", "--json"],
    ];
    for args in commands {
        let out = cli.run_unread(args).await?;
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "engram {args:?} panicked: {err}");
        assert!(
            out.status.success(),
            "engram {args:?} ended {:?}: {err}",
            out.status
        );
    }
    // Read, the same command prints what it always did.
    let listed = cli.run(&["memories", "list", "--all"]).await?;
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert_eq!(String::from_utf8(listed.stdout)?.lines().count(), 40);
    cli.stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn get_of_a_missing_id_exits_non_zero_naming_it() -> anyhow::Result<()> {
    let cli = Cli::start().await?;
    let missing = uuid::Uuid::new_v4().to_string();
    let out = cli.run(&["memories", "get", &missing]).await?;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("1 of 1 ids not found"), "{err}");
    assert!(err.contains(&missing), "{err}");
    assert!(out.stdout.is_empty());
    cli.stack.shutdown().await;
    Ok(())
}

/// The demo's sample holds two memories joined by a `contradicts` edge
/// (Alice's morning and afternoon meetings); asked about them, the answer
/// carries the pair.
const MEETINGS: &str = "When does Alice prefer to have meetings?";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn query_shows_conflicts_by_text_in_json_and_a_cache_hit_as_cached() -> anyhow::Result<()> {
    let cli = Cli::start().await?;
    let mut client = cli.client().await?;
    engram::demo::load_sample(&mut client, &cli.tenant).await?;

    let out = cli.run(&["query", MEETINGS, "--json"]).await?;
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let conflicts = v["conflicts"].as_array().cloned().unwrap_or_default();
    assert!(!conflicts.is_empty(), "no conflicts in {v}");
    for field in ["memory_a", "memory_b", "resolution", "winner_id", "reason"] {
        assert!(conflicts[0].get(field).is_some(), "{field} missing: {v}");
    }
    assert_eq!(v["cached"], false, "{v}");

    // The text output, asked again: the gateway answers from its cache.
    let again = cli.run(&["query", MEETINGS, "--json"]).await?;
    let v: serde_json::Value = serde_json::from_slice(&again.stdout)?;
    assert_eq!(v["cached"], true, "{v}");
    let text = cli.run(&["query", MEETINGS]).await?;
    let text = String::from_utf8(text.stdout)?;
    assert!(text.contains("route=cached"), "{text}");
    assert!(!text.contains("route=skip"), "{text}");
    let conflict = (text.lines())
        .find(|l| l.contains("conflict"))
        .ok_or_else(|| anyhow::anyhow!("no conflict line in {text}"))?;
    assert!(conflict.contains("\"Alice"), "{conflict}");
    let ids = [&conflicts[0]["memory_a"], &conflicts[0]["memory_b"]];
    for id in ids.iter().filter_map(|id| id.as_str()) {
        assert!(!conflict.contains(id), "a raw id in {conflict}");
    }
    cli.stack.shutdown().await;
    Ok(())
}
