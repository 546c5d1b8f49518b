//! `vrange run`: runs a program with libvrange_malloc preloaded and passes its exit status (or
//! the signal that ended it) through. With `--stats` every process of the program's tree
//! publishes its statistics into a fresh private directory (`VRANGE_STATS_DIR`, made by
//! `tempfile` with a random name and mode 0700, removed at the end), which `run` sums up at the
//! end with the peak RSS from wait4.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Options {
    /// `None`: `VRANGE_MALLOC_MODE` from the environment when set, else hybrid.
    pub mode: Option<vrange::Policy>,
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

/// The symbol the shim must define: it is there to interpose malloc.
const SHIM_SYMBOL: &[u8] = b"malloc";

/// Whether `lib` is something the dynamic loader would preload as the shim: a readable ELF
/// shared object of this process's class, byte order and machine, whose dynamic symbol table
/// defines `malloc`. The loader itself only prints a warning and runs the program without it
/// (`ld.so: object ... cannot be preloaded: ignored`), so this is checked before. Parsed here
/// rather than `dlopen`ed: loading the shim into this process would run its initialiser (which
/// reads the `VRANGE_*` settings and warns) in the command itself.
pub fn check_shim(lib: &Path) -> Result<(), String> {
    let bytes = std::fs::read(lib).map_err(|e| vrange_sys::statsdir::plain(&e))?;
    let ours = std::fs::File::open("/proc/self/exe")
        .and_then(|f| {
            use std::io::Read;
            let mut head = [0u8; 20];
            f.take(20).read_exact(&mut head).map(|()| head)
        })
        .map_err(|e| format!("cannot read this executable's ELF header: {e}"))?;
    elf_defines(&bytes, &ours, SHIM_SYMBOL)
}

/// The checks of [`check_shim`] on an ELF image, against `ours` (the first 20 bytes of this
/// executable: identification, type and machine). Every offset and size read from the file is
/// bounds-checked.
fn elf_defines(elf: &[u8], ours: &[u8; 20], symbol: &[u8]) -> Result<(), String> {
    const NOT: &str = "not a shared library (no ELF header)";
    if elf.len() < 64 || elf[..4] != *b"\x7fELF" {
        return Err(NOT.into());
    }
    // Class (32/64-bit), byte order; then e_machine.
    if elf[4..6] != ours[4..6] || elf[18..20] != ours[18..20] {
        return Err("an ELF object for another machine or word size".into());
    }
    // Only 64-bit objects are parsed below; the command runs on x86-64 and arm64.
    if elf[4] != 2 {
        return Err("a 32-bit ELF object".into());
    }
    let le = elf[5] == 1;
    let u16_at = |at: usize| -> Option<u64> {
        let b: [u8; 2] = elf.get(at..at.checked_add(2)?)?.try_into().ok()?;
        Some(u64::from(if le {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        }))
    };
    let u32_at = |at: usize| -> Option<u64> {
        let b: [u8; 4] = elf.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(u64::from(if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }))
    };
    let u64_at = |at: usize| -> Option<u64> {
        let b: [u8; 8] = elf.get(at..at.checked_add(8)?)?.try_into().ok()?;
        Some(if le {
            u64::from_le_bytes(b)
        } else {
            u64::from_be_bytes(b)
        })
    };
    const ET_DYN: u64 = 3;
    if u16_at(16) != Some(ET_DYN) {
        return Err("an ELF object but not a shared library".into());
    }
    let truncated = || "a truncated or malformed ELF object".to_string();
    let us = |v: u64| usize::try_from(v).ok();
    let shoff = u64_at(40).and_then(us).ok_or_else(truncated)?;
    let shentsize = u16_at(58).and_then(us).ok_or_else(truncated)?;
    let shnum = u16_at(60).and_then(us).ok_or_else(truncated)?;
    if shentsize < 64 {
        return Err(truncated());
    }
    let section = |i: usize| -> Option<usize> { shoff.checked_add(i.checked_mul(shentsize)?) };
    const SHT_DYNSYM: u64 = 11;
    for i in 0..shnum {
        let sh = section(i).ok_or_else(truncated)?;
        if u32_at(sh + 4) != Some(SHT_DYNSYM) {
            continue;
        }
        let field = |at: usize| u64_at(sh + at).and_then(us).ok_or_else(truncated);
        let (offset, size, entsize) = (field(24)?, field(32)?, field(56)?);
        let link = u32_at(sh + 40).and_then(us).ok_or_else(truncated)?;
        let strtab = section(link).ok_or_else(truncated)?;
        let str_off = u64_at(strtab + 24).and_then(us).ok_or_else(truncated)?;
        let str_size = u64_at(strtab + 32).and_then(us).ok_or_else(truncated)?;
        let end = str_off.checked_add(str_size).ok_or_else(truncated)?;
        let strings = elf.get(str_off..end).ok_or_else(truncated)?;
        if entsize < 24 {
            return Err(truncated());
        }
        for n in 0..size / entsize {
            let sym = n
                .checked_mul(entsize)
                .and_then(|o| o.checked_add(offset))
                .ok_or_else(truncated)?;
            let name = u32_at(sym).and_then(us).ok_or_else(truncated)?;
            let info = *elf.get(sym + 4).ok_or_else(truncated)?;
            let shndx = u16_at(sym + 6).ok_or_else(truncated)?;
            let Some(rest) = strings.get(name..) else {
                continue;
            };
            let name = rest.split(|&b| b == 0).next().unwrap_or(&[]);
            // Defined (not SHN_UNDEF), global or weak binding.
            if name == symbol && shndx != 0 && matches!(info >> 4, 1 | 2) {
                return Ok(());
            }
        }
    }
    Err(format!(
        "a shared library that does not define {} (not libvrange_malloc.so)",
        String::from_utf8_lossy(symbol)
    ))
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
    // The loader resolves a relative LD_PRELOAD entry from each process's working directory;
    // a program that changes directory would lose the shim.
    let lib = std::path::absolute(&lib).unwrap_or(lib);
    if let Err(why) = check_shim(&lib) {
        let given = if o.lib.is_some() { "--lib " } else { "" };
        eprintln!(
            "vrange run: {given}{}: {why}; the program would run without vrange",
            lib.display()
        );
        // A bad --lib is a usage error; a broken shim where it was found, like a missing one.
        return if o.lib.is_some() { 2 } else { 127 };
    }
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
    // An explicit --mode wins; else the documented variable is left to the allocator, which
    // reads it (and warns in one line about a malformed value, as for every setting); else the
    // default, hybrid.
    let mode = match o.mode {
        Some(vrange::Policy::Lazy) => Some("lazy"),
        Some(vrange::Policy::Managed) => Some("managed"),
        Some(vrange::Policy::Hybrid) => Some("hybrid"),
        None if std::env::var_os("VRANGE_MALLOC_MODE").is_some() => None,
        None => Some("hybrid"),
    };
    if let Some(mode) = mode {
        cmd.env("VRANGE_MALLOC_MODE", mode);
    }
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

/// Sums the final statistics every process of the tree left in `dir`. Each figure is named
/// for what it measures: the kernel's counts (peak RSS, minor faults: pages the program really
/// touched, of any memory) beside the allocator's, which count blocks it handed out, that is
/// address space, whether or not the program then touched every page of them.
fn summary(dir: &Path, usage: &libc::rusage) {
    eprint!("{}", summary_text(dir, usage, vrange::page_size() as u64));
}

fn summary_text(dir: &Path, usage: &libc::rusage, page: u64) -> String {
    use crate::out::count;
    let mut total: std::collections::BTreeMap<String, u64> = Default::default();
    let mut processes = 0u64;
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
                let sum = total.entry(k).or_default();
                *sum = sum.saturating_add(v);
            }
        }
    }
    let get = |k: &str| total.get(k).copied().unwrap_or(0);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let minflt = u64::try_from(usage.ru_minflt).unwrap_or(0);
    let mut out = format!(
        "vrange run: peak RSS {:.1} MiB (the largest process); {} (pages the program touched \
         for the first time or after a purge, in every kind of memory)\n",
        usage.ru_maxrss as f64 / 1024.0,
        count(minflt, "minor page fault", None),
    );
    if processes == 0 {
        out.push_str(
            "vrange run: no vrange statistics: no process of the program published any (only \
             a process whose allocator served a block of at least VRANGE_MALLOC_THRESHOLD, \
             64 KiB by default, runs the reclaimer that publishes them)\n",
        );
        return out;
    }
    let reused = get("alloc_reused_intact_bytes");
    out.push_str(&format!(
        "vrange run: {} published vrange statistics: vrange-malloc served {}; of the address \
         space it handed out, {:.1} MiB was reused intact (~{} saved) and {:.1} MiB was fresh \
         or purged (the kernel zero-fills such a page only if it is touched: see the minor \
         page faults)\n",
        count(processes, "process", Some("processes")),
        count(get("alloc_allocations"), "allocation", None),
        mib(reused),
        count(reused / page.max(1), "page fault", None),
        mib(get("alloc_zero_filled_bytes")),
    ));
    out.push_str(&format!(
        "vrange run: at exit {:.1} MiB free and volatile; {:.1} MiB purged under pressure in all\n",
        mib(get("volatile_bytes")),
        mib(get("purged_total_bytes")),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(minflt: i64) -> libc::rusage {
        // SAFETY: rusage is plain data; all zeros is a valid value.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        u.ru_minflt = minflt;
        u.ru_maxrss = 1024;
        u
    }

    /// Issue 20: "1 allocations", "process(es)"; and a 12,572 MiB "zero-filled" figure that
    /// was address space handed out, printed as if the kernel had filled it.
    #[test]
    fn stats_summary_says_one_allocation_and_names_address_space_for_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("vrange-42.stats"),
            "pid=42\nalloc_allocations=1\nalloc_zero_filled_bytes=13182697472\n\
             alloc_reused_intact_bytes=4096\n",
        )
        .unwrap();
        let text = summary_text(dir.path(), &usage(1), 4096);
        assert!(text.contains(" 1 minor page fault "), "{text}");
        assert!(text.contains("1 process published"), "{text}");
        assert!(text.contains("served 1 allocation;"), "{text}");
        assert!(text.contains("~1 page fault saved"), "{text}");
        assert!(
            !text.contains("(es)") && !text.contains("zero-filled"),
            "{text}"
        );
        assert!(text.contains("12572.0 MiB was fresh or purged"), "{text}");
        assert!(text.contains("address space"), "{text}");
    }

    /// Issue 19: the summary claimed "no process of the program made a large allocation"
    /// when it had only found no statistics file.
    #[test]
    fn stats_summary_without_files_says_only_what_it_saw() {
        let dir = tempfile::tempdir().unwrap();
        let text = summary_text(dir.path(), &usage(2), 4096);
        assert!(!text.contains("large allocation"), "{text}");
        assert!(
            text.contains("no process of the program published any"),
            "{text}"
        );
        assert!(text.contains("2 minor page faults"), "{text}");
    }

    #[test]
    fn a_file_that_is_not_the_shim_is_refused() {
        let ours: [u8; 20] = std::fs::read("/proc/self/exe").unwrap()[..20]
            .try_into()
            .unwrap();
        let exe = std::fs::read("/proc/self/exe").unwrap();
        // A test executable (a PIE: ET_DYN) imports malloc; it does not define it.
        let e = elf_defines(&exe, &ours, SHIM_SYMBOL).unwrap_err();
        assert!(e.contains("does not define malloc"), "{e}");
        assert!(elf_defines(b"#!/bin/sh\n", &ours, SHIM_SYMBOL).is_err());
        let mut other = exe.clone();
        other[18] ^= 0xff; // another machine
        assert!(elf_defines(&other, &ours, SHIM_SYMBOL)
            .unwrap_err()
            .contains("another machine"));
        // Truncated anywhere: refused, never a panic.
        for len in [64, 100, 1000, exe.len() / 2] {
            assert!(elf_defines(&exe[..len], &ours, SHIM_SYMBOL).is_err());
        }
    }
}
