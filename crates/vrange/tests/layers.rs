//! The core's modules depend on each other in one direction only: no module reaches, through
//! any chain of `crate::` paths, back to itself. Read from the sources, so that a new circle
//! fails here rather than in a reviewer's head. (`lib.rs` is the public face and may name
//! everything; `reclaim` is one module with its files.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module name → the modules its code names with `crate::`, comments left out.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files: Vec<(String, std::path::PathBuf)> = Vec::new();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "rs") {
            let m = p.file_stem().unwrap().to_string_lossy().into_owned();
            if m != "lib" {
                files.push((m, p));
            }
        } else if p.is_dir() {
            let m = p.file_name().unwrap().to_string_lossy().into_owned();
            for f in std::fs::read_dir(&p).unwrap().flatten() {
                files.push((m.clone(), f.path()));
            }
        }
    }
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, path) in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let deps = g.entry(m.clone()).or_default();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            // `use crate::{a, b::c}` and `crate::a::f()` alike.
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                let names: Vec<&str> = if let Some(list) = rest.strip_prefix('{') {
                    let list = list.split('}').next().unwrap_or("");
                    list.split(',').map(|n| n.trim()).collect()
                } else {
                    vec![rest]
                };
                for n in names {
                    let name: String = n
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if modules.contains(&name) && &name != m {
                        deps.insert(name);
                    }
                }
            }
        }
    }
    g
}

#[test]
fn no_module_circles() {
    let g = graph();
    assert!(g.len() > 10, "found too few modules: {g:?}");
    // Depth-first search for a back edge, reporting the circle it closes.
    fn visit(
        m: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut circle = path[i..].to_vec();
            circle.push(m.to_string());
            return Some(circle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for d in g.get(m).into_iter().flatten() {
            if let Some(c) = visit(d, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for m in g.keys() {
        if let Some(circle) = visit(m, &g, &mut Vec::new(), &mut done) {
            panic!("module circle: {}", circle.join(" -> "));
        }
    }
}

#[test]
fn the_reclaimer_depends_on_the_regions_not_the_reverse() {
    let g = graph();
    assert!(g["reclaim"].contains("managed"), "{:?}", g["reclaim"]);
    for m in ["managed", "registry", "state", "stats", "shared", "lazy"] {
        assert!(!g[m].contains("reclaim"), "{m} depends on reclaim");
    }
}
