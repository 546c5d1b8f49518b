//! Links the shim so that a program preloading it keeps as little of it resident as possible
//! (issue "the allocator taxes small programs": peak RSS within 256 KiB of glibc's alone):
//!
//! - `hot.ld` gathers the code every preloaded program runs into one place of the text (see
//!   that file).
//! - Relative relocations are packed (`-z pack-relative-relocs`, DT_RELR): 1,200 of them took
//!   29 KiB of 24-byte entries at the front of the read-only segment, which pushed the
//!   constants read at load into a second 64 KiB window of the kernel's fault-around; packed,
//!   they take 350 bytes and one window holds both. The dynamic loader needs glibc 2.36 for
//!   that, so it is done only when the shim is built for the machine building it and that
//!   machine's glibc has it (a shim built here already asks for glibc 2.35's symbols);
//!   `VRANGE_MALLOC_RELR=0` turns it off for a shim meant for an older glibc.

use std::process::Command;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=hot.ld");
    println!("cargo:rerun-if-env-changed=VRANGE_MALLOC_RELR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-T,{dir}/hot.ld");
    if pack_relative_relocs() {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether to pack relative relocations: a glibc target built on its own kind of machine, whose
/// glibc is 2.36 or newer, unless `VRANGE_MALLOC_RELR=0`.
fn pack_relative_relocs() -> bool {
    if std::env::var("VRANGE_MALLOC_RELR").is_ok_and(|v| v == "0") {
        return false;
    }
    let target = std::env::var("TARGET").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    if target != host || std::env::var("CARGO_CFG_TARGET_ENV").as_deref() != Ok("gnu") {
        return false;
    }
    // "glibc 2.36"
    let Ok(out) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut version = text
        .trim()
        .strip_prefix("glibc ")
        .unwrap_or("")
        .split('.')
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (version.next().unwrap_or(0), version.next().unwrap_or(0));
    (major, minor) >= (2, 36)
}
