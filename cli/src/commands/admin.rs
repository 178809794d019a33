//! `fence`: an admin command applied through the metadata store.

use stream_listener::coordinator::AdminCommand;

use crate::error::CliError;
use crate::redis_ctx::Ctx;
use crate::table::{json_text, seconds, shard_list};

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
