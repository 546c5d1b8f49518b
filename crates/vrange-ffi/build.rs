//! Writes `vrange.pc` next to the built libraries (target/<profile>/), pointing at this
//! checkout's include/ and library directory, so C clients can build against an uninstalled
//! tree with `PKG_CONFIG_PATH=target/release pkg-config --cflags --libs vrange`.

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.parent().unwrap().parent().unwrap().to_path_buf();
    // OUT_DIR is target/<profile>/build/<pkg>-<hash>/out: three levels below the profile dir.
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let Some(libdir) = out.ancestors().nth(3) else {
        return;
    };
    let version = std::env::var("CARGO_PKG_VERSION").unwrap();
    let pc = format!(
        "prefix={root}\nincludedir=${{prefix}}/include\nlibdir={lib}\n\n\
         Name: vrange\nDescription: Volatile ranges for Linux userspace\nVersion: {version}\n\
         Cflags: -I${{includedir}}\nLibs: -L${{libdir}} -Wl,-rpath,${{libdir}} -lvrange\n\
         Libs.private: -lpthread -ldl -lm\n",
        root = root.display(),
        lib = libdir.display(),
    );
    let _ = std::fs::write(libdir.join("vrange.pc"), pc);
    println!("cargo:rerun-if-changed=build.rs");
}
