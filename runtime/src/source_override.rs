//! `TILEFUSE_OVERRIDE_DIR`: a hand-edited kernel compiled in place of the
//! generated one, so that it runs under the runtime's own launch (its grid,
//! its shares of a split loop, its scratch), as Triton's
//! `TRITON_KERNEL_OVERRIDE` does. A developer's tool for measuring what a
//! change to the generated code would give before writing it into the
//! lowering: a harness of one's own launches a kernel differently, and
//! times it differently.
//!
//! Dump the sources with `TILEFUSE_DUMP_DIR=dir`, edit one, and run with
//! `TILEFUSE_OVERRIDE_DIR=dir`: a file named as the dump names a generated
//! source (`{kernel}-{arch}-{hash}.cu`, the hash of the generated text) is
//! compiled instead of that source. The edit must keep the kernel's
//! signature, which the launch fills: an override whose parameter list
//! differs from the generated one's is refused.

use crate::error::{argument, Result};
use std::path::{Path, PathBuf};

/// The text to compile in place of `source` (`kernel`'s generated code for
/// `arch`), where `TILEFUSE_OVERRIDE_DIR` holds one.
pub(crate) fn lookup(kernel: &str, arch: &str, source: &str) -> Result<Option<String>> {
    match std::env::var_os("TILEFUSE_OVERRIDE_DIR") {
        Some(dir) => from_dir(Path::new(&dir), kernel, arch, source),
        None => Ok(None),
    }
}

/// The path under `dir` that overrides `source`, and the name
/// `TILEFUSE_DUMP_DIR` writes it under (its log and cubin beside it, the
/// extension changed).
pub(crate) fn path_in(dir: &Path, kernel: &str, arch: &str, source: &str) -> PathBuf {
    let hash = tilefuse_codegen::hash::fnv1a64(source.as_bytes());
    dir.join(format!("{kernel}-{arch}-{hash:016x}.cu"))
}

fn from_dir(dir: &Path, kernel: &str, arch: &str, source: &str) -> Result<Option<String>> {
    let path = path_in(dir, kernel, arch, source);
    let context = || format!("TILEFUSE_OVERRIDE_DIR, kernel `{kernel}`");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(argument(
                context(),
                path.display().to_string(),
                format!("could not be read: {e}"),
            ))
        }
    };
    if signature(&text) != signature(source) {
        return Err(argument(
            context(),
            path.display().to_string(),
            "its kernel's name or parameters differ from the generated source's; the launch \
             passes the generated ones: edit the body only",
        ));
    }
    crate::log::warn(format_args!(
        "TILEFUSE_OVERRIDE_DIR: compiling {} in place of `{kernel}`'s generated source",
        path.display()
    ));
    Ok(Some(text))
}

/// The kernel's entry and parameter list: from `extern "C" __global__` to the
/// body's opening brace, whitespace collapsed.
fn signature(source: &str) -> Option<String> {
    let start = source.find("extern \"C\" __global__")?;
    let rest = &source[start..];
    let end = rest.find(") {")?;
    Some(rest[..end].split_whitespace().collect::<Vec<_>>().join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GENERATED: &str = "// prelude\nextern \"C\" __global__ void __launch_bounds__(32, 1) tf_k(\n    float* t0,\n    long long s0) {\n  t0[0] = 1.0f;\n}\n";

    #[test]
    fn an_override_replaces_the_body_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            from_dir(dir.path(), "k", "sm_90a", GENERATED).unwrap(),
            None
        );
        let edited = GENERATED.replace("t0[0] = 1.0f;", "t0[0] = 2.0f;");
        std::fs::write(path_in(dir.path(), "k", "sm_90a", GENERATED), &edited).unwrap();
        assert_eq!(
            from_dir(dir.path(), "k", "sm_90a", GENERATED).unwrap(),
            Some(edited)
        );
        // Another arch or another generated text names another file.
        assert_eq!(from_dir(dir.path(), "k", "sm_80", GENERATED).unwrap(), None);
        let other = GENERATED.replace("1.0f", "3.0f");
        assert_eq!(from_dir(dir.path(), "k", "sm_90a", &other).unwrap(), None);
    }

    #[test]
    fn an_override_that_changes_the_parameters_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let edited = GENERATED.replace("long long s0", "int s0");
        std::fs::write(path_in(dir.path(), "k", "sm_90a", GENERATED), edited).unwrap();
        let err = from_dir(dir.path(), "k", "sm_90a", GENERATED).unwrap_err();
        assert!(err.to_string().contains("edit the body only"), "{err}");
        // The launch bounds are part of the entry: a different block size is refused too.
        let edited = GENERATED.replace("(32, 1)", "(64, 1)");
        std::fs::write(path_in(dir.path(), "k", "sm_90a", GENERATED), edited).unwrap();
        assert!(from_dir(dir.path(), "k", "sm_90a", GENERATED).is_err());
    }
}
