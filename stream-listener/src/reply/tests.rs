use super::*;
use proptest::prelude::*;

fn bulk(s: &str) -> Value {
    Value::BulkString(s.into())
}

/// A group's record the way RESP2 sends it: a flat `[field, value, ...]` array.
fn flat(fields: &[(&str, Value)]) -> Value {
    Value::Array(
        fields
            .iter()
            .flat_map(|(k, v)| [bulk(k), v.clone()])
            .collect(),
    )
}

/// The same record the way RESP3 sends it: a map.
fn map(fields: &[(&str, Value)]) -> Value {
    Value::Map(fields.iter().map(|(k, v)| (bulk(k), v.clone())).collect())
}

/// Every field Redis 7 reports for a group.
fn full_group(name: &str, lag: Value) -> Vec<(&'static str, Value)> {
    vec![
        ("name", bulk(name)),
        ("consumers", Value::Int(2)),
        ("pending", Value::Int(3)),
        ("last-delivered-id", bulk("5-1")),
        ("entries-read", Value::Int(9)),
        ("lag", lag),
    ]
}

fn expected(name: &str, lag: Option<u64>) -> GroupInfo {
    GroupInfo {
        name: name.into(),
        consumers: Some(2),
        pending: Some(3),
        last_delivered_id: Some("5-1".into()),
        entries_read: Some(9),
        lag,
    }
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        any::<i64>().prop_map(Value::Int),
        any::<f64>().prop_map(Value::Double),
        proptest::collection::vec(any::<u8>(), 0..12).prop_map(Value::BulkString),
        "[a-z0-9-]{0,8}".prop_map(Value::SimpleString),
        Just(Value::Okay),
        Just(bulk("name")),
        Just(bulk("lag")),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Set),
            proptest::collection::vec((inner.clone(), inner), 0..4).prop_map(Value::Map),
        ]
    })
}

proptest! {
    /// Stream replies come from a server we do not control (another version, a proxy, a bug): decoding
    /// must never panic, whatever the shape.
    #[test]
    fn the_decoders_never_panic(reply in value()) {
        let _ = read(reply.clone());
        let _ = read_by_stream(reply.clone());
        let _ = entries(reply.clone());
        let _ = autoclaim(reply.clone());
        let _ = pending(reply.clone());
        let _ = xinfo_groups(&reply);
        let _ = pending_counts(reply);
    }
}

#[test]
fn xinfo_groups_reads_resp2_flat_pairs_and_resp3_maps_alike() {
    let resp2 = Value::Array(vec![
        flat(&full_group("a", Value::Int(4))),
        flat(&full_group("b", Value::Int(0))),
    ]);
    let resp3 = Value::Array(vec![
        map(&full_group("a", Value::Int(4))),
        map(&full_group("b", Value::Int(0))),
    ]);
    let want = vec![expected("a", Some(4)), expected("b", Some(0))];
    assert_eq!(xinfo_groups(&resp2).unwrap(), want);
    assert_eq!(xinfo_groups(&resp3).unwrap(), want);
}

#[test]
fn a_nil_lag_stays_none() {
    for record in [flat, map] {
        let reply = Value::Array(vec![record(&full_group("g", Value::Nil))]);
        assert_eq!(xinfo_groups(&reply).unwrap(), vec![expected("g", None)]);
    }
}

#[test]
fn missing_fields_are_none_and_a_group_without_a_name_is_skipped() {
    // Redis 6 reports neither `entries-read` nor `lag`.
    let old = flat(&[
        ("name", bulk("g")),
        ("consumers", Value::Int(1)),
        ("pending", Value::Int(0)),
        ("last-delivered-id", bulk("0-0")),
    ]);
    let nameless = map(&[("pending", Value::Int(1))]);
    let only_name = map(&[("name", bulk("h"))]);
    let groups = xinfo_groups(&Value::Array(vec![old, nameless, only_name])).unwrap();
    assert_eq!(
        groups,
        vec![
            GroupInfo {
                name: "g".into(),
                consumers: Some(1),
                pending: Some(0),
                last_delivered_id: Some("0-0".into()),
                entries_read: None,
                lag: None,
            },
            GroupInfo {
                name: "h".into(),
                consumers: None,
                pending: None,
                last_delivered_id: None,
                entries_read: None,
                lag: None,
            },
        ]
    );
}

#[test]
fn garbage_in_xinfo_groups_is_skipped_or_an_error_never_a_guess() {
    // Not a list: an error. Nil: no groups (as redis-rs reads a nil list).
    assert!(xinfo_groups(&Value::Int(3)).is_err());
    assert!(xinfo_groups(&bulk("groups")).is_err());
    assert_eq!(xinfo_groups(&Value::Nil).unwrap(), vec![]);
    let reply = Value::Array(vec![
        // Not a record.
        Value::Int(7),
        bulk("name"),
        // A name that is not text, or not UTF-8.
        flat(&[("name", Value::Int(5))]),
        flat(&[("name", Value::BulkString(vec![0xff, 0xfe]))]),
        // Odd length: the trailing field has no value.
        Value::Array(vec![bulk("name"), bulk("g"), bulk("last-delivered-id")]),
        // Counts that are not counts, an id that is not text.
        flat(&[
            ("name", bulk("h")),
            ("consumers", Value::Int(-1)),
            ("pending", bulk("many")),
            ("last-delivered-id", Value::Array(vec![])),
            ("entries-read", Value::Okay),
            ("lag", Value::Double(0.5)),
        ]),
    ]);
    let none = |name: &str| GroupInfo {
        name: name.into(),
        consumers: None,
        pending: None,
        last_delivered_id: None,
        entries_read: None,
        lag: None,
    };
    assert_eq!(xinfo_groups(&reply).unwrap(), vec![none("g"), none("h")]);
}

#[test]
fn the_last_delivered_id_is_read_from_either_protocol_and_per_group() {
    let group = |name: &str, last: &str| {
        vec![
            ("name", bulk(name)),
            ("consumers", Value::Int(1)),
            ("last-delivered-id", bulk(last)),
        ]
    };
    let last_of = |reply: Value, name: &str| {
        xinfo_groups(&reply)
            .unwrap()
            .into_iter()
            .find(|g| g.name == name)
            .and_then(|g| g.last_delivered_id)
    };
    let resp2 = Value::Array(vec![flat(&group("other", "9-0")), flat(&group("g", "5-1"))]);
    assert_eq!(last_of(resp2, "g").as_deref(), Some("5-1"));
    let resp3 = Value::Array(vec![Value::Map(vec![
        (bulk("last-delivered-id"), bulk("7-0")),
        (bulk("name"), bulk("g")),
    ])]);
    assert_eq!(last_of(resp3, "g").as_deref(), Some("7-0"));
    assert_eq!(
        last_of(Value::Array(vec![flat(&group("other", "9-0"))]), "g"),
        None
    );
    // A group entry without the field, or an odd-length row, is no answer rather than a guess.
    let broken = Value::Array(vec![Value::Array(vec![bulk("name"), bulk("g"), bulk("x")])]);
    assert_eq!(last_of(broken, "g"), None);
}

#[test]
fn counts_sent_as_text_are_read_and_the_first_occurrence_of_a_field_counts() {
    let reply = Value::Array(vec![flat(&[
        ("name", Value::SimpleString("g".into())),
        ("pending", bulk("12")),
        ("lag", Value::Double(3.0)),
        ("name", bulk("other")),
    ])]);
    let groups = xinfo_groups(&reply).unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!(
        (groups[0].name.as_str(), groups[0].pending, groups[0].lag),
        ("g", Some(12), Some(3))
    );
}

#[test]
fn parses_read_reply() {
    let reply = Value::Array(vec![Value::Array(vec![
        bulk("s:0"),
        Value::Array(vec![Value::Array(vec![
            bulk("1-0"),
            Value::Array(vec![bulk("k"), bulk("user-1"), bulk("p"), bulk("{}")]),
        ])]),
    ])]);
    let entries = read(reply);
    assert_eq!(
        entries,
        vec![StreamEntry {
            id: "1-0".into(),
            fields: Some(vec![
                (b"k".to_vec(), b"user-1".to_vec()),
                (b"p".to_vec(), b"{}".to_vec()),
            ]),
        }]
    );
    assert!(read(Value::Nil).is_empty());
}

#[test]
fn a_read_reply_is_keyed_by_stream_in_resp2_and_resp3() {
    let entry = || Value::Array(vec![Value::Array(vec![bulk("1-0"), Value::Array(vec![])])]);
    let resp2 = Value::Array(vec![
        Value::Array(vec![bulk("s:0"), entry()]),
        Value::Array(vec![bulk("s:1"), Value::Array(vec![])]),
        // Malformed: skipped.
        Value::Array(vec![bulk("s:2")]),
        Value::Int(1),
    ]);
    let resp3 = Value::Map(vec![
        (bulk("s:0"), entry()),
        (bulk("s:1"), Value::Array(vec![])),
        (Value::Nil, entry()),
    ]);
    for reply in [resp2, resp3] {
        let by_stream = read_by_stream(reply);
        let keys: Vec<_> = by_stream
            .iter()
            .map(|(k, e)| (k.as_str(), e.len()))
            .collect();
        assert_eq!(keys, vec![("s:0", 1), ("s:1", 0)]);
    }
}

#[test]
fn entry_fields_come_as_flat_pairs_or_a_map_and_nil_fields_mark_a_deleted_entry() {
    let reply = Value::Array(vec![
        Value::Array(vec![
            bulk("1-0"),
            Value::Array(vec![bulk("k"), Value::Int(7)]),
        ]),
        Value::Array(vec![
            bulk("2-0"),
            Value::Map(vec![(bulk("k"), Value::SimpleString("v".into()))]),
        ]),
        Value::Array(vec![bulk("3-0"), Value::Nil]),
        // No id, a wrong arity, not an array: skipped.
        Value::Array(vec![Value::Nil, Value::Array(vec![])]),
        Value::Array(vec![bulk("4-0")]),
        bulk("5-0"),
    ]);
    assert_eq!(
        entries(reply),
        vec![
            StreamEntry {
                id: "1-0".into(),
                fields: Some(vec![(b"k".to_vec(), b"7".to_vec())]),
            },
            StreamEntry {
                id: "2-0".into(),
                fields: Some(vec![(b"k".to_vec(), b"v".to_vec())]),
            },
            StreamEntry {
                id: "3-0".into(),
                fields: None,
            },
        ]
    );
}

#[test]
fn an_autoclaim_reply_gives_its_cursor_and_entries() {
    let claimed = Value::Array(vec![Value::Array(vec![bulk("1-0"), Value::Nil])]);
    // Redis 7 adds the deleted ids as a third element.
    let reply = Value::Array(vec![bulk("5-0"), claimed, Value::Array(vec![])]);
    let (cursor, entries) = autoclaim(reply);
    assert_eq!(cursor.as_deref(), Some("5-0"));
    assert_eq!(entries.len(), 1);
    assert_eq!(autoclaim(Value::Nil), (None, vec![]));
    assert_eq!(autoclaim(Value::Array(vec![Value::Int(1)])), (None, vec![]));
}

#[test]
fn pending_rows_of_the_wrong_shape_are_skipped() {
    let row = |id: &str, consumer: &str, count: i64| {
        Value::Array(vec![
            bulk(id),
            bulk(consumer),
            Value::Int(5),
            Value::Int(count),
        ])
    };
    let reply = Value::Array(vec![
        row("1-0", "a", 2),
        Value::Array(vec![bulk("2-0")]),
        row("3-0", "b", -1),
        row("4-0", "c", 1),
    ]);
    let pending_row = |id: &str, consumer: &str, deliveries| PendingRow {
        id: id.into(),
        consumer: consumer.into(),
        deliveries,
    };
    assert_eq!(
        pending(reply.clone()),
        vec![pending_row("1-0", "a", 2), pending_row("4-0", "c", 1)]
    );
    assert_eq!(
        pending_counts(reply),
        HashMap::from([("1-0".to_owned(), 2), ("4-0".to_owned(), 1)])
    );
    assert!(pending(Value::Nil).is_empty());
}

/// What a real server sends, over both protocols: the same rows, a nil lag once an entry between the
/// group's position and the end is deleted.
#[tokio::test]
async fn a_real_servers_xinfo_groups_reads_the_same_over_resp2_and_resp3() {
    let server = stream_listener_test_support::RedisServer::start();
    let url = server.url();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for id in ["1-0", "2-0", "3-0"] {
        let _: String = redis::cmd("XADD")
            .arg("s")
            .arg(id)
            .arg("f")
            .arg("v")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    for group in ["early", "late"] {
        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg("s")
            .arg(group)
            .arg("0")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("early")
        .arg("c")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg("s")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    let groups = |url: String| async move {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let reply: Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg("s")
            .query_async(&mut conn)
            .await
            .unwrap();
        (reply.clone(), xinfo_groups(&reply).unwrap())
    };
    let (raw2, resp2) = groups(url.clone()).await;
    let (raw3, resp3) = groups(format!("{url}?protocol=resp3")).await;
    assert!(
        matches!(&raw2, Value::Array(g) if matches!(g[0], Value::Array(_))),
        "{raw2:?}"
    );
    assert!(
        matches!(&raw3, Value::Array(g) if matches!(g[0], Value::Map(_))),
        "{raw3:?}"
    );
    let early = GroupInfo {
        name: "early".into(),
        consumers: Some(1),
        pending: Some(1),
        last_delivered_id: Some("1-0".into()),
        entries_read: Some(1),
        lag: Some(2),
    };
    let late = GroupInfo {
        name: "late".into(),
        consumers: Some(0),
        pending: Some(0),
        last_delivered_id: Some("0-0".into()),
        entries_read: None,
        lag: Some(3),
    };
    assert_eq!(resp2, vec![early.clone(), late.clone()]);
    assert_eq!(resp3, resp2);

    // A deleted entry above `early`'s position: Redis cannot tell its lag any more.
    let _: i64 = redis::cmd("XDEL")
        .arg("s")
        .arg("2-0")
        .query_async(&mut conn)
        .await
        .unwrap();
    let (_, resp2) = groups(url.clone()).await;
    let (_, resp3) = groups(format!("{url}?protocol=resp3")).await;
    assert_eq!(resp2[0].lag, None, "{resp2:?}");
    assert_eq!(resp3, resp2);
}
