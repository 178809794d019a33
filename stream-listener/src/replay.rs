//! Replaying a dead letter to the one group that gave up on it.
//!
//! A shard stream is read by every consumer group of the stream, so re-publishing a dead letter as a plain
//! entry would deliver it again to groups that handled it fine the first time. A replay therefore adds the
//! field [`ONLY_GROUP_FIELD`] naming the group it is for: consumers of every other group acknowledge such an
//! entry without running their handler (it still counts as read and acknowledged there, so their lag and
//! pending counts stay right). The admin CLI's `dead-letters replay` writes it.
//!
//! Limits: consumers that do not know the field (other clients of the spec, or builds of this library
//! older than the field) handle the entry like any other.

/// Field of a replayed entry naming the only consumer group that should handle it.
pub const ONLY_GROUP_FIELD: &str = crate::names::field::ONLY_GROUP;

/// Whether an entry with these fields is a replay addressed to a group other than `group`.
pub fn addressed_to_other_group<'a>(
    fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    group: &str,
) -> bool {
    fields
        .into_iter()
        .find(|(name, _)| *name == ONLY_GROUP_FIELD.as_bytes())
        .is_some_and(|(_, value)| value != group.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_group_handles_a_replay() {
        let fields: Vec<(&[u8], &[u8])> = vec![(b"k", b"x"), (b"sl_only_group", b"billing")];
        assert!(!addressed_to_other_group(fields.clone(), "billing"));
        assert!(addressed_to_other_group(fields, "shipping"));
        let plain: Vec<(&[u8], &[u8])> = vec![(b"k", b"x"), (b"p", b"{}")];
        assert!(!addressed_to_other_group(plain, "shipping"));
    }
}
