//! What users see while a kernel is tuned: a progress bar on stderr (candidates
//! done / planned, best so far), then one summary line. Nothing when nothing is
//! tuned.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::time::Duration;

pub(crate) struct Progress {
    bar: ProgressBar,
    kernel: String,
}

impl Progress {
    pub fn start(kernel: &str, effort: &str) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "tilefuse: tuning {prefix} [{bar:24}] {pos}/{len} candidates, {msg} ({elapsed})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_prefix(format!("`{kernel}` ({effort})"));
        bar.set_message("best: -");
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress {
            bar,
            kernel: kernel.to_string(),
        }
    }

    /// More candidates are planned (a new round of the local search).
    pub fn plan(&self, more: usize) {
        self.bar.inc_length(more as u64);
    }

    pub fn done_one(&self, best_ms: Option<f64>) {
        self.bar.inc(1);
        if let Some(b) = best_ms {
            self.bar.set_message(format!("best {b:.3} ms"));
        }
    }

    /// Clears the bar and prints the summary line.
    pub fn finish(self, summary: &str) {
        self.bar.finish_and_clear();
        eprintln!("tilefuse: tuned `{}`: {summary}", self.kernel);
    }
}
