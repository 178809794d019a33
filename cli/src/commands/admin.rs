//! `rollback` and `fence`: admin commands applied through the metadata store.

use stream_listener::coordinator::AdminCommand;
use stream_listener::topology::{Topology, TopologyError};

use crate::error::CliError;
use crate::redis_ctx::Ctx;
use crate::table::{json_text, label, seconds, shard_list};

/// Rolls back the group's last shard count change (`AdminCommand::RollbackResharding`).
pub async fn rollback(ctx: &mut Ctx, stream: &str, group: &str) -> Result<String, CliError> {
    let mut store = ctx.existing_group(stream, group).await?;
    store.command(AdminCommand::RollbackResharding).await??;
    let (_, coordinator) = store.load().await?;
    let meta = coordinator.metadata();
    let mut out = format!(
        "group `{group}` rolled back to {} shards (group epoch {})",
        meta.shard_count, meta.group_epoch
    );
    if let Some(r) = &meta.resharding {
        out.push_str(&format!(", resharding {}", label(&r.state)));
    }
    out.push('\n');
    // The stream's topology is what running members follow: if it still says otherwise, they re-apply it.
    match Topology::load(&mut ctx.conn, stream).await {
        Ok(topology) if topology.shard_count() != meta.shard_count => out.push_str(&format!(
            "warning: stream `{stream}` still has {} shards in its topology; running members will apply \
             that count again. Use `stream-listener reshard --stream {stream} --shards {}` to change the \
             stream itself\n",
            topology.shard_count(),
            meta.shard_count
        )),
        Ok(_) | Err(TopologyError::Missing { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(out)
}

/// Fences a live member (`AdminCommand::FenceMember`): it must rejoin with epoch 0; its shards stay held
/// until its lease passes.
pub async fn fence(
    ctx: &mut Ctx,
    stream: &str,
    group: &str,
    member: &str,
    json: bool,
) -> Result<String, CliError> {
    let mut store = ctx.existing_group(stream, group).await?;
    store
        .command(AdminCommand::FenceMember(member.to_string()))
        .await??;
    let (_, coordinator) = store.load().await?;
    let now = ctx.now_ms().await?;
    let holds: Vec<_> = coordinator
        .metadata()
        .holds
        .iter()
        .filter(|(_, hold)| hold.member_id == member)
        .collect();
    let held: Vec<u32> = holds.iter().map(|(&shard, _)| shard).collect();
    let held_until = holds.iter().map(|(_, hold)| hold.until_ms).max();
    if json {
        return Ok(json_text(&serde_json::json!({
            "fenced": member,
            "group": group,
            "stream": stream,
            "heldShards": held,
            "heldUntilMs": held_until,
            "heldForMs": held_until.map(|until| (until - now).max(0)),
        })));
    }
    let mut out =
        format!("member `{member}` of group `{group}` fenced: it must rejoin with epoch 0\n");
    if let Some(until) = held_until {
        out.push_str(&format!(
            "its shards {} stay held until its lease passes (in {})\n",
            shard_list(&held),
            seconds((until - now).max(0))
        ));
    }
    Ok(out)
}
