//! `vrange run`: runs a program with libvrange_malloc preloaded and passes its exit status (or
//! the signal that ended it) through. With `--stats` every process of the program's tree
//! publishes its statistics into a fresh private directory (`VRANGE_STATS_DIR`, made by
//! `tempfile` with a random name and mode 0700, removed at the end), which `run` sums up at the
//! end with the peak RSS from wait4.

use crate::Mode;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Options {
    pub mode: Mode,
    /// Bytes.
    pub budget: Option<u64>,
    pub stats: bool,
    pub lib: Option<PathBuf>,
    pub command: Vec<OsString>,
}

/// libvrange_malloc.so beside this executable (cargo puts both in `target/<profile>`), else in
/// `../lib` (`make install` puts the command in `$PREFIX/bin`, the shim in `$PREFIX/lib`).
pub fn default_lib() -> Option<PathBuf> {
    const SHIM: &str = "libvrange_malloc.so";
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?;
    let installed = bin.parent().map(|prefix| prefix.join("lib").join(SHIM));
    [Some(bin.join(SHIM)), installed]
        .into_iter()
        .flatten()
        .find(|so| so.exists())
}

static CHILD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(std::sync::atomic::Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

pub fn main(o: Options) -> i32 {
    let Some(lib) = o.lib.clone().or_else(default_lib) else {
        eprintln!(
            "vrange run: libvrange_malloc.so not found next to this executable or in ../lib; \
             build it with `cargo build --release -p vrange-malloc-preload`, install it with \
             `make install`, or pass --lib"
        );
        return 127;
    };
    let mut cmd = Command::new(&o.command[0]);
    cmd.args(&o.command[1..]);
    let preload = match std::env::var_os("LD_PRELOAD") {
        Some(old) if !old.is_empty() => {
            let mut v = lib.clone().into_os_string();
            v.push(":");
            v.push(old);
            v
        }
        _ => lib.clone().into_os_string(),
    };
    cmd.env("LD_PRELOAD", preload);
    cmd.env(
        "VRANGE_MALLOC_MODE",
        match o.mode {
            Mode::Lazy => "lazy",
            Mode::Managed => "managed",
            Mode::Hybrid => "hybrid",
        },
    );
    if let Some(b) = o.budget {
        cmd.env("VRANGE_MALLOC_BUDGET", b.to_string());
    }
    let stats_dir = if o.stats {
        // A reader of statistics clears what killed processes left in the user's directory.
        vrange::published::sweep();
        stats_dir()
    } else {
        None
    };
    if let Some(d) = &stats_dir {
        cmd.env("VRANGE_STATS_DIR", d.path());
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vrange run: cannot run {:?}: {e}", o.command[0]);
            return if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    let pid = child.id() as i32;
    CHILD.store(pid, std::sync::atomic::Ordering::Relaxed);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: the handler only calls kill(2), which is async-signal-safe.
        unsafe { libc::signal(sig, forward as *const () as libc::sighandler_t) };
    }
    let (status, usage) = wait(pid);
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    if let Some(d) = stats_dir {
        summary(d.path(), &usage);
        if let Err(e) = d.close() {
            eprintln!("vrange run: cannot remove the statistics directory: {e}");
        }
    }
    if libc::WIFSIGNALED(status) {
        reraise(libc::WTERMSIG(status));
    }
    code
}

/// A fresh directory for the program's statistics files: a random name, mode 0700 (tempfile's
/// default is 0777 less the umask), made by mkdir, which fails rather than accept a directory
/// someone else made, in `$TMPDIR` or /tmp. `None` (said on stderr) when it cannot be made: the
/// program runs without.
fn stats_dir() -> Option<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let made = tempfile::Builder::new()
        .prefix("vrange-run-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir();
    match made {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!(
                "vrange run: cannot create a private statistics directory: {e}; no --stats summary"
            );
            None
        }
    }
}

fn wait(pid: i32) -> (i32, libc::rusage) {
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for our child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waits for our own child; the pointers are valid.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            return (status, usage);
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return (status, usage);
        }
    }
}

/// Ends this process with the signal that ended the child, so a shell sees the same thing.
fn reraise(sig: i32) {
    // SAFETY: restoring the default action and raising a signal on ourselves.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Sums the final statistics every process of the tree left in `dir`.
fn summary(dir: &Path, usage: &libc::rusage) {
    let mut total: std::collections::BTreeMap<String, u64> = Default::default();
    let mut processes = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().ends_with(".stats") || name.to_string_lossy().starts_with('.') {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        processes += 1;
        for (k, v) in vrange::published::parse(&text) {
            if !matches!(k.as_str(), "pid" | "start_ticks" | "time_ns" | "page_size") {
                *total.entry(k).or_default() += v;
            }
        }
    }
    let get = |k: &str| total.get(k).copied().unwrap_or(0);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let page = vrange::page_size() as u64;
    eprintln!(
        "vrange run: peak RSS {:.1} MiB; {} minor page faults",
        usage.ru_maxrss as f64 / 1024.0,
        usage.ru_minflt
    );
    if processes == 0 {
        eprintln!(
            "vrange run: no process of the program made a large allocation (no vrange statistics)"
        );
        return;
    }
    eprintln!(
        "vrange run: {processes} process(es) used vrange-malloc: {} allocations; {:.1} MiB reused without a page fault (~{} faults saved), {:.1} MiB zero-filled",
        get("alloc_allocations"),
        mib(get("alloc_reused_intact_bytes")),
        get("alloc_reused_intact_bytes") / page,
        mib(get("alloc_zero_filled_bytes")),
    );
    eprintln!(
        "vrange run: at exit {:.1} MiB free and volatile; {:.1} MiB purged under pressure in all",
        mib(get("volatile_bytes")),
        mib(get("purged_total_bytes")),
    );
}
