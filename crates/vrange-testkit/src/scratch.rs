//! Scratch directories for files a test makes (compiled helpers, databases, repositories).

use std::path::{Path, PathBuf};

/// A fresh directory under the system's temporary directory, removed with everything in it on
/// drop.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// A fresh directory; `tag` names the test. Unique in this process, and a leftover of a
    /// crashed run with the same pid is removed first, as are (once per process) the scratch
    /// directories of test processes that are gone: a killed test, or one kept in a `static`,
    /// which is never dropped.
    pub fn new(tag: &str) -> Scratch {
        use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(sweep);
        let n = NEXT.fetch_add(1, Relaxed);
        let dir =
            std::env::temp_dir().join(format!("vrange-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }
}

/// Removes `vrange-test-<tag>-<pid>-<n>` directories whose process no longer exists.
fn sweep() {
    let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("vrange-test-")) else {
            continue;
        };
        let pid = rest.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
