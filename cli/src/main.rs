//! `stream-listener`: the admin CLI of stream-listener groups.
//!
//! Every command reads and writes through the library's public API (the metadata store, the topology,
//! the producer), so it sees and changes exactly what members see. Text output is aligned tables; `--json`
//! prints JSON instead. Failures print `error: …` on stderr and exit with 1 (2 for usage errors). The
//! Redis URL is only ever printed redacted (`redis://user:***@host`).

mod commands;
mod error;
mod redis_ctx;
mod serve;
mod snapshot;
mod table;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::error::CliError;
use crate::redis_ctx::Ctx;

/// Operate stream-listener consumer groups over sharded Redis Streams.
#[derive(Debug, Parser)]
#[command(name = "stream-listener", version, about)]
struct Cli {
    /// Redis to talk to (`redis://[user[:password]@]host[:port][/db]`). Printed only redacted.
    #[arg(
        long,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379",
        global = true
    )]
    redis_url: String,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(subcommand)]
    command: Command,
}

/// TLS for `rediss://` URLs. Without `--tls-ca-cert` the system's root certificates are trusted.
#[derive(Debug, Args)]
struct TlsArgs {
    /// PEM file of the certificate authority that signed the server's certificate.
    #[arg(long, env = stream_listener::tls::CA_CERT_ENV, global = true, value_name = "PEM")]
    tls_ca_cert: Option<std::path::PathBuf>,
    /// PEM file of a client certificate, for servers that require one (`tls-auth-clients yes`).
    #[arg(
        long,
        env = stream_listener::tls::CERT_ENV,
        global = true,
        value_name = "PEM",
        requires = "tls_key"
    )]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM file of the client certificate's private key.
    #[arg(
        long,
        env = stream_listener::tls::KEY_ENV,
        global = true,
        value_name = "PEM",
        requires = "tls_cert"
    )]
    tls_key: Option<std::path::PathBuf>,
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

/// `--json`.
#[derive(Debug, Args)]
struct Output {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Which dead letters: `--id ID...` or `--all [--group G]`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct DeadLetterSelection {
    /// Dead letter entry ids in `<stream>:dlq` (repeatable).
    #[arg(long, num_args = 1..)]
    id: Vec<String>,
    /// Every dead letter (of `--group` only, if given). Asks for confirmation.
    #[arg(long)]
    all: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Every stream and group in this Redis (a bounded SCAN): shard count, state, live members, backlog.
    Groups {
        /// Visit at most about this many keys.
        #[arg(long, default_value_t = 100_000)]
        scan_limit: usize,
        #[command(flatten)]
        output: Output,
    },
    /// Group state, epochs, resharding, backlog, members and invariant violations.
    Status {
        #[command(flatten)]
        target: GroupArgs,
        #[command(flatten)]
        output: Output,
        /// Show expired and fenced tombstones too.
        #[arg(long)]
        all: bool,
    },
    /// Per shard: owners, fenced hold, stream length, group lag, pending entries, last delivered id.
    Shards {
        #[command(flatten)]
        target: GroupArgs,
        #[command(flatten)]
        output: Output,
    },
    /// A live view of a group (members, epochs, shards, lag, rates), refreshed until ctrl-c.
    Watch {
        #[command(flatten)]
        target: GroupArgs,
        /// Refresh interval in milliseconds.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..))]
        interval_ms: u64,
        /// Stop after this many frames.
        #[arg(long)]
        iterations: Option<u64>,
        /// Show expired and fenced tombstones too.
        #[arg(long)]
        all: bool,
        /// JSON Lines: one `status --json` object per refresh.
        #[command(flatten)]
        output: Output,
    },
    /// The newest audit events of a group, oldest first.
    Audit {
        #[command(flatten)]
        target: GroupArgs,
        /// How many events.
        #[arg(long, default_value_t = 20)]
        count: usize,
        #[command(flatten)]
        output: Output,
    },
    /// Move a group's position on some or all shards (XGROUP SETID). Refused while members own them.
    Seek {
        #[command(flatten)]
        target: GroupArgs,
        /// `earliest` (read everything again), `latest` (skip the backlog), or an entry id (read what
        /// comes after it).
        #[arg(long, value_parser = commands::seek::Position::parse)]
        to: commands::seek::Position,
        /// Only these shards (repeatable) [default: all of the group's shards].
        #[arg(long)]
        shard: Vec<u32>,
        #[command(flatten)]
        output: Output,
    },
    /// Serve groups' lag, pending entries and oldest unacknowledged age over HTTP without being a
    /// member: `/metrics` (Prometheus text), `/lag` and `/lag/<stream>/<group>` (JSON for KEDA's
    /// metrics-api scaler, `valueLocation: lag` or `backlog`). Runs until SIGTERM or ctrl-c.
    Exporter {
        /// Address to listen on (port 0: any free port; the address is printed).
        #[arg(long, default_value = "0.0.0.0:9464")]
        listen: String,
        /// Export this group, as `<stream>/<group>` (repeatable) [default: every group discovered].
        #[arg(long, value_parser = stream_listener::lag::GroupName::parse)]
        group: Vec<stream_listener::lag::GroupName>,
        /// Discover groups from the keyspace (topology and group metadata keys) as well as `--group`.
        #[arg(long)]
        discover: bool,
        /// Serve a scrape's answer again for this long, in ms: concurrent scrapes share one read.
        #[arg(long, default_value_t = 1000)]
        cache_ms: u64,
        /// Scan the keyspace for new groups at most this often, in ms.
        #[arg(long, default_value_t = 30_000)]
        discovery_interval_ms: u64,
        /// Count at most this many entries on a shard whose lag Redis cannot tell (above: a lower bound).
        #[arg(long, default_value_t = 10_000)]
        count_limit: u64,
        /// Visit at most about this many keys per discovery.
        #[arg(long, default_value_t = 100_000)]
        scan_limit: usize,
    },
    /// Serve the spec's HTTP API v1 (`/coord/v1/...`), so its Python and Spring clients join this
    /// Redis's groups beside Rust members. Stateless: run as many replicas as you like.
    Serve {
        /// Where to listen (`host:port`; port 0 picks a free one, printed on stdout).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        /// The largest request body accepted, in bytes.
        #[arg(long, default_value_t = 1 << 20)]
        body_limit: usize,
        /// How long one request may take, in ms (a heartbeat that runs out is answered `RETRY`).
        #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(100..))]
        request_timeout_ms: u64,
        /// How long in-flight requests get to finish after SIGTERM or ctrl-c, in ms.
        #[arg(long, default_value_t = 10_000)]
        shutdown_grace_ms: u64,
        /// This replica's name in `/coord/v1/monitoring/health` [default: `serve-<pid>`].
        #[arg(long)]
        server_id: Option<String>,
        /// How long past its lease an HTTP member's shards stay held from everyone after it expires or
        /// is fenced, in ms: these clients do not stop reading on their own when their lease passes.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(i64).range(0..=86_400_000))]
        hold_after_lease_ms: i64,
        /// A shard granted to an HTTP member with entries pending (an earlier owner's) is rewound so that
        /// the member reads them first, delivering again at most this many entries; a shard that needs
        /// more is not given to it (these clients never claim pending entries).
        #[arg(long, default_value_t = 1_000)]
        max_rewind: u64,
        /// How long producers may keep writing the old layout after a scale or rollback, in ms (the
        /// resize's grace: at least every producer's topology refresh interval, 1 s by default).
        #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
        resize_grace_ms: u64,
        /// Users and roles, one `name:password:ROLE[,ROLE..]` per line (READ, WRITE, ADMIN, MONITOR,
        /// MEMBER). Without users nothing is authenticated.
        #[arg(long, value_name = "FILE", conflicts_with = "users")]
        users_file: Option<std::path::PathBuf>,
        /// The same lines, from the environment (whitespace separates entries too).
        #[arg(long, env = "SL_SERVE_USERS", hide_env_values = true)]
        users: Option<String>,
        /// The key login tokens are signed with (at least 16 bytes; the same on every replica): the
        /// origin's `coordinator.api.token-secret`, so tokens pass between it and us. Unset or blank:
        /// the origin's fallback, `<admin>:<password>:redis-stream-coordinator-token` of the first
        /// ADMIN user.
        #[arg(long, env = "SL_SERVE_TOKEN_SECRET", hide_env_values = true)]
        token_secret: Option<String>,
        /// How long a login's token is valid, in seconds (the origin's default: 7 days).
        #[arg(long, default_value_t = 604_800)]
        token_ttl_secs: u64,
        /// Heartbeats need the MEMBER role (the origin's `authenticateMemberApi`).
        #[arg(long)]
        authenticate_heartbeats: bool,
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
        #[command(flatten)]
        output: Output,
    },
    /// The shard and shard stream each key routes to under the stream's current shard count.
    Route {
        /// Logical stream.
        #[arg(long)]
        stream: String,
        /// Partition keys (their UTF-8 bytes are hashed).
        #[arg(required = true)]
        keys: Vec<String>,
        #[command(flatten)]
        output: Output,
    },
    /// Roll a stream back to its shard count before the last resize; every group follows.
    Rollback {
        /// Logical stream.
        #[arg(long)]
        stream: String,
        /// How long producers may keep writing the current layout, in ms [default: the library's, 2000].
        #[arg(long)]
        grace_ms: Option<u64>,
        #[command(flatten)]
        output: Output,
    },
    /// Fence a member: it must rejoin; its shards stay held until its lease passes.
    Fence {
        #[command(flatten)]
        target: GroupArgs,
        /// The memberId.
        #[arg(long)]
        member: String,
        #[command(flatten)]
        output: Output,
    },
    /// List dead letters of a stream (`<stream>:dlq`); show, replay or purge them.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    DeadLetters {
        #[command(subcommand)]
        action: Option<DeadLetterAction>,
        /// Logical stream.
        #[arg(long, required = true)]
        stream: Option<String>,
        /// Only the dead letters of this group.
        #[arg(long)]
        group: Option<String>,
        /// How many entries (oldest first).
        #[arg(long, default_value_t = 20)]
        count: usize,
        /// Show a payload column.
        #[arg(long)]
        payloads: bool,
        #[command(flatten)]
        output: Output,
    },
}

#[derive(Debug, Subcommand)]
enum DeadLetterAction {
    /// Every field of one dead letter, the payload in full.
    Show {
        /// Logical stream.
        #[arg(long)]
        stream: String,
        /// The dead letter's entry id in `<stream>:dlq`.
        #[arg(long)]
        id: String,
        #[command(flatten)]
        output: Output,
    },
    /// Publish dead letters again, to the group that failed them only, and delete them from the DLQ.
    Replay {
        /// Logical stream.
        #[arg(long)]
        stream: String,
        #[command(flatten)]
        which: DeadLetterSelection,
        /// With --all: only the dead letters of this group.
        #[arg(long, requires = "all")]
        group: Option<String>,
        /// Publish as plain entries that every group of the stream handles again.
        #[arg(long)]
        to_all_groups: bool,
        /// Do not ask for confirmation (required when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
        #[command(flatten)]
        output: Output,
    },
    /// Delete dead letters for good. Asks for confirmation.
    Purge {
        /// Logical stream.
        #[arg(long)]
        stream: String,
        #[command(flatten)]
        which: DeadLetterSelection,
        /// With --all: only the dead letters of this group.
        #[arg(long, requires = "all")]
        group: Option<String>,
        /// Do not ask for confirmation (required when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
        #[command(flatten)]
        output: Output,
    },
}

impl DeadLetterSelection {
    fn selection(&self, group: Option<String>) -> commands::dead_letters::Selection {
        if self.all {
            commands::dead_letters::Selection::All { group }
        } else {
            commands::dead_letters::Selection::Ids(self.id.clone())
        }
    }
}

fn main() -> ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // Named when the URL does not parse.
    let url_origin = match matches.value_source("redis_url") {
        Some(clap::parser::ValueSource::CommandLine) => "--redis-url",
        Some(clap::parser::ValueSource::EnvVariable) => "the environment variable REDIS_URL",
        _ => "the default of --redis-url",
    };
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
    match runtime.block_on(run(cli, url_origin)) {
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
async fn run(cli: Cli, url_origin: &'static str) -> Result<String, CliError> {
    use commands::dead_letters;
    let tls = stream_listener::TlsFiles {
        ca_cert: cli.tls.tls_ca_cert,
        cert: cli.tls.tls_cert,
        key: cli.tls.tls_key,
    };
    let mut ctx = Ctx::connect(&cli.redis_url, url_origin, &tls).await?;
    match cli.command {
        Command::Groups { scan_limit, output } => {
            commands::groups::run(&mut ctx, scan_limit, output.json).await
        }
        Command::Status {
            target,
            output,
            all,
        } => commands::status::run(&mut ctx, &target.stream, &target.group, output.json, all).await,
        Command::Shards { target, output } => {
            commands::shards::run(&mut ctx, &target.stream, &target.group, output.json).await
        }
        Command::Watch {
            target,
            interval_ms,
            iterations,
            all,
            output,
        } => {
            commands::watch::run(
                &mut ctx,
                &target.stream,
                &target.group,
                std::time::Duration::from_millis(interval_ms),
                iterations,
                all,
                output.json,
            )
            .await
        }
        Command::Audit {
            target,
            count,
            output,
        } => {
            commands::audit::run(&mut ctx, &target.stream, &target.group, count, output.json).await
        }
        Command::Seek {
            target,
            to,
            shard,
            output,
        } => {
            commands::seek::run(
                &mut ctx,
                &target.stream,
                &target.group,
                &to,
                &shard,
                output.json,
            )
            .await
        }
        Command::Exporter {
            listen,
            group,
            discover,
            cache_ms,
            discovery_interval_ms,
            count_limit,
            scan_limit,
        } => {
            let settings = commands::exporter::Settings {
                listen,
                groups: group,
                discover,
                cache: std::time::Duration::from_millis(cache_ms),
                discovery_interval: std::time::Duration::from_millis(discovery_interval_ms),
                count_limit,
                scan_limit,
            };
            commands::exporter::run(&ctx, settings).await
        }
        Command::Serve {
            listen,
            body_limit,
            request_timeout_ms,
            shutdown_grace_ms,
            server_id,
            hold_after_lease_ms,
            max_rewind,
            resize_grace_ms,
            users_file,
            users,
            token_secret,
            token_ttl_secs,
            authenticate_heartbeats,
        } => {
            let settings = serve::Settings {
                listen,
                body_limit,
                request_timeout: std::time::Duration::from_millis(request_timeout_ms),
                shutdown_grace: std::time::Duration::from_millis(shutdown_grace_ms),
                server_id: server_id.unwrap_or_else(|| format!("serve-{}", std::process::id())),
                hold_after_lease_ms,
                max_rewind,
                resize_grace: std::time::Duration::from_millis(resize_grace_ms),
            };
            let users = match users_file {
                Some(path) => std::fs::read_to_string(&path).map_err(|e| {
                    CliError::Refused(format!("cannot read {}: {e}", path.display()))
                })?,
                None => users
                    .unwrap_or_default()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join("\n"),
            };
            let auth = serve::AuthSettings {
                users,
                token_secret,
                token_ttl: std::time::Duration::from_secs(token_ttl_secs),
                authenticate_heartbeats,
            };
            serve::run(&ctx, settings, auth).await
        }
        Command::Reshard {
            stream,
            shards,
            grace_ms,
            output,
        } => commands::reshard::run(&mut ctx, &stream, shards, grace_ms, output.json).await,
        Command::Route {
            stream,
            keys,
            output,
        } => commands::route::run(&mut ctx, &stream, &keys, output.json).await,
        Command::Rollback {
            stream,
            grace_ms,
            output,
        } => commands::reshard::rollback(&mut ctx, &stream, grace_ms, output.json).await,
        Command::Fence {
            target,
            member,
            output,
        } => {
            commands::admin::fence(
                &mut ctx,
                &target.stream,
                &target.group,
                &member,
                output.json,
            )
            .await
        }
        Command::DeadLetters {
            action: Some(action),
            ..
        } => match action {
            DeadLetterAction::Show { stream, id, output } => {
                dead_letters::show(&mut ctx, &stream, &id, output.json).await
            }
            DeadLetterAction::Replay {
                stream,
                which,
                group,
                to_all_groups,
                yes,
                output,
            } => {
                dead_letters::replay(
                    &mut ctx,
                    &stream,
                    &which.selection(group),
                    to_all_groups,
                    yes,
                    output.json,
                )
                .await
            }
            DeadLetterAction::Purge {
                stream,
                which,
                group,
                yes,
                output,
            } => {
                dead_letters::purge(&mut ctx, &stream, &which.selection(group), yes, output.json)
                    .await
            }
        },
        Command::DeadLetters {
            action: None,
            stream,
            group,
            count,
            payloads,
            output,
        } => {
            let stream = stream.expect("clap requires --stream without a subcommand");
            dead_letters::list(
                &mut ctx,
                &stream,
                group.as_deref(),
                count,
                payloads,
                output.json,
            )
            .await
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
