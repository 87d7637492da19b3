//! Reading ptxas's resource report (NVRTC's log with `--ptxas-options=-v`).

/// The bytes of spill stores ptxas reports for the kernel (the entry named
/// `tf_…`, not a helper function it kept apart), or `None` where the log
/// holds no report of it.
///
/// ```
/// let log = "ptxas info    : Function properties for tf_k\n\
///            ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads";
/// assert_eq!(tilefuse_testkit::kernel_spill_stores(log), Some(4));
/// assert_eq!(tilefuse_testkit::kernel_spill_stores("no report"), None);
/// ```
pub fn kernel_spill_stores(log: &str) -> Option<usize> {
    let mut lines = log.lines();
    while let Some(l) = lines.next() {
        if l.contains("Function properties for tf_") {
            let before = lines.next()?.split(" bytes spill stores").next()?;
            return before.rsplit(", ").next()?.trim().parse().ok();
        }
    }
    None
}
