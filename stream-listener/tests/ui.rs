//! Compile-time behaviour of `#[stream_listener]`: what it accepts (`ui/pass`) and the exact errors it
//! gives for what it rejects (`ui/fail/*.rs` with their `.stderr`).
//!
//! The `.stderr` files are compiler output, so they are only meaningful for the compiler that produced
//! them: [`EXPECTED_RUSTC`]. On any other compiler this test prints a loud skip message and passes, so a
//! developer's newer toolchain is not blocked; under `CI` a skip fails, since CI must run these checks. To regenerate after an upgrade (or after changing
//! a message), update `EXPECTED_RUSTC`, then run
//!
//! ```text
//! TRYBUILD=overwrite cargo test -p stream-listener --test ui
//! ```
//!
//! and review the diffs of `tests/ui/fail/*.stderr` like code: every error must still point at the
//! offending token of the user's code, not at generated code.

use std::process::Command;

/// `rustc --version` of the compiler the `.stderr` files were generated with.
const EXPECTED_RUSTC: &str = "rustc 1.95.0 ";

/// `rustc --version` of the compiler cargo uses: `$RUSTC` if set (cargo sets it for build scripts, and
/// users may set it), else `rustc` on `PATH` (what trybuild's cargo invocation will use too).
fn rustc_version() -> Option<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let output = Command::new(rustc).arg("--version").output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

#[test]
fn ui() {
    match rustc_version() {
        Some(version) if version.starts_with(EXPECTED_RUSTC) => {}
        other => {
            let why = format!(
                "the .stderr files were generated with `{}...`, this compiler is {other:?}; \
                 see tests/ui.rs to regenerate them",
                EXPECTED_RUSTC.trim_end()
            );
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must run the trybuild UI test: {why}"
            );
            println!("SKIPPED the trybuild UI test: {why}");
            return;
        }
    }
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
