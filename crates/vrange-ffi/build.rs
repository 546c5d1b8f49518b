//! Gives libvrange.so its SONAME (`libvrange.so.<major>`, as installed by `make install`), and
//! makes the build tree usable by C clients as it is: next to the built libraries
//! (target/<profile>/) it writes `vrange.pc` from `vrange.pc.in`, pointing at this crate's
//! `include/` and at that directory (with an rpath), and the `libvrange.so.<major>` link that
//! programs linked against the SONAME load. Then
//! `PKG_CONFIG_PATH=target/release pkg-config --cflags --libs vrange` works without installing.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=vrange.pc.in");
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap();
    let soname = format!("libvrange.so.{major}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");

    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    // OUT_DIR is target/<profile>/build/<pkg>-<hash>/out: three levels below the profile dir.
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let Some(libdir) = out.ancestors().nth(3) else {
        return;
    };
    // Best effort: a build must not fail because the build tree's conveniences cannot be made.
    let _ = write_pc(&manifest, libdir);
    let link = libdir.join(&soname);
    if std::fs::read_link(&link).ok().as_deref() != Some(Path::new("libvrange.so")) {
        let _ = std::fs::remove_file(&link);
        let _ = std::os::unix::fs::symlink("libvrange.so", &link);
    }
}

fn write_pc(manifest: &Path, libdir: &Path) -> std::io::Result<()> {
    let template = std::fs::read_to_string(manifest.join("vrange.pc.in"))?;
    let pc = template
        .replace("@PREFIX@", &manifest.display().to_string())
        .replace("@LIBDIR@", &libdir.display().to_string())
        .replace("@INCLUDEDIR@", "${prefix}/include")
        .replace("@VERSION@", &std::env::var("CARGO_PKG_VERSION").unwrap())
        .replace("@RPATH@", " -Wl,-rpath,${libdir}");
    std::fs::write(libdir.join("vrange.pc"), pc)
}
