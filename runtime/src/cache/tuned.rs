//! Tuning results, keyed by the kernel's IR, its specialization (dtypes,
//! alignment, contiguity), the bucketed shapes, the GPU (name and compute
//! capability), the driver and NVRTC versions, tilefuse's version and a digest
//! of the code the tuning times (the default's and the seeds' CUDA C).

use serde::{Deserialize, Serialize};
use tilefuse_codegen::Config;

/// What the autotuner found for one key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tuned {
    pub config: Config,
    /// The winner's median time and the default config's, in ms.
    pub ms: f64,
    pub default_ms: f64,
    /// `"quick"` or `"full"`.
    pub effort: String,
    /// Candidates benchmarked, and the seconds the tuning took.
    pub candidates: usize,
    pub seconds: f64,
}

/// The result stored for `key`, if a valid one is there.
pub fn load(key: &str) -> Option<Tuned> {
    let bytes = super::of_kind("tuned")?.get(key)?;
    match serde_json::from_slice(&bytes) {
        Ok(t) => Some(t),
        Err(e) => {
            super::warn(format!(
                "a tuning result in the cache could not be read ({e}); tuning again"
            ));
            None
        }
    }
}

pub fn store(key: &str, t: &Tuned) {
    if let (Some(c), Ok(bytes)) = (super::of_kind("tuned"), serde_json::to_vec_pretty(t)) {
        c.put(key, &bytes);
    }
}
