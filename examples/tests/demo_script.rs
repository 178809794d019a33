//! `./scripts/demo` says what it is doing during its long first build and lets cargo show its progress:
//! run with a stand-in `cargo` first on `PATH` that records how it was called.

use std::path::Path;
use std::process::Command;

#[test]
fn the_demo_script_announces_the_release_build_and_shows_cargos_progress() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("demo-script");
    std::fs::create_dir_all(&dir).unwrap();
    let calls = dir.join("calls");
    let _ = std::fs::remove_file(&calls);
    let fake = dir.join("cargo");
    std::fs::write(
        &fake,
        format!("#!/bin/sh\necho \"$*\" >> '{}'\n", calls.display()),
    )
    .unwrap();
    Command::new("chmod").arg("+x").arg(&fake).status().unwrap();
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/demo");
    let output = Command::new("bash")
        .arg(script)
        .arg("--extra")
        .env("PATH", path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("building the demo in release mode"),
        "{stderr}"
    );
    let calls = std::fs::read_to_string(calls).unwrap();
    let calls: Vec<&str> = calls.lines().collect();
    assert_eq!(
        calls,
        [
            // Not quiet: cargo's progress shows.
            "build --release -p stream-listener-examples --bin demo",
            "run --release -q -p stream-listener-examples --bin demo -- --extra",
        ],
        "{stderr}"
    );
}
