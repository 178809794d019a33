//! The origin's remaining monitoring endpoints (session, compatibility, every group, a shard's
//! messages) and its token format, in its shapes, against a running server.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use stream_listener_test_support::aio::xpending_count;
use stream_listener_test_support::RedisServer;

use super::server::{basic, get_json as get, request_with, Server};
use super::{create_group, GROUP};

const SECRET: &str = "a-secret-of-at-least-16-bytes";

/// A token made as the origin's `CoordinatorApiTokenCodec.issue` makes one, under `secret`.
fn origin_token(secret: &str, user: &str, expires_at: u64, roles: &[&str]) -> String {
    let mut roles = roles.to_vec();
    roles.sort_unstable();
    let payload = URL_SAFE_NO_PAD.encode(format!("v1\n{user}\n{expires_at}\n{}", roles.join(",")));
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(payload.as_bytes());
    let signature = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{payload}.{signature}")
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_compatibility_groups_messages_and_tokens_are_the_origins() {
    let redis = RedisServer::start();
    let url = redis.url();
    create_group(&url, "org").await;
    create_group(&url, "org-b").await;
    let mut conn = stream_listener_tests::connection(&url).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let id: String = redis::cmd("XADD")
            .arg("org:1")
            .arg("*")
            .arg("payload")
            .arg(format!("p{i}"))
            .arg("k")
            .arg(i)
            .query_async(&mut conn)
            .await
            .unwrap();
        ids.push(id);
    }
    let server = Server::start(
        &url,
        &[
            "--users",
            "reader:reader-pw:READ root:root-pw:MONITOR,ADMIN",
            "--token-secret",
            SECRET,
        ],
    );
    let base = server.base();
    let m = format!("{base}/coord/v1/monitoring");
    let reader = basic("reader", "reader-pw");

    // Tokens: ours are the origin's format, and one made as the origin makes it is accepted.
    let (status, _, body) = request_with(
        "POST",
        &format!("{base}/coord/v1/auth/login"),
        Some(br#"{"username":"root","password":"root-pw"}"#),
        None,
    );
    assert_eq!(status, 200, "{body}");
    let login: Value = serde_json::from_str(&body).unwrap();
    let token = login["accessToken"].as_str().unwrap();
    let (payload, _) = token.split_once('.').unwrap();
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
    let exp: u64 = text.split('\n').nth(2).unwrap().parse().unwrap();
    assert_eq!(text, format!("v1\nroot\n{exp}\nADMIN,MONITOR"));
    assert_eq!(
        token,
        origin_token(SECRET, "root", exp, &["MONITOR", "ADMIN"])
    );
    assert_eq!(login["roles"], json!(["ADMIN", "MONITOR"]));

    let session = format!("{m}/session");
    let bearer = format!("Bearer {token}");
    assert_eq!(
        get(&session, Some(&bearer)),
        (
            200,
            json!({"authenticated": true, "username": "root", "roles": ["ADMIN", "MONITOR"]})
        )
    );
    assert_eq!(
        get(&session, Some(&reader)),
        (
            200,
            json!({"authenticated": true, "username": "reader", "roles": ["READ"]})
        )
    );
    let foreign = origin_token(SECRET, "grafana", now_secs() + 600, &["READ"]);
    assert_eq!(
        get(&session, Some(&format!("Bearer {foreign}"))),
        (
            200,
            json!({"authenticated": true, "username": "grafana", "roles": ["READ"]})
        )
    );
    for refused in [
        origin_token(
            "another-secret-16-bytes",
            "grafana",
            now_secs() + 600,
            &["READ"],
        ),
        origin_token(SECRET, "grafana", now_secs() - 1, &["READ"]),
        origin_token(SECRET, "grafana", now_secs() + 600, &["ROOT"]),
    ] {
        assert_eq!(get(&session, Some(&format!("Bearer {refused}"))).0, 401);
    }
    assert_eq!(get(&session, None).0, 401);

    // Compatibility: coordination version 1, with this library's group defaults as Java durations.
    assert_eq!(
        get(&format!("{m}/compatibility"), Some(&reader)),
        (
            200,
            json!({
                "currentCoordinationVersion": 1,
                "supportedCoordinationVersions": {"min": 1, "max": 1},
                "coordinationVersions": [{
                    "version": 1,
                    "status": "ACTIVE",
                    "introducedIn": {"major": 0, "minor": 1, "patch": 0, "qualifier": null, "version": "0.1.0"},
                    "deprecatedIn": null,
                    "minimumSupportedUntil": {"major": 1, "minor": 0, "patch": 0, "qualifier": null, "version": "1.0.0"},
                    "removedIn": null,
                    "timingDefaults": {
                        "heartbeatInterval": "PT1S",
                        "memberLeaseTtl": "PT10S",
                        "rebalanceTimeout": "PT30S",
                    },
                }],
            })
        )
    );

    // Every group: exactly the two, each as its own GroupResponse.
    let (status, groups) = get(&format!("{m}/groups"), Some(&reader));
    assert_eq!(status, 200, "{groups}");
    let mut expected = Vec::new();
    for stream in ["org", "org-b"] {
        let (status, group) = get(
            &format!("{m}/streams/{stream}/groups/{GROUP}"),
            Some(&reader),
        );
        assert_eq!(status, 200);
        assert_eq!(group["shardCount"], 4);
        expected.push(group);
    }
    assert_eq!(groups, json!({ "groups": expected }));

    // Messages: newest first by default, pages by cursor, forward from the start.
    let messages = format!("{m}/streams/org/groups/{GROUP}/shards/1/messages");
    let record = |i: usize| {
        let ms: i64 = ids[i].split('-').next().unwrap().parse().unwrap();
        json!({
            "streamPrefix": "org",
            "consumerGroup": GROUP,
            "shard": {"shardIndex": 1},
            "streamKey": "org:1",
            "recordId": ids[i],
            "fields": {"payload": format!("p{i}"), "k": i.to_string()},
            "payload": format!("p{i}"),
            "recordTimestampMs": ms,
        })
    };
    let page = |query: &str| {
        let (status, mut page) = get(&format!("{messages}?{query}"), Some(&reader));
        assert_eq!(status, 200, "{query}: {page}");
        for r in page["records"].as_array_mut().unwrap() {
            let time = r.as_object_mut().unwrap().remove("recordTime").unwrap();
            assert!(time.as_str().unwrap().ends_with('Z'), "{time}");
        }
        page
    };
    let shape = |direction: &str, limit: u64, records: Vec<Value>, next: Option<&str>| {
        json!({
            "streamPrefix": "org", "consumerGroup": GROUP, "shard": {"shardIndex": 1},
            "streamKey": "org:1", "direction": direction, "limit": limit,
            "records": records, "nextCursor": next,
        })
    };
    assert_eq!(
        page("limit=2"),
        shape("BACKWARD", 2, vec![record(4), record(3)], Some(&ids[3]))
    );
    assert_eq!(
        page(&format!("limit=2&cursor={}", ids[3])),
        shape("BACKWARD", 2, vec![record(2), record(1)], Some(&ids[1]))
    );
    assert_eq!(
        page(&format!("limit=2&cursor={}", ids[1])),
        shape("BACKWARD", 2, vec![record(0)], None)
    );
    assert_eq!(
        page("direction=FORWARD&limit=3"),
        shape(
            "FORWARD",
            3,
            vec![record(0), record(1), record(2)],
            Some(&ids[2])
        )
    );
    assert_eq!(
        page(&format!("direction=FORWARD&cursor={}", ids[2])),
        shape("FORWARD", 25, vec![record(3), record(4)], None)
    );
    assert_eq!(
        page("limit=0"),
        shape("BACKWARD", 1, vec![record(4)], Some(&ids[4]))
    );
    assert_eq!(page("limit=100000")["limit"], 1000);
    // Reading changed nothing in the consumer group.
    assert_eq!(xpending_count(&mut conn, "org:1", GROUP).await, 0);
    let (status, empty) = get(
        &format!("{m}/streams/org/groups/{GROUP}/shards/0/messages"),
        Some(&reader),
    );
    assert_eq!((status, &empty["records"]), (200, &json!([])));

    // Errors, in the origin's body.
    let error = |path: &str| {
        let (status, body) = get(&format!("{m}/streams/{path}"), Some(&reader));
        (
            status,
            body["status"].clone(),
            body["errorCode"].clone(),
            body["message"].clone(),
        )
    };
    let (status, name, code, _) = error("org/groups/nobody/shards/0/messages");
    assert_eq!(
        (status, name, code),
        (404, json!("NOT_FOUND"), json!("GROUP_NOT_FOUND"))
    );
    assert_eq!(
        error(&format!("org/groups/{GROUP}/shards/4/messages")),
        (
            400,
            json!("BAD_REQUEST"),
            json!("INVALID_REQUEST"),
            json!("shardIndex must be between 0 and 3")
        )
    );
    for bad in [
        "shards/x/messages",
        "shards/-1/messages",
        "shards/1/messages?direction=SIDEWAYS",
        "shards/1/messages?limit=ten",
    ] {
        let (status, name, code, _) = error(&format!("org/groups/{GROUP}/{bad}"));
        assert_eq!(
            (status, name, code),
            (400, json!("BAD_REQUEST"), json!("INVALID_REQUEST")),
            "{bad}"
        );
    }
    assert_eq!(get(&messages, None).0, 401);

    // The served document lists them.
    let (_, document) = get(&format!("{base}/coord/v1/openapi.json"), Some(&reader));
    for path in [
        "/coord/v1/monitoring/session",
        "/coord/v1/monitoring/compatibility",
        "/coord/v1/monitoring/groups",
        "/coord/v1/monitoring/streams/{streamPrefix}/groups/{consumerGroup}/shards/{shardIndex}/messages",
    ] {
        assert!(
            document["paths"][path]["get"].is_object(),
            "GET {path} is not documented"
        );
    }
}
