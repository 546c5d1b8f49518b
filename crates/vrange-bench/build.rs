//! Compiles the C workloads (`c/NAME.c`, each a program, and `forward.c`, a shared object)
//! into `OUT_DIR/NAME` with the C compiler the `cc` crate finds (`$CC`, else `cc`), so that
//! vrange-bench carries them (`workload.rs`) and nothing compiles at run time. `sqlite_service` links Debian's
//! libsqlite3 (`libsqlite3-dev`); where that is missing it is built without SQLite and says so
//! when run (the sqlite suite then reports itself skipped).

use std::path::PathBuf;

/// The programs; `workload.rs` embeds each.
const WORKLOADS: [&str; 5] = [
    "churn",
    "pair",
    "peak_and_next",
    "tradeoff",
    "sqlite_service",
];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=c");
    // -O2 whatever the profile: the workloads are what the suites measure.
    let compiler = cc::Build::new()
        .opt_level(2)
        .debug(false)
        .warnings(true)
        .extra_warnings(true)
        .get_compiler();
    let sqlite = links_sqlite(&compiler, &out);
    for name in WORKLOADS {
        let src = format!("c/{name}.c");
        let mut cmd = compiler.to_command();
        cmd.arg("-pthread").arg("-o").arg(out.join(name)).arg(&src);
        if name == "sqlite_service" {
            if sqlite {
                cmd.args(["-lsqlite3", "-ldl"]);
            } else {
                cmd.arg("-DVRANGE_BENCH_NO_SQLITE");
            }
        }
        let done = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run the C compiler {cmd:?}: {e}"));
        for line in String::from_utf8_lossy(&done.stderr).lines() {
            println!("cargo:warning={line}");
        }
        assert!(done.status.success(), "{cmd:?} failed ({})", done.status);
    }
    // The one shared object: preloaded by the mimalloc-bench suite.
    let mut cmd = compiler.to_command();
    cmd.args(["-shared", "-fPIC", "-fno-plt", "-o"])
        .arg(out.join("forward.so"))
        .arg("c/forward.c");
    let done = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cmd:?}: {e}"));
    assert!(done.status.success(), "{cmd:?} failed ({})", done.status);
}

/// Whether a program including `<sqlite3.h>` compiles and links with `-lsqlite3` here.
fn links_sqlite(compiler: &cc::Tool, out: &std::path::Path) -> bool {
    let src = out.join("probe_sqlite.c");
    std::fs::write(
        &src,
        "#include <sqlite3.h>\nint main(void) { return sqlite3_libversion_number() < 0; }\n",
    )
    .expect("write the probe");
    let mut cmd = compiler.to_command();
    cmd.arg("-o")
        .arg(out.join("probe_sqlite"))
        .arg(&src)
        .arg("-lsqlite3");
    cmd.output().is_ok_and(|o| o.status.success())
}
