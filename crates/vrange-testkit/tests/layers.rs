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

// ci: host only: reads the sources

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

/// A rule that lives in one file, and what gives away a second copy of it: a line of code (not
/// a comment) containing every fragment of one of `copies`, in a file other than `owner` (and
/// the `allowed` files, each for a reason said there).
struct OnePlace {
    rule: &'static str,
    owner: &'static [&'static str],
    copies: &'static [&'static [&'static str]],
    allowed: &'static [(&'static str, &'static str)],
}

/// /proc text files whose parsing is vrange-sys `procfs`'s (and `cgroup.rs`'s for the cgroup
/// files).
const PROC_TEXT: &[&str] = &[
    "/status\"",
    "/smaps",
    "/meminfo\"",
    "/vmstat\"",
    "/stat\"",
    "/limits\"",
    "/maps\"",
    "/loadavg\"",
    "/cgroup\"",
    "/mountinfo\"",
    "/comm\"",
    "/wchan\"",
    "/syscall\"",
];

const ONE_PLACE: &[OnePlace] = &[
    OnePlace {
        rule: "the fork protocol's one registration",
        owner: &[
            "crates/vrange-sys/src/lock/held.rs",
            "crates/vrange-sys/src/process.rs",
        ],
        copies: &[&["at_fork("], &["pthread_atfork("]],
        allowed: &[],
    },
    OnePlace {
        rule: "the headroom threshold (auto)",
        owner: &["crates/vrange/src/short.rs"],
        copies: &[&["/ 16).clamp("], &["4 << 20, 256 << 20"]],
        allowed: &[(
            "crates/vrange-bench/src/cache/trace.rs",
            "a slab a sixteenth of a small cache's budget, not a headroom",
        )],
    },
    OnePlace {
        rule: "the deficit (back to twice the threshold)",
        owner: &["crates/vrange/src/short.rs"],
        copies: &[&["threshold", "saturating_mul(2)"], &["threshold * 2"]],
        allowed: &[],
    },
    OnePlace {
        rule: "the tight watermark",
        owner: &["crates/vrange/src/short.rs"],
        copies: &[&["FAULT_RATE"], &["MIN_WATERMARK"]],
        allowed: &[],
    },
    OnePlace {
        rule: "the headroom formula",
        owner: &["crates/vrange-sys/src/cgroup.rs"],
        copies: &[&["ceiling", "saturating_sub(", "usage"]],
        allowed: &[],
    },
    OnePlace {
        rule: "the victim order",
        owner: &["crates/vrange/src/order.rs"],
        copies: &[
            &["impl Ord for Place"],
            &["sort", "priority", "last_used"],
            &["sort", "purge_class", "idle"],
            &["Reverse(", "idle()"],
            &["class <", "min_age"],
        ],
        allowed: &[],
    },
];

/// Every Rust file of ours, relative to the workspace root.
fn rust_files() -> Vec<std::path::PathBuf> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "target") {
                    walk(&p, out);
                }
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = workspace_root();
    let mut files = Vec::new();
    walk(&root.join("crates"), &mut files);
    files
        .into_iter()
        .map(|p| p.strip_prefix(&root).unwrap().to_path_buf())
        .collect()
}

/// The code of a line: what precedes a `//` comment (a line that is all comment is empty).
fn code(line: &str) -> &str {
    let t = line.trim_start();
    if t.starts_with("//") {
        return "";
    }
    // A `//` inside a string literal ("https://") stays: only a comment after code is cut.
    match line.find(" // ") {
        Some(i) => &line[..i],
        None => line,
    }
}

/// The places outside its owner where `rule` is written again.
fn second_copies(rule: &OnePlace, files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in files {
        if rule.owner.contains(&path.as_str())
            || rule.allowed.iter().any(|(p, _)| p == path)
            || path == THIS_FILE
        {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            let c = code(line);
            if rule
                .copies
                .iter()
                .any(|frags| frags.iter().all(|f| c.contains(f)))
            {
                found.push(format!("{path}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn each_rule_has_one_place() {
    let files: Vec<(String, String)> = rust_files()
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(workspace_root().join(&p)).unwrap();
            (p.to_string_lossy().into_owned(), text)
        })
        .collect();
    assert!(files.len() > 200, "found too few files: {}", files.len());
    let mut wrong = Vec::new();
    for rule in ONE_PLACE {
        for owner in rule.owner {
            assert!(
                files.iter().any(|(p, _)| p == owner),
                "{}: its owner {owner} is gone: move the rule's entry with it",
                rule.rule
            );
        }
        for copy in second_copies(rule, &files) {
            wrong.push(format!("{} also at {copy}", rule.rule));
        }
    }
    // /proc text is parsed in vrange-sys alone.
    for (path, text) in &files {
        if path.starts_with("crates/vrange-sys/src/") || path == THIS_FILE {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            let c = code(line);
            if c.contains("\"/proc/") && PROC_TEXT.iter().any(|f| c.contains(f)) {
                let allowed = PROC_ALLOWED
                    .iter()
                    .any(|(p, l, _)| p == path && c.contains(l));
                if !allowed {
                    wrong.push(format!(
                        "/proc parsing also at {path}:{}: {}",
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "rules written again outside their one place (DESIGN.md, \"Where each rule lives\"):\n{}",
        wrong.join("\n")
    );
}

/// This file, which names every fragment it looks for.
const THIS_FILE: &str = "crates/vrange-testkit/tests/layers.rs";

/// /proc file names in code that reads no /proc text: (file, what the line holds, why).
const PROC_ALLOWED: &[(&str, &str, &str)] = &[
    (
        "crates/vrange/tests/scratch.rs",
        ".expect(\"/proc/self/status\")",
        "the message of vrange-sys's reader failing",
    ),
    (
        "crates/vrange/src/features.rs",
        "/proc/self/maps is parsed",
        "a sentence of the feature report",
    ),
    (
        "crates/vrange/tests/guest.rs",
        "File::open(\"/proc/self/status\")",
        "a descriptor to collide with vrange's, never read",
    ),
];

#[test]
fn a_second_copy_is_found() {
    let rule = &ONE_PLACE[1];
    let files = vec![
        (
            "crates/vrange-cache/src/x.rs".to_string(),
            "let t = (limit / 16).clamp(4 << 20, 256 << 20); // restated".to_string(),
        ),
        (
            "crates/vrange-cache/src/y.rs".to_string(),
            "// (limit / 16).clamp(4 << 20, 256 << 20) in a comment".to_string(),
        ),
        (
            rule.owner[0].to_string(),
            "(c / 16).clamp(4 << 20, 256 << 20)".to_string(),
        ),
    ];
    let found = second_copies(rule, &files);
    assert_eq!(rule.rule, "the headroom threshold (auto)");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("crates/vrange-cache/src/x.rs:1"));
}
