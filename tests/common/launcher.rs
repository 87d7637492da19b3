//! Where the tests that launch themselves under `tilefuse-run` find it, and the
//! example programs they launch.

/// `TILEFUSE_RUN`, else `tilefuse-run` next to the test's build folder
/// (`target/<profile>/deps/<test>-…` → `target/<profile>/tilefuse-run`, built by
/// `cargo test --workspace`).
#[allow(dead_code)] // Not every test that includes this launches the launcher.
pub fn launcher() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("TILEFUSE_RUN") {
        return p.into();
    }
    let me = std::env::current_exe().unwrap_or_default();
    me.parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("tilefuse-run"))
        .unwrap_or_default()
}

/// Example program `name`: in `TILEFUSE_EXAMPLES_DIR`, else in the test's build
/// folder (`target/<profile>/examples/`, built by `cargo test`).
#[allow(dead_code)] // Not every test that includes this launches an example.
pub fn example(name: &str) -> std::path::PathBuf {
    if let Some(d) = std::env::var_os("TILEFUSE_EXAMPLES_DIR") {
        return std::path::PathBuf::from(d).join(name);
    }
    let me = std::env::current_exe().unwrap_or_default();
    me.parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("examples").join(name))
        .unwrap_or_default()
}
