//! Scratch directories for files a test makes (compiled helpers, databases, repositories).

use std::path::{Path, PathBuf};

/// A fresh directory under the system's temporary directory, removed with everything in it on
/// drop.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// A fresh directory; `tag` names the test. Unique in this process, and a leftover of a
    /// crashed run with the same pid is removed first.
    pub fn new(tag: &str) -> Scratch {
        use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
        static NEXT: AtomicU32 = AtomicU32::new(0);
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

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
