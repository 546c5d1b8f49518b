//! The allocators a suite compares, each as a preloaded library plus the variables that
//! configure it: glibc (nothing preloaded), jemalloc and mimalloc (and tcmalloc where
//! installed) as shipped and told to purge at every free, and vrange-malloc in its three modes;
//! for the tradeoff suite also the peers with their own huge-page settings and vrange-malloc
//! without huge pages ([`with_huge_pages`]).
//!
//! Peers are the Debian packages, found with `dpkg -L`; a missing one is a configuration with
//! the reason it cannot run, so its row says so and the others still run.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use vrange_testkit::proc::clean_command;

/// What a configuration is compared as.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// A peer as shipped.
    Default,
    /// A peer told to give freed memory back at once (MADV_DONTNEED at every free).
    Eager,
    /// vrange-malloc.
    Ours,
    /// A peer as shipped but for its own huge-page setting (only the tradeoff suite runs
    /// these: [`with_huge_pages`]).
    Huge,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub allocator: &'static str,
    /// The settings, as written in the tables.
    pub label: String,
    pub kind: Kind,
    /// The library to preload (`None`: glibc), or why the configuration cannot run here.
    pub preload: Result<Option<PathBuf>, String>,
    pub env: Vec<(&'static str, String)>,
}

impl Config {
    /// "jemalloc eager (MALLOC_CONF=...)": allocator and label in one cell.
    pub fn name(&self) -> String {
        format!("{} {}", self.allocator, self.label)
    }

    /// A short name for plots: "jemalloc eager", "vrange-malloc lazy".
    pub fn short(&self) -> String {
        match (self.kind, self.env.first()) {
            (Kind::Eager, _) => format!("{} eager", self.allocator),
            (Kind::Huge, _) => format!("{} huge pages", self.allocator),
            (Kind::Ours, Some(("VRANGE_MALLOC_THP", _))) => {
                format!("{} huge chunks", self.allocator)
            }
            (Kind::Ours, Some((_, mode))) => format!("{} {mode}", self.allocator),
            (Kind::Ours, None) => format!("{} hybrid", self.allocator),
            (Kind::Default, _) => self.allocator.to_string(),
        }
    }

    /// Applies the preload and variables to `cmd` (made with `vrange_testkit::proc::clean_command`).
    pub fn apply(&self, cmd: &mut Command) -> Result<(), String> {
        let preload = self.preload.as_ref().map_err(Clone::clone)?;
        if let Some(lib) = preload {
            cmd.env("LD_PRELOAD", lib);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        Ok(())
    }

    /// vrange-malloc hybrid, its default.
    pub fn is_ours_default(&self) -> bool {
        self.kind == Kind::Ours && self.env.is_empty()
    }
}

/// The file `name` of Debian package `package`, with the package's version.
fn debian_lib(package: &str, name: &str) -> Result<(PathBuf, String), String> {
    let out = Command::new("dpkg")
        .args(["-L", package])
        .output()
        .map_err(|e| format!("cannot run dpkg -L {package}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{package} is not installed"));
    }
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .find(|p| p.file_name() == Some(OsStr::new(name)) && p.exists())
        .ok_or_else(|| format!("{package} has no {name}"))?;
    let version = Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", package])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    Ok((path, format!("{package} {version}")))
}

/// The variable that sets mimalloc's purge delay in this version of the library (2.1 reads
/// `MIMALLOC_PURGE_DELAY`, 2.0 `MIMALLOC_DECOMMIT_DELAY` and ignores the other): the library
/// lists the options it read under `MIMALLOC_VERBOSE=1`.
fn mimalloc_purge_var(lib: &Path) -> Result<&'static str, String> {
    for (var, option) in [
        ("MIMALLOC_PURGE_DELAY", "purge_delay"),
        ("MIMALLOC_DECOMMIT_DELAY", "decommit_delay"),
    ] {
        let out = clean_command(Path::new("/bin/true"))
            .env("LD_PRELOAD", lib)
            .env("MIMALLOC_VERBOSE", "1")
            .env(var, "0")
            .output()
            .map_err(|e| format!("cannot run /bin/true: {e}"))?;
        if String::from_utf8_lossy(&out.stderr).contains(&format!("option '{option}': 0")) {
            return Ok(var);
        }
    }
    Err("this mimalloc honours neither MIMALLOC_PURGE_DELAY nor MIMALLOC_DECOMMIT_DELAY".into())
}

/// Every configuration, in table order; `versions` collects the peers' package versions.
pub fn configs(ours: Result<PathBuf, String>, versions: &mut Vec<String>) -> Vec<Config> {
    let config = |allocator, label: &str, kind, preload, env| Config {
        allocator,
        label: label.to_string(),
        kind,
        preload,
        env,
    };
    let jemalloc = debian_lib("libjemalloc2", "libjemalloc.so.2");
    let mimalloc = debian_lib("libmimalloc2.0", "libmimalloc.so.2");
    let tcmalloc = debian_lib("libtcmalloc-minimal4", "libtcmalloc_minimal.so.4")
        .or_else(|_| debian_lib("libgoogle-perftools4", "libtcmalloc.so.4"))
        .map_err(|_| {
            "neither libtcmalloc-minimal4 nor libgoogle-perftools4 is installed".to_string()
        });
    versions.extend(
        [&jemalloc, &mimalloc, &tcmalloc]
            .into_iter()
            .flatten()
            .map(|(_, v)| v.clone()),
    );
    let purge_var = mimalloc
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|(lib, _)| mimalloc_purge_var(lib));
    let preload = |lib: &Result<(PathBuf, String), String>| {
        lib.as_ref()
            .map(|(path, _)| Some(path.clone()))
            .map_err(Clone::clone)
    };
    let (jemalloc, mimalloc, tcmalloc) =
        (preload(&jemalloc), preload(&mimalloc), preload(&tcmalloc));
    let ours = ours.map(Some);

    let eager = "dirty_decay_ms:0,muzzy_decay_ms:0";
    let mut v = vec![
        config("glibc", "default", Kind::Default, Ok(None), vec![]),
        config(
            "jemalloc",
            "default",
            Kind::Default,
            jemalloc.clone(),
            vec![],
        ),
        config(
            "jemalloc",
            &format!("MALLOC_CONF={eager}"),
            Kind::Eager,
            jemalloc,
            vec![("MALLOC_CONF", eager.to_string())],
        ),
        config(
            "mimalloc",
            "default",
            Kind::Default,
            mimalloc.clone(),
            vec![],
        ),
        match purge_var {
            Ok(var) => config(
                "mimalloc",
                &format!("{var}=0"),
                Kind::Eager,
                mimalloc,
                vec![(var, "0".to_string())],
            ),
            Err(e) => config("mimalloc", "eager purge", Kind::Eager, Err(e), vec![]),
        },
    ];
    match &tcmalloc {
        Ok(_) => {
            v.push(config(
                "tcmalloc",
                "default",
                Kind::Default,
                tcmalloc.clone(),
                vec![],
            ));
            v.push(config(
                "tcmalloc",
                "TCMALLOC_AGGRESSIVE_DECOMMIT=t",
                Kind::Eager,
                tcmalloc,
                vec![("TCMALLOC_AGGRESSIVE_DECOMMIT", "t".to_string())],
            ));
        }
        Err(e) => v.push(config(
            "tcmalloc",
            "default",
            Kind::Default,
            Err(e.clone()),
            vec![],
        )),
    }
    v.push(config(
        "vrange-malloc",
        "default (hybrid)",
        Kind::Ours,
        ours.clone(),
        vec![],
    ));
    for mode in ["managed", "lazy"] {
        v.push(config(
            "vrange-malloc",
            &format!("VRANGE_MALLOC_MODE={mode}"),
            Kind::Ours,
            ours.clone(),
            vec![("VRANGE_MALLOC_MODE", mode.to_string())],
        ));
    }
    v
}

/// The huge-page setting of each peer that has one, as `(variable, value)`: glibc's tunable
/// (MADV_HUGEPAGE on its heaps, so it needs THP `madvise` or `always`), jemalloc's `thp`
/// option (MADV_HUGEPAGE on every mapping) and mimalloc's large OS pages (MAP_HUGETLB where
/// huge pages are reserved, else MADV_HUGEPAGE on its segments).
fn huge_setting(allocator: &str) -> Option<(&'static str, &'static str)> {
    match allocator {
        "glibc" => Some(("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")),
        "jemalloc" => Some(("MALLOC_CONF", "thp:always")),
        "mimalloc" => Some(("MIMALLOC_LARGE_OS_PAGES", "1")),
        _ => None,
    }
}

/// `configs` with the peers' huge-page configurations (after each peer's own) and
/// vrange-malloc's default with huge pages on its chunks too (`VRANGE_MALLOC_THP=always`, after
/// the default), so that huge pages are compared with huge pages; and vrange-malloc arming free
/// chunks at the reclaimer's next tick (`VRANGE_MALLOC_ARM_DELAY_MS=0`) rather than after
/// 1 s, so the kernel itself can take free memory from a neighbour that grows fast.
pub fn with_huge_pages(configs: Vec<Config>) -> Vec<Config> {
    let mut out = Vec::with_capacity(configs.len() + 5);
    for (i, c) in configs.iter().enumerate() {
        out.push(c.clone());
        if c.is_ours_default() {
            out.push(Config {
                label: "VRANGE_MALLOC_ARM_DELAY_MS=0".into(),
                env: vec![("VRANGE_MALLOC_ARM_DELAY_MS", "0".into())],
                ..c.clone()
            });
            out.push(Config {
                label: "VRANGE_MALLOC_THP=always".into(),
                env: vec![("VRANGE_MALLOC_THP", "always".into())],
                ..c.clone()
            });
        }
        let last_of_allocator = configs
            .get(i + 1)
            .is_none_or(|next| next.allocator != c.allocator);
        let shipped = configs
            .iter()
            .find(|d| d.allocator == c.allocator && d.kind == Kind::Default);
        if let (true, Some((var, value)), Some(shipped)) =
            (last_of_allocator, huge_setting(c.allocator), shipped)
        {
            out.push(Config {
                allocator: c.allocator,
                label: format!("{var}={value}"),
                kind: Kind::Huge,
                preload: shipped.preload.clone(),
                env: vec![(var, value.into())],
            });
        }
    }
    out
}

/// Whether the allocator read the huge-page setting of `config` (a [`Kind::Huge`]
/// configuration): what it reports about the setting, or why that cannot be seen. Each
/// allocator is asked in its own way: glibc lists its tunables (`ld.so --list-tunables`),
/// jemalloc prints its options (`stats_print`), mimalloc lists the options it read
/// (`MIMALLOC_VERBOSE=1`).
pub fn huge_setting_read(config: &Config) -> Result<String, String> {
    let setting = |name: &str| {
        config
            .env
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let (program, how, wanted) = match config.allocator {
        "glibc" => (
            "ld.so",
            "ld.so --list-tunables",
            "glibc.malloc.hugetlb: 0x1",
        ),
        "jemalloc" => ("/bin/true", "stats_print", r#"opt.thp: "always""#),
        "mimalloc" => (
            "/bin/true",
            "MIMALLOC_VERBOSE=1",
            "option 'large_os_pages': 1",
        ),
        other => return Err(format!("no way to ask {other}")),
    };
    let mut cmd = clean_command(Path::new(program));
    config.apply(&mut cmd)?;
    match config.allocator {
        "glibc" => cmd.arg("--list-tunables"),
        "jemalloc" => cmd.env(
            "MALLOC_CONF",
            format!("{},stats_print:true", setting("MALLOC_CONF")),
        ),
        _ => cmd.env("MIMALLOC_VERBOSE", "1"),
    };
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if text.contains(wanted) {
        Ok(format!("{how}: {wanted}"))
    } else {
        Err(format!("{how} does not show {wanted:?}"))
    }
}
