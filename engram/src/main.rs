//! `engram`: run any set of services, the demo, ingest, query; eval, tune
//! and bench come from the lab (`engram-lab`). Commands live in the
//! libraries (`engram::commands`, `engram_lab::run`); this file only parses.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc malloc for every service this binary runs:
/// a query allocates and frees thousands of short-lived buffers (protobuf
/// messages, rows, the graph walk's maps), and glibc's arenas spent ~8 % of
/// the services' CPU on them at 8 in flight (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "engram",
    version,
    about = "Retrieval for AI agents' long-term memory"
)]
struct Cli {
    /// TOML config file (default: ./engram.toml when present; env ENGRAM__SECTION__KEY overrides).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// All services in one process on the embedded Postgres (or DATABASE_URL).
    Up,
    /// Any subset of services: --services retrieval,search,graph,rerank.
    Serve {
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "retrieval,search,graph,rerank"
        )]
        services: Vec<String>,
    },
    /// Start everything, load a small sample, run a few queries, print them.
    Demo,
    /// Load a JSONL file of memories (and edges) through the gateway.
    Ingest {
        file: PathBuf,
        #[command(flatten)]
        conn: engram::commands::Conn,
    },
    // eval, tune, bench (engram-lab), listed here as they always were.
    #[command(flatten)]
    Lab(engram_lab::LabCommand),
    /// Recompute every memory's decay_score now (search-svc's decay job, one pass).
    Decay {
        /// One full pass, then exit.
        #[arg(long)]
        once: bool,
    },
    /// Index the sentences of memories stored before the fact index
    /// existed (or while search.fact_index was off); safe beside traffic.
    IndexFacts {
        /// Only this tenant's memories (default: every tenant's).
        #[arg(long)]
        tenant: Option<String>,
        /// Memories per transaction.
        #[arg(long, default_value_t = 64)]
        batch: u32,
    },
    /// See and clean what the key's tenant stored: list, get, delete,
    /// export, import, wipe (docs/memories.md).
    Memories {
        #[command(subcommand)]
        command: engram::memories::MemoriesCommand,
    },
    /// Review the updates engram detected at write time
    /// (search.update_detection): list, confirm, reject.
    Conflicts {
        #[command(subcommand)]
        command: engram::conflicts::ConflictsCommand,
    },
    /// Serve engram's memory as MCP tools over stdio, or streamable HTTP
    /// with --http (docs/mcp.md).
    Mcp {
        #[command(flatten)]
        args: engram::mcp::McpArgs,
    },
    /// Ask the gateway one question.
    Query {
        text: String,
        #[command(flatten)]
        options: engram::commands::QueryOptions,
        #[command(flatten)]
        conn: engram::commands::Conn,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match engram_common::Settings::load(cli.config.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("engram: {e}");
            return ExitCode::from(2);
        }
    };
    engram_common::telemetry::init(&settings.log);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("engram: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    use engram::commands;
    let result = rt.block_on(async move {
        match cli.command {
            Command::Up => commands::up(settings, None).await,
            Command::Serve { services } => commands::up(settings, Some(services)).await,
            Command::Demo => commands::demo(settings).await,
            Command::Ingest { file, conn } => commands::ingest(settings, &file, conn).await,
            Command::Lab(command) => engram_lab::run(settings, command).await,
            Command::Decay { once } => commands::decay(settings, once).await,
            Command::IndexFacts { tenant, batch } => {
                commands::index_facts(settings, tenant, batch).await
            }
            Command::Memories { command } => engram::memories::run(settings, command).await,
            Command::Conflicts { command } => engram::conflicts::run(settings, command).await,
            Command::Mcp { args } => engram::mcp::run(settings, args).await,
            Command::Query {
                text,
                options,
                conn,
            } => commands::query(settings, &text, options, conn).await,
        }
    });
    // Flush the spans still batched for the OTLP exporter (no-op without it).
    engram_common::telemetry::shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `engram memories list | head`: the reader had what it wanted.
        Err(e) if engram_stack::out::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("engram: {e:#}");
            ExitCode::FAILURE
        }
    }
}
