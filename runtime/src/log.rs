//! Where the library's messages go. Everything goes through `tracing`, so a
//! program's own subscriber shows it; a warning ([`warn`]) also reaches a user
//! whose program installed none, on stderr, so none is lost. [`init`] installs
//! the subscriber `tilefuse-run` and the examples use.

/// A warning the user must see: through `tracing` when the program installed a
/// subscriber, else on stderr.
pub fn warn(msg: impl std::fmt::Display) {
    if tracing::dispatcher::has_been_set() {
        tracing::warn!("{msg}");
    } else {
        eprintln!("tilefuse: warning: {msg}");
    }
}

/// Shows the library's messages on stderr, filtered by `TILEFUSE_LOG` in
/// tracing-subscriber's `EnvFilter` syntax (default `warn`; e.g. `info`, or
/// `tilefuse_runtime::autotune=debug`). A filter that does not parse is said
/// and `warn` used. Does nothing when the program installed a subscriber.
///
/// ```no_run
/// tilefuse_runtime::log::init();
/// ```
pub fn init() {
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("TILEFUSE_LOG") {
        Ok(v) => EnvFilter::try_new(&v).unwrap_or_else(|e| {
            eprintln!(
                "tilefuse: warning: TILEFUSE_LOG=`{v}` is not a filter ({e}); showing warnings"
            );
            EnvFilter::new("warn")
        }),
        Err(_) => EnvFilter::new("warn"),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
