//! Compiles the C workloads (`c/NAME.c`, each a program) into `OUT_DIR/NAME` with the C
//! compiler the `cc` crate finds (`$CC`, else `cc`), so that vrange-bench carries them
//! (`workload.rs`) and nothing compiles at run time.

use std::path::PathBuf;

/// The programs; `workload.rs` embeds each.
const WORKLOADS: [&str; 4] = ["churn", "pair", "peak_and_next", "tradeoff"];

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
    for name in WORKLOADS {
        let src = format!("c/{name}.c");
        let mut cmd = compiler.to_command();
        cmd.arg("-pthread").arg("-o").arg(out.join(name)).arg(&src);
        let done = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run the C compiler {cmd:?}: {e}"));
        for line in String::from_utf8_lossy(&done.stderr).lines() {
            println!("cargo:warning={line}");
        }
        assert!(done.status.success(), "{cmd:?} failed ({})", done.status);
    }
}
