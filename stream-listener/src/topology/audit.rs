//! The stream's resize audit (`sl:topology:{<prefix>}:audit`): `RESIZED`, `ROLLED_BACK` and
//! `SHARDS_RETIRED` events, written by the scripts, read here.

use std::collections::BTreeMap;

use redis::aio::ConnectionLike;

use super::{Topology, TopologyError};

/// One event of a stream's resize audit (`sl:topology:{<prefix>}:audit`), see [`Topology::history`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResizeEvent {
    /// The audit entry id.
    pub id: String,
    /// `RESIZED`, `ROLLED_BACK` or `SHARDS_RETIRED`.
    pub event: String,
    /// Shard count before.
    pub from: u32,
    /// Shard count after.
    pub to: u32,
    /// Topology version after.
    pub version: u64,
    /// Redis time of the event (ms).
    pub at_ms: u64,
}

impl Topology {
    /// The newest `count` events of the stream's resize audit, oldest first.
    pub async fn history<C>(
        conn: &mut C,
        prefix: &str,
        count: usize,
    ) -> Result<Vec<ResizeEvent>, TopologyError>
    where
        C: ConnectionLike + Send,
    {
        let entries: Vec<(String, BTreeMap<String, String>)> = redis::cmd("XREVRANGE")
            .arg(Self::audit_key(prefix))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(count)
            .query_async(conn)
            .await?;
        Ok(entries
            .into_iter()
            .rev()
            .map(|(id, f)| {
                let n = |name: &str| f.get(name).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
                ResizeEvent {
                    event: f.get("event").cloned().unwrap_or_default(),
                    from: n("from") as u32,
                    to: n("to") as u32,
                    version: n("version"),
                    at_ms: n("atMs"),
                    id,
                }
            })
            .collect())
    }
}
