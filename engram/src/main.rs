//! `engram`: run any set of services, the demo, ingest, query; eval, tune,
//! bench, soak and ranker training are the lab's, run by the `engram-lab`
//! binary (`engram::lab`). Commands live in the library; this file only
//! parses.

use std::ffi::OsString;
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
    about = "Retrieval for AI agents' long-term memory",
    after_help = engram::lab::HELP
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
    #[command(flatten)]
    Product(Product),
    // eval, tune, bench, soak, ranker: run by `engram-lab` (after_help).
    #[command(external_subcommand)]
    Lab(Vec<OsString>),
}

/// What this binary runs itself.
#[derive(Subcommand)]
enum Product {
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
    let command = match cli.command {
        Command::Lab(args) => return engram::lab::run(cli.config.as_deref(), args),
        Command::Product(command) => command,
    };
    use engram::commands;
    engram_stack::cli::run("engram", cli.config.as_deref(), |settings| async move {
        match command {
            Product::Up => commands::up(settings, None).await,
            Product::Serve { services } => commands::up(settings, Some(services)).await,
            Product::Demo => commands::demo(settings).await,
            Product::Ingest { file, conn } => commands::ingest(settings, &file, conn).await,
            Product::Decay { once } => commands::decay(settings, once).await,
            Product::IndexFacts { tenant, batch } => {
                commands::index_facts(settings, tenant, batch).await
            }
            Product::Memories { command } => engram::memories::run(settings, command).await,
            Product::Conflicts { command } => engram::conflicts::run(settings, command).await,
            Product::Mcp { args } => engram::mcp::run(settings, args).await,
            Product::Query {
                text,
                options,
                conn,
            } => commands::query(settings, &text, options, conn).await,
        }
    })
}
