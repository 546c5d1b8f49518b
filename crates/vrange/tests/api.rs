//! The safe face of the public API: the pin guard of `VolatileRegion` and the typed `Config`,
//! on the real kernel (purges are real MADV_DONTNEED by `vrange::purge`).
//!
//! The tests of this binary run one at a time: a purge purges every volatile region of the
//! process, and `Config` is process-wide.

use std::time::Duration;
use vrange::{Config, Headroom, OptionError, Options, Policy, Psi, VolatileRegion};
use vrange_testkit::serial;

fn managed(len: usize) -> VolatileRegion {
    VolatileRegion::new(
        len,
        Options {
            policy: Policy::Managed,
            ..Options::default()
        },
    )
    .unwrap()
}

/// Keeps pressure from elsewhere on the machine from purging behind the test's back.
fn quiet() {
    let mut c = Config::current();
    c.psi = None;
    c.vmpressure = false;
    c.headroom = Headroom::Off;
    c.budget = 0;
    c.apply().unwrap();
}

#[test]
fn a_pin_guard_keeps_content_and_reports_a_purge() {
    let _serial = serial();
    quiet();
    let mut region = managed(4 << 20);
    {
        let mut bytes = region.pin().unwrap();
        assert!(!bytes.was_purged());
        bytes.fill(0x5a);
        // Pinned: an explicit purge cannot take it.
        assert_eq!(vrange::purge(usize::MAX), 0);
    }
    // Dropped: volatile again, so the purge takes it now.
    assert!(vrange::purge(usize::MAX) >= 4 << 20);
    let bytes = region.pin().unwrap();
    assert!(bytes.was_purged(), "{:?}", bytes.report());
    assert!(
        bytes.iter().all(|&b| b == 0),
        "purged content must read as zero"
    );
    drop(bytes);

    // Not purged in between: the content survives the round trip.
    let mut bytes = region.pin().unwrap();
    bytes.fill(7);
    drop(bytes);
    let bytes = region.pin().unwrap();
    assert!(!bytes.was_purged());
    assert!(bytes.iter().all(|&b| b == 7));
}

#[test]
fn config_round_trips_and_refuses_what_the_kernel_would() {
    let _serial = serial();
    let before = Config::current();
    let mut c = before;
    c.budget = 64 << 20;
    c.poll_interval = Duration::from_millis(50);
    c.psi = Some(Psi {
        full: true,
        stall: Duration::from_millis(200),
        window: Duration::from_secs(4),
    });
    c.apply().unwrap();
    assert_eq!(Config::current(), c);
    // The string form sets the same fields.
    let parsed = before
        .with_option("VRANGE_BUDGET", "64M")
        .and_then(|c| c.with_option("VRANGE_POLL_MS", "50"))
        .and_then(|c| c.with_option("VRANGE_PSI", "full 200000 4000000"))
        .unwrap();
    assert_eq!(parsed, c);
    assert_eq!(c.show("VRANGE_BUDGET").to_string(), "64M");

    let mut bad = c;
    bad.pressure_share = 0;
    assert!(matches!(bad.apply(), Err(OptionError::InvalidValue { .. })));
    bad = c;
    bad.psi = Some(Psi {
        full: false,
        stall: Duration::from_secs(3),
        window: Duration::from_secs(2),
    });
    assert!(matches!(bad.apply(), Err(OptionError::InvalidValue { .. })));
    assert_eq!(
        Config::current(),
        c,
        "a refused configuration changed something"
    );
    assert_eq!(
        before.with_option("VRANGE_NOPE", "1"),
        Err(OptionError::UnknownName)
    );
    before.apply().unwrap();
}
