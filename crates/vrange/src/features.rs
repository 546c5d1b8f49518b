//! What the running kernel offers vrange: the OS layer's probes, each called once, reported in
//! the core's own types: `vrange features`, `vrange_features()` and the tests' skip policy read
//! the same answers.

use std::fmt;
use std::path::PathBuf;
use vrange_sys::lock::ForkOnce;
use vrange_sys::probe as sys;

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

/// The cgroup hierarchy holding this process's memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// cgroup v1: `memory.limit_in_bytes`, vmpressure events.
    V1,
    /// cgroup v2: `memory.max`/`memory.high`, PSI in `memory.pressure`.
    V2,
}

/// Why a feature is not available to this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// The errno behind it, when the kernel answered one (EPERM, EACCES, ENOSYS, EINVAL...).
    pub errno: Option<i32>,
    /// In words: "not permitted for uid 1000", "needs CAP_SYS_PTRACE or ...".
    pub reason: String,
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Unavailable {}

/// What the running kernel offers vrange, probed once; see [`features`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Features {
    /// Base page size in bytes.
    pub page_size: usize,
    /// MADV_FREE (4.5): the lazy purge path. Without it, marking records state but the kernel
    /// cannot discard anything: content is always kept.
    pub madv_free: bool,
    /// MADV_PAGEOUT (5.4): deterministic purge for tests and `vrange demo`. Without it, tests
    /// rely on cgroup pressure only.
    pub madv_pageout: bool,
    /// MADV_POPULATE_WRITE (5.14): prefaulting without writing. Without it, pages are touched.
    pub madv_populate_write: bool,
    /// THP policy; vrange requests huge pages for 2 MiB-aligned regions under `madvise`.
    pub thp: ThpMode,
    /// PMD size (the THP size), usually 2 MiB.
    pub thp_pmd_size: usize,
    /// Multi-size THP folio sizes the kernel offers (bytes), from `hugepages-*kB` directories.
    pub mthp_sizes: Vec<usize>,
    /// Whether MADV_DONTNEED over a whole 2 MiB block frees its page table (PT_RECLAIM),
    /// measured through VmPTE; `None` when it could not be measured.
    pub pt_reclaim: Option<bool>,
    /// PROCMAP_QUERY (6.11): range checks by ioctl. Without it, `/proc/self/maps` is parsed.
    pub procmap_query: bool,
    /// PAGEMAP_SCAN (6.7): an unmark proves a whole 2 MiB huge page with one pin. Without it,
    /// every page of a huge page is proven by its own pin.
    pub pagemap_scan: bool,
    /// userfaultfd(2) usable by this process for faults in user mode (UFFD_USER_MODE_ONLY).
    pub userfaultfd: bool,
    /// userfaultfd(2) for all faults, kernel-mode ones included (needs CAP_SYS_PTRACE or
    /// `vm.unprivileged_userfaultfd=1`); otherwise why not, in words.
    pub userfaultfd_kernel: Result<(), Unavailable>,
    /// `/dev/userfaultfd` can be opened by this process; otherwise why not.
    pub userfaultfd_dev: Result<(), Unavailable>,
    /// UFFDIO_MOVE (6.8): refill regions move the pages of their fill buffer into place, and
    /// near the memory cgroup's limit fill it with their oldest blocks' pages (no copy, no
    /// charge). Without it (or with `VRANGE_REFILL_MOVE=off`) they copy each block into place.
    pub uffd_move: bool,
    /// MAP_DROPPABLE (6.11) mappings can be created.
    pub map_droppable: bool,
    /// process_madvise(2) on our own pidfd (5.10) works.
    pub process_madvise: bool,
    /// `/proc/pressure/memory` readable (PSI).
    pub psi: bool,
    /// A PSI trigger with a 2 s window could be armed on `/proc/pressure/memory`; otherwise why
    /// not.
    pub psi_trigger: Result<(), Unavailable>,
    /// CAP_SYS_RESOURCE is effective: PSI windows from 500 ms rather than in 2 s steps.
    pub cap_sys_resource: bool,
    /// This process's memory cgroup, if any: version and directory.
    pub cgroup: Option<(CgroupVersion, PathBuf)>,
    /// That cgroup's memory limit in bytes, if set.
    pub cgroup_limit: Option<u64>,
    /// These credentials may create a child memory cgroup of that cgroup (see
    /// the cgroup's files and, on v2, its member processes); otherwise why not.
    pub cgroup_create: Result<(), Unavailable>,
    /// A thread may have a descriptor table of its own ( close_range with
    /// CLOSE_RANGE_UNSHARE, Linux 5.9, or unshare(CLONE_FILES)); otherwise why not.
    pub own_table: Result<(), Unavailable>,
}

/// The features of this kernel, probed on first call and cached for the process.
pub fn features() -> &'static Features {
    static FEATURES: ForkOnce<Features> = ForkOnce::new();
    FEATURES.get_or_init(probe)
}

/// Each of the OS layer's probes, once (several try the real operation on a scratch mapping).
fn probe() -> Features {
    use vrange_sys::cgroup::{MemCgroup, Version};
    use vrange_sys::{mem, pagemap, vma};
    let cg = MemCgroup::current();
    Features {
        page_size: mem::page_size(),
        madv_free: mem::lazy_free_supported(),
        madv_pageout: sys::madv_pageout_works(),
        madv_populate_write: sys::populate_write_works(),
        thp: thp(sys::thp_mode()),
        thp_pmd_size: sys::thp_pmd_size(),
        mthp_sizes: sys::mthp_sizes(),
        pt_reclaim: sys::pt_reclaim(),
        procmap_query: vma::has_procmap_query(),
        pagemap_scan: pagemap::has_pagemap_scan(),
        userfaultfd: sys::userfaultfd_user_mode(),
        userfaultfd_kernel: sys::userfaultfd_kernel().map_err(unavailable),
        userfaultfd_dev: sys::userfaultfd_dev().map_err(unavailable),
        uffd_move: sys::uffd_move(),
        map_droppable: sys::map_droppable_works(),
        process_madvise: sys::process_madvise_works(),
        psi: sys::psi_readable(),
        psi_trigger: sys::psi_trigger_works().map_err(unavailable),
        cap_sys_resource: vrange_sys::pressure::has_cap_sys_resource(),
        cgroup_limit: cg.as_ref().and_then(MemCgroup::limit),
        cgroup_create: sys::cgroup_create(cg.as_ref()).map_err(unavailable),
        cgroup: cg.map(|c| {
            let v = match c.version() {
                Version::V1 => CgroupVersion::V1,
                Version::V2 => CgroupVersion::V2,
            };
            (v, c.path().to_path_buf())
        }),
        own_table: sys::own_table().map_err(unavailable),
    }
}

fn unavailable(u: vrange_sys::unavailable::Unavailable) -> Unavailable {
    Unavailable {
        errno: u.errno,
        reason: u.reason,
    }
}

pub(crate) fn thp(mode: sys::ThpMode) -> ThpMode {
    match mode {
        sys::ThpMode::Always => ThpMode::Always,
        sys::ThpMode::Madvise => ThpMode::Madvise,
        sys::ThpMode::Never => ThpMode::Never,
        sys::ThpMode::Unavailable => ThpMode::Unavailable,
    }
}

impl fmt::Display for ThpMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ThpMode::Always => "always",
            ThpMode::Madvise => "madvise",
            ThpMode::Never => "never",
            ThpMode::Unavailable => "not available",
        })
    }
}

/// One line of the report per feature: the name, a colon, and the answer in words, aligned.
/// A missing feature says what vrange does without it; a refused permission says why.
impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let yes = |b: bool, without: &str| -> String {
            match (b, without) {
                (true, _) => "yes".into(),
                (false, "") => "no".into(),
                (false, w) => format!("no; without it {w}"),
            }
        };
        let allowed = |r: &Result<(), Unavailable>| match r {
            Ok(()) => "yes".to_string(),
            Err(why) => format!("no ({why})"),
        };
        let kib = |sizes: &[usize]| {
            let list: Vec<String> = sizes.iter().map(|s| (s >> 10).to_string()).collect();
            if list.is_empty() {
                "none".to_string()
            } else {
                format!("{} KiB", list.join(", "))
            }
        };
        let thp = match self.thp {
            ThpMode::Always => "always (every large enough anonymous mapping)",
            ThpMode::Madvise => {
                "madvise (ranges advised huge; vrange advises 2 MiB-aligned regions)"
            }
            ThpMode::Never => "never; without it 4 KiB pages",
            ThpMode::Unavailable => "not available; without it 4 KiB pages",
        };
        let psi_trigger = match &self.psi_trigger {
            Ok(()) if self.cap_sys_resource => {
                "yes, windows from 500 ms to 10 s (CAP_SYS_RESOURCE)".to_string()
            }
            Ok(()) => "yes, windows of 2, 4, 6, 8 or 10 s (no CAP_SYS_RESOURCE)".to_string(),
            Err(why) => format!("no ({why})"),
        };
        let cgroup = match &self.cgroup {
            Some((v, p)) => format!(
                "{}, {}, {}",
                match v {
                    CgroupVersion::V1 => "v1",
                    CgroupVersion::V2 => "v2",
                },
                p.display(),
                self.cgroup_limit
                    .map_or("no limit".into(), |l| format!("limit {} MiB", l >> 20))
            ),
            None => "none".into(),
        };
        // SIGBUS mode and refill regions need a userfaultfd, from the system call or the device.
        let userfaultfd = match (self.userfaultfd, &self.userfaultfd_dev) {
            (true, _) => "yes".to_string(),
            (false, Ok(())) => "no; /dev/userfaultfd serves instead".to_string(),
            (false, Err(_)) => "no (refused, or not built); SIGBUS mode and refill regions fail \
                 with ENOTSUP: allow the userfaultfd system call (a container's seccomp profile) \
                 or give access to /dev/userfaultfd"
                .to_string(),
        };
        let own_table = match &self.own_table {
            Ok(()) => "yes (the reclaimer's descriptors are never in the program's)".to_string(),
            Err(why) => format!(
                "no ({why}); without it the reclaimer opens files in the program's table, \
                 only while 0, 1 and 2 are open"
            ),
        };
        let rows: [(&str, String); 20] = [
            ("page size", format!("{} bytes", self.page_size)),
            ("MADV_FREE", yes(self.madv_free, "marking keeps every page")),
            (
                "MADV_PAGEOUT",
                yes(self.madv_pageout, "purges wait for real pressure"),
            ),
            (
                "MADV_POPULATE_WRITE",
                yes(self.madv_populate_write, "pages are touched"),
            ),
            (
                "THP",
                format!("{thp}; PMD size {} KiB", self.thp_pmd_size >> 10),
            ),
            ("mTHP sizes", kib(&self.mthp_sizes)),
            (
                "PT_RECLAIM",
                self.pt_reclaim.map_or("not measured".into(), |b| {
                    yes(b, "page tables stay after purges")
                }),
            ),
            (
                "PROCMAP_QUERY",
                yes(self.procmap_query, "/proc/self/maps is parsed"),
            ),
            (
                "PAGEMAP_SCAN",
                yes(self.pagemap_scan, "huge pages are proven page by page"),
            ),
            ("userfaultfd", userfaultfd),
            (
                "userfaultfd, kernel faults",
                allowed(&self.userfaultfd_kernel),
            ),
            ("/dev/userfaultfd", allowed(&self.userfaultfd_dev)),
            (
                "UFFDIO_MOVE",
                yes(
                    self.uffd_move,
                    "refill regions copy each block into place (UFFDIO_COPY)",
                ),
            ),
            ("MAP_DROPPABLE", yes(self.map_droppable, "")),
            (
                "process_madvise",
                yes(self.process_madvise, "one madvise per range"),
            ),
            ("PSI", yes(self.psi, "cgroup and budget sources only")),
            ("PSI triggers", psi_trigger),
            ("memory cgroup", cgroup),
            ("create memory cgroups", allowed(&self.cgroup_create)),
            ("own descriptor table", own_table),
        ];
        let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0) + 1;
        for (name, value) in rows {
            writeln!(f, "{:<width$} {value}", format!("{name}:"))?;
        }
        Ok(())
    }
}
