//! vrange in the containers users run: under Docker's default seccomp profile and capabilities
//! (userfaultfd, process_madvise, unshare refused; no CAP_SYS_RESOURCE), and as an unprivileged
//! user (no cgroup creation, PSI windows in 2 s steps, userfaultfd for user-mode faults only).
//! Each test re-executes this binary confined (`vrange_testkit::confine`) to play the role
//! below, which reports what works; the test checks that each feature works or fails with its
//! documented errno.

use std::time::{Duration, Instant};
use vrange::{Error, Options, Policy, RefillRegion, Source, VolatileRegion};
use vrange_testkit::confine::{self, Confinement};
use vrange_testkit::pattern::{check, fill, is_zero};
use vrange_testkit::proc::Exit;
use vrange_testkit::role::{role, say, Reply, Role};
use vrange_testkit::scratch::Scratch;

const ROLE: &str = "confined";
const TIMEOUT: Duration = Duration::from_secs(60);

/// The errno of a failed creation, 0 for success.
fn errno<T>(r: Result<T, Error>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(Error::Os(e)) => e,
        Err(e) => panic!("not an errno: {e}"),
    }
}

/// In the confined process: what the kernel lets it do, and whether each kind of region works.
fn play() {
    let f = vrange::features();
    say(format!(
        "features uffd={} uffd_kernel={} process_madvise={} own_table={} psi_trigger={} \
         cap_sys_resource={} cgroup_create={}",
        u8::from(f.userfaultfd),
        u8::from(f.userfaultfd_kernel.is_ok()),
        u8::from(f.process_madvise),
        u8::from(f.own_table.is_ok()),
        u8::from(f.psi_trigger.is_ok()),
        u8::from(f.cap_sys_resource),
        u8::from(f.cgroup_create.is_ok()),
    ));

    // Managed regions: one purged, one kept, each reported exactly.
    let len = 4 << 20;
    let managed = Options {
        policy: Policy::Managed,
        ..Options::default()
    };
    let purged = VolatileRegion::new(len, managed).expect("a managed region");
    let kept = VolatileRegion::new(len, managed).expect("a managed region");
    fill(purged.as_ptr(), len, 1);
    fill(kept.as_ptr(), len, 2);
    // SAFETY: no reference into the region is held while it is volatile.
    unsafe { purged.mark() }.unwrap();
    let freed = vrange::purge(usize::MAX);
    // SAFETY: as above.
    unsafe { kept.mark() }.unwrap();
    let lost = purged.unmark().unwrap();
    let intact = kept.unmark().unwrap();
    let exact = freed >= len
        && lost.was_purged()
        && is_zero(purged.as_ptr(), len)
        && !intact.was_purged()
        && check(kept.as_ptr(), len, 2);
    say(format!("managed exact={}", u8::from(exact)));

    // The reclaimer, in its own descriptor table, with a pressure source open: it opens them
    // once volatile memory has lasted a tick.
    // SAFETY: as above.
    unsafe { kept.mark() }.unwrap();
    let t0 = Instant::now();
    let sources = loop {
        let s: Vec<Source> = vrange::reclaimer::active_sources()
            .into_iter()
            .filter(|s| !matches!(s, Source::Explicit | Source::Budget))
            .collect();
        if !s.is_empty() || t0.elapsed() > Duration::from_secs(5) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let names: Vec<String> = sources.iter().map(|s| format!("{s:?}")).collect();
    say(format!(
        "reclaimer running={} sources={}",
        u8::from(vrange::reclaimer::is_running()),
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(",")
        }
    ));

    // SIGBUS mode and refill regions need userfaultfd.
    let sigbus = VolatileRegion::new(
        len,
        Options {
            sigbus: true,
            ..managed
        },
    );
    let refill = RefillRegion::new(len, 1 << 16, |_, buf| {
        buf.fill(7);
        true
    });
    let refilled = refill.as_ref().is_ok_and(|r| {
        // SAFETY: inside the region; the read waits for its fill.
        unsafe { r.as_ptr().add(12345).read_volatile() == 7 }
    });
    let here = RefillRegion::filled_here(len, 1 << 16, |_, buf| {
        buf.fill(9);
        true
    });
    let filled_here = here.as_ref().is_ok_and(|r| {
        // SAFETY: inside the region; the read fills its block on this thread.
        unsafe { r.as_ptr().add(12345).read_volatile() == 9 }
    });
    say(format!(
        "userfaultfd sigbus={} refill={} refilled={} here={} filled_here={}",
        errno(sigbus),
        errno(refill),
        u8::from(refilled),
        errno(here),
        u8::from(filled_here)
    ));
}

/// Runs the role confined; checks what works in every confinement (the core exact, the
/// reclaimer in its own descriptor table with a pressure source, no CAP_SYS_RESOURCE, no
/// cgroup creation) and returns the features and userfaultfd reports.
fn run(c: Confinement, test: &str) -> Option<(Reply, Reply)> {
    if !vrange_testkit::is_root() {
        vrange_testkit::skip("confining a child (capabilities, another user) needs root");
        return None;
    }
    // One at a time: a child forked while the binary's copy is open for writing would make
    // exec'ing the copy fail with ETXTBSY.
    let _serial = vrange_testkit::serial();
    let scratch = Scratch::new(&format!("confined-{}", c.name()));
    let cmd = confine::role_command(c, &scratch, test, ROLE);
    let mut p = Role::spawn(ROLE, cmd);
    let [features, managed, reclaimer, uffd] =
        ["features", "managed", "reclaimer", "userfaultfd"].map(|tag| p.expect(tag, TIMEOUT));
    let exit = p.wait(TIMEOUT);
    assert!(
        matches!(exit, Exit::Code(0)),
        "{}: the role ended with {exit}\n{}",
        c.name(),
        p.diagnostics()
    );
    println!(
        "{}: {features:?} {managed:?} {reclaimer:?} {uffd:?}",
        c.name()
    );
    assert_eq!(features.u64("own_table"), 1, "{features:?}");
    assert_eq!(features.u64("cap_sys_resource"), 0, "{features:?}");
    assert_eq!(features.u64("cgroup_create"), 0, "{features:?}");
    assert_eq!(managed.u64("exact"), 1, "{managed:?}");
    assert_eq!(reclaimer.u64("running"), 1, "{reclaimer:?}");
    assert_ne!(reclaimer.str("sources"), "none", "{reclaimer:?}");
    Some((features, uffd))
}

/// Docker's default profile: the core, the reclaimer (its own table: close_range is allowed)
/// and PSI in 2 s windows work; userfaultfd is refused, so SIGBUS mode and refill regions fail
/// with ENOTSUP; process_madvise is refused (purges make one madvise per range); the cgroup
/// file system is read-only (no cgroup created, no vmpressure event registered).
#[test]
fn under_dockers_default_seccomp_profile() {
    if role().as_deref() == Some(ROLE) {
        return play();
    }
    let Some((features, uffd)) = run(Confinement::Docker, "under_dockers_default_seccomp_profile")
    else {
        return;
    };
    assert_eq!(features.u64("uffd"), 0, "{features:?}");
    assert_eq!(features.u64("uffd_kernel"), 0, "{features:?}");
    assert_eq!(features.u64("process_madvise"), 0, "{features:?}");
    assert_eq!(uffd.u64("sigbus"), libc::ENOTSUP as u64, "{uffd:?}");
    assert_eq!(uffd.u64("refill"), libc::ENOTSUP as u64, "{uffd:?}");
    assert_eq!(uffd.u64("here"), libc::ENOTSUP as u64, "{uffd:?}");
}

/// An unprivileged user: the core and the reclaimer work; no cgroup can be created and PSI
/// windows come in 2 s steps; userfaultfd serves user-mode faults (SIGBUS mode and refill
/// regions work) unless the kernel refuses even those.
#[test]
fn as_an_unprivileged_user() {
    if role().as_deref() == Some(ROLE) {
        return play();
    }
    let Some((features, uffd)) = run(Confinement::Unprivileged, "as_an_unprivileged_user") else {
        return;
    };
    if features.u64("uffd") == 1 {
        let errnos = (uffd.u64("sigbus"), uffd.u64("refill"), uffd.u64("here"));
        assert_eq!(errnos, (0, 0, 0), "{uffd:?}");
        assert_eq!(uffd.u64("refilled"), 1, "{uffd:?}");
        assert_eq!(uffd.u64("filled_here"), 1, "{uffd:?}");
    } else {
        assert_eq!(uffd.u64("sigbus"), libc::ENOTSUP as u64, "{uffd:?}");
        assert_eq!(uffd.u64("refill"), libc::ENOTSUP as u64, "{uffd:?}");
        assert_eq!(uffd.u64("here"), libc::ENOTSUP as u64, "{uffd:?}");
    }
}
