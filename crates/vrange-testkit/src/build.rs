//! The workspace's artifacts that cargo does not build for a test or a benchmark: the LD_PRELOAD
//! shim (`libvrange_malloc.so`) and the C library (`libvrange.so`) are cdylibs, which cargo
//! builds for no integration test, hence the nested `cargo build` into the target directory
//! the test itself was built in (a no-op when they are up to date). Only tests do this: the
//! shipped `vrange` command and the vrange-bench suites find the shim beside themselves and
//! never run cargo.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The workspace root (this crate is `crates/vrange-testkit`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/vrange-testkit lies two levels below the workspace root")
        .to_path_buf()
}

/// A C workload of the vrange-bench suites (`crates/vrange-bench/c/NAME`), which tests run
/// too: one copy, kept with the suites that run it.
pub fn bench_workload(name: &str) -> PathBuf {
    workspace_root().join("crates/vrange-bench/c").join(name)
}

/// Where cargo put the running test or bench executable,
/// `<target>/[<triple>/]<profile dir>/deps/<name>-<hash>`.
#[derive(Debug, Clone)]
pub struct Profile {
    /// `<target>/[<triple>/]<profile dir>`: where this profile's artifacts are.
    pub dir: PathBuf,
    /// The cargo profile: `dev` for `target/debug` (the `test` profile shares it), else the
    /// directory's name.
    pub name: String,
    /// The target directory (cargo marks it with a `CACHEDIR.TAG`).
    pub target_dir: PathBuf,
    /// The `--target` triple, if the tests were built with one.
    pub triple: Option<String>,
}

/// The profile of the running executable. Outside a target directory (a copied executable),
/// `CARGO_TARGET_DIR` or the workspace's `target`, with the dev profile.
pub fn profile() -> Profile {
    let exe = std::env::current_exe().expect("this executable's path");
    let found = exe.parent().and_then(Path::parent).and_then(|dir| {
        let parent = dir.parent()?;
        let name = match dir.file_name().and_then(OsStr::to_str)? {
            "debug" => "dev".to_string(),
            other => other.to_string(),
        };
        let (target_dir, triple) = if parent.join("CACHEDIR.TAG").exists() {
            (parent.to_path_buf(), None)
        } else {
            let grand = parent.parent()?;
            if !grand.join("CACHEDIR.TAG").exists() {
                return None;
            }
            let triple = parent.file_name().and_then(OsStr::to_str)?.to_string();
            (grand.to_path_buf(), Some(triple))
        };
        Some(Profile {
            dir: dir.to_path_buf(),
            name,
            target_dir,
            triple,
        })
    });
    found.unwrap_or_else(|| {
        let target_dir = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(dir) => workspace_root().join(dir),
            None => workspace_root().join("target"),
        };
        Profile {
            dir: target_dir.join("debug"),
            name: "dev".into(),
            target_dir,
            triple: None,
        }
    })
}

/// Builds `package` of the workspace with cargo for `profile`, into the target directory (and
/// for the target triple) of the running executable, and returns the directory of that
/// profile's artifacts.
///
/// With `VRANGE_PREBUILT` set (the emulated guests of `.ci/guest-tests`, whose host built
/// these artifacts before boot), cargo is not run: a build there would compile under emulation
/// for many minutes, two guests at once in one shared target directory.
///
/// # Errors
/// cargo cannot be run or fails; the message has its command and stderr.
pub fn cargo_build(package: &str, profile_name: &str) -> Result<PathBuf, String> {
    let p = profile();
    let dir_name = match profile_name {
        "dev" | "test" => "debug",
        other => other,
    };
    let mut dir = p.target_dir.clone();
    if let Some(triple) = &p.triple {
        dir.push(triple);
    }
    let dir = dir.join(dir_name);
    if std::env::var_os("VRANGE_PREBUILT").is_some() {
        return Ok(dir);
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args(["build", "-p", package, "--profile", profile_name])
        .arg("--manifest-path")
        .arg(workspace_root().join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&p.target_dir);
    if let Some(triple) = &p.triple {
        cmd.args(["--target", triple]);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cargo.to_string_lossy()))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({})\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(dir)
}

/// `libvrange_malloc.so`, built once per test process (`cargo build --release -p
/// vrange-malloc-preload`); panics if it cannot be built.
pub fn shim() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        let dir = cargo_build("vrange-malloc-preload", "release").unwrap_or_else(|e| panic!("{e}"));
        let so = dir.join("libvrange_malloc.so");
        assert!(
            so.exists(),
            "building the shim did not produce {}",
            so.display()
        );
        so
    })
}
