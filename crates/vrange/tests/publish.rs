//! Statistics files (`vrange::publish`) in a hostile /dev/shm: symbolic links planted at every
//! name vrange writes or creates, the per-user directory made a link or taken by another user,
//! `VRANGE_STATS_DIR` naming directories that are not private, and files left by processes
//! that are gone.
//!
//! Every case runs in a mount namespace of its own with a fresh tmpfs on /dev/shm, so the
//! machine's `/dev/shm/vrange-0`, which other root processes use, is never touched: the test
//! re-executes this binary as a "lab" inside it, which plants, starts "publisher" processes
//! (this binary again, in the same namespace, as root like the lab) and checks every victim
//! file (owned by root, which the publisher could overwrite if it followed a link) afterwards.
//! Needs root (a mount namespace, files owned by another user); elsewhere the tests print
//! "skipped: ..." (and fail under CI).

// ci: host only: files and links in a private tmpfs, the same on every kernel

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vrange_testkit::proc::Exit;
use vrange_testkit::role::{command, role, role_command, say, Role};

const LAB: &str = "lab";
const PUBLISHER: &str = "publisher";
/// The attacker's uid, used by nothing else.
const ATTACKER: u32 = 4_000_123;
const SHM: &str = "/dev/shm";
const TIMEOUT: Duration = Duration::from_secs(20);

/// Runs the current test's lab role in a new mount namespace with its own /dev/shm, and fails
/// the test with the lab's output if the lab fails.
fn run_lab(test: &str) {
    if !vrange_testkit::is_root() {
        return vrange_testkit::skip("needs root (a mount namespace and files of another owner)");
    }
    let mut cmd = role_command(test, LAB);
    cmd.env_remove("VRANGE_STATS_DIR");
    // SAFETY: between fork and exec the hook only makes system calls (unshare, mount) on
    // static NUL-terminated strings and builds io::Errors from errno.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            let fail = || Err(std::io::Error::last_os_error());
            let none = std::ptr::null();
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return fail();
            }
            let root = c"/".as_ptr();
            if libc::mount(
                none,
                root,
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                none.cast(),
            ) != 0
            {
                return fail();
            }
            let tmpfs = c"tmpfs".as_ptr();
            let shm = c"/dev/shm".as_ptr();
            let opts = c"mode=1777".as_ptr().cast();
            if libc::mount(tmpfs, shm, tmpfs, libc::MS_NOSUID | libc::MS_NODEV, opts) != 0 {
                return fail();
            }
            Ok(())
        });
    }
    let mut lab = Role::spawn(LAB, cmd);
    lab.expect("done", Duration::from_secs(120));
    let exit = lab.wait(TIMEOUT);
    assert!(
        matches!(exit, Exit::Code(0)),
        "the lab ended with {exit}\n{}",
        lab.diagnostics()
    );
}

/// In a role process: plays the publisher or the lab when asked to; true if it did.
fn played(lab: impl FnOnce()) -> bool {
    match role().as_deref() {
        Some(PUBLISHER) => publisher(),
        Some(LAB) => {
            lab();
            say("done");
        }
        _ => return false,
    }
    true
}

/// A process that publishes: says "ready", waits for "go" (the lab plants for its pid
/// meanwhile), starts the reclaimer, and says "published ok=1" once its own file can be read
/// back (ok=0 after 1.5 s without). It exits when its stdin closes, through the exit handler.
fn publisher() {
    say("ready");
    assert_eq!(command().as_deref(), Some("go"));
    vrange::purge(0);
    assert!(vrange::reclaimer::is_running(), "the reclaimer runs");
    let pid = std::process::id();
    let t0 = Instant::now();
    // At least 600 ms: two or more writes, so that a refusal said twice would show.
    let ok = loop {
        let ok = vrange::published::read(pid).is_ok();
        let waited = t0.elapsed();
        if (ok && waited > Duration::from_millis(600)) || waited > Duration::from_millis(1500) {
            break ok;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    say(format!("published ok={}", u8::from(ok)));
    while command().is_some() {}
}

/// A file the attacker would like overwritten: owned by root, mode 0644, known content.
struct Victim {
    path: PathBuf,
    content: String,
}

/// The lab's victims and the links to them.
struct Lab {
    victims: Vec<Victim>,
}

impl Lab {
    fn new() -> Lab {
        let dir = Path::new(SHM).join("victims");
        std::fs::create_dir(&dir).expect("the lab's /dev/shm is fresh");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let attacker = Path::new(SHM).join("attacker");
        std::fs::create_dir(&attacker).unwrap();
        std::fs::set_permissions(&attacker, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::os::unix::fs::chown(&attacker, Some(ATTACKER), Some(ATTACKER)).unwrap();
        Lab {
            victims: Vec::new(),
        }
    }

    /// Plants a symbolic link at `at`, owned by the attacker, to a new victim file.
    fn plant(&mut self, at: &Path) {
        let n = self.victims.len();
        let path = Path::new(SHM).join("victims").join(format!("victim-{n}"));
        let content = format!("victim {n}, the target of {}\n", at.display());
        std::fs::write(&path, &content).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&path, at).unwrap();
        std::os::unix::fs::lchown(at, Some(ATTACKER), Some(ATTACKER)).unwrap();
        self.victims.push(Victim { path, content });
    }

    /// Every victim still has its content and mode, and is still a single regular file.
    fn check_victims(&self, case: &str) {
        for v in &self.victims {
            let meta = std::fs::symlink_metadata(&v.path).unwrap();
            assert!(
                meta.is_file() && meta.nlink() == 1,
                "{case}: {v:?}",
                v = v.path
            );
            assert_eq!(meta.mode() & 0o7777, 0o644, "{case}: {}", v.path.display());
            assert_eq!(meta.uid(), 0, "{case}: {}", v.path.display());
            let now = std::fs::read_to_string(&v.path).unwrap();
            assert_eq!(now, v.content, "{case}: {} was written", v.path.display());
        }
    }

    /// Runs one publisher with `env`; `plant` gets its pid before it starts publishing, `live`
    /// runs while it still lives (it has said whether it published). Returns whether it
    /// published and its stderr lines saying "not publishing".
    fn publish(
        &mut self,
        test: &str,
        env: &[(&str, &str)],
        plant: impl FnOnce(&mut Lab, u32),
        live: impl FnOnce(&Lab, u32),
    ) -> (bool, Vec<String>) {
        let mut cmd = role_command(test, PUBLISHER);
        cmd.env_remove("VRANGE_STATS_DIR");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut p = Role::spawn(PUBLISHER, cmd);
        p.expect("ready", TIMEOUT);
        let pid = p.pid() as u32;
        plant(self, pid);
        assert!(p.send("go"));
        let ok = p.expect("published", TIMEOUT).u64("ok") == 1;
        live(self, pid);
        p.close_stdin();
        let exit = p.wait(TIMEOUT);
        let out = p.diagnostics();
        assert!(matches!(exit, Exit::Code(0)), "{exit}\n{out}");
        let said = out
            .lines()
            .filter(|l| l.contains("not publishing"))
            .map(str::to_string)
            .collect();
        (ok, said)
    }
}

/// The names in `dir` and what each is (`l` link, `f` file, `d` directory), sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            let kind = if t.is_symlink() {
                'l'
            } else if t.is_dir() {
                'd'
            } else {
                'f'
            };
            format!("{kind} {}", e.file_name().to_string_lossy())
        })
        .collect();
    names.sort();
    names
}

/// A regular file owned by root with mode 0600 holding the statistics of `pid`.
fn assert_statistics_file(path: &Path, pid: u32) {
    let meta =
        std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(meta.is_file(), "{} is a regular file", path.display());
    assert_eq!(
        (meta.mode() & 0o7777, meta.uid()),
        (0o600, 0),
        "{}",
        path.display()
    );
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.starts_with(&format!("pid={pid}\n")), "{text}");
}

fn refusal(what: &str, why: &str) -> Vec<String> {
    vec![format!(
        "vrange: {what} is not a private directory ({why}); not publishing"
    )]
}

/// Symbolic links at every path vrange writes or creates, pointing at root-owned files, leave
/// those files unchanged: publishing either goes on safely or is refused with one line.
#[test]
fn planted_symlinks_never_redirect_a_write() {
    if played(symlink_lab) {
        return;
    }
    run_lab(TEST_SYMLINK);
}

fn symlink_lab() {
    let mut lab = Lab::new();
    let own = PathBuf::from(format!("{SHM}/vrange-0"));
    let attacker = PathBuf::from(format!("{SHM}/attacker"));
    let none: &[(&str, &str)] = &[];

    // 1. The guessable names of the old layout, in the world-writable /dev/shm itself.
    let (ok, said) = lab.publish(
        TEST_SYMLINK,
        none,
        |lab, pid| {
            lab.plant(&Path::new(SHM).join(format!("vrange-{pid}.stats")));
            lab.plant(&Path::new(SHM).join(format!(".vrange-{pid}.stats.tmp")));
        },
        |_, pid| assert_statistics_file(&own.join(format!("vrange-{pid}.stats")), pid),
    );
    assert!(ok && said.is_empty(), "{said:?}");
    let meta = std::fs::symlink_metadata(&own).unwrap();
    assert!(meta.is_dir());
    assert_eq!((meta.mode() & 0o7777, meta.uid()), (0o700, 0));
    assert!(
        listing(&own).is_empty(),
        "the exit handler removed the file: {:?}",
        listing(&own)
    );
    lab.check_victims("old names in /dev/shm");

    // 2. Links inside the private directory itself, at the final name and at the temporary
    //    names a fresh process tries first: the temporary file skips taken names (O_EXCL),
    //    the stale-file sweep removes the link at the final name, nothing is written through.
    let (ok, said) = lab.publish(
        TEST_SYMLINK,
        none,
        |lab, pid| {
            lab.plant(&own.join(format!("vrange-{pid}.stats")));
            lab.plant(&own.join(format!(".vrange-{pid}.stats.tmp")));
            for n in 0..16 {
                lab.plant(&own.join(format!(".vrange-{pid}.{n}.tmp")));
            }
        },
        |_, pid| assert_statistics_file(&own.join(format!("vrange-{pid}.stats")), pid),
    );
    assert!(ok && said.is_empty(), "{said:?}");
    let left = listing(&own);
    assert_eq!(
        left.len(),
        17,
        "only the planted temporary links remain: {left:?}"
    );
    assert!(left.iter().all(|l| l.starts_with("l .vrange-")), "{left:?}");
    lab.check_victims("links inside the private directory");
    std::fs::remove_dir_all(&own).unwrap();

    // 3. The per-user directory is a link to the attacker's directory.
    std::os::unix::fs::symlink(&attacker, &own).unwrap();
    std::os::unix::fs::lchown(&own, Some(ATTACKER), Some(ATTACKER)).unwrap();
    let mut planted = Vec::new();
    let (ok, said) = lab.publish(
        TEST_SYMLINK,
        none,
        |lab, pid| {
            lab.plant(&attacker.join(format!("vrange-{pid}.stats")));
            planted = listing(&attacker);
        },
        |_, _| {},
    );
    assert!(!ok);
    assert_eq!(said, refusal("/dev/shm/vrange-0", "it is a symbolic link"));
    assert_eq!(
        listing(&attacker),
        planted,
        "nothing created in the attacker's directory"
    );
    lab.check_victims("per-user directory a link");
    std::fs::remove_file(&own).unwrap();

    // 4. The per-user directory was made by the attacker (who can do so in /dev/shm).
    std::fs::create_dir(&own).unwrap();
    std::os::unix::fs::chown(&own, Some(ATTACKER), Some(ATTACKER)).unwrap();
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (ok, said) = lab.publish(
        TEST_SYMLINK,
        none,
        |lab, pid| lab.plant(&own.join(format!("vrange-{pid}.stats"))),
        |_, _| {},
    );
    assert!(!ok);
    assert_eq!(
        said,
        refusal(
            "/dev/shm/vrange-0",
            &format!("it is owned by uid {ATTACKER}")
        )
    );
    assert_eq!(listing(&own).len(), 1, "{:?}", listing(&own));
    lab.check_victims("per-user directory the attacker's");
    std::fs::remove_dir_all(&own).unwrap();

    // 5. Our own directory, but open to everyone.
    std::fs::create_dir(&own).unwrap();
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (ok, said) = lab.publish(TEST_SYMLINK, none, |_, _| {}, |_, _| {});
    assert!(!ok);
    assert_eq!(
        said,
        refusal("/dev/shm/vrange-0", "mode 0777 lets other users in")
    );
    assert!(listing(&own).is_empty());
    std::fs::remove_dir(&own).unwrap();

    // 6. VRANGE_STATS_DIR naming a link, a world-writable directory, the attacker's directory.
    let private = PathBuf::from(format!("{SHM}/private"));
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = PathBuf::from(format!("{SHM}/link-to-private"));
    std::os::unix::fs::symlink(&private, &link).unwrap();
    for (dir, why) in [
        (link.to_str().unwrap(), "it is a symbolic link".to_string()),
        (SHM, "mode 1777 lets other users in".to_string()),
        (
            attacker.to_str().unwrap(),
            format!("it is owned by uid {ATTACKER}"),
        ),
    ] {
        let before = listing(Path::new(dir));
        let (ok, said) = lab.publish(
            TEST_SYMLINK,
            &[("VRANGE_STATS_DIR", dir)],
            |_, _| {},
            |_, _| {},
        );
        assert!(!ok, "{dir}");
        assert_eq!(said, refusal(&format!("VRANGE_STATS_DIR={dir}"), &why));
        assert_eq!(listing(Path::new(dir)), before, "nothing created in {dir}");
    }
    assert!(listing(&private).is_empty());

    // 7. A private VRANGE_STATS_DIR with links at the final and temporary names: the rename
    //    replaces the link at the final name (an entry, not what it points to), and the final
    //    snapshot stays after exit as a regular file.
    let (ok, said) = lab.publish(
        TEST_SYMLINK,
        &[("VRANGE_STATS_DIR", private.to_str().unwrap())],
        |lab, pid| {
            lab.plant(&private.join(format!("vrange-{pid}.stats")));
            for n in 0..4 {
                lab.plant(&private.join(format!(".vrange-{pid}.{n}.tmp")));
            }
        },
        |_, pid| assert_statistics_file(&private.join(format!("vrange-{pid}.stats")), pid),
    );
    assert!(ok && said.is_empty(), "{said:?}");
    let snapshots: Vec<String> = listing(&private)
        .into_iter()
        .filter(|l| l.ends_with(".stats"))
        .collect();
    assert_eq!(snapshots.len(), 1, "{snapshots:?}");
    assert!(snapshots[0].starts_with("f "), "{snapshots:?}");
    lab.check_victims("links in VRANGE_STATS_DIR");
}

const TEST_SYMLINK: &str = "planted_symlinks_never_redirect_a_write";
const TEST_STALE: &str = "stale_files_are_removed_by_the_next_publisher_and_reader";

/// Files left by processes that are gone (or whose pid now names another process), and
/// temporary files abandoned over a minute ago, are removed by the next publisher and by
/// readers; in a `VRANGE_STATS_DIR` the final snapshots stay.
#[test]
fn stale_files_are_removed_by_the_next_publisher_and_reader() {
    if played(stale_lab) {
        return;
    }
    run_lab(TEST_STALE);
}

/// Writes the files a killed process, a reused pid and a live publisher would leave in `dir`;
/// returns the names that are stale and those that must stay.
fn litter(dir: &Path, dead: u32, reused: u32, live: u32) -> (Vec<String>, Vec<String>) {
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    };
    let live_start = vrange_sys::procfs::start_ticks(Some(live)).unwrap();
    write(
        &format!("vrange-{dead}.stats"),
        format!("pid={dead}\nstart_ticks=5\n"),
    );
    write(
        &format!("vrange-{reused}.stats"),
        format!("pid={reused}\nstart_ticks=1\n"),
    );
    write(
        &format!("vrange-{live}.stats"),
        format!("pid={live}\nstart_ticks={live_start}\nvolatile_bytes=42\n"),
    );
    write(&format!(".vrange-{dead}.0.tmp"), "half".into());
    let old = std::time::SystemTime::now() - Duration::from_secs(120);
    std::fs::File::options()
        .write(true)
        .open(dir.join(format!(".vrange-{dead}.0.tmp")))
        .unwrap()
        .set_modified(old)
        .unwrap();
    write(&format!(".vrange-{live}.1.tmp"), "being written".into());
    write("notes.txt", "not ours".into());
    (
        vec![
            format!("vrange-{dead}.stats"),
            format!("vrange-{reused}.stats"),
            format!(".vrange-{dead}.0.tmp"),
        ],
        vec![
            format!("vrange-{live}.stats"),
            format!(".vrange-{live}.1.tmp"),
            "notes.txt".into(),
        ],
    )
}

fn assert_swept(dir: &Path, stale: &[String], kept: &[String], who: &str) {
    for name in stale {
        assert!(
            !dir.join(name).exists(),
            "{who} left {name}: {:?}",
            listing(dir)
        );
    }
    for name in kept {
        assert!(
            dir.join(name).exists(),
            "{who} removed {name}: {:?}",
            listing(dir)
        );
    }
}

fn stale_lab() {
    let dead = {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    };
    let mut reused = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let mut live = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let (reused_pid, live_pid) = (reused.id(), live.id());
    let own = PathBuf::from(format!("{SHM}/vrange-0"));
    std::fs::create_dir(&own).unwrap();
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut lab = Lab::new();
    let none: &[(&str, &str)] = &[];

    // The next publisher.
    let (stale, kept) = litter(&own, dead, reused_pid, live_pid);
    let (ok, _) = lab.publish(TEST_STALE, none, |_, _| {}, |_, _| {});
    assert!(ok);
    assert_swept(&own, &stale, &kept, "the publisher");

    // A reader: vrange stat's read, and the sweep of vrange run and of stat on a dead pid.
    let (stale, kept) = litter(&own, dead, reused_pid, live_pid);
    let values = vrange::published::read(live_pid).expect("the live file is read");
    assert!(
        values.contains(&("volatile_bytes".to_string(), 42)),
        "{values:?}"
    );
    assert_swept(&own, &stale, &kept, "the reader");
    assert!(
        vrange::published::read(reused_pid).is_err_and(|e| e.is_absent()),
        "a file from before the pid was reused is not believed"
    );
    let (stale, kept) = litter(&own, dead, reused_pid, live_pid);
    vrange::published::sweep();
    assert_swept(&own, &stale, &kept, "sweep");

    // In a directory named by VRANGE_STATS_DIR the final snapshots of the gone stay; only
    // abandoned temporary files go.
    let chosen = PathBuf::from(format!("{SHM}/chosen"));
    std::fs::create_dir(&chosen).unwrap();
    std::fs::set_permissions(&chosen, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (stale, mut kept) = litter(&chosen, dead, reused_pid, live_pid);
    let (ok, _) = lab.publish(
        TEST_STALE,
        &[("VRANGE_STATS_DIR", chosen.to_str().unwrap())],
        |_, _| {},
        |_, _| {},
    );
    assert!(ok);
    kept.extend(stale[..2].iter().cloned());
    assert_swept(
        &chosen,
        &stale[2..],
        &kept,
        "a publisher in VRANGE_STATS_DIR",
    );

    for c in [&mut reused, &mut live] {
        let _ = c.kill();
        let _ = c.wait();
    }
    lab.check_victims("stale files");
}
