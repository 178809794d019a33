//! Queued heartbeats: what a process that waits for the writer lock leaves for the writer to apply.
//!
//! An entry is `"<deadline ms> <reply id> <heartbeat JSON>"` in the group's inbox list. The writer applies
//! the entries in arrival order together with its own input and commits them in one write; the commit
//! script pushes each answer to `reply:<id>`, where its sender waits. Anything in the list may be stale,
//! repeated or written by someone else: an entry that does not parse is skipped (and trimmed), never
//! applied, and one past its deadline is dropped because its sender stopped waiting.

use crate::coordinator::wire::HeartbeatRequest;

/// Entries one commit applies at most.
pub(crate) const BATCH: usize = 512;

/// One queued heartbeat.
#[derive(Debug)]
pub(crate) struct Queued {
    /// Store time after which the sender no longer waits.
    pub deadline: i64,
    /// Where the answer goes (`reply:<id>`).
    pub reply_id: String,
    /// The heartbeat itself.
    pub request: HeartbeatRequest,
}

/// Why an entry cannot be applied.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BadEntry {
    /// Not `<deadline> <id> <json>`.
    Shape,
    /// The heartbeat JSON does not decode.
    Heartbeat(String),
}

/// The entry as it is written by `enqueue.lua` (for tests: the script writes it in Redis).
#[cfg(test)]
pub(crate) fn encode(deadline: i64, reply_id: &str, request: &HeartbeatRequest) -> Vec<u8> {
    let json = serde_json::to_string(request).expect("heartbeats serialize");
    format!("{deadline} {reply_id} {json}").into_bytes()
}

/// Decodes one entry.
pub(crate) fn decode(entry: &[u8]) -> Result<Queued, BadEntry> {
    let mut parts = entry.splitn(3, |&b| b == b' ');
    let (Some(deadline), Some(reply_id), Some(json)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(BadEntry::Shape);
    };
    let deadline = std::str::from_utf8(deadline)
        .ok()
        .and_then(|d| d.parse::<i64>().ok())
        .ok_or(BadEntry::Shape)?;
    let reply_id = std::str::from_utf8(reply_id)
        .ok()
        .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric()))
        .ok_or(BadEntry::Shape)?
        .to_string();
    let request = serde_json::from_slice(json).map_err(|e| BadEntry::Heartbeat(e.to_string()))?;
    Ok(Queued {
        deadline,
        reply_id,
        request,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request() -> HeartbeatRequest {
        HeartbeatRequest {
            protocol_version: crate::coordinator::wire::PROTOCOL_VERSION,
            request_id: "r1".into(),
            member_id: "m1".into(),
            member_name: None,
            member_epoch: 0,
            metadata_version: 0,
            runtime_consumer_capacity: Default::default(),
            owned_shards: None,
            revoking_shards: Vec::new(),
            shard_progress: Vec::new(),
            weight: None,
            restarting: false,
            hold_after_lease_ms: 0,
        }
    }

    #[test]
    fn an_entry_round_trips() {
        let entry = encode(1234, "abc9", &request());
        let queued = decode(&entry).expect("decodes");
        assert_eq!(queued.deadline, 1234);
        assert_eq!(queued.reply_id, "abc9");
        assert_eq!(queued.request.member_id, "m1");
    }

    #[test]
    fn a_forged_or_mangled_entry_is_refused() {
        assert_eq!(decode(b"").unwrap_err(), BadEntry::Shape);
        assert_eq!(decode(b"12 abc").unwrap_err(), BadEntry::Shape);
        assert_eq!(decode(b"x abc {}").unwrap_err(), BadEntry::Shape);
        // A reply id that would name another key is refused.
        assert_eq!(decode(b"12 ../meta {}").unwrap_err(), BadEntry::Shape);
        assert!(matches!(
            decode(b"12 abc {\"memberId\":1}"),
            Err(BadEntry::Heartbeat(_))
        ));
    }

    proptest! {
        #[test]
        fn entries_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes);
        }
    }
}
