//! Kernel feature probes: what this kernel and these privileges allow. The core calls each once
//! and keeps the answers (`vrange::features()`).
//!
//! Each probe performs the real operation on a scratch mapping (or opens the real file) rather
//! than trusting version numbers, and each feature records what vrange does without it.

use super::cgroup::MemCgroup;
use super::unavailable::Unavailable;
use super::{mem, procfs};
use std::io::Read;
use std::sync::atomic::{AtomicU8, Ordering};

/// Transparent huge page policy from `/sys/kernel/mm/transparent_hugepage/enabled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThpMode {
    /// Every large enough anonymous mapping gets huge pages.
    Always,
    /// Only ranges advised with MADV_HUGEPAGE (vrange advises its large regions).
    Madvise,
    /// Never.
    Never,
    /// The kernel has no THP support (or the file is unreadable).
    Unavailable,
}

/// MADV_PAGEOUT works (5.4).
pub fn madv_pageout_works() -> bool {
    try_advice(mem::reclaim_now)
}

/// MADV_POPULATE_WRITE works (5.14).
pub fn populate_write_works() -> bool {
    try_advice(mem::populate_write)
}

/// The PMD size (the THP size), 2 MiB where the kernel does not say.
pub fn thp_pmd_size() -> usize {
    read_number("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
        .unwrap_or(mem::HUGE_PAGE as u64) as usize
}

/// userfaultfd(2) usable for faults in user mode (UFFD_USER_MODE_ONLY).
pub fn userfaultfd_user_mode() -> bool {
    userfaultfd(UFFD_USER_MODE_ONLY).is_ok()
}

/// userfaultfd(2) for all faults, kernel-mode ones included; otherwise why not.
pub fn userfaultfd_kernel() -> Result<(), Unavailable> {
    userfaultfd(0).map_err(|e| match e.raw_os_error() {
        Some(libc::EPERM) => Unavailable {
            errno: Some(libc::EPERM),
            reason: "needs CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1".into(),
        },
        _ => Unavailable::from_io(&e),
    })
}

/// UFFDIO_MOVE (Linux 6.8): pages of the process's own anonymous memory move into a
/// userfaultfd-registered range without a copy (`uffd::move_works`, one real move on a scratch
/// mapping). Probed once, then cached; allocates nothing after that, so a refill region's
/// creation may ask. Without it refill regions copy each block into place (UFFDIO_COPY).
pub fn uffd_move() -> bool {
    static MOVES: AtomicU8 = AtomicU8::new(u8::MAX);
    match MOVES.load(Ordering::Relaxed) {
        u8::MAX => {
            let works = crate::uffd::move_works().is_ok();
            MOVES.store(u8::from(works), Ordering::Relaxed);
            works
        }
        known => known == 1,
    }
}

/// `/proc/pressure/memory` is readable (PSI).
pub fn psi_readable() -> bool {
    std::fs::read_to_string("/proc/pressure/memory").is_ok()
}

/// Whether these credentials may create a child memory cgroup of `cg` (see
/// [`MemCgroup::may_create_child`]); otherwise why not.
pub fn cgroup_create(cg: Option<&MemCgroup>) -> Result<(), Unavailable> {
    match cg {
        Some(c) => c.may_create_child(),
        None => Err(Unavailable::because("this process has no memory cgroup")),
    }
}

/// A thread may have a descriptor table of its own ([`crate::own_table`]); otherwise why not.
pub fn own_table() -> Result<(), Unavailable> {
    crate::own_table::apart(|| ()).map_err(|e| Unavailable::from_io(&e))
}

/// Maps a scratch page, writes it, applies `advise`, unmaps.
fn try_advice(advise: impl FnOnce(*mut u8, usize) -> std::io::Result<()>) -> bool {
    let page = mem::page_size();
    let Ok(ptr) = mem::map_anon(page, page) else {
        return false;
    };
    // SAFETY: ptr is a fresh private mapping of one page owned here.
    unsafe { ptr.as_ptr().write(1) };
    let ok = advise(ptr.as_ptr(), page).is_ok();
    // SAFETY: the scratch mapping is owned here and no reference into it exists.
    unsafe { mem::unmap(ptr, page) };
    ok
}

fn read_number(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The THP policy, read once and cached. Allocates nothing (a stack buffer), so region
/// creation can ask without the core's full feature report.
pub fn thp_mode() -> ThpMode {
    static MODE: AtomicU8 = AtomicU8::new(u8::MAX);
    const MODES: [ThpMode; 4] = [
        ThpMode::Always,
        ThpMode::Madvise,
        ThpMode::Never,
        ThpMode::Unavailable,
    ];
    if let Some(&mode) = MODES.get(usize::from(MODE.load(Ordering::Relaxed))) {
        return mode;
    }
    let mut buf = [0u8; 128];
    let n = std::fs::File::open("/sys/kernel/mm/transparent_hugepage/enabled")
        .and_then(|mut f| f.read(&mut buf))
        .unwrap_or(0);
    let mode = parse_thp_mode(&buf[..n]);
    MODE.store(
        MODES.iter().position(|m| *m == mode).unwrap_or(3) as u8,
        Ordering::Relaxed,
    );
    mode
}

/// The bracketed word of `always [madvise] never`.
fn parse_thp_mode(text: &[u8]) -> ThpMode {
    let chosen = text
        .split(|&b| b == b'[')
        .nth(1)
        .and_then(|rest| rest.split(|&b| b == b']').next());
    match chosen {
        Some(b"always") => ThpMode::Always,
        Some(b"madvise") => ThpMode::Madvise,
        Some(b"never") => ThpMode::Never,
        _ => ThpMode::Unavailable,
    }
}

pub fn mthp_sizes() -> Vec<usize> {
    let mut sizes: Vec<usize> = std::fs::read_dir("/sys/kernel/mm/transparent_hugepage")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let kb: usize = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            Some(kb * 1024)
        })
        .collect();
    sizes.sort_unstable();
    sizes
}

/// Whether MADV_DONTNEED over a whole 2 MiB block frees its page table on this kernel
/// (PT_RECLAIM), measured once per process (the first call maps 128 MiB of address space,
/// touches 64 pages and unmaps them); an inconclusive measurement counts as yes, so that the
/// fallback (`mem::purge_remap`) is used only where the kernel plainly keeps the tables.
pub fn frees_page_tables() -> bool {
    static FREES: crate::lock::ForkOnce<bool> = crate::lock::ForkOnce::new();
    *FREES.get_or_init(|| pt_reclaim().unwrap_or(true))
}

/// Touches one page in each of 64 2 MiB blocks (64 page tables, 256 KiB of VmPTE on x86-64),
/// drops them with MADV_DONTNEED and sees whether VmPTE falls back.
pub fn pt_reclaim() -> Option<bool> {
    const BLOCKS: usize = 64;
    let len = BLOCKS * mem::HUGE_PAGE;
    let ptr = mem::map_anon(len, mem::HUGE_PAGE).ok()?;
    let base = ptr.as_ptr();
    let _ = mem::advise_huge(base, len, false);
    let measure = || procfs::status(None).ok().map(|s| s.vm_pte_kb);
    let before = measure();
    for i in 0..BLOCKS {
        // SAFETY: i * HUGE_PAGE < len, inside the probe's own mapping.
        unsafe { base.add(i * mem::HUGE_PAGE).write(1) };
    }
    let touched = measure();
    // SAFETY: the probe owns the mapping; its content is not needed.
    let dropped = unsafe { mem::purge_forced(base, len) }
        .ok()
        .and_then(|_| measure());
    // SAFETY: the probe owns the mapping and holds no reference into it.
    unsafe { mem::unmap(ptr, len) };
    let (before, touched, dropped) = (before?, touched?, dropped?);
    let grown = touched.saturating_sub(before);
    // Other threads can change VmPTE meanwhile; demand a clear signal either way.
    if grown < 128 {
        return None;
    }
    Some(touched.saturating_sub(dropped) >= grown * 3 / 4)
}

const UFFD_USER_MODE_ONLY: libc::c_long = 1;

/// Creates and closes a userfaultfd with `flags`.
fn userfaultfd(flags: libc::c_long) -> std::io::Result<()> {
    // SAFETY: userfaultfd takes flags only and returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_userfaultfd,
            libc::O_CLOEXEC as libc::c_long | flags,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just returned to us.
    unsafe { libc::close(fd as i32) };
    Ok(())
}

/// Opens and closes `/dev/userfaultfd` (opening creates nothing; the USERFAULTFD_IOC_NEW
/// ioctl would).
pub fn userfaultfd_dev() -> Result<(), Unavailable> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Unavailable {
            errno: e.raw_os_error(),
            reason: "not present".into(),
        }),
        Err(e) => Err(Unavailable::from_io(&e)),
    }
}

pub fn map_droppable_works() -> bool {
    let page = mem::page_size();
    match mem::map_droppable(page, page) {
        Ok(p) => {
            // SAFETY: the mapping was just made here and nothing refers into it.
            unsafe { mem::unmap(p, page) };
            true
        }
        Err(_) => false,
    }
}

pub fn process_madvise_works() -> bool {
    // SAFETY: pidfd_open on our own pid returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    if pidfd < 0 {
        return false;
    }
    let ok = try_advice(|p, l| {
        let iov = libc::iovec {
            iov_base: p.cast(),
            iov_len: l,
        };
        // SAFETY: iov describes one page of the probe's scratch mapping; MADV_COLD keeps content.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                pidfd,
                &iov,
                1,
                libc::MADV_COLD,
                0,
            )
        };
        if rc == l as libc::c_long {
            Ok(())
        } else {
            Err(std::io::Error::from_raw_os_error(libc::EINVAL))
        }
    });
    // SAFETY: pidfd was opened above.
    unsafe { libc::close(pidfd as i32) };
    ok
}

pub fn psi_trigger_works() -> Result<(), Unavailable> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/pressure/memory")
        .map_err(|e| Unavailable::from_io(&e).within("cannot open /proc/pressure/memory"))?;
    // The trigger string must include its NUL; unprivileged windows are multiples of 2 s.
    // Kernels before 6.5 refuse every trigger without CAP_SYS_RESOURCE.
    f.write_all(b"some 150000 2000000\0")
        .map_err(|e| Unavailable::from_io(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thp_mode_is_the_bracketed_word() {
        assert_eq!(
            parse_thp_mode(b"always [madvise] never\n"),
            ThpMode::Madvise
        );
        assert_eq!(parse_thp_mode(b"[always] madvise never\n"), ThpMode::Always);
        assert_eq!(parse_thp_mode(b"always madvise [never]\n"), ThpMode::Never);
        assert_eq!(parse_thp_mode(b""), ThpMode::Unavailable);
        assert_eq!(thp_mode(), thp_mode(), "cached");
    }
}
