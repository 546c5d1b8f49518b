//! The C ABI from C: builds `tests/c/test_vrange.c`, `tests/c/test_regions.c`,
//! `tests/c/test_cache.c` and `tests/c/test_version.c` against `include/vrange.h` and the
//! `libvrange.so` of this profile,
//! through the generated `vrange.pc`, runs them, checks that the header compiles and links as
//! C++11 and C++17 (`tests/c/header_cxx.cpp`), and that README's C example is
//! `tests/c/readme_example.c` and runs.
//!
//! Cargo does not build a cdylib-only library for an integration test, so the test builds it
//! itself with `cargo build -p vrange-ffi` for the same profile and target directory (a no-op
//! when it is up to date). Needs `cc`, `g++` and `pkg-config` (`apt-get install pkg-config`).
//! `CC` and `CXX` override the compilers.

// ci: guest 6.1 only: the C ABI forwards to the core, whose tests run in both guests; 6.1 shows its answers where the kernel lacks a feature

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
// Under the names this file has always called them by.
use vrange_testkit::build::{cargo_build, profile, workspace_root as repo_root};
use vrange_testkit::proc::{output as run, show};
use vrange_testkit::role::field;
use vrange_testkit::scratch::Scratch;
use vrange_testkit::{cgroup, skip};

/// Builds libvrange.so for this profile (once per test process) and returns its directory,
/// which also holds the `vrange.pc` and the `libvrange.so.0` link written by build.rs.
fn library_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = cargo_build("vrange-ffi", &profile().name)
            .unwrap_or_else(|e| panic!("building libvrange.so failed: {e}"));
        for file in ["libvrange.so", "libvrange.so.0", "vrange.pc"] {
            assert!(
                dir.join(file).exists(),
                "cargo build -p vrange-ffi did not produce {}",
                dir.join(file).display()
            );
        }
        dir
    })
}

/// `pkg-config --cflags --libs vrange` against the generated vrange.pc of this profile.
fn pkg_config_flags() -> Vec<String> {
    let lib = library_dir();
    let out = Command::new("pkg-config")
        .args(["--cflags", "--libs", "vrange"])
        .env("PKG_CONFIG_PATH", lib)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run pkg-config ({e}): install it with `apt-get install pkg-config` \
                 (the CI script does)"
            )
        });
    assert!(
        out.status.success(),
        "pkg-config cannot use {}/vrange.pc\n{}",
        lib.display(),
        show(&out)
    );
    let flags: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    // crates/vrange-ffi/include links to the repository's include/, so that the published
    // crate carries the header too.
    let include = format!(
        "-I{}",
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("include")
            .display()
    );
    let libdir = format!("-L{}", lib.display());
    assert!(
        flags.contains(&include)
            && flags.contains(&libdir)
            && flags.iter().any(|f| f == "-lvrange"),
        "vrange.pc should point at {include} and {libdir}: {flags:?}"
    );
    flags
}

fn compiler(var: &str, default: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// Compiles `source` into `exe` with `compiler`, `args` and the pkg-config flags.
fn compile(compiler: &str, args: &[&str], source: &Path, exe: &Path, flags: &[String]) {
    let mut cmd = Command::new(compiler);
    cmd.args(args).arg(source).arg("-o").arg(exe).args(flags);
    let out = run(&mut cmd);
    assert!(
        out.status.success(),
        "compiling failed: {cmd:?}\n{}",
        show(&out)
    );
}

/// Compiles `tests/c/<name>.c` as C11 with every warning an error (and `defines`), runs it and
/// checks its TAP output: a plan line and no "not ok" line except known bugs ("# TODO").
fn run_c_test(name: &str, defines: &[&str]) {
    run_c_test_with(name, defines, &[]);
}

/// [`run_c_test`], linked with `libs` too.
fn run_c_test_with(name: &str, defines: &[&str], libs: &[&str]) {
    let mut flags = pkg_config_flags();
    flags.extend(libs.iter().map(|l| l.to_string()));
    let scratch = Scratch::new(name);
    let exe = scratch.join(name);
    let source = repo_root().join(format!("tests/c/{name}.c"));
    let mut args = vec!["-std=c11", "-Wall", "-Wextra", "-Werror"];
    args.extend_from_slice(defines);
    compile(&compiler("CC", "cc"), &args, &source, &exe, &flags);
    let out = run(&mut Command::new(&exe));
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "{} failed ({}): see the \"not ok\" lines above",
        source.display(),
        out.status
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // "not ok ... # TODO" lines record known bugs and do not count as failures.
    let failed = stdout
        .lines()
        .filter(|l| l.starts_with("not ok") && !l.contains("# TODO"))
        .count();
    assert!(
        stdout.lines().any(|l| l.starts_with("1..")) && failed == 0,
        "the C test did not run to its end or has {failed} failure(s):\n{stdout}"
    );
}

/// `vrange`, `vrange_unmark`, `vrange_forget` and the feature report on arbitrary memory.
#[test]
#[cfg_attr(miri, ignore = "spawns compilers")]
fn c_test_program_passes() {
    run_c_test("test_vrange", &[]);
}

/// Regions (`vrange_alloc` and the policies), managed purging and its order, statistics,
/// options and shared regions across fork.
#[test]
#[cfg_attr(miri, ignore = "spawns compilers")]
fn c_regions_test_passes() {
    run_c_test("test_regions", &[]);
}

/// Caches: put, get (ENOENT versus ESTALE), release, remove, statistics, purges, classes,
/// a budget, threads and the error cases.
#[test]
#[cfg_attr(miri, ignore = "spawns compilers")]
fn c_cache_test_passes() {
    run_c_test("test_cache", &[]);
}

/// SQLite (Debian's libsqlite3) on `vrange_sqlite_pcache()`: a file database, an in-memory one
/// and connections in threads, every volatile page purged between and inside their work.
#[test]
#[cfg_attr(miri, ignore = "spawns compilers")]
fn c_sqlite_test_passes() {
    run_c_test_with("test_sqlite", &[], &["-lsqlite3", "-lpthread"]);
}

/// SQLite on `vrange_sqlite_pcache()` under real pressure: a database of 40,000 rows (about
/// 52 MiB) and four connections whose caches are sized for all memory (each reads the whole
/// database, then mixes checked reads, transactions that commit or roll back, and range scans
/// for 6 s) in a memory cgroup of 24 MiB: never a wrong row, integrity_check ok, no OOM kill.
/// The same run on SQLite's own page cache, in the same limit, is OOM-killed: the pressure is
/// real.
#[test]
#[cfg_attr(miri, ignore = "spawns compilers")]
fn sqlite_in_a_cgroup_smaller_than_its_database_loses_nothing_and_is_not_oom_killed() {
    const LIMIT: u64 = 24 << 20;
    let _s = vrange_testkit::serial();
    let mut flags = pkg_config_flags();
    flags.extend(["-lsqlite3", "-lpthread"].map(String::from));
    let scratch = Scratch::new("sqlite_stress");
    let exe = scratch.join("sqlite_stress");
    let source = repo_root().join("tests/c/sqlite_stress.c");
    compile(
        &compiler("CC", "cc"),
        &["-std=c11", "-Wall", "-Wextra", "-Werror"],
        &source,
        &exe,
        &flags,
    );
    // One database for both runs: the run on SQLite's own cache goes first (its OOM kill
    // comes while it reads, and the stress run reads the versions the rows hold anyway).
    let db = scratch.join("stress.db");
    let created = run(Command::new(&exe).arg("create").arg(&db).arg("40000"));
    assert!(created.status.success(), "create: {}", show(&created));
    let run_in_cgroup = |mode: &str| {
        let child = match cgroup::child("vrange-sqlite-", LIMIT) {
            Ok(c) => c,
            Err(why) => return Err(why),
        };
        let mut cmd = Command::new(&exe);
        cmd.arg(mode).arg(&db).arg("6").arg("4");
        cgroup::join(&mut cmd, child.cgroup()).expect("join the cgroup");
        let out = run(&mut cmd);
        let kills = child.cgroup().oom_kills().expect("OOM kills");
        cgroup::remove(child);
        Ok((out, kills))
    };
    let (plain, plain_kills) = match run_in_cgroup("stress-plain") {
        Ok(r) => r,
        Err(why) => return skip(why),
    };
    let (out, kills) = run_in_cgroup("stress").expect("a second cgroup");
    let text = show(&out);
    println!("{text}");
    let done = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("DONE "))
        .map(str::to_string)
        .unwrap_or_default();
    assert_eq!(kills, 0, "no OOM kill\n{text}");
    assert!(out.status.success(), "the stress run failed\n{text}");
    assert!(
        done.contains(" wrong=0 ") && done.contains(" integrity=ok "),
        "every row right and the database intact: {done}"
    );
    assert!(
        field::<u64>(&done, "reads").unwrap_or(0) > 0
            && field::<u64>(&done, "commits").unwrap_or(0) > 0,
        "the connections worked: {done}"
    );
    assert!(
        plain_kills >= 1 && !plain.status.success(),
        "on SQLite's own page cache the same run is OOM-killed ({plain_kills} kills): {}",
        show(&plain)
    );
}

/// The header's version macros name this crate's version, and `vrange_version()` returns the
/// header's `VRANGE_VERSION`.
#[test]
#[cfg_attr(miri, ignore = "spawns compilers")]
fn c_version_matches_the_crate() {
    let expected = format!(
        "-DVRANGE_EXPECTED_VERSION=\"{}\"",
        env!("CARGO_PKG_VERSION")
    );
    run_c_test("test_version", &[&expected]);
}

#[test]
#[cfg_attr(miri, ignore = "spawns compilers")]
fn header_compiles_and_links_as_cxx() {
    let flags = pkg_config_flags();
    let scratch = Scratch::new("cxx");
    let source = repo_root().join("tests/c/header_cxx.cpp");
    for std in ["c++11", "c++17"] {
        let exe = scratch.join(format!("header_{std}"));
        compile(
            &compiler("CXX", "g++"),
            &[
                &format!("-std={std}"),
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pedantic",
            ],
            &source,
            &exe,
            &flags,
        );
        let out = run(&mut Command::new(&exe));
        assert!(
            out.status.success(),
            "{} ({std}) failed\n{}",
            exe.display(),
            show(&out)
        );
    }
}

/// The C block of README.md that follows its mention of `tests/c/readme_example.c`.
fn readme_c_block(readme: &str) -> Option<&str> {
    let after = &readme[readme.find("tests/c/readme_example.c")?..];
    let start = after.find("```c\n")? + "```c\n".len();
    let len = after[start..].find("```\n")?;
    Some(&after[start..start + len])
}

/// README's C example is `tests/c/readme_example.c`, byte for byte (`.ci/check-install` builds
/// the file against an installed prefix), and builds as a user would build it (the compiler's
/// default dialect, which has MAP_ANONYMOUS) and runs.
#[test]
#[cfg_attr(miri, ignore = "spawns compilers")]
fn readme_c_example_is_the_test_file_and_runs() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let source = root.join("tests/c/readme_example.c");
    let example = std::fs::read_to_string(&source).unwrap();
    assert!(
        readme_c_block(&readme) == Some(example.as_str()),
        "README.md's C example and {} differ: keep them identical",
        source.display()
    );
    let flags = pkg_config_flags();
    let scratch = Scratch::new("readme");
    let exe = scratch.join("readme_example");
    compile(
        &compiler("CC", "cc"),
        &["-Wall", "-Wextra", "-Werror"],
        &source,
        &exe,
        &flags,
    );
    let out = run(&mut Command::new(&exe));
    assert!(out.status.success(), "{}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("libvrange "), "{stdout}");
}
