//! `stream-listener`: the admin CLI of stream-listener groups.
//!
//! Every command reads and writes through the library's public API (the metadata store, the topology,
//! the producer), so it sees and changes exactly what members see. Text output is aligned tables;
//! `status --json` prints the monitoring projection. Failures print `error: …` on stderr and exit with 1
//! (2 for usage errors).

mod commands;
mod error;
mod redis_ctx;
mod table;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::error::CliError;
use crate::redis_ctx::Ctx;

/// Operate stream-listener consumer groups over sharded Redis Streams.
#[derive(Debug, Parser)]
#[command(name = "stream-listener", version, about)]
struct Cli {
    /// Redis to talk to.
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        global = true
    )]
    redis_url: String,
    #[command(subcommand)]
    command: Command,
}

/// `--stream S --group G`.
#[derive(Debug, Args)]
struct GroupArgs {
    /// Logical stream (the shard streams are `<stream>:0..n-1`).
    #[arg(long)]
    stream: String,
    /// Consumer group.
    #[arg(long)]
    group: String,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Group state, epochs, resharding, members and invariant violations.
    Status {
        #[command(flatten)]
        target: GroupArgs,
        /// Print the monitoring projection as JSON instead.
        #[arg(long)]
        json: bool,
    },
    /// Per shard: owners, fenced hold, stream length, group lag, pending entries, last delivered id.
    Shards {
        #[command(flatten)]
        target: GroupArgs,
    },
    /// The newest audit events of a group, oldest first.
    Audit {
        #[command(flatten)]
        target: GroupArgs,
        /// How many events.
        #[arg(long, default_value_t = 20)]
        count: usize,
    },
    /// Change a stream's shard count; every group reading it follows within a few heartbeats.
    Reshard {
        /// Logical stream.
        #[arg(long)]
        stream: String,
        /// New shard count.
        #[arg(long)]
        shards: u32,
        /// How long producers may keep writing the old layout, in ms: at least their topology refresh
        /// interval plus a margin [default: the library's, 2000].
        #[arg(long)]
        grace_ms: Option<u64>,
    },
    /// Roll back a group's last shard count change.
    Rollback {
        #[command(flatten)]
        target: GroupArgs,
    },
    /// Fence a member: it must rejoin; its shards stay held until its lease passes.
    Fence {
        #[command(flatten)]
        target: GroupArgs,
        /// The memberId.
        #[arg(long)]
        member: String,
    },
    /// List dead letters of a stream (`<stream>:dlq`), or replay one.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    DeadLetters {
        #[command(subcommand)]
        action: Option<DeadLetterAction>,
        /// Logical stream.
        #[arg(long, required = true)]
        stream: Option<String>,
        /// How many entries (oldest first).
        #[arg(long, default_value_t = 20)]
        count: usize,
    },
}

#[derive(Debug, Subcommand)]
enum DeadLetterAction {
    /// Publish a dead letter's original entry again (routed by its key) and delete it from the DLQ.
    Replay {
        /// Logical stream.
        #[arg(long)]
        stream: String,
        /// The dead letter's entry id in `<stream>:dlq`.
        #[arg(long)]
        id: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(output) => {
            print!("{output}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one command; returns what to print.
async fn run(cli: Cli) -> Result<String, CliError> {
    let mut ctx = Ctx::connect(&cli.redis_url).await?;
    match cli.command {
        Command::Status { target, json } => {
            commands::status::run(&mut ctx, &target.stream, &target.group, json).await
        }
        Command::Shards { target } => {
            commands::shards::run(&mut ctx, &target.stream, &target.group).await
        }
        Command::Audit { target, count } => {
            commands::audit::run(&mut ctx, &target.stream, &target.group, count).await
        }
        Command::Reshard {
            stream,
            shards,
            grace_ms,
        } => commands::reshard::run(&mut ctx, &stream, shards, grace_ms).await,
        Command::Rollback { target } => {
            commands::admin::rollback(&mut ctx, &target.stream, &target.group).await
        }
        Command::Fence { target, member } => {
            commands::admin::fence(&mut ctx, &target.stream, &target.group, &member).await
        }
        Command::DeadLetters {
            action: Some(DeadLetterAction::Replay { stream, id }),
            ..
        } => commands::dead_letters::replay(&mut ctx, &stream, &id).await,
        Command::DeadLetters {
            action: None,
            stream,
            count,
        } => {
            let stream = stream.expect("clap requires --stream without a subcommand");
            commands::dead_letters::list(&mut ctx, &stream, count).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_valid() {
        Cli::command().debug_assert();
    }
}
