//! Settings end to end: a process started with malformed `VRANGE_*` variables reports each one
//! once, in one line on stderr naming the variable, what it accepts and the default it uses
//! instead, then works as usual; well-formed values in any spelling of the one grammar pass
//! silently; and [`vrange::set_option`] refuses what the environment would, with a typed error.
//!
//! The environment is read once per process, so each case runs in a child: this test executable
//! again, running only [`child`] (which does nothing unless `CHILD` is set).

// ci: host only: the settings grammar and its one-line warnings, the same on every kernel

use std::process::{Command, Output};
use vrange::{OptionError, Options, Policy, VolatileRegion};

const CHILD: &str = "VRANGE_TEST_SETTINGS_CHILD";

/// In a child: starts the reclaimer with a managed region (which reads the settings), marks
/// and unmarks it, and says "child ok" if the content survived.
#[test]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let options = Options {
        policy: Policy::Managed,
        ..Options::default()
    };
    let r = VolatileRegion::new(1 << 20, options).expect("region");
    // SAFETY: the region is this test's own memory, of r.len() bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(r.as_ptr(), r.len()) };
    bytes.fill(0x5a);
    // SAFETY: no reference into the region is used while it is volatile.
    unsafe { r.mark().expect("mark") };
    let u = r.unmark().expect("unmark");
    // SAFETY: as above; the range is pinned again.
    let bytes = unsafe { std::slice::from_raw_parts(r.as_ptr(), r.len()) };
    assert!(u.purged > 0 || bytes.iter().all(|&b| b == 0x5a));
    println!("child ok");
}

/// Runs [`child`] in a new process with `env` (and no other `VRANGE_*` variable).
fn run_child(env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(std::env::current_exe().expect("this test executable"));
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"]);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("VRANGE_") {
            cmd.env_remove(name);
        }
    }
    cmd.env(CHILD, "1").envs(env.iter().copied());
    let out = cmd.output().expect("run the child");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("child ok"),
        "the child failed: {}\n--- stdout ---\n{}--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn malformed_variables_are_reported_once_each_and_the_defaults_used() {
    let out = run_child(&[
        ("VRANGE_RECLAIMER", "maybe"),
        ("VRANGE_ARM_DELAY_MS", "1s"),
        ("VRANGE_BUDGET", "12Q"),
        ("VRANGE_HEADROOM", "lots"),
        ("VRANGE_POLL_MS", "-1"),
        ("VRANGE_PSI", "some 3 2"),
        ("VRANGE_VMPRESSURE", "2"),
        ("VRANGE_PRESSURE_SHARE", "0"),
    ]);
    let size = vrange_sys::settings::SIZE_GRAMMAR;
    let switch = vrange_sys::settings::SWITCH_GRAMMAR;
    let expected = [
        format!("vrange: VRANGE_RECLAIMER=maybe is not valid ({switch}); using on"),
        "vrange: VRANGE_ARM_DELAY_MS=1s is not valid (milliseconds); using 1000".into(),
        format!("vrange: VRANGE_BUDGET=12Q is not valid ({size}); using 0"),
        "vrange: VRANGE_HEADROOM=lots is not valid (auto, off or a size such as 64M); using auto"
            .into(),
        "vrange: VRANGE_POLL_MS=-1 is not valid (milliseconds); using 100".into(),
        "vrange: VRANGE_PSI=some 3 2 is not valid (off, or some or full, then STALL_US \
         WINDOW_US with 0 < STALL_US <= WINDOW_US <= 10000000); using some 100000 2000000"
            .into(),
        format!("vrange: VRANGE_VMPRESSURE=2 is not valid ({switch}); using on"),
        "vrange: VRANGE_PRESSURE_SHARE=0 is not valid (a percentage from 1 to 100); using 25"
            .into(),
    ];
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines, expected, "stderr:\n{stderr}");
}

#[test]
fn well_formed_values_in_any_spelling_pass_silently() {
    let out = run_child(&[
        ("VRANGE_RECLAIMER", " YES "),
        ("VRANGE_ARM_DELAY_MS", "250"),
        ("VRANGE_BUDGET", "64MiB"),
        ("VRANGE_HEADROOM", "16 mb"),
        // Documented clamp: 0 polls every millisecond, without a warning.
        ("VRANGE_POLL_MS", "0"),
        ("VRANGE_PSI", "Full 50000 1000000"),
        ("VRANGE_VMPRESSURE", "False"),
        ("VRANGE_PRESSURE_SHARE", "100"),
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn set_option_refuses_malformed_values_with_a_typed_error() {
    assert_eq!(
        vrange::set_option("VRANGE_NO_SUCH_OPTION", "1"),
        Err(OptionError::UnknownName)
    );
    for (name, value) in [
        ("VRANGE_BUDGET", "12Q"),
        ("VRANGE_BUDGET", "1.5G"),
        ("VRANGE_BUDGET", "-1"),
        ("VRANGE_BUDGET", "M"),
        ("VRANGE_BUDGET", ""),
        ("VRANGE_POLL_MS", "10K"),
        ("VRANGE_RECLAIMER", "enabled"),
    ] {
        match vrange::set_option(name, value) {
            Err(e @ OptionError::InvalidValue { accepted }) => {
                assert!(!accepted.is_empty());
                assert!(e.to_string().contains(accepted), "{e}");
                assert_eq!(e.errno(), libc::EINVAL);
                assert_eq!(vrange::Error::from(e).errno(), libc::EINVAL);
            }
            other => panic!("set_option({name}, {value:?}) = {other:?}"),
        }
    }
    assert_eq!(vrange::set_option("VRANGE_BUDGET", " 64 MiB "), Ok(()));
    assert_eq!(vrange::set_option("VRANGE_BUDGET", "0"), Ok(()));
}
