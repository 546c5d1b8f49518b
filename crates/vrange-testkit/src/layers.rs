//! The layers, read from the sources: which module of a crate names which other module, and
//! which crate depends on which. The rules themselves (no circle, the crates' order) are stated
//! in this crate's `tests/layers.rs`; this module only reads and searches. It never builds
//! anything and never runs cargo: it parses `.rs` files (syn) and `Cargo.toml` files
//! (toml_edit) as they are on disk.
//!
//! # Modules
//! A crate root's module tree is followed through its `mod` declarations (inline ones too),
//! with the default file layout (`name.rs` or `name/mod.rs`; a `#[path]` attribute is refused
//! rather than guessed). A module names another when its code holds a path that resolves to it:
//! `crate::a::b`, `super::b`, `self::b`, a child module's name, in `use` trees, in code, and in
//! the tokens of macro calls (`println!("{}", crate::a::f())`, `$crate::a` in a
//! `macro_rules!`). Comments and strings name nothing. A path to an item resolves to the
//! deepest module it goes through.
//!
//! Code under `#[cfg(test)]` (unit tests, their helpers) is left out, as the files in `tests/`
//! are: a test may use any module as a tool (a test of the reclaimer's registers the fork
//! handlers through the public face, and the fork protocol calls the reclaimer's child hook);
//! the layers order the code a crate ships.
//!
//! A module may always name its ancestors (a child uses what its parent holds in common) and
//! its descendants (a parent, the face of its children, may name them all): a circle is among
//! the children of one module. So the check is made once per module that has children, over
//! its children: `reclaim::victims` naming `managed` counts as `reclaim -> managed` among the
//! crate root's children, and naming `reclaim::budget` as `victims -> budget` among
//! `reclaim`'s.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// A directed graph by name: each node and the nodes it points to.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// A circle in `graph`, as the nodes along it with the first repeated at the end
/// (`a -> b -> a`); `None` if the graph has none. Depth-first, in name order, so the answer is
/// the same on every run.
pub fn circle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == node) {
            let mut circle = path[i..].to_vec();
            circle.push(node.to_string());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// A module's path from its crate root, `[]` for the root itself.
type ModPath = Vec<String>;

/// One crate root's modules (a library's `lib.rs`, a binary's `main.rs`) and the modules each
/// one names.
#[derive(Debug)]
pub struct Modules {
    /// The root file, for messages.
    pub root: PathBuf,
    /// Every module of the tree, the root (`[]`) included.
    modules: BTreeSet<ModPath>,
    /// Each module and the modules its own code names (not its inline children's).
    names: BTreeMap<ModPath, BTreeSet<ModPath>>,
}

/// A parsed file and the module it is.
struct File {
    module: ModPath,
    syntax: syn::File,
}

impl Modules {
    /// The module tree of the crate root `root` (a `lib.rs` or `main.rs`), from disk.
    ///
    /// # Errors
    /// A file that cannot be read or parsed, a `mod` declaration whose file is missing or
    /// placed by `#[path]`.
    pub fn read(root: &Path) -> io::Result<Modules> {
        Modules::parse(root, &|p: &Path| std::fs::read_to_string(p))
    }

    /// As [`Modules::read`], with `read` standing in for the file system (the checker's own
    /// tests feed it made-up files).
    ///
    /// # Errors
    /// As [`Modules::read`].
    pub fn parse(root: &Path, read: &dyn Fn(&Path) -> io::Result<String>) -> io::Result<Modules> {
        let mut files = Vec::new();
        let mut modules = BTreeSet::new();
        let dir = root.parent().unwrap_or(Path::new("")).to_path_buf();
        load(root, Vec::new(), &dir, read, &mut files, &mut modules)?;
        let mut names: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
        for f in &files {
            let mut v = Namer {
                modules: &modules,
                current: f.module.clone(),
                names: &mut names,
            };
            v.visit_file(&f.syntax);
        }
        Ok(Modules {
            root: root.to_path_buf(),
            modules,
            names,
        })
    }

    /// Every module's path (`reclaim::victims`), the root as `crate`.
    pub fn modules(&self) -> impl Iterator<Item = String> + '_ {
        self.modules.iter().map(display)
    }

    /// The edges among the children of `parent` (`&[]`: the root's children): `a -> b` when
    /// code anywhere in `a` (its descendants included) names `b` or a descendant of it.
    pub fn among_children_of(&self, parent: &[&str]) -> Graph {
        let parent: ModPath = parent.iter().map(|s| s.to_string()).collect();
        let mut g = Graph::new();
        for child in self.children(&parent) {
            g.entry(child.last().cloned().unwrap_or_default())
                .or_default();
        }
        for (from, tos) in &self.names {
            for to in tos {
                let Some((a, b)) = split(from, to) else {
                    continue;
                };
                if a[..a.len() - 1] == parent[..] {
                    g.entry(a[a.len() - 1].clone())
                        .or_default()
                        .insert(b[b.len() - 1].clone());
                }
            }
        }
        g
    }

    /// The first circle among the children of any module, as full module paths
    /// (`reclaim::budget -> reclaim::room -> reclaim::budget`); `None` if there is none.
    pub fn circle(&self) -> Option<Vec<String>> {
        self.modules.iter().find_map(|parent| {
            let names: Vec<&str> = parent.iter().map(String::as_str).collect();
            let c = circle(&self.among_children_of(&names))?;
            Some(
                c.into_iter()
                    .map(|m| {
                        let mut p = parent.clone();
                        p.push(m);
                        display(&p)
                    })
                    .collect(),
            )
        })
    }

    fn children<'a>(&'a self, parent: &'a ModPath) -> impl Iterator<Item = &'a ModPath> + 'a {
        self.modules
            .iter()
            .filter(move |m| m.len() == parent.len() + 1 && m.starts_with(parent))
    }
}

/// For modules `from` and `to` of which neither holds the other, the two children of their
/// nearest common ancestor that hold them (`reclaim::victims`, `managed` ->
/// `reclaim`, `managed`): the circle check's edge. `None` when one holds the other.
fn split<'a>(from: &'a ModPath, to: &'a ModPath) -> Option<(&'a [String], &'a [String])> {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    (common < from.len() && common < to.len()).then(|| (&from[..=common], &to[..=common]))
}

fn display(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".to_string()
    } else {
        m.join("::")
    }
}

/// Reads the file of module `module` at `path` (its children's files are under `dir`), and
/// every file module it declares, in turn.
fn load(
    path: &Path,
    module: ModPath,
    dir: &Path,
    read: &dyn Fn(&Path) -> io::Result<String>,
    files: &mut Vec<File>,
    modules: &mut BTreeSet<ModPath>,
) -> io::Result<()> {
    let text =
        read(path).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let syntax = syn::parse_file(&text).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })?;
    modules.insert(module.clone());
    declared(&syntax.items, &module, dir, path, read, files, modules)?;
    files.push(File { module, syntax });
    Ok(())
}

/// Follows the `mod` declarations among `items` (of module `module`, whose children's files
/// are under `dir`).
fn declared(
    items: &[syn::Item],
    module: &ModPath,
    dir: &Path,
    file: &Path,
    read: &dyn Fn(&Path) -> io::Result<String>,
    files: &mut Vec<File>,
    modules: &mut BTreeSet<ModPath>,
) -> io::Result<()> {
    for item in items {
        let syn::Item::Mod(m) = item else { continue };
        if test_only(&m.attrs) {
            continue;
        }
        if m.attrs.iter().any(|a| a.path().is_ident("path")) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{}: `mod {}` has a #[path]", file.display(), m.ident),
            ));
        }
        let name = m.ident.to_string();
        let mut child = module.clone();
        child.push(name.clone());
        match &m.content {
            Some((_, inner)) => {
                modules.insert(child.clone());
                declared(inner, &child, &dir.join(&name), file, read, files, modules)?;
            }
            None => {
                let flat = dir.join(format!("{name}.rs"));
                let nested = dir.join(&name).join("mod.rs");
                let found = [flat, nested].into_iter().find(|p| read(p).is_ok());
                let Some(p) = found else {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{}: no file for `mod {name}`", file.display()),
                    ));
                };
                load(&p, child, &dir.join(&name), read, files, modules)?;
            }
        }
    }
    Ok(())
}

/// Whether `attrs` hold `#[cfg(test)]`.
fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
    })
}

/// Collects, for each module of one file, the modules its paths name.
struct Namer<'a> {
    modules: &'a BTreeSet<ModPath>,
    current: ModPath,
    names: &'a mut BTreeMap<ModPath, BTreeSet<ModPath>>,
}

impl Namer<'_> {
    /// Records the module a path (its segments as written) names, if it names one of this tree.
    fn name(&mut self, segments: &[String]) {
        let Some(first) = segments.first() else {
            return;
        };
        let mut abs: ModPath = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.current.clone(),
            "super" => {
                let mut m = self.current.clone();
                m.pop();
                m
            }
            child => {
                let mut m = self.current.clone();
                m.push(child.to_string());
                if !self.modules.contains(&m) {
                    return;
                }
                self.current.clone()
            }
        };
        let rest = if first == "super" || first == "self" || first == "crate" {
            &segments[1..]
        } else {
            segments
        };
        let mut rest = rest.iter().peekable();
        while rest.peek().is_some_and(|s| *s == "super") {
            abs.pop();
            rest.next();
        }
        // The deepest module the path goes through: the rest may be an item, or its fields.
        for s in rest {
            abs.push(s.clone());
            if !self.modules.contains(&abs) {
                abs.pop();
                break;
            }
        }
        // Inline modules inside function bodies are not in the tree: their code is their
        // nearest known ancestor's.
        let mut from = self.current.clone();
        while !self.modules.contains(&from) {
            from.pop();
        }
        self.names.entry(from).or_default().insert(abs);
    }

    /// The paths in a macro call's tokens: each run `ident :: ident ...` (`$crate` too, its
    /// `$` being a separate token).
    fn tokens(&mut self, tokens: TokenStream) {
        let mut run: Vec<String> = Vec::new();
        let mut colons = 0;
        for t in tokens {
            match t {
                TokenTree::Ident(i) if run.is_empty() || colons == 2 => {
                    run.push(i.to_string());
                    colons = 0;
                }
                TokenTree::Punct(p) if p.as_char() == ':' && !run.is_empty() && colons < 2 => {
                    colons += 1;
                }
                other => {
                    if run.len() > 1 {
                        self.name(&run);
                    }
                    run.clear();
                    colons = 0;
                    match other {
                        TokenTree::Group(g) => self.tokens(g.stream()),
                        TokenTree::Ident(i) => run.push(i.to_string()),
                        _ => {}
                    }
                }
            }
        }
        if run.len() > 1 {
            self.name(&run);
        }
    }
}

/// Each path a `use` tree brings in, as segments (`a::{b, c::*}`: `a::b`, `a::c`).
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => out.push(with(prefix, &n.ident)),
        syn::UseTree::Rename(r) => out.push(with(prefix, &r.ident)),
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_paths(t, prefix, out);
            }
        }
    }
}

/// `prefix::ident`; `prefix::self` is `prefix`.
fn with(prefix: &[String], ident: &syn::Ident) -> Vec<String> {
    let mut p = prefix.to_vec();
    if ident != "self" || p.is_empty() {
        p.push(ident.to_string());
    }
    p
}

impl<'ast> Visit<'ast> for Namer<'_> {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        let attrs = match i {
            syn::Item::Const(x) => &x.attrs,
            syn::Item::Enum(x) => &x.attrs,
            syn::Item::Fn(x) => &x.attrs,
            syn::Item::Impl(x) => &x.attrs,
            syn::Item::Macro(x) => &x.attrs,
            syn::Item::Mod(x) => &x.attrs,
            syn::Item::Static(x) => &x.attrs,
            syn::Item::Struct(x) => &x.attrs,
            syn::Item::Trait(x) => &x.attrs,
            syn::Item::Type(x) => &x.attrs,
            syn::Item::Union(x) => &x.attrs,
            syn::Item::Use(x) => &x.attrs,
            _ => return syn::visit::visit_item(self, i),
        };
        if !test_only(attrs) {
            syn::visit::visit_item(self, i);
        }
    }

    fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
        let attrs = match i {
            syn::ImplItem::Const(x) => &x.attrs,
            syn::ImplItem::Fn(x) => &x.attrs,
            syn::ImplItem::Type(x) => &x.attrs,
            syn::ImplItem::Macro(x) => &x.attrs,
            _ => return syn::visit::visit_impl_item(self, i),
        };
        if !test_only(attrs) {
            syn::visit::visit_impl_item(self, i);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        // A file module's code is read from its own file.
        if let Some((_, items)) = &m.content {
            self.current.push(m.ident.to_string());
            for item in items {
                self.visit_item(item);
            }
            self.current.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if u.leading_colon.is_some() {
            return;
        }
        let mut paths = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut paths);
        for p in paths {
            self.name(&p);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
            self.name(&segments);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.tokens(m.tokens.clone());
    }

    // Attributes (docs, derives, cfgs) name no module of the crate's code.
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
}

/// What kind of dependency a `Cargo.toml` table declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `[dependencies]`: part of what the crate ships.
    Normal,
    /// `[build-dependencies]`: run at build time, shipped with the package's build.
    Build,
    /// `[dev-dependencies]`: its tests, examples and benches only.
    Dev,
}

/// One crate's manifest, as far as the layers go.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// The package's name.
    pub name: String,
    /// The crate's directory.
    pub dir: PathBuf,
    /// Whether `cargo publish` may publish it (`publish = false` says not).
    pub published: bool,
    /// Each dependency by its package's name (a renamed one, `engine = { package =
    /// "vrange-malloc" }`, by `vrange-malloc`), and how it is declared (target-specific tables
    /// included).
    pub dependencies: BTreeMap<String, BTreeSet<Kind>>,
    /// The crate roots: the library's and each binary's (declared or at cargo's default
    /// places).
    pub roots: Vec<PathBuf>,
}

impl Manifest {
    /// Reads `dir/Cargo.toml`.
    ///
    /// # Errors
    /// A manifest that cannot be read, is not TOML, or has no package name.
    pub fn read(dir: &Path) -> io::Result<Manifest> {
        let path = dir.join("Cargo.toml");
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let text = std::fs::read_to_string(&path)?;
        let parsed = toml_edit::Document::parse(text)
            .map_err(|e| bad(format!("{}: {e}", path.display())))?;
        let doc = parsed.as_item();
        let name = doc
            .get("package")
            .and_then(|p| p.get("name"))
            .and_then(|n| n.as_str())
            .ok_or_else(|| bad(format!("{}: no package name", path.display())))?
            .to_string();
        let published = doc
            .get("package")
            .and_then(|p| p.get("publish"))
            .and_then(|p| p.as_bool())
            .unwrap_or(true);
        let mut dependencies: BTreeMap<String, BTreeSet<Kind>> = BTreeMap::new();
        let mut tables: Vec<&toml_edit::Item> = vec![doc];
        if let Some(targets) = doc.get("target").and_then(|t| t.as_table_like()) {
            tables.extend(targets.iter().map(|(_, t)| t));
        }
        for table in tables {
            for (key, kind) in [
                ("dependencies", Kind::Normal),
                ("build-dependencies", Kind::Build),
                ("dev-dependencies", Kind::Dev),
            ] {
                let Some(deps) = table.get(key).and_then(|d| d.as_table_like()) else {
                    continue;
                };
                for (dep, spec) in deps.iter() {
                    let package = spec.get("package").and_then(|p| p.as_str()).unwrap_or(dep);
                    dependencies
                        .entry(package.to_string())
                        .or_default()
                        .insert(kind);
                }
            }
        }
        let declared = |table: &toml_edit::Item| {
            table
                .get("path")
                .and_then(|p| p.as_str())
                .map(|p| dir.join(p))
        };
        let mut roots: Vec<PathBuf> = Vec::new();
        roots.extend(doc.get("lib").and_then(declared));
        if let Some(bins) = doc.get("bin").and_then(|b| b.as_array_of_tables()) {
            roots.extend(
                bins.iter()
                    .filter_map(|b| b.get("path")?.as_str().map(|p| dir.join(p))),
            );
        }
        roots.extend(
            [dir.join("src/lib.rs"), dir.join("src/main.rs")]
                .into_iter()
                .filter(|p| p.exists()),
        );
        if let Ok(bins) = std::fs::read_dir(dir.join("src/bin")) {
            roots.extend(bins.flatten().map(|e| e.path()).filter(|p| {
                p.extension().is_some_and(|x| x == "rs") || p.join("main.rs").exists()
            }));
        }
        let mut roots: Vec<PathBuf> = roots
            .into_iter()
            .map(|p| if p.is_dir() { p.join("main.rs") } else { p })
            .collect();
        roots.sort();
        roots.dedup();
        Ok(Manifest {
            name,
            dir: dir.to_path_buf(),
            published,
            dependencies,
            roots,
        })
    }

    /// Its dependencies of `kind` among `names`.
    pub fn on<'a>(
        &'a self,
        kind: Kind,
        names: &'a BTreeSet<String>,
    ) -> impl Iterator<Item = &'a str> + 'a {
        self.dependencies
            .iter()
            .filter(move |(n, kinds)| kinds.contains(&kind) && names.contains(*n))
            .map(|(n, _)| n.as_str())
    }
}

/// The workspace's crates: its members and the crates it excludes (built on their own, as the
/// Python module is), from the root manifest at `root`.
///
/// # Errors
/// A manifest that cannot be read.
pub fn workspace(root: &Path) -> io::Result<Vec<Manifest>> {
    let path = root.join("Cargo.toml");
    let text = std::fs::read_to_string(&path)?;
    let parsed = toml_edit::Document::parse(text).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })?;
    let doc = parsed.as_item();
    let mut dirs = Vec::new();
    for key in ["members", "exclude"] {
        if let Some(list) = doc
            .get("workspace")
            .and_then(|w| w.get(key))
            .and_then(|l| l.as_array())
        {
            dirs.extend(list.iter().filter_map(|d| d.as_str()).map(|d| root.join(d)));
        }
    }
    dirs.iter().map(|d| Manifest::read(d)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The module tree of made-up files, `(path, text)`, rooted at `src/lib.rs`.
    fn tree(files: &[(&str, &str)]) -> Modules {
        let files: BTreeMap<PathBuf, String> = files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect();
        let read = move |p: &Path| {
            files
                .get(p)
                .cloned()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        };
        Modules::parse(Path::new("src/lib.rs"), &read).unwrap()
    }

    #[test]
    fn a_circle_through_crate_paths_is_found() {
        let m = tree(&[
            ("src/lib.rs", "mod a; mod b; mod c;"),
            ("src/a.rs", "use crate::b::f; pub fn g() { f() }"),
            ("src/b.rs", "pub fn f() { crate::c::h() }"),
            ("src/c.rs", "pub fn h() { let _ = crate::a::g; }"),
        ]);
        assert_eq!(
            m.circle(),
            Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
        );
    }

    #[test]
    fn one_way_is_no_circle() {
        let m = tree(&[
            (
                "src/lib.rs",
                "pub mod a; mod b; pub use a::g; fn x() { b::f() }",
            ),
            ("src/a.rs", "use crate::b::f; pub fn g() { f() }"),
            // Naming the root (the face) is no circle, nor are comments and strings.
            (
                "src/b.rs",
                "use crate::g; // crate::a::g\npub fn f() { let _ = \"crate::a\"; }",
            ),
        ]);
        assert_eq!(m.circle(), None);
        assert_eq!(
            m.among_children_of(&[])["a"],
            BTreeSet::from(["b".to_string()])
        );
        assert!(m.among_children_of(&[])["b"].is_empty());
    }

    #[test]
    fn super_in_a_directory_and_in_an_inline_module_resolves_where_it_is() {
        let files = [
            ("src/lib.rs", "mod r; mod m;"),
            ("src/r/mod.rs", "mod x; mod y; pub struct S;"),
            // `super::S` is the parent's (no circle); `super::y` is the sibling.
            ("src/r/x.rs", "use super::S; fn f() { super::y::g() }"),
            (
                "src/r/y.rs",
                "pub fn g() {}\nmod inner { use super::*; fn t() { super::super::x::f } }",
            ),
            ("src/m.rs", "fn f() { crate::r::y::g() }"),
        ];
        let m = tree(&files);
        assert_eq!(
            m.circle(),
            Some(vec!["r::x".into(), "r::y".into(), "r::x".into()])
        );
        let top = m.among_children_of(&[]);
        assert_eq!(top["m"], BTreeSet::from(["r".to_string()]));
        assert!(top["r"].is_empty(), "{top:?}");
    }

    #[test]
    fn unit_tests_are_left_out() {
        let m = tree(&[
            ("src/lib.rs", "mod a; mod b;"),
            ("src/a.rs", "pub fn f() { crate::b::g() }"),
            (
                "src/b.rs",
                "pub fn g() {}\n#[cfg(test)] mod tests { fn t() { crate::a::f() } }\n\
                 #[cfg(test)] fn helper() { crate::a::f() }\n#[cfg(test)] mod more;",
            ),
        ]);
        assert_eq!(m.circle(), None);
        assert!(m.among_children_of(&[])["b"].is_empty());
    }

    #[test]
    fn macro_tokens_and_use_groups_name_modules() {
        let m = tree(&[
            ("src/lib.rs", "mod a; mod b; mod c;"),
            ("src/a.rs", "fn f() { println!(\"{}\", crate::b::N); }"),
            (
                "src/b.rs",
                "use crate::{c::{self}, a as _};\npub const N: u8 = 1;",
            ),
            ("src/c.rs", "macro_rules! m { () => { $crate::a::f() } }"),
        ]);
        let top = m.among_children_of(&[]);
        assert_eq!(top["a"], BTreeSet::from(["b".to_string()]));
        assert_eq!(top["b"], BTreeSet::from(["a".to_string(), "c".to_string()]));
        assert_eq!(top["c"], BTreeSet::from(["a".to_string()]));
        assert!(m.circle().is_some());
    }

    #[test]
    fn a_path_attribute_is_refused() {
        let read = |p: &Path| match p.to_str() {
            Some("src/lib.rs") => Ok("#[path = \"x.rs\"] mod a;".to_string()),
            _ => Err(io::Error::from(io::ErrorKind::NotFound)),
        };
        let e = Modules::parse(Path::new("src/lib.rs"), &read).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
    }

    #[test]
    fn circle_finds_the_loop_of_a_graph() {
        let g: Graph = [("x", &["y"][..]), ("y", &["z"]), ("z", &["y"])]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
            .collect();
        assert_eq!(circle(&g), Some(vec!["y".into(), "z".into(), "y".into()]));
        let mut g = g;
        g.get_mut("z").unwrap().clear();
        assert_eq!(circle(&g), None);
    }
}
