//! The confinement users' containers put a program in, reproduced for a child process: Docker's
//! default seccomp profile and capabilities, or an unprivileged user.
//!
//! [`Confinement::Docker`]: the calls of Docker's default profile (moby
//! `profiles/seccomp/default.json`) that a default container is refused and vrange may make:
//! `userfaultfd` (not in the profile at all), `process_madvise`, `pidfd_getfd` and `kcmp`
//! (allowed only with CAP_SYS_PTRACE), `unshare` and `setns` (only with CAP_SYS_ADMIN) fail with
//! EPERM, and `clone3` with ENOSYS (so that the C library falls back to `clone`). Every other
//! call is allowed, as the profile allows every other call vrange makes (`close_range`,
//! `memfd_create`, `madvise`, `mincore`, `eventfd2`, AF_UNIX sockets, `pidfd_open`, ...). The
//! process stays root with Docker's default capability set, which lacks CAP_SYS_RESOURCE (PSI
//! windows in 2 s steps), CAP_SYS_PTRACE and CAP_SYS_ADMIN, and sees a `/dev` of its own as a
//! container does: a tmpfs with `null`, `zero`, `full`, `random`, `urandom` and `tty`, a fresh
//! `shm`, and no `userfaultfd`, and the cgroup file system read-only (in a mount namespace of
//! its own).
//!
//! [`Confinement::Unprivileged`]: user and group `nobody` (65534), no supplementary groups, no
//! capability: no cgroup creation, PSI windows in 2 s steps, userfaultfd for user-mode faults
//! only (with the usual `vm.unprivileged_userfaultfd = 0`).
//!
//! The filters are compiled in the parent (it allocates) and installed between fork and exec.

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// How a child is confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confinement {
    /// Docker's default seccomp profile and capabilities, as root.
    Docker,
    /// User `nobody`, no capability, no seccomp filter.
    Unprivileged,
}

/// The unprivileged user and group.
pub const NOBODY: u32 = 65534;

/// The calls a default Docker container is refused with EPERM, of those vrange may make.
const REFUSED: &[i64] = &[
    libc::SYS_userfaultfd,
    libc::SYS_process_madvise,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    libc::SYS_unshare,
    libc::SYS_setns,
];

/// Docker's default capabilities (`oci/caps/defaults.go`): CHOWN, DAC_OVERRIDE, FSETID, FOWNER,
/// MKNOD, NET_RAW, SETGID, SETUID, SETFCAP, SETPCAP, NET_BIND_SERVICE, SYS_CHROOT, KILL,
/// AUDIT_WRITE, as bits of the first capability word (all are below 32).
const DOCKER_CAPS: u32 = (1 << 0) // CHOWN
    | (1 << 1) // DAC_OVERRIDE
    | (1 << 4) // FSETID
    | (1 << 3) // FOWNER
    | (1 << 27) // MKNOD
    | (1 << 13) // NET_RAW
    | (1 << 6) // SETGID
    | (1 << 7) // SETUID
    | (1 << 31) // SETFCAP
    | (1 << 8) // SETPCAP
    | (1 << 10) // NET_BIND_SERVICE
    | (1 << 18) // SYS_CHROOT
    | (1 << 5) // KILL
    | (1 << 29); // AUDIT_WRITE

fn filter(calls: &[i64], errno: u32) -> BpfProgram {
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        calls.iter().map(|&nr| (nr, Vec::new())).collect();
    let arch = TargetArch::try_from(std::env::consts::ARCH).expect("a seccompiler architecture");
    SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno),
        arch,
    )
    .and_then(BpfProgram::try_from)
    .expect("the filter compiles")
}

/// Docker's refusals, as two filters (EPERM, and ENOSYS for clone3).
fn docker_filters() -> [BpfProgram; 2] {
    [
        filter(REFUSED, libc::EPERM as u32),
        filter(&[libc::SYS_clone3], libc::ENOSYS as u32),
    ]
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Sets the calling process's capabilities to `low` (the first word) and nothing above.
/// Async-signal-safe: one capset(2) on stack data.
fn set_caps(low: u32) -> std::io::Result<()> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: low,
            permitted: low,
            inheritable: 0,
        },
        CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
    ];
    // SAFETY: capset reads one header and two data words, all on the stack for the call.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Confinement {
    /// Makes `cmd` start confined (between fork and exec). Needs root.
    /// `scratch` holds a mount point for Docker's `/dev`.
    pub fn apply<'a>(
        self,
        cmd: &'a mut Command,
        scratch: &crate::scratch::Scratch,
    ) -> &'a mut Command {
        match self {
            Confinement::Docker => {
                let filters = docker_filters();
                let dev = ContainerDev::new(scratch);
                // SAFETY: the closure makes only system calls (unshare, mount, mknod, capset,
                // prctl, seccomp) on data prepared before the fork: async-signal-safe.
                unsafe {
                    cmd.pre_exec(move || {
                        dev.mount()?;
                        set_caps(DOCKER_CAPS)?;
                        for f in &filters {
                            seccompiler::apply_filter(f)
                                .map_err(|_| std::io::Error::from_raw_os_error(libc::EPERM))?;
                        }
                        Ok(())
                    })
                }
            }
            Confinement::Unprivileged => {
                let _ = scratch;
                // SAFETY: as above (setgroups, setgid, setuid).
                unsafe {
                    cmd.pre_exec(|| {
                        if libc::setgroups(0, std::ptr::null()) != 0
                            || libc::setgid(NOBODY) != 0
                            || libc::setuid(NOBODY) != 0
                        {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    })
                }
            }
        }
    }

    /// Its name, for messages and role names.
    pub fn name(self) -> &'static str {
        match self {
            Confinement::Docker => "docker",
            Confinement::Unprivileged => "unprivileged",
        }
    }
}

/// A command that re-executes this test binary confined, to run only `test` as `role` (see
/// [`crate::role`]). For [`Confinement::Unprivileged`] the binary is first copied into a
/// scratch directory that user can read (the build directory may not be), and the child starts
/// in `/`; callers hold [`crate::serial`] meanwhile (a child another test forks while the copy
/// is open for writing makes the exec fail with ETXTBSY).
pub fn role_command(
    confinement: Confinement,
    scratch: &crate::scratch::Scratch,
    test: &str,
    role: &str,
) -> Command {
    use std::os::unix::fs::PermissionsExt;
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = match confinement {
        Confinement::Docker => crate::role::role_command_at(&exe, test, role),
        Confinement::Unprivileged => {
            let copy = scratch.join("test-binary");
            std::fs::copy(&exe, &copy).expect("copy the test binary");
            for p in [scratch.path(), copy.as_path()] {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            }
            let mut cmd = crate::role::role_command_at(&copy, test, role);
            cmd.current_dir("/");
            cmd
        }
    };
    confinement.apply(&mut cmd, scratch);
    cmd
}

/// `cmd`'s output, for a program copied just before (a public copy of a binary): while another
/// thread's fork still holds the copy's write descriptor (until that child execs), exec fails
/// with ETXTBSY; then it is tried again, for up to 5 s.
pub fn output_of_copy(cmd: &mut Command) -> std::io::Result<std::process::Output> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match cmd.output() {
            Err(e)
                if e.raw_os_error() == Some(libc::ETXTBSY)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// The paths of a container's `/dev`, prepared before the fork.
struct ContainerDev {
    /// Where the host's `/dev` stays reachable while the container's is made.
    host: CString,
    /// (host device, the container's node) for each device a container gets.
    devices: Vec<(CString, CString)>,
}

fn c(s: impl Into<Vec<u8>>) -> CString {
    CString::new(s).expect("no NUL in a path")
}

fn check(rc: libc::c_int) -> std::io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl ContainerDev {
    fn new(scratch: &crate::scratch::Scratch) -> ContainerDev {
        let host = scratch.join("host-dev");
        std::fs::create_dir_all(&host).expect("mount point");
        let host_s = host.to_str().expect("a UTF-8 scratch path").to_string();
        let devices = ["null", "zero", "full", "random", "urandom", "tty"]
            .iter()
            .map(|d| (c(format!("{host_s}/{d}")), c(format!("/dev/{d}"))))
            .collect();
        ContainerDev {
            host: c(host_s),
            devices,
        }
    }

    /// In the child: a mount namespace of its own, and a tmpfs `/dev` holding what Docker's
    /// does. Only system calls on the prepared strings.
    fn mount(&self) -> std::io::Result<()> {
        let none = std::ptr::null::<libc::c_char>();
        let no_data = std::ptr::null::<libc::c_void>();
        // SAFETY: every pointer is a NUL-terminated string that lives across the calls, or
        // null where mount(2) takes null.
        unsafe {
            check(libc::unshare(libc::CLONE_NEWNS))?;
            let private = libc::MS_REC | libc::MS_PRIVATE;
            check(libc::mount(none, c"/".as_ptr(), none, private, no_data))?;
            let bind_all = libc::MS_BIND | libc::MS_REC;
            check(libc::mount(
                c"/dev".as_ptr(),
                self.host.as_ptr(),
                none,
                bind_all,
                no_data,
            ))?;
            let tmpfs = c"tmpfs".as_ptr();
            let opts = c"mode=755,size=64k".as_ptr().cast();
            check(libc::mount(
                tmpfs,
                c"/dev".as_ptr(),
                tmpfs,
                libc::MS_NOSUID,
                opts,
            ))?;
            for (host, node) in &self.devices {
                // An empty regular file to bind the device onto.
                check(libc::mknod(node.as_ptr(), libc::S_IFREG | 0o666, 0))?;
                check(libc::mount(
                    host.as_ptr(),
                    node.as_ptr(),
                    none,
                    libc::MS_BIND,
                    no_data,
                ))?;
            }
            check(libc::mkdir(c"/dev/shm".as_ptr(), 0o1777))?;
            let shm = libc::MS_NOSUID | libc::MS_NODEV;
            let opts = c"mode=1777,size=64m".as_ptr().cast();
            check(libc::mount(
                c"shm".as_ptr(),
                c"/dev/shm".as_ptr(),
                tmpfs,
                shm,
                opts,
            ))?;
            check(libc::symlink(
                c"/proc/self/fd".as_ptr(),
                c"/dev/fd".as_ptr(),
            ))?;
            check(libc::umount2(self.host.as_ptr(), libc::MNT_DETACH))?;
            // The cgroup file system, read-only as Docker mounts it: no cgroup is created, no
            // control file written.
            #[repr(C)]
            struct MountAttr {
                set: u64,
                clear: u64,
                propagation: u64,
                userns_fd: u64,
            }
            const MOUNT_ATTR_RDONLY: u64 = 1;
            let attr = MountAttr {
                set: MOUNT_ATTR_RDONLY,
                clear: 0,
                propagation: 0,
                userns_fd: 0,
            };
            let rc = libc::syscall(
                libc::SYS_mount_setattr,
                libc::AT_FDCWD,
                c"/sys/fs/cgroup".as_ptr(),
                libc::AT_RECURSIVE,
                &attr,
                std::mem::size_of::<MountAttr>(),
            );
            if rc != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}
