//! The layers of the whole project, read from the sources and manifests, so that a dependency
//! pointing the wrong way fails here rather than in a reviewer's head (the reading is
//! `vrange_testkit::layers`; the rules are here).
//!
//! - Inside every crate (the workspace's members and the Python module, which builds on its
//!   own), modules depend one way: no circle among the children of any module.
//! - Between crates, dependencies point down: the OS layer (vrange-sys) depends on no crate of
//!   ours; the core (vrange) on the OS layer alone; the client libraries (cache, coordinator,
//!   allocator, SQLite page cache, the commands' printing) on the core and the OS layer, never
//!   on each other; the front-ends (the C ABI, the preload shim, the command, the Python
//!   module) on the libraries below them, never on another front-end. The test kit builds on
//!   the OS layer alone (so that the core's tests can use it); the benchmark suites on anything
//!   but a front-end (none of their code is binary-only: the `vrange` command ships none of
//!   it). Nothing depends on the benchmarks, and a published crate takes the test kit as a
//!   dev-dependency only.

use std::collections::{BTreeMap, BTreeSet};

use vrange_testkit::build::workspace_root;
use vrange_testkit::layers::{self, Kind, Manifest, Modules};

/// Where a crate stands. A crate may depend on the crates of lower layers only; `Apart` crates
/// have rules of their own ([`allowed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    Os,
    Core,
    Library,
    FrontEnd,
    Apart,
}

/// Every crate of ours and its layer: a new crate fails [`every_crate_has_a_layer`] until it
/// is placed here.
const LAYERS: &[(&str, Layer)] = &[
    ("vrange-sys", Layer::Os),
    ("vrange", Layer::Core),
    ("vrange-cache", Layer::Library),
    ("vrange-coordinator", Layer::Library),
    ("vrange-malloc", Layer::Library),
    ("vrange-sqlite", Layer::Library),
    ("vrange-print", Layer::Library),
    ("vrange-ffi", Layer::FrontEnd),
    ("vrange-malloc-preload", Layer::FrontEnd),
    ("vrange-cli", Layer::FrontEnd),
    ("vrange-python", Layer::FrontEnd),
    ("vrange-testkit", Layer::Apart),
    ("vrange-bench", Layer::Apart),
];

fn layer(name: &str) -> Layer {
    LAYERS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("{name} has no layer in LAYERS"))
        .1
}

/// Whether `from` may depend on `to` as a normal or build dependency.
fn allowed(from: &str, to: &str) -> bool {
    match from {
        // Every crate's tests run on it, the core's included: it stays below the core.
        "vrange-testkit" => layer(to) == Layer::Os,
        // The suites measure the libraries, with the tests' tooling; no front-end's code.
        "vrange-bench" => to == "vrange-testkit" || layer(to) < Layer::FrontEnd,
        // `Apart` is above every layer: nothing else may depend on it.
        _ => layer(to) < layer(from),
    }
}

/// The workspace's crates and the Python module.
fn crates() -> Vec<Manifest> {
    let all = layers::workspace(&workspace_root()).unwrap();
    assert!(all.len() >= 10, "found too few crates: {all:?}");
    all
}

#[test]
fn every_crate_has_a_layer() {
    let found: BTreeSet<String> = crates().into_iter().map(|m| m.name).collect();
    let placed: BTreeSet<String> = LAYERS.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(found, placed, "crates found vs crates placed in LAYERS");
}

#[test]
fn no_crate_has_a_module_circle() {
    let mut checked = 0;
    let mut circles = Vec::new();
    for m in crates() {
        assert!(!m.roots.is_empty(), "{}: no crate root", m.name);
        for root in &m.roots {
            let modules = Modules::read(root).unwrap();
            checked += modules.modules().count();
            if let Some(c) = modules.circle() {
                circles.push(format!(
                    "{} ({}): {}",
                    m.name,
                    root.display(),
                    c.join(" -> ")
                ));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "module circles:\n{}",
        circles.join("\n")
    );
    // Every file module was read: the core alone has more than forty.
    assert!(checked > 150, "found too few modules: {checked}");
}

#[test]
fn crate_dependencies_point_down() {
    let all = crates();
    let ours: BTreeSet<String> = all.iter().map(|m| m.name.clone()).collect();
    let published: BTreeMap<&str, bool> =
        all.iter().map(|m| (m.name.as_str(), m.published)).collect();
    let mut wrong = Vec::new();
    for m in &all {
        for kind in [Kind::Normal, Kind::Build] {
            for to in m.on(kind, &ours) {
                if !allowed(&m.name, to) {
                    wrong.push(format!("{} -> {to} ({kind:?})", m.name));
                }
                if m.published && !published[to] {
                    wrong.push(format!(
                        "{} (published) -> {to} (unpublished, {kind:?})",
                        m.name
                    ));
                }
            }
        }
        // Tests may use the test kit, and what the crate itself may use.
        for to in m.on(Kind::Dev, &ours) {
            if to != "vrange-testkit" && !allowed(&m.name, to) {
                wrong.push(format!("{} -> {to} (Dev)", m.name));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "dependencies against the layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_rules_reject_what_the_layers_forbid() {
    // The checks above pass only if these fail: each is a way the layers could break.
    assert!(!allowed("vrange-sys", "vrange"));
    assert!(!allowed("vrange", "vrange-cache"));
    assert!(!allowed("vrange", "vrange-testkit"));
    assert!(!allowed("vrange-cache", "vrange-malloc"));
    assert!(!allowed("vrange-cli", "vrange-ffi"));
    assert!(!allowed("vrange-bench", "vrange-cli"));
    assert!(!allowed("vrange-testkit", "vrange"));
    assert!(!allowed("vrange-cli", "vrange-bench"));
    assert!(!allowed("vrange-cli", "vrange-testkit"));
    assert!(allowed("vrange-ffi", "vrange-sqlite"));
    assert!(allowed("vrange-bench", "vrange-testkit"));
}

#[test]
fn the_core_reclaimer_depends_on_the_regions_not_the_reverse() {
    let core = workspace_root().join("crates/vrange/src/lib.rs");
    let g = Modules::read(&core).unwrap().among_children_of(&[]);
    assert!(g["reclaim"].contains("managed"), "{:?}", g["reclaim"]);
    for m in ["managed", "registry", "state", "stats", "shared", "lazy"] {
        assert!(!g[m].contains("reclaim"), "{m} depends on reclaim");
    }
}
