//! Private directories for the small files other processes read (the statistics files of
//! `crate::publish`): a directory is used only after its descriptor proves it is a directory
//! owned by the expected user that nobody else may write, and every file operation after that
//! is relative to that descriptor.
//!
//! Must never: follow a symbolic link at a name it creates, opens, replaces or removes; create
//! over, truncate or open for writing a file that already exists; hand out a descriptor below 3
//! (a program started with stdout closed must not find its output in our file); keep a
//! descriptor past the [`PrivateDir`] that needed it (one publication, one `vrange stat`).

use std::ffi::{CStr, CString};
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Read no more than this from a file: statistics files are well under 1 KiB.
const READ_LIMIT: u64 = 64 << 10;

/// Why a directory was not used.
#[derive(Debug)]
pub enum Refusal {
    /// Nothing at the path (only when not asked to create it).
    Missing,
    /// A symbolic link, which could point anywhere.
    Symlink,
    /// Something other than a directory.
    NotDirectory,
    /// Owned by another user.
    Owner(u32),
    /// Its mode lets group or others in (the mode).
    Mode(u32),
    /// Not an absolute path (a relative one names another directory after a `chdir`).
    Relative,
    /// It could not be created or opened.
    Io(io::Error),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Missing => f.write_str("it does not exist"),
            Refusal::Symlink => f.write_str("it is a symbolic link"),
            Refusal::NotDirectory => f.write_str("it is not a directory"),
            Refusal::Owner(uid) => write!(f, "it is owned by uid {uid}"),
            Refusal::Mode(mode) => write!(f, "mode {mode:04o} lets other users in"),
            Refusal::Relative => f.write_str("not an absolute path"),
            Refusal::Io(e) => write!(f, "{}", plain(e)),
        }
    }
}

/// An error in words, without Rust's "(os error N)" suffix.
pub fn plain(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::PermissionDenied => "permission denied".into(),
        io::ErrorKind::NotFound => "no such file or directory".into(),
        _ => {
            let text = e.to_string();
            match text.find(" (os error") {
                Some(cut) => text[..cut].to_string(),
                None => text,
            }
        }
    }
}

/// One entry of a [`PrivateDir`], as `fstatat` without following links saw it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    /// Last modification, seconds since the epoch.
    pub modified: i64,
}

/// An open directory that passed [`PrivateDir::open`]'s checks.
#[derive(Debug)]
pub struct PrivateDir {
    fd: OwnedFd,
}

impl PrivateDir {
    /// Opens the directory `path` if it is owned by `owner` and its mode has none of the
    /// `forbidden` bits (0o077: nobody else may even look; 0o022: nobody else may write).
    /// With `create`, a missing directory is made first with mode 0700 (the last component
    /// only; a symbolic link or anything else already there is not replaced, and fails the
    /// checks).
    ///
    /// The checks are made with `fstat` on the descriptor opened with `O_DIRECTORY |
    /// O_NOFOLLOW`, so what was checked is what is used, whatever happens to the path later.
    ///
    /// # Errors
    /// A [`Refusal`] saying why the directory is not used.
    pub fn open(
        path: &Path,
        owner: u32,
        forbidden: u32,
        create: bool,
    ) -> Result<PrivateDir, Refusal> {
        if !path.is_absolute() {
            return Err(Refusal::Relative);
        }
        let c = cstring(path.as_os_str().as_bytes()).map_err(Refusal::Io)?;
        let opened = match open_dir(&c) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create => {
                // SAFETY: c is a NUL-terminated path; mkdir creates at most one directory.
                if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 {
                    let e = io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::EEXIST) {
                        return Err(Refusal::Io(e));
                    }
                }
                open_dir(&c)
            }
            other => other,
        };
        let fd = opened.map_err(|e| match e.raw_os_error() {
            // O_DIRECTORY makes a link fail with ENOTDIR, O_NOFOLLOW with ELOOP: look again
            // (for the message only; nothing was opened).
            Some(libc::ELOOP | libc::ENOTDIR) if is_symlink(&c) => Refusal::Symlink,
            Some(libc::ELOOP | libc::ENOTDIR) => Refusal::NotDirectory,
            Some(libc::ENOENT) => Refusal::Missing,
            _ => Refusal::Io(e),
        })?;
        let st = fstat(fd.as_raw_fd()).map_err(Refusal::Io)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(Refusal::NotDirectory);
        }
        if st.st_uid != owner {
            return Err(Refusal::Owner(st.st_uid));
        }
        let mode = st.st_mode & 0o7777;
        if mode & forbidden != 0 {
            return Err(Refusal::Mode(mode));
        }
        Ok(PrivateDir { fd })
    }

    /// Creates the file `name` for writing, mode 0600; fails with `EEXIST` if anything, a
    /// symbolic link included, already has that name.
    ///
    /// # Errors
    /// `openat(2)`'s.
    pub fn create_new(&self, name: &str) -> io::Result<File> {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        Ok(File::from(self.open_at(name, flags)?))
    }

    /// Renames `from` to `to` within the directory, atomically replacing whatever entry `to`
    /// was (a symbolic link there is replaced itself, not followed).
    ///
    /// # Errors
    /// `renameat(2)`'s.
    pub fn replace(&self, from: &str, to: &str) -> io::Result<()> {
        let (from, to) = (cstring(from.as_bytes())?, cstring(to.as_bytes())?);
        let dir = self.fd.as_raw_fd();
        // SAFETY: both names are NUL-terminated and relative to the same open directory.
        check(unsafe { libc::renameat(dir, from.as_ptr(), dir, to.as_ptr()) })
    }

    /// Removes the entry `name` (a symbolic link is removed, not followed).
    ///
    /// # Errors
    /// `unlinkat(2)`'s.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        let c = cstring(name.as_bytes())?;
        // SAFETY: c is NUL-terminated, relative to an open directory; flags 0 removes a file.
        check(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) })
    }

    /// The text of the regular file `name` (at most 64 KiB of it). A symbolic link fails with
    /// `ELOOP`, a FIFO or device with `EINVAL`, before anything is read.
    ///
    /// # Errors
    /// `openat(2)`'s and `read(2)`'s; invalid UTF-8.
    pub fn read(&self, name: &str) -> io::Result<String> {
        // O_NONBLOCK: opening a FIFO must not wait for a writer.
        let fd = self.open_at(name, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK)?;
        if fstat(fd.as_raw_fd())?.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut text = String::new();
        File::from(fd).take(READ_LIMIT).read_to_string(&mut text)?;
        Ok(text)
    }

    /// `openat(2)` of `name` in the directory with `flags` and close-on-exec; a file it creates
    /// gets mode 0600.
    fn open_at(&self, name: &str, flags: libc::c_int) -> io::Result<OwnedFd> {
        std_fds_open()?;
        let c = cstring(name.as_bytes())?;
        // SAFETY: self.fd is an open directory and c is NUL-terminated; the mode argument is
        // read only with O_CREAT.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                flags | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // Landed at 0, 1 or 2: ours only if it still is the file of that name.
        crate::fd::settle(fd, || {
            // SAFETY: stat is plain data that fstatat fills.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: c is NUL-terminated, relative to an open directory; st is writable.
            let rc = unsafe {
                libc::fstatat(
                    self.fd.as_raw_fd(),
                    c.as_ptr(),
                    &mut st,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            (rc == 0).then_some((st.st_dev, st.st_ino))
        })
    }

    /// The entries of the directory ("." and ".." left out), in no particular order.
    ///
    /// # Errors
    /// `fdopendir(3)`'s; entries that vanish meanwhile are left out.
    pub fn entries(&self) -> io::Result<Vec<Entry>> {
        // fdopendir takes over its descriptor (closedir closes it): give it a copy.
        let copy = dup_above_stdio(self.fd.as_raw_fd())?;
        // SAFETY: copy is an open directory descriptor; on success the DIR owns it.
        let dir = unsafe { libc::fdopendir(copy.as_raw_fd()) };
        if dir.is_null() {
            return Err(io::Error::last_os_error());
        }
        std::mem::forget(copy);
        let mut names = Vec::new();
        loop {
            // SAFETY: dir is a live DIR stream used by this thread only.
            let ent = unsafe { libc::readdir(dir) };
            if ent.is_null() {
                break;
            }
            // SAFETY: readdir returned a valid entry whose d_name is NUL-terminated; it stays
            // valid until the next readdir on this stream.
            let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
            if name.to_bytes() != b"." && name.to_bytes() != b".." {
                names.push(name.to_owned());
            }
        }
        // SAFETY: dir came from fdopendir and is closed once (with the copied descriptor).
        unsafe { libc::closedir(dir) };
        let mut entries = Vec::with_capacity(names.len());
        for name in names {
            // SAFETY: stat is plain data that fstatat fills.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: name is NUL-terminated, relative to an open directory; st is writable.
            let rc = unsafe {
                libc::fstatat(
                    self.fd.as_raw_fd(),
                    name.as_ptr(),
                    &mut st,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if let (0, Ok(name)) = (rc, name.into_string()) {
                entries.push(Entry {
                    name,
                    modified: st.st_mtime,
                });
            }
        }
        Ok(entries)
    }
}

/// The effective user id of this process: whose private directory it writes.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid cannot fail and has no preconditions.
    unsafe { libc::geteuid() }
}

/// Opens a directory, refusing a symbolic link at the last component.
fn open_dir(path: &CStr) -> io::Result<OwnedFd> {
    crate::fd::open_path(path, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW)
}

/// Whether `path` itself (not what it points to) is a symbolic link.
fn is_symlink(path: &CStr) -> bool {
    // SAFETY: stat is plain data that lstat fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated; st is writable.
    let rc = unsafe { libc::lstat(path.as_ptr(), &mut st) };
    rc == 0 && st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

/// Opening files waits while the program has a standard descriptor closed (see
/// `fd::std_fds_open`): EAGAIN, try again later.
fn std_fds_open() -> io::Result<()> {
    if crate::fd::std_fds_open() {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EAGAIN))
    }
}

/// A close-on-exec copy of `fd` numbered 3 or above.
fn dup_above_stdio(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on an open descriptor returns a new one or -1.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: copy was just returned by fcntl and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data that fstat fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; st is writable.
    check(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the target dir, removed on drop.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let base = std::env::temp_dir().join(format!(
                "vrange-statsdir-{tag}-{}-{}",
                std::process::id(),
                crate::clock::now_ns()
            ));
            std::fs::create_dir(&base).unwrap();
            Scratch(base)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn creates_a_private_directory_and_refuses_open_ones() {
        use std::os::unix::fs::PermissionsExt;
        let s = Scratch::new("open");
        let me = effective_uid();
        let private = s.0.join("private");
        let dir = PrivateDir::open(&private, me, 0o077, true).unwrap();
        let mode = std::fs::metadata(&private).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        drop(dir);
        assert!(matches!(
            PrivateDir::open(&s.0.join("absent"), me, 0o077, false),
            Err(Refusal::Missing)
        ));
        assert!(matches!(
            PrivateDir::open(Path::new("relative"), me, 0o077, true),
            Err(Refusal::Relative)
        ));
        std::os::unix::fs::symlink(&private, s.0.join("link")).unwrap();
        assert!(matches!(
            PrivateDir::open(&s.0.join("link"), me, 0o077, true),
            Err(Refusal::Symlink)
        ));
        std::fs::write(s.0.join("file"), "").unwrap();
        assert!(matches!(
            PrivateDir::open(&s.0.join("file"), me, 0o077, true),
            Err(Refusal::NotDirectory)
        ));
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o750)).unwrap();
        assert!(matches!(
            PrivateDir::open(&private, me, 0o077, false),
            Err(Refusal::Mode(0o750))
        ));
        assert!(PrivateDir::open(&private, me, 0o022, false).is_ok());
        assert!(matches!(
            PrivateDir::open(&private, me.wrapping_add(1), 0o022, false),
            Err(Refusal::Owner(uid)) if uid == me
        ));
    }

    #[test]
    fn files_are_created_exclusively_and_links_never_followed() {
        let s = Scratch::new("files");
        let victim = s.0.join("victim");
        std::fs::write(&victim, "victim").unwrap();
        let dir = PrivateDir::open(&s.0.join("d"), effective_uid(), 0o077, true).unwrap();
        std::os::unix::fs::symlink(&victim, s.0.join("d/link")).unwrap();
        let e = dir.create_new("link").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        assert_eq!(
            dir.read("link").unwrap_err().raw_os_error(),
            Some(libc::ELOOP)
        );
        {
            use std::io::Write;
            let mut f = dir.create_new("new").unwrap();
            f.write_all(b"fresh").unwrap();
        }
        assert_eq!(
            dir.create_new("new").unwrap_err().raw_os_error(),
            Some(libc::EEXIST)
        );
        dir.replace("new", "link").unwrap();
        assert_eq!(dir.read("link").unwrap(), "fresh");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "victim");
        let mut names: Vec<String> = dir.entries().unwrap().into_iter().map(|e| e.name).collect();
        names.sort();
        assert_eq!(names, ["link"]);
        dir.remove("link").unwrap();
        assert!(dir.entries().unwrap().is_empty());
    }
}
