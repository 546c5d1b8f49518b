//! The C workloads of the suites (`crates/vrange-bench/c`): compiled with vrange-bench itself
//! (`build.rs`) and carried in it, so that nothing is compiled at run time; a suite writes the
//! one it runs into its output directory. Processes, cgroups and hogs are vrange-testkit's.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A compiled C workload.
pub struct Workload {
    name: &'static str,
    exe: &'static [u8],
}

macro_rules! workload {
    ($name:literal) => {
        Workload {
            name: $name,
            exe: include_bytes!(concat!(env!("OUT_DIR"), "/", $name)),
        }
    };
}

/// `churn.c`: the ebizzy 0.3 workload.
pub const CHURN: Workload = workload!("churn");
/// `forward.c`: malloc, free, calloc and realloc that only call glibc's (a shared object to
/// preload: the cost of interposition alone).
pub const FORWARD: Workload = workload!("forward.so");
/// `pair.c`: one malloc+free pair of a large block, in a loop.
pub const PAIR: Workload = workload!("pair");
/// `peak_and_next.c`: the pressure suite's two processes.
pub const PEAK_AND_NEXT: Workload = workload!("peak_and_next");
/// `sqlite_service.c`: the sqlite suite's database and service.
pub const SQLITE_SERVICE: Workload = workload!("sqlite_service");
/// `tradeoff.c`: the tradeoff suite's churner and neighbour (the stress suite's burst too).
pub const TRADEOFF: Workload = workload!("tradeoff");

impl Workload {
    /// Writes the program as `dir/NAME` (mode 0755) and returns its path. Written beside under
    /// another name and renamed over it, so that a copy still running is left alone.
    pub fn install(&self, dir: &Path) -> Result<PathBuf, String> {
        let exe = dir.join(self.name);
        let part = dir.join(format!(".{}.{}", self.name, std::process::id()));
        std::fs::write(&part, self.exe)
            .and_then(|()| std::fs::set_permissions(&part, std::fs::Permissions::from_mode(0o755)))
            .and_then(|()| std::fs::rename(&part, &exe))
            .map_err(|e| {
                let _ = std::fs::remove_file(&part);
                format!("cannot write {}: {e}", exe.display())
            })?;
        Ok(exe)
    }
}
