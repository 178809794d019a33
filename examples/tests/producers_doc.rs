//! `docs/producers.md`'s Python routing recipe routes every key as the library does: its ```` ```python ````
//! block runs in `python3` over keys and shard counts (rejection sampling included), and each answer must
//! be `stream_listener::routing::shard_for_key`'s.

use std::io::Write;
use std::process::{Command, Stdio};

use stream_listener::routing::shard_for_key;

const DOC: &str = include_str!("../../docs/producers.md");

/// Counts that reject about half the hashes (`2^31 + 1`) or a third, besides small ones.
const COUNTS: &[u32] = &[1, 3, 10, 12, 16, 1000, 2_147_483_649, 3_000_000_000];

fn keys() -> Vec<String> {
    let mut keys: Vec<String> = ["", "order-123", "user-42", "customer-42", "hé ☃ ключ"]
        .map(String::from)
        .to_vec();
    keys.extend((0..60).map(|i| format!("key-{i}-{}", "x".repeat(i % 9))));
    keys
}

#[test]
fn the_python_recipe_routes_every_key_as_the_library_does() {
    let start = DOC.find("```python\n").expect("a python block") + "```python\n".len();
    let recipe = &DOC[start..start + DOC[start..].find("```").unwrap()];
    let keys = keys();
    let counts: Vec<String> = COUNTS.iter().map(u32::to_string).collect();
    let driver = format!(
        "{recipe}\nimport json, sys\nkeys = json.loads(sys.stdin.read())\n\
         for n in [{}]:\n    print(' '.join(str(shard_for_key(k, n)) for k in keys))\n",
        counts.join(", ")
    );
    let python = Command::new("python3")
        .arg("-c")
        .arg(&driver)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    // Not skipped: without python3 this test cannot say the recipe works, so it fails.
    let mut python = python.expect("python3 runs docs/producers.md's recipe: install python3");
    let input = serde_json::to_string(&keys).unwrap();
    python
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = python.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), COUNTS.len(), "{stdout}");
    for (line, &n) in lines.iter().zip(COUNTS) {
        let expected: Vec<String> = keys
            .iter()
            .map(|k| shard_for_key(k.as_bytes(), n).to_string())
            .collect();
        assert_eq!(
            line.split(' ').collect::<Vec<_>>(),
            expected,
            "shard count {n}"
        );
    }
    // The spec's vectors, which the doc quotes.
    assert_eq!(shard_for_key(b"order-123", 16), 13);
    assert_eq!(shard_for_key(b"order-123", 10), 1);
    assert_eq!(shard_for_key(b"user-42", 12), 8);
}
