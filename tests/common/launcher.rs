//! Where the tests that launch themselves under `tilefuse-run` find it.

/// `TILEFUSE_RUN`, else `tilefuse-run` next to the test's build folder
/// (`target/<profile>/deps/<test>-…` → `target/<profile>/tilefuse-run`, built by
/// `cargo test --workspace`).
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
