//! Finds the workspace's binaries for black-box tests.
//!
//! Integration tests of this crate cannot name another package's binaries through
//! `CARGO_BIN_EXE_*`, so they look beside the test executable (`target/<profile>/`), where
//! `cargo build --workspace --bins` (`scripts/test.sh`: `--all-targets --profile test`) puts them.

use std::path::PathBuf;

/// Path of the workspace binary `name` (`llorch-cpud`, `worker-orcd`); fails the test with the
/// build command when it has not been built.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe()
        .unwrap_or_else(|err| panic!("cannot locate the test executable: {err}"));
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(PathBuf::from)
        .unwrap_or_default();
    let path = profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is missing; build it first with `cargo build --workspace --bins`",
        path.display()
    );
    path
}
