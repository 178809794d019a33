//! Starting one member from its plan: its heartbeat connection, its stream's topology and group, its
//! store, and its three tasks (consumer, heartbeat loop, metrics), each supervised.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::connection::{ConnectOptions, Connection, RedisTarget};
use crate::consumer::{Consumer, PauseHandle};
use crate::coordinator::metadata::GroupConfig;
use crate::member::heartbeat::{MemberLoop, MemberStatus};
use crate::member::lifecycle::OwnershipDeadline;
use crate::member::session::{MemberIdentity, MemberSession};
use crate::store::GroupStore;
use crate::topology::{Topology, TopologyError};

use super::plan::MemberPlan;
use super::supervise::{self, Exits};
use super::RuntimeError;

/// The shortest connection timeout of a member's heartbeat connection (see [`heartbeat_connection`]).
const MIN_CONNECTION_TIMEOUT: Duration = Duration::from_secs(1);

/// What every member of one runtime shares.
pub(super) struct Shared {
    pub(super) client: RedisTarget,
    /// Timing of groups this process creates; the heartbeat interval and session timeout of its members.
    pub(super) group_config: GroupConfig,
    /// Shards of a stream a member creates, unless its listener names a count.
    pub(super) default_shard_count: u32,
    pub(super) shutdown_timeout: Duration,
    pub(super) shutdown: watch::Receiver<bool>,
    pub(super) exits: Exits,
}

/// One started member.
#[derive(Debug)]
pub(super) struct RunningMember {
    pub(super) member_id: String,
    /// The `member` span (member, stream, group) its tasks run in, for the lines logged about it.
    pub(super) span: tracing::Span,
    pub(super) probe: crate::health::Probe,
    pub(super) pause: PauseHandle,
    pub(super) deadline: Arc<OwnershipDeadline>,
    pub(super) status: watch::Receiver<MemberStatus>,
    pub(super) heartbeat_task: JoinHandle<()>,
    pub(super) consumer_task: JoinHandle<()>,
}

impl RunningMember {
    /// Prepares the member's stream and group, then spawns its tasks; `wakeup` is its registration with
    /// its group's wake-up subscription.
    pub(super) async fn spawn(
        plan: MemberPlan,
        wakeup: Arc<Notify>,
        shared: &Shared,
    ) -> Result<Self, RuntimeError> {
        let owner = format!("member {}", plan.member_id);
        let stream = plan.consumer.stream_prefix.clone();
        let group = plan.consumer.group.clone();
        let interval = Duration::from_millis(shared.group_config.heartbeat_interval_ms as u64);
        let mut conn = heartbeat_connection(&shared.client, interval).await?;
        let topology = stream_and_group(&mut conn, &plan, shared.default_shard_count).await?;
        let sampler_conn = conn.clone();
        let store = GroupStore::create(
            conn,
            &stream,
            &group,
            topology.read_shard_count(),
            shared.group_config,
        )?;
        let identity = MemberIdentity {
            member_id: plan.member_id.as_str().into(),
            member_name: Some(plan.label.clone()),
            weight: plan.weight,
            runtime_max_concurrency: plan.consumer.runtime_max_concurrency as u32,
        };
        let deadline = OwnershipDeadline::new();
        let consumer = Consumer::connect(shared.client.clone(), plan.consumer, plan.handler)
            .await?
            .with_deadline(deadline.clone())
            .with_hooks(plan.hooks);
        let probe = consumer.probe();
        let pause = consumer.pause_handle();
        let (commands_tx, commands_rx) = mpsc::unbounded_channel();
        let (reports_tx, reports_rx) = mpsc::unbounded_channel();
        // Every log line of the member (heartbeats, store, consumer jobs, handlers) carries who it is. At
        // ERROR level, so it is enabled whenever any of its events is.
        let span = tracing::error_span!("member", member = %plan.member_id, stream = %stream, group = %group);

        let consumer_task = tokio::spawn(supervise::supervised(
            owner.clone(),
            "consumer",
            shared.exits.clone(),
            consumer
                .run(commands_rx, reports_tx)
                .instrument(span.clone()),
        ));

        let (status_tx, status) = watch::channel(MemberStatus::default());
        tokio::spawn(supervise::logged(
            format!("metrics of {owner}"),
            crate::metrics::follow_member(
                status.clone(),
                deadline.clone(),
                stream,
                group,
                plan.member_id.clone(),
                Some(crate::metrics::ShardSampler {
                    conn: sampler_conn,
                    every: interval * 10,
                }),
            )
            .instrument(span.clone()),
        ));

        let session = MemberSession::new(
            identity,
            shared.group_config.session_timeout_ms,
            incarnation(),
        )
        .restarts(plan.restarts);
        span.in_scope(|| tracing::info!(listener = %plan.label, static_membership = plan.restarts, "member starting"));
        let heartbeat_task = tokio::spawn(supervise::supervised(
            owner,
            "heartbeat loop",
            shared.exits.clone(),
            MemberLoop::new(
                session,
                store,
                deadline.clone(),
                commands_tx,
                reports_rx,
                shared.shutdown.clone(),
            )
            .with_status(status_tx)
            .with_shutdown_timeout(shared.shutdown_timeout)
            .with_wakeup(wakeup)
            .run()
            .instrument(span.clone()),
        ));

        Ok(RunningMember {
            member_id: plan.member_id,
            span,
            probe,
            pause,
            deadline,
            status,
            heartbeat_task,
            consumer_task,
        })
    }
}

/// The member's own connection, for its heartbeats and its stream's set-up: never behind a blocking read.
/// Its response timeout is one heartbeat interval, so a stuck Redis shows up before the lease is at risk.
/// Connecting may take longer (a TLS handshake over a slow link, every node of a cluster): a connection
/// timeout below that would never connect at all; each heartbeat stays bounded by its own budget anyway.
async fn heartbeat_connection(
    client: &RedisTarget,
    interval: Duration,
) -> Result<Connection, RuntimeError> {
    let options = ConnectOptions {
        response_timeout: Some(interval),
        connection_timeout: Some(interval.max(MIN_CONNECTION_TIMEOUT)),
        retries: Some(2),
        ..Default::default()
    };
    Ok(client.connect(options).await?)
}

/// The plan's stream topology (created with the plan's shard count, else `default_shards`, when no
/// producer created it), and its consumer group on every shard (at the plan's `StartFrom`).
async fn stream_and_group(
    conn: &mut Connection,
    plan: &MemberPlan,
    default_shards: u32,
) -> Result<Topology, RuntimeError> {
    let stream = &plan.consumer.stream_prefix;
    let topology = match Topology::load(conn, stream).await {
        Ok(topology) => topology,
        Err(TopologyError::Missing { .. }) => {
            let shards = plan.shard_count.unwrap_or(default_shards);
            Topology::ensure(conn, stream, shards).await?
        }
        Err(e) => return Err(e.into()),
    };
    Topology::ensure_group(conn, stream, &plan.consumer.group, plan.start_from).await?;
    Ok(topology)
}

/// A nonce that differs between processes and restarts using the same memberId.
fn incarnation() -> u64 {
    crate::util::random_u64() ^ u64::from(std::process::id())
}
