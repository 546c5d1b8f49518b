//! reaction: how long each pressure source takes from its signal to bytes freed.
//!
//! - `explicit`: `vrange::purge` of one 64 MiB managed range (the call's duration).
//! - `budget`: a mark takes resident volatile bytes 32 MiB over a 32 MiB budget; reaction is
//!   the reclaimer's, from the wake-up the mark sends to the purge's end.
//! - `headroom`, `vmpressure`, `psi`: a holder process in a child memory cgroup (256 MiB limit)
//!   keeps 160 MiB of volatile ranges (4 MiB each; managed for headroom, hybrid armed after
//!   100 ms for the other two, see `holder`) with only that source enabled; a hog
//!   in the same cgroup then touches 160 MiB, 4 MiB every 10 ms. Reaction is from the signal's
//!   arrival (poll returning, or the tick that found headroom short) to the end of the purge.
//!   The hog must survive (no OOM kill).
//!
//! Every number is a median over the events of the run (`trials` for the first two). Needs
//! root and a cgroup v1 memory hierarchy for the last three; prints `skipped: <reason>`
//! otherwise. Re-executes itself for the holder and the hog (`VRANGE_REACTION_ROLE`).

use std::process::Command;
use std::time::{Duration, Instant};
use vrange::{Options, Policy, Source, VolatileRegion};
use vrange_testkit::proc::{Exit, Proc};
use vrange_testkit::{cgroup, hog};

const MIB: usize = 1 << 20;

fn managed(len: usize) -> VolatileRegion {
    region(len, Policy::Managed)
}

fn region(len: usize, policy: Policy) -> VolatileRegion {
    let r = VolatileRegion::new(
        len,
        Options {
            policy,
            ..Options::default()
        },
    )
    .expect("region");
    // SAFETY: the region is ours and nothing refers into it.
    unsafe { r.as_ptr().write_bytes(0x5A, r.len()) };
    r
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

fn us(ns: u64) -> String {
    format!("{:.1} µs", ns as f64 / 1e3)
}

fn quiet() {
    for (k, v) in [
        ("VRANGE_PSI", "off"),
        ("VRANGE_VMPRESSURE", "off"),
        ("VRANGE_HEADROOM", "off"),
        ("VRANGE_BUDGET", "0"),
    ] {
        vrange::set_option(k, v).unwrap();
    }
}

fn explicit(trials: usize) -> u64 {
    quiet();
    let mut t = Vec::new();
    for _ in 0..trials {
        let r = managed(64 * MIB);
        // SAFETY: nothing refers into the region.
        unsafe { r.mark().unwrap() };
        let t0 = Instant::now();
        assert_eq!(vrange::purge(1), 64 * MIB);
        t.push(t0.elapsed().as_nanos() as u64);
    }
    median(t)
}

fn budget(trials: usize) -> u64 {
    quiet();
    vrange::set_option("VRANGE_BUDGET", "32M").unwrap();
    let mut t = Vec::new();
    for _ in 0..trials {
        let a = managed(32 * MIB);
        let b = managed(32 * MIB);
        let before = vrange::stats().source(Source::Budget).purging_events;
        // SAFETY: nothing refers into the regions.
        unsafe {
            a.mark().unwrap();
            b.mark().unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while vrange::stats().source(Source::Budget).purging_events == before {
            assert!(Instant::now() < deadline, "budget never enforced");
            std::thread::sleep(Duration::from_millis(1));
        }
        t.push(vrange::stats().source(Source::Budget).reaction_last_ns);
    }
    quiet();
    median(t)
}

fn spawn(role: &str, source: &str) -> Proc {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env("VRANGE_REACTION_ROLE", role)
        .env("VRANGE_REACTION_SOURCE", source);
    Proc::spawn(cmd)
}

/// (events that purged, bytes purged, median-ish reaction: last, max, mean ns, OOM kills).
fn cgroup_source(source: &str) -> Result<String, String> {
    const DEADLINE: Duration = Duration::from_secs(60);
    let cg = cgroup::child("vrange-reaction", 256 * MIB as u64)?;
    let ooms = cg.cgroup().oom_kills().unwrap_or(0);
    let mut holder = spawn("holder", source);
    cg.add_pid(holder.pid()).map_err(|e| e.to_string())?;
    holder.send("go");
    let ready = holder.next_line(DEADLINE);
    assert_eq!(
        ready.as_deref().map(str::trim),
        Ok("ready"),
        "holder: {}",
        holder.stderr_so_far()
    );
    let mut hog = spawn("hog", source);
    cg.add_pid(hog.pid()).map_err(|e| e.to_string())?;
    hog.send("go");
    let hog_exit = hog.wait(DEADLINE);
    std::thread::sleep(Duration::from_millis(300));
    let line = if holder.send("report") {
        holder.next_line(DEADLINE).unwrap_or_default()
    } else {
        String::new()
    };
    let holder_exit = holder.wait(DEADLINE);
    let ooms = cg.cgroup().oom_kills().unwrap_or(0) - ooms;
    let fate = |e: Exit| {
        if e == Exit::Code(0) {
            "survived".to_string()
        } else {
            format!("KILLED ({e})")
        }
    };
    Ok(format!(
        "{} | holder {}, hog {} | OOM kills {ooms}",
        if line.trim().is_empty() {
            "no report"
        } else {
            line.trim()
        },
        fate(holder_exit),
        fate(hog_exit)
    ))
}

fn holder(source: &str) {
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    quiet();
    vrange::set_option("VRANGE_POLL_MS", "20").unwrap();
    let (name, value) = match source {
        "headroom" => ("VRANGE_HEADROOM", "32M"),
        "vmpressure" => ("VRANGE_VMPRESSURE", "on"),
        _ => ("VRANGE_PSI", "some 50000 2000000"),
    };
    vrange::set_option(name, value).unwrap();
    // Without swap the kernel never scans anonymous memory, so vmpressure and PSI see reclaim
    // only where there is something to scan: armed (lazy-free) hybrid ranges. Headroom needs no
    // kernel reclaim at all and is measured on managed ranges.
    let policy = if source == "headroom" {
        Policy::Managed
    } else {
        vrange::set_option("VRANGE_ARM_DELAY_MS", "100").unwrap();
        Policy::Hybrid
    };
    let regions: Vec<VolatileRegion> = (0..40).map(|_| region(4 * MIB, policy)).collect();
    for r in &regions {
        // SAFETY: nothing refers into the regions.
        unsafe { r.mark().unwrap() };
    }
    std::thread::sleep(Duration::from_millis(1500)); // sources open, PSI's averages settle
    println!("ready");
    let mut cmd = String::new();
    std::io::stdin().read_line(&mut cmd).unwrap();
    let st = vrange::stats();
    let mut fired = Vec::new();
    for s in Source::ALL {
        let c = st.source(s);
        if c.bytes > 0 {
            fired.push(format!(
                "{}: {} purges, {} MiB, reaction last {} max {} mean {}",
                s.name(),
                c.purging_events,
                c.bytes >> 20,
                us(c.reaction_last_ns),
                us(c.reaction_max_ns),
                us(c.reaction_total_ns / c.purging_events.max(1))
            ));
        }
    }
    let lost: usize = regions.iter().map(|r| r.unmark().unwrap().purged).sum();
    println!(
        "{}; pages reported lost {lost} ({} MiB), of which the reclaimer purged {} MiB",
        if fired.is_empty() {
            "no source purged".into()
        } else {
            fired.join("; ")
        },
        (lost * vrange::page_size()) >> 20,
        st.purged_total_bytes >> 20
    );
}

fn hog() {
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    hog::touch(40 * 4 * MIB, 4 * MIB, Duration::from_millis(10)).expect("map the hog's memory");
}

fn main() {
    if let Ok(role) = std::env::var("VRANGE_REACTION_ROLE") {
        let source = std::env::var("VRANGE_REACTION_SOURCE").unwrap_or_default();
        match role.as_str() {
            "holder" => holder(&source),
            _ => hog(),
        }
        return;
    }
    let quick = std::env::var_os("VRANGE_BENCH_QUICK").is_some();
    let trials = if quick { 5 } else { 21 };
    println!("| source | reaction (median) | notes |");
    println!("|---|---|---|");
    println!(
        "| explicit | {} | purge(64 MiB managed range), {trials} trials |",
        us(explicit(trials))
    );
    println!(
        "| budget | {} | 32 MiB over a 32 MiB budget, {trials} trials |",
        us(budget(trials))
    );
    for source in ["headroom", "vmpressure", "psi"] {
        match cgroup_source(source) {
            Ok(line) => println!("| {source} | see notes | {line} |"),
            Err(why) => println!("| {source} | skipped: {why} | |"),
        }
    }
}
