//! coordinate: several processes with volatile caches and a neighbour whose demand ramps up,
//! in one memory cgroup, under three ways of making room: each process's own reclaimer, the
//! coordinator (one purge order for the whole cgroup), and the kernel's OOM killer alone; the
//! first two with the caches in private memory and in shared memory.
//!
//! Every configuration runs in a fresh child memory cgroup, with the same processes (this
//! executable again, `vrange-bench role ...`):
//! - `coordinate-participant INDEX CHUNKS RATE EPOCH_NS FILL_NS END_NS MODE PREFILL`: a cache
//!   of `CHUNKS` chunks of 4 MiB, filled at `FILL_NS` (the participants start staggered), then
//!   serving `RATE` requests a second until `END_NS`: a request draws a chunk from a Zipf law,
//!   pins it, checks it (a hit) or fills it again when it was purged or is missing (a miss),
//!   and unpins it. The participants differ in load: a busy service and ever quieter ones, so
//!   that the oldest data of the container is the quiet ones' and the youngest the busy one's.
//!   `MODE` `volatile`: the chunks are managed `VolatileRegion`s, volatile while unpinned;
//!   `shared`: the chunks are page ranges of one shared region, pinned and unpinned range by
//!   range, which a partner process (`coordinate-partner END_NS`) maps too until the end;
//!   `plain`: ordinary memory (the kill-based baseline: only an OOM kill makes room). Every
//!   participant makes itself the OOM killer's first choice (`oom_score_adj` 1000), so the
//!   neighbour is spared, and a killed one is started again after [`RESTART`] with an empty
//!   cache, as a supervisor would. It prints a line a second (`sec n= req= hit= miss= wrong=
//!   purged=`), a line per chunk found purged with the time the chunk had been volatile
//!   (`purge chunk= age_ms=`, the age when it was last seen intact: a scan every
//!   [`SCAN`]), and the reaction times its own reclaimer reports (`vrange::stats()`: signal to
//!   bytes freed).
//! - `neighbour PEAK EPOCH_NS WARMUP_MS PERIOD_MS END_NS` (`neighbour.rs`, the cache suite's
//!   too): resident memory 0 → PEAK → 0 over the period (a raised cosine) after the warm-up.
//!
//! Configurations: per-process reclaimers (`VRANGE_COORDINATOR=off`), the coordinator
//! (`vrange_coordinator::run` in a thread of this process, watching the child cgroup, with
//! the daemon's default settings; the participants get `VRANGE_COORDINATOR=<its socket>`),
//! the same two with shared memory (without swap the kernel cannot drop shared pages: every
//! byte the neighbour gets back comes from a purge, so the time from pressure to headroom
//! back is how fast a purge reaches it), and kill-based (plain memory). Reported per
//! configuration: OOM kills (the cgroup's
//! `oom_kill` counter), participants killed and their time without service, the youngest and
//! the median age of the data purged, the time from pressure to memory returned (sampled: the
//! cgroup's headroom under the reclaimers' threshold until it is back above it; and as the
//! purgers report it: the coordinator's rounds, `vrange_coordinator_last_response_seconds`, or
//! each reclaimer's reaction time), and the participants' hit rate, overall, while the
//! neighbour is above half its peak, and per participant.

use super::coordinator::InProcess;
use super::neighbour::{Neighbour, Ramp};
use super::plot::{self, Axis, Series, Unit};
use super::report::{self, mib, pct, progress, Csv, Table};
use super::service::{
    headroom, plot_over_time, sleep_until, Rng, Sample, Samples, Seat, Second, Seconds, Zipf, MIB,
    RESTART, SEC,
};
use super::Ctx;
use std::path::PathBuf;
use std::time::Duration;
use vrange::{Policy, Source, VolatileRegion};
use vrange_sys::clock::now_ns;
use vrange_testkit::proc::{clean_command, Proc};
use vrange_testkit::role::field;
use vrange_testkit::{cgroup, procfs};

/// Bytes of one chunk of a participant's cache.
const CHUNK: usize = 4 << 20;
/// Requests per second of each participant: a busy service, then ever quieter ones.
const RATES: [u64; 4] = [400, 100, 25, 6];
/// The Zipf exponent of the chunks' popularity within a participant.
const ZIPF: f64 = 1.0;
/// The neighbour's peak, in percent of the limit.
const NEIGHBOUR_PERCENT: u64 = 50;
/// Between the participants' start (each fills its cache then).
const STAGGER: Duration = Duration::from_millis(500);
/// How often a participant looks for purged chunks (the resolution of the ages).
const SCAN: Duration = Duration::from_millis(5);

mod roles;
mod scenario;

pub use roles::{participant_role, partner_role};
use scenario::*;

/// "45 ms" or "1.23 s" from milliseconds.
fn ms(v: f64) -> String {
    if v < 1000.0 {
        format!("{v:.0} ms")
    } else {
        format!("{:.2} s", v / 1000.0)
    }
}

/// The median of `v` and how many, as a cell.
fn median_cell(v: &[f64], unit_ns: f64) -> String {
    match report::median(&mut v.to_vec()) {
        Some(m) => format!("{} ({})", report::ns(m * unit_ns), v.len()),
        None => "–".into(),
    }
}

fn earlyoom() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("earlyoom"))
        .find(|p| p.is_file())
}

pub fn run(ctx: &Ctx) -> Result<(), String> {
    if !ctx.memory_cgroups("coordinate") {
        return Ok(());
    }
    let quick = ctx.quick();
    let limit = if quick { 128 * MIB } else { 256 * MIB };
    let s = Scenario {
        limit,
        chunks: if quick { 4 } else { 8 },
        neighbour: Ramp {
            peak: limit * NEIGHBOUR_PERCENT / 100,
            warmup: Duration::from_secs(if quick { 3 } else { 5 }),
            period: Duration::from_secs(if quick { 8 } else { 20 }),
            tail: Duration::from_secs(if quick { 1 } else { 3 }),
        },
    };
    let n = RATES.len();
    let cache = n as u64 * s.chunks as u64 * CHUNK as u64;
    ctx.say(format!(
        "Scenario: {n} participants and a neighbour in one memory cgroup of {} (no swap). \
         Participant i holds a cache of {} chunks of {} MiB ({} in all), filled {} ms after \
         participant i−1, and serves {} requests/s (participant 0 to {}): a request draws a \
         chunk from a Zipf law (s = {ZIPF}), pins it, checks it (a hit) or fills it again \
         when it was purged or is missing (a miss), and unpins it. The busy participant's \
         data is young, the quiet ones' old. The neighbour holds nothing for {} s, then \
         ramps its resident memory 0 → {} ({NEIGHBOUR_PERCENT} % of the limit) → 0 over {} \
         s (a raised cosine), then nothing for {} s. Every participant makes itself the OOM \
         killer's first choice (oom_score_adj 1000), so the neighbour is spared; a killed \
         participant is started again after {} s with an empty cache. Configurations: \
         per-process reclaimers (managed volatile regions, VRANGE_COORDINATOR=off, default \
         settings: VRANGE_HEADROOM=auto, {} here), the coordinator (the same regions; \
         vrange_coordinator::run in a thread of the bench, watching the cgroup with the \
         daemon's defaults: headroom auto, {} here, a 50 ms tick), the same two with the \
         caches in shared memory (each participant's chunks are page ranges of one shared \
         region, pinned and unpinned range by range, which a partner process maps too, as a \
         browser maps a renderer's discardable memory: without swap the kernel cannot drop \
         shared pages by itself, so the room comes from the reclaimers or the coordinator \
         alone, and 'pressure → headroom back' is how fast their purge reaches the \
         neighbour), and kill-based (the same data in ordinary memory: only an OOM kill makes \
         room).",
        mib(limit),
        s.chunks,
        CHUNK as u64 / MIB,
        mib(cache),
        STAGGER.as_millis(),
        RATES.map(|r| r.to_string()).join(", "),
        n - 1,
        s.neighbour.warmup.as_secs(),
        mib(s.neighbour.peak),
        s.neighbour.period.as_secs(),
        s.neighbour.tail.as_secs(),
        RESTART.as_secs(),
        mib(headroom(limit)),
        mib(headroom(limit)),
    ));
    ctx.say(match earlyoom() {
        None => "The kill-based baseline is the kernel OOM killer alone (earlyoom is not \
                 installed here)."
            .to_string(),
        Some(p) => format!(
            "The kill-based baseline is the kernel OOM killer alone ({} is installed but not \
             used).",
            p.display()
        ),
    });
    let mut runs = Vec::new();
    for config in Config::ALL {
        progress(format!(
            "coordinate: {} ({} s)",
            config.label(),
            s.neighbour.total().as_secs()
        ));
        runs.push(run_one(&s, config)?);
    }
    let secs = s.neighbour.seconds();
    let high = |i: usize| s.neighbour.at(i as f64 + 0.5) >= s.neighbour.peak / 2;
    let mut table = Table::new(&[
        "configuration",
        "OOM kills",
        "participants killed",
        "downtime",
        "requests not served",
        "data purged",
        "youngest purged",
        "median age purged",
        "pressure → headroom back",
        "purger's reaction",
        "hit rate",
        "hit rate, neighbour above half its peak",
        "worst second",
        "peak cgroup memory",
        "wrong values",
    ]);
    let mut csv = Csv::new(&[
        "configuration",
        "limit_bytes",
        "oom_kills",
        "participants_killed",
        "participant_killed_at_s",
        "neighbour_killed_at_s",
        "downtime_s",
        "requests_not_served",
        "chunks_purged",
        "bytes_purged",
        "youngest_purged_ms",
        "median_age_purged_ms",
        "pressure_episodes",
        "pressure_median_s",
        "pressure_max_s",
        "pressure_open_at_end_s",
        "reactions",
        "reaction_median_ns",
        "requests",
        "hits",
        "hit_rate",
        "hit_rate_neighbour_high",
        "worst_second_hit_rate",
        "peak_cgroup_bytes",
        "wrong_values",
        "participant_connections",
        "requests_obeyed",
        "pressure_deferred",
        "coordinator_rounds",
        "coordinator_requests",
        "coordinator_freed_bytes",
    ]);
    let mut seconds_csv = Csv::new(&[
        "configuration",
        "second",
        "requests",
        "hits",
        "hit_rate",
        "chunks_purged",
        "youngest_purged_ms",
        "neighbour_target_bytes",
        "neighbour_rss_bytes",
        "cgroup_usage_bytes",
    ]);
    let mut participants_csv = Csv::new(&[
        "configuration",
        "participant",
        "rate_per_s",
        "requests",
        "hits",
        "hit_rate",
        "chunks_purged",
        "youngest_purged_ms",
        "killed",
    ]);
    let mut purges_csv = Csv::new(&["configuration", "participant", "t_s", "age_ms"]);
    let mut series = Vec::new();
    let mut wrong = 0u64;
    for (config, run) in Config::ALL.iter().zip(&runs) {
        let t = run.seconds.total();
        wrong += t.wrong;
        let worst = run
            .seconds
            .iter()
            .filter(|x| x.req > 0)
            .map(Second::rate)
            .fold(f64::MAX, f64::min);
        let worst = if worst == f64::MAX { 0.0 } else { worst };
        let purged_bytes = run.purges.len() as u64 * CHUNK as u64;
        let volatile = *config != Config::Kill;
        let oom = match run.oom_kills {
            None => "?".into(),
            Some(k) if run.neighbour_kills.is_empty() => k.to_string(),
            Some(k) => format!("{k} (neighbour {})", run.neighbour_kills.len()),
        };
        let mut episodes = run.episodes.clone();
        let pressure = match report::median(&mut episodes) {
            Some(m) => format!("{} ({})", report::ns(m * 1e9), run.episodes.len()),
            None if run.open_episode.is_some() => "never".into(),
            None => "–".into(),
        };
        let reaction = match config {
            Config::Kill => "–".into(),
            c if c.coordinated() => median_cell(&run.rounds, 1.0),
            _ => median_cell(&run.reactions, 1.0),
        };
        table.row(vec![
            config.label().into(),
            oom,
            run.kills.len().to_string(),
            if run.down > 0.0 {
                format!("{:.1} s", run.down)
            } else {
                "0".into()
            },
            format!("{:.0}", run.unserved),
            if volatile {
                mib(purged_bytes)
            } else {
                "–".into()
            },
            run.youngest_purged().map_or("–".into(), |a| ms(a as f64)),
            run.median_age().map_or("–".into(), ms),
            pressure,
            reaction,
            pct(t.rate()),
            pct(run.seconds.rate_where(high)),
            pct(worst),
            run.peak.map_or("?".into(), mib),
            t.wrong.to_string(),
        ]);
        let join = |v: &mut dyn Iterator<Item = f64>| {
            v.map(|k| format!("{k:.1}")).collect::<Vec<_>>().join(" ")
        };
        csv.row([
            config.label().to_string(),
            limit.to_string(),
            run.oom_kills.map_or(String::new(), |k| k.to_string()),
            run.kills.len().to_string(),
            join(&mut run.kills.iter().map(|k| k.1)),
            join(&mut run.neighbour_kills.iter().copied()),
            format!("{:.2}", run.down),
            format!("{:.0}", run.unserved),
            run.purges.len().to_string(),
            purged_bytes.to_string(),
            run.youngest_purged()
                .map_or(String::new(), |a| a.to_string()),
            report::opt(run.median_age(), 0),
            run.episodes.len().to_string(),
            report::opt(report::median(&mut run.episodes.clone()), 3),
            report::opt(run.episodes.iter().copied().reduce(f64::max), 3),
            report::opt(run.open_episode, 3),
            if config.coordinated() {
                run.rounds.len()
            } else {
                run.reactions.len()
            }
            .to_string(),
            report::opt(
                report::median(&mut if config.coordinated() {
                    run.rounds.clone()
                } else {
                    run.reactions.clone()
                }),
                0,
            ),
            t.req.to_string(),
            t.hit.to_string(),
            format!("{:.4}", t.rate()),
            format!("{:.4}", run.seconds.rate_where(high)),
            format!("{worst:.4}"),
            run.peak.map_or(String::new(), |p| p.to_string()),
            t.wrong.to_string(),
            run.connections.to_string(),
            run.obeyed.to_string(),
            run.deferred.to_string(),
            run.coordinator.map_or(String::new(), |c| c.0.to_string()),
            run.coordinator.map_or(String::new(), |c| c.1.to_string()),
            run.coordinator.map_or(String::new(), |c| c.2.to_string()),
        ]);
        for (i, sec) in run.seconds.iter().enumerate() {
            let mean = |f: fn(&Sample) -> u64| report::opt(run.samples.mean_in(i, f), 0);
            seconds_csv.row([
                config.label().to_string(),
                i.to_string(),
                sec.req.to_string(),
                sec.hit.to_string(),
                format!("{:.4}", sec.rate()),
                sec.purged.to_string(),
                run.youngest_in(i).map_or(String::new(), |a| a.to_string()),
                s.neighbour.at(i as f64 + 0.5).to_string(),
                mean(|x| x.neighbour),
                mean(|x| x.usage),
            ]);
        }
        for (p, per) in run.per.iter().enumerate() {
            participants_csv.row([
                config.label().to_string(),
                p.to_string(),
                RATES[p].to_string(),
                per.req.to_string(),
                per.hit.to_string(),
                format!("{:.4}", per.rate()),
                run.purges.iter().filter(|x| x.0 == p).count().to_string(),
                run.purges
                    .iter()
                    .filter(|x| x.0 == p)
                    .map(|x| x.2)
                    .min()
                    .map_or(String::new(), |a| a.to_string()),
                run.kills.iter().filter(|k| k.0 == p).count().to_string(),
            ]);
        }
        for &(p, t, age) in &run.purges {
            purges_csv.row([
                config.label().to_string(),
                p.to_string(),
                format!("{t:.3}"),
                age.to_string(),
            ]);
        }
        // Requests that arrived while a killed participant was down count as not answered
        // from the cache: the plot shows what clients saw.
        series.push(Series::new(
            config.short(),
            run.seconds
                .iter()
                .enumerate()
                .filter(|(_, sec)| sec.req > 0)
                .map(|(i, sec)| {
                    let lost = run.unserved_seconds.get(i).copied().unwrap_or(0.0);
                    (
                        i as f64 + 0.5,
                        100.0 * sec.hit as f64 / (sec.req as f64 + lost),
                    )
                })
                .collect(),
        ));
    }
    ctx.table(&table);
    ctx.say(
        "OOM kills: the cgroup's oom_kill counter. Downtime: participant-seconds from a kill \
         to the restarted participant serving again. Data purged: chunks found purged, and \
         the time each had been volatile (unused) when last seen intact (a scan every 5 ms); \
         a kill loses all of a participant's data, the youngest too, and is not counted \
         there. Pressure → headroom back: the median time the cgroup's headroom (limit − \
         usage, sampled every 10 ms) stayed under the reclaimers' threshold, and how many \
         times it fell under it. Purger's reaction: per-process, each reclaimer's time from \
         the pressure signal to the bytes freed (vrange::stats()), one per purge; \
         coordinator, from the pressure it saw to the last participant's answer, one per \
         round (vrange_coordinator_last_response_seconds: a round ends with the last answer). \
         Requests not served: \
         those that arrived while a killed participant was down (its rate × its downtime). \
         Hit rate: hits over requests served, every participant together (the busy one \
         weighs most).",
    );
    // Per participant: who paid for the room made.
    let mut headers = vec!["participant".to_string(), "requests/s".to_string()];
    for c in Config::ALL {
        headers.push(format!("{}: hit rate", c.short()));
        headers.push(format!(
            "{}: {}",
            c.short(),
            if c == Config::Kill {
                "killed"
            } else {
                "purged"
            }
        ));
    }
    let header_refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut per_table = Table::new(&header_refs);
    for (p, rate) in RATES.iter().enumerate() {
        let mut row = vec![p.to_string(), rate.to_string()];
        for (c, run) in Config::ALL.iter().zip(&runs) {
            row.push(pct(run.per[p].rate()));
            row.push(if *c == Config::Kill {
                run.kills.iter().filter(|k| k.0 == p).count().to_string()
            } else {
                let mine: Vec<u64> = run
                    .purges
                    .iter()
                    .filter(|x| x.0 == p)
                    .map(|x| x.2)
                    .collect();
                match mine.iter().min() {
                    Some(y) => format!(
                        "{} (youngest {})",
                        mib(mine.len() as u64 * CHUNK as u64),
                        ms(*y as f64)
                    ),
                    None => "0".into(),
                }
            });
        }
        per_table.row(row);
    }
    ctx.table(&per_table);
    let coord = &runs[1];
    if coord.never_connected > 0 {
        ctx.say(format!(
            "Note: {} participant process(es) of the coordinator's run never connected to it.",
            coord.never_connected
        ));
    }
    if let Some((rounds, requests, freed)) = coord.coordinator {
        let events: Vec<String> = coord
            .coordinator_events
            .iter()
            .map(|(src, n)| format!("{src} {n}"))
            .collect();
        ctx.say(format!(
            "The coordinator: {rounds} rounds, {requests} purge requests, {} freed for it; \
             pressure events seen: {} (a medium event asks for a quarter of the volatile \
             bytes, a critical one for all of them); the participants obeyed {} requests and \
             left {} pressure signals to it.",
            mib(freed),
            events.join(", "),
            coord.obeyed,
            coord.deferred
        ));
    }
    // How fast a purge of shared memory reaches the neighbour, beside the same data private.
    let back = |r: &Run| {
        report::median(&mut r.episodes.clone()).map_or("–".to_string(), |m| report::ns(m * 1e9))
    };
    let reacted = |c: Config, r: &Run| {
        report::median(&mut if c.coordinated() {
            r.rounds.clone()
        } else {
            r.reactions.clone()
        })
        .map_or("–".to_string(), report::ns)
    };
    ctx.say(format!(
        "How fast a purge reaches the neighbour with the caches in shared memory (which the \
         kernel cannot drop by itself here): the headroom was back {} after it fell under the \
         threshold with the per-process reclaimers ({} with private memory), {} with the \
         coordinator ({} private); the purgers' reaction {} and {} ({} and {} private). The \
         partners (one per participant, about 4 MiB resident each, most of it the program's \
         shared text) are in the cgroup too. Shared pages are punched out 4 KiB at a time \
         (shmem_enabled is never by default), the private chunks are THP-advised: a purge of \
         shared memory costs the kernel more per byte.",
        back(&runs[2]),
        back(&runs[0]),
        back(&runs[3]),
        back(&runs[1]),
        reacted(Config::SharedPerProcess, &runs[2]),
        reacted(Config::SharedCoordinator, &runs[3]),
        reacted(Config::PerProcess, &runs[0]),
        reacted(Config::Coordinator, &runs[1]),
    ));
    if let Some((rounds, requests, freed)) = runs[3].coordinator {
        ctx.say(format!(
            "The coordinator with shared regions: {rounds} rounds, {requests} purge requests \
             (the participants' private memory: none here), {} freed, the shared regions' \
             pages purged by the coordinator itself, in holes punched for both processes \
             mapping each.",
            mib(freed),
        ));
    }
    let per_process = &runs[0];
    if !per_process.sources.is_empty() {
        let by: Vec<String> = per_process
            .sources
            .iter()
            .map(|(src, n)| format!("{src} {n}"))
            .collect();
        ctx.say(format!(
            "The per-process reclaimers purged on these signals (purging events, all \
             participants): {}.",
            by.join(", ")
        ));
    }
    csv.write(&ctx.out, "coordinate.csv")?;
    seconds_csv.write(&ctx.out, "coordinate-seconds.csv")?;
    participants_csv.write(&ctx.out, "coordinate-participants.csv")?;
    purges_csv.write(&ctx.out, "coordinate-purges.csv")?;
    plot_over_time(
        ctx,
        "coordinate",
        format!(
            "Hit rate, {n} participants, neighbour up to {NEIGHBOUR_PERCENT} % of {}",
            mib(limit)
        ),
        "hit rate, killed = miss (%); neighbour (% of limit)",
        series,
        &runs[0].samples,
        secs,
        limit,
    )?;
    // How young the data thrown away was: per volatile configuration, MiB purged of data
    // volatile for at most x ms (each chunk at the age it was last seen intact).
    let ages: Vec<Series> = Config::ALL
        .iter()
        .zip(&runs)
        .filter(|(c, _)| **c != Config::Kill)
        .map(|(c, run)| {
            let mut a: Vec<u64> = run.purges.iter().map(|x| x.2.max(1)).collect();
            a.sort_unstable();
            let points = a
                .iter()
                .enumerate()
                .map(|(i, &ms)| (ms as f64, ((i + 1) * CHUNK) as f64 / MIB as f64))
                .collect();
            Series::new(c.short(), points)
        })
        .collect();
    let svg = plot::lines(
        &ctx.figure("Data purged by how long it had been unused"),
        &Axis::log("unused for at most (ms)", Unit::Plain),
        &Axis::linear("MiB purged (cumulative)", Unit::Plain),
        &ages,
    );
    report::write_file(&ctx.out, "coordinate-ages.svg", &svg)?;
    if wrong > 0 {
        return Err(format!("{wrong} wrong values read from the caches"));
    }
    Ok(())
}
