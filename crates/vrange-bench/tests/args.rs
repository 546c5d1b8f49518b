//! vrange-bench's command line: the suites it lists and refuses, its size grammar, and the role
//! subcommand, which its own processes use and its help does not show.

// ci: host only: the command line

mod common;
use common::vrange_bench;

use vrange_testkit::proc::show;

const SUITES: [&str; 15] = [
    "ebizzy",
    "pressure",
    "lazyfree",
    "pagetable",
    "markcost",
    "refill",
    "cache",
    "coordinate",
    "proactive",
    "sqlite",
    "pairs",
    "tradeoff",
    "stress",
    "all",
    "mimalloc-bench",
];

#[test]
fn rejects_unknown_suites_and_lists_the_suites() {
    let out = vrange_bench().arg("nonsense").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&SUITES.join(", ")), "{err}");
    let help = vrange_bench().arg("--help").output().unwrap();
    assert!(help.status.success(), "{}", show(&help));
    let help = String::from_utf8_lossy(&help.stdout);
    for suite in SUITES {
        assert!(
            help.contains(&format!("- {suite}:")),
            "{suite} not listed:\n{help}"
        );
    }
    assert!(
        !help.contains("role"),
        "the role subcommand is internal:\n{help}"
    );
}

#[test]
fn mimalloc_bench_needs_a_checkout_and_says_so_with_status_2() {
    let out = vrange_bench().arg("mimalloc-bench").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--src") && err.lines().count() == 1,
        "{}",
        show(&out)
    );
    let dir = tempfile::tempdir().unwrap();
    let out = vrange_bench()
        .args(["mimalloc-bench", "--src"])
        .arg(dir.path())
        .arg("--out")
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not a mimalloc-bench checkout"),
        "{}",
        show(&out)
    );
}

#[test]
fn refuses_a_malformed_chunk_size_with_status_2() {
    for bad in ["12Q", "1.5M", "0", "12"] {
        let out = vrange_bench()
            .args(["ebizzy", "--chunk-size", bad])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}", show(&out));
        assert!(
            stderr.contains("--chunk-size") && stderr.contains(bad),
            "does not say what is wrong: {}",
            show(&out)
        );
    }
}

#[test]
fn refuses_an_unknown_stress_scenario_with_status_2_and_lists_them() {
    let out = vrange_bench()
        .args(["stress", "--scenarios", "tradeoff,nonsense"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    // The bad name, and the possible ones (the first and the last).
    for name in ["nonsense", "burst", "sqlite"] {
        assert!(err.contains(name), "{name} not said: {}", show(&out));
    }
}

#[test]
fn refuses_a_bad_cache_part_or_miss_cost_with_status_2() {
    for (args, said) in [
        (["--parts", "hot,nonsense"], "nonsense"),
        (["--miss-cost", "20,x"], "x"),
        (["--miss-cost", "2000000"], "2000000"),
    ] {
        let out = vrange_bench().arg("cache").args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", show(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(said),
            "{args:?}: {said} not said: {}",
            show(&out)
        );
    }
}

#[test]
fn a_role_runs_instead_of_a_suite() {
    let out = vrange_bench()
        .args(["role", "nonsense", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "vrange-bench role: unknown role \"nonsense\"\n",
        "{}",
        show(&out)
    );
    assert!(out.stdout.is_empty(), "{}", show(&out));
}
