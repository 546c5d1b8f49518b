//! Helpers shared by the tests that run other programs under the LD_PRELOAD shim
//! (`programs.rs`, `pressure.rs`): building `libvrange_malloc.so`, compiling the C helpers in
//! `tests/c/`, scratch directories, skipping, and reading the summary the shim prints at exit.
#![allow(dead_code)] // each test file uses its own subset

#[path = "../../support/shim.rs"]
mod build;
use build::target_dir;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub use vrange_testkit::skip;

/// The programs in `paths` that do not exist, as a skip reason (`None`: all present).
pub fn missing(paths: &[&str]) -> Option<String> {
    let gone: Vec<&str> = paths
        .iter()
        .copied()
        .filter(|p| !Path::new(p).exists())
        .collect();
    (!gone.is_empty()).then(|| format!("{} not installed", gone.join(", ")))
}

/// A C source of `tests/c/`.
pub fn c_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(name)
}

/// `libvrange_malloc.so`, built once per test process into the target directory the tests
/// were built in.
pub fn shim() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| build::build_shim(&target_dir()).unwrap_or_else(|e| panic!("{e}")))
}

/// Runs `cmd` to completion, capturing its output; panics if it cannot be started.
pub fn output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// A command's stdout and stderr, for failure messages.
pub fn show(out: &Output) -> String {
    format!(
        "--- stdout ---\n{}--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Keeps the shim and its settings out of a command (the test itself may run under them).
pub fn without_shim(cmd: &mut Command) -> &mut Command {
    cmd.env_remove("LD_PRELOAD");
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with("VRANGE_")) {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// Runs a command under the shim (after any `extra` preloads) with the exit summary on.
pub fn with_shim<'a>(cmd: &'a mut Command, extra: &[&Path]) -> &'a mut Command {
    let mut preload = shim().as_os_str().to_owned();
    for p in extra {
        preload.push(" ");
        preload.push(p.as_os_str());
    }
    without_shim(cmd)
        .env("LD_PRELOAD", preload)
        .env("VRANGE_MALLOC_STATS", "1")
}

/// Compiles `source` (a file of `tests/c/`) with `/usr/bin/gcc -O2 -Wall -Wextra -Werror` and
/// `flags` into `out`, without the shim.
pub fn compile(source: &str, out: &Path, flags: &[&str]) {
    let mut cmd = Command::new("/usr/bin/gcc");
    cmd.args(["-O2", "-Wall", "-Wextra", "-Werror"])
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(c_source(source));
    let o = output(without_shim(&mut cmd));
    assert!(o.status.success(), "{cmd:?} failed\n{}", show(&o));
}

/// A scratch directory, removed with everything in it on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    /// A fresh directory under the system's temporary directory; `tag` names the test.
    pub fn new(tag: &str) -> Scratch {
        use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Relaxed);
        let dir =
            std::env::temp_dir().join(format!("vrange-malloc-{tag}-{}-{n}", std::process::id()));
        // A leftover of a crashed run with the same pid.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The first line of the shim's exit summary (`VRANGE_MALLOC_STATS=1`), one per process:
/// "vrange-malloc: N allocations, M frees; ..." and, on its second line, "purged in all X MiB
/// by the reclaimer".
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Blocks the shim served (requests at or above its threshold).
    pub allocations: u64,
    pub frees: u64,
    /// MiB the reclaimer purged over the process's life.
    pub purged_mib: f64,
}

/// Every summary in a stderr text, in order (a program that runs others prints several).
pub fn summaries(stderr: &str) -> Vec<Summary> {
    let mut out: Vec<Summary> = Vec::new();
    for line in stderr.lines() {
        let Some(rest) = line.strip_prefix("vrange-malloc: ") else {
            continue;
        };
        if let Some((n, rest)) = rest.split_once(" allocations, ") {
            let frees = rest.split_once(" frees").map(|(f, _)| f);
            if let (Ok(allocations), Some(Ok(frees))) = (n.parse(), frees.map(str::parse)) {
                out.push(Summary {
                    allocations,
                    frees,
                    purged_mib: f64::NAN,
                });
            }
        } else if let Some((_, tail)) = rest.split_once("purged in all ") {
            let mib = tail.strip_suffix(" MiB by the reclaimer").map(str::parse);
            if let (Some(last), Some(Ok(mib))) = (out.last_mut(), mib) {
                last.purged_mib = mib;
            }
        }
    }
    out
}

/// Lines of a stderr text that mention vrange but are not the exit summary (warnings, panics).
pub fn vrange_complaints(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("vrange") && !l.starts_with("vrange-malloc: "))
        .collect()
}
