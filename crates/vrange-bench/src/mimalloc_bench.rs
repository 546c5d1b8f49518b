//! mimalloc-bench: the allocator field's own benchmark programs (the `bench/` directory of
//! github.com/daanx/mimalloc-bench: cfrac, espresso, barnes, larson, alloc-test, xmalloc-test,
//! cache-scratch, malloc-large, mstress, rptest, glibc-simple, glibc-thread, mleak), run as
//! that project's `bench.sh` runs them, under glibc, jemalloc, mimalloc and tcmalloc (Debian's,
//! as shipped) and vrange-malloc (as shipped: hybrid), all in one invocation.
//!
//! The programs are built from a checkout the user names (`--src DIR`): their sources are
//! other projects' (several licences) and not ours to carry, and a CI machine has no network
//! to fetch them. The build copies `DIR/bench` under `--out`, leaves out what `bench.sh`
//! downloads separately (shbench) and the security tests, and runs cmake (Release).
//!
//! Per program and allocator, the median over the trials of the time and of the peak RSS.
//! Time is wall time, except for the programs that run for a fixed time and print a rate,
//! whose *relative time* is derived from their output exactly as `bench.sh` does (larson,
//! xmalloc-test, rptest, glibc-thread). Peak RSS is GNU time's `%M` (the process's maximum
//! resident set), as in `bench.sh`. Targets (issue "clients that win"): vrange-malloc's time
//! within 3 % of glibc's and its peak RSS at most glibc's plus 256 KiB on every program; malloc-large at
//! least as fast as the best peer.

use super::alloc::{self, Config, Kind};
use super::report::{self, progress, Csv, Table};
use super::Ctx;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use vrange_testkit::proc::clean_command;

/// How a program's time is read.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Metric {
    /// Wall time.
    Wall,
    /// larson: ".* time: X" in its output.
    Larson,
    /// xmalloc-test: "rtime: X".
    Xmalloc,
    /// rptest: 2,000,000 / the N of "...N memory ops".
    Rptest,
    /// glibc-thread: 1,000,000,000 / its first number (iterations).
    GlibcThread,
}

/// One benchmark as `bench.sh` names and runs it: name, executable, arguments (`{procs}` is the
/// core count, `{src}` the checkout), standard input, and how its time is read.
struct Program {
    name: &'static str,
    exe: &'static str,
    args: &'static [&'static str],
    stdin: Option<&'static str>,
    metric: Metric,
}

const fn prog(
    name: &'static str,
    exe: &'static str,
    args: &'static [&'static str],
    metric: Metric,
) -> Program {
    Program {
        name,
        exe,
        args,
        stdin: None,
        metric,
    }
}

/// The programs of the issue, with `bench.sh`'s arguments (its `procs` is the core count).
const PROGRAMS: &[Program] = &[
    prog(
        "cfrac",
        "cfrac",
        &["17545186520507317056371138836327483792789528"],
        Metric::Wall,
    ),
    prog(
        "espresso",
        "espresso",
        &["{src}/bench/espresso/largest.espresso"],
        Metric::Wall,
    ),
    Program {
        name: "barnes",
        exe: "barnes",
        args: &[],
        stdin: Some("{src}/bench/barnes/input"),
        metric: Metric::Wall,
    },
    prog(
        "larsonN",
        "larson",
        &["5", "8", "1000", "5000", "100", "4141", "{procs}"],
        Metric::Larson,
    ),
    prog("alloc-test1", "alloc-test", &["1"], Metric::Wall),
    prog("alloc-testN", "alloc-test", &["{procs}"], Metric::Wall),
    prog(
        "xmalloc-testN",
        "xmalloc-test",
        &["-w", "{procs}", "-t", "5", "-s", "64"],
        Metric::Xmalloc,
    ),
    prog(
        "cache-scratch1",
        "cache-scratch",
        &["1", "1000", "1", "2000000", "{procs}"],
        Metric::Wall,
    ),
    prog(
        "cache-scratchN",
        "cache-scratch",
        &["{procs}", "1000", "1", "2000000", "{procs}"],
        Metric::Wall,
    ),
    prog("malloc-large", "malloc-large", &[], Metric::Wall),
    prog(
        "mstressN",
        "mstress",
        &["{procs}", "50", "25"],
        Metric::Wall,
    ),
    prog(
        "rptestN",
        "rptest",
        &["{procs}", "0", "1", "2", "500", "1000", "100", "8", "16000"],
        Metric::Rptest,
    ),
    prog("glibc-simple", "glibc-simple", &[], Metric::Wall),
    prog(
        "glibc-thread",
        "glibc-thread",
        &["{procs}"],
        Metric::GlibcThread,
    ),
    prog("mleak10", "mleak", &["5"], Metric::Wall),
    prog("mleak100", "mleak", &["50"], Metric::Wall),
];

/// What `--quick` runs: one of each kind, briefly.
const QUICK: &[&str] = &["cfrac", "glibc-simple", "malloc-large", "mleak10"];

/// A run longer than this is killed and reported as failed.
const TIMEOUT_S: &str = "600";

/// One run: seconds (as the metric reads them) and peak RSS.
#[derive(Clone, Copy, Debug)]
struct Run {
    seconds: f64,
    maxrss_kb: u64,
}

type Cell = report::Cell<Run>;

pub fn run(ctx: &Ctx) -> Result<(), String> {
    // `main` refuses the suite without --src (status 2).
    let src = ctx.args.src.clone().ok_or("--src DIR is required")?;
    let quick = ctx.quick();
    let reps = ctx.args.reps.unwrap_or(if quick { 1 } else { 3 }).max(1);
    let procs = super::machine::cores().to_string();
    let build = build(&src, &ctx.out.join("mimalloc-bench"))?;
    let mut versions = Vec::new();
    let mut configs: Vec<Config> = alloc::configs(ctx.lib(), &mut versions)
        .into_iter()
        .filter(|c| c.kind == Kind::Default || c.is_ours_default())
        .collect();
    // The floor of any allocator that forwards what it does not serve, beside ours.
    let forward = super::workload::FORWARD.install(&ctx.out)?;
    let at = configs
        .iter()
        .position(Config::is_ours_default)
        .unwrap_or(configs.len());
    configs.insert(
        at,
        Config {
            allocator: FORWARDING,
            label: String::new(),
            kind: Kind::Default,
            preload: Ok(Some(forward)),
            env: Vec::new(),
        },
    );
    let programs: Vec<&Program> = PROGRAMS
        .iter()
        .filter(|p| !quick || QUICK.contains(&p.name))
        .collect();
    ctx.say(format!(
        "mimalloc-bench ({}): its programs with bench.sh's arguments ({procs} cores), every \
         allocator as shipped ({}), and {FORWARDING} (malloc, free, calloc and realloc that \
         only call glibc's: the cost of LD_PRELOAD itself), {reps} trial(s) each, trials of one program interleaved \
         across allocators. Time: wall time, or for larson, xmalloc-test, rptest and \
         glibc-thread the relative time bench.sh derives from their output; peak RSS: GNU \
         time's %M. The median of the trials.",
        src.display(),
        versions.join(", ")
    ));
    let mut csv = Csv::new(&[
        "program",
        "allocator",
        "trial",
        "seconds",
        "maxrss_kb",
        "error",
    ]);
    let mut cells: Vec<Vec<Cell>> = Vec::new();
    for p in &programs {
        let mut row: Vec<Cell> = configs.iter().map(|_| Cell::default()).collect();
        for trial in 0..reps {
            for (c, cell) in configs.iter().zip(row.iter_mut()) {
                if cell.failed.is_some() {
                    continue;
                }
                progress(format!(
                    "mimalloc-bench: {} under {} ({trial})",
                    p.name,
                    c.short()
                ));
                match run_once(p, c, &build, &src, &procs) {
                    Ok(r) => {
                        csv.row([
                            p.name.to_string(),
                            c.short(),
                            trial.to_string(),
                            format!("{:.4}", r.seconds),
                            r.maxrss_kb.to_string(),
                            String::new(),
                        ]);
                        cell.runs.push(r);
                    }
                    Err(e) => {
                        csv.note(&[p.name, &c.short(), &trial.to_string()], &e);
                        cell.failed = Some(e);
                    }
                }
            }
        }
        cells.push(row);
    }
    let names: Vec<String> = configs.iter().map(Config::short).collect();
    ctx.say("Time (median; lower is better):");
    ctx.table(&table(&programs, &names, &cells, Measure::Time));
    ctx.say("Peak RSS (median; lower is better):");
    ctx.table(&table(&programs, &names, &cells, Measure::Rss));
    csv.write(&ctx.out, "mimalloc-bench.csv")?;
    Ok(())
}

/// The column of `c/forward.c`: interposition alone.
const FORWARDING: &str = "forwarding only";

/// What vrange-malloc's peak RSS may exceed glibc's by (KiB): its own image and bookkeeping.
const RSS_SLACK_KB: f64 = 256.0;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Measure {
    Time,
    Rss,
}

/// A table of one measure: a row per program, a column per allocator, then vrange-malloc
/// against glibc and the target.
fn table(programs: &[&Program], names: &[String], cells: &[Vec<Cell>], m: Measure) -> Table {
    let mut headers: Vec<&str> = vec!["program"];
    headers.extend(names.iter().map(String::as_str));
    headers.extend(["vrange-malloc / glibc", "forwarding only / glibc", "target"]);
    let mut t = Table::new(&headers);
    let ours = names.iter().position(|n| n.starts_with("vrange-malloc"));
    let glibc = names.iter().position(|n| n == "glibc");
    let forwarding = names.iter().position(|n| n == FORWARDING);
    for (p, row) in programs.iter().zip(cells) {
        let value = |cell: &Cell| match m {
            Measure::Time => cell.median(|r| r.seconds),
            Measure::Rss => cell.median(|r| r.maxrss_kb as f64),
        };
        let mut line = vec![p.name.to_string()];
        for cell in row {
            line.push(match (value(cell), &cell.failed) {
                (Some(v), _) if m == Measure::Time => format!("{v:.3} s"),
                (Some(v), _) => report::kb(v as u64),
                (None, Some(why)) => format!("failed: {why}"),
                (None, None) => "–".to_string(),
            });
        }
        let against_glibc = |column: Option<usize>| {
            column
                .zip(glibc)
                .and_then(|(c, g)| value(&row[c]).zip(value(&row[g])))
                .map(|(c, g)| c / g.max(1e-9))
        };
        let ratio = against_glibc(ours);
        line.push(report::times(ratio));
        line.push(report::times(against_glibc(forwarding)));
        let excess = ours
            .zip(glibc)
            .and_then(|(o, g)| value(&row[o]).zip(value(&row[g])))
            .map(|(o, g)| o - g);
        // The best peer: the fastest allocator of the others.
        let best = (0..row.len())
            .filter(|&i| Some(i) != ours && Some(i) != forwarding)
            .filter_map(|i| value(&row[i]))
            .fold(f64::INFINITY, f64::min);
        let mine = ours.and_then(|o| value(&row[o]));
        line.push(target(p, m, ratio, excess, mine, best));
        t.row(line);
    }
    t
}

/// Whether the target is met: time within 3 % of glibc's (malloc-large: at most the best
/// peer's), peak RSS at most glibc's plus 256 KiB (`excess`: ours minus glibc's, in the
/// measure's unit; `mine`: vrange-malloc's value; `best`: the fastest peer's, forwarding only
/// not counted).
fn target(
    p: &Program,
    m: Measure,
    ratio: Option<f64>,
    excess: Option<f64>,
    mine: Option<f64>,
    best: f64,
) -> String {
    let verdict = |met: bool, what: &str| {
        if met {
            format!("met ({what})")
        } else {
            format!("MISSED ({what})")
        }
    };
    match (m, ratio) {
        (_, None) => "–".to_string(),
        (Measure::Time, Some(_)) if p.name == "malloc-large" => {
            verdict(mine.is_some_and(|t| t <= best), "≤ the best peer")
        }
        (Measure::Time, Some(r)) => verdict(r <= 1.03, "≤ 1.03× glibc"),
        (Measure::Rss, Some(_)) => verdict(
            excess.is_some_and(|kb| kb <= RSS_SLACK_KB),
            "≤ glibc + 256 KiB",
        ),
    }
}

/// Builds the programs from `src` (a mimalloc-bench checkout) under `dir`; returns the
/// directory holding the executables.
fn build(src: &Path, dir: &Path) -> Result<PathBuf, String> {
    let bench = src.join("bench");
    let lists = bench.join("CMakeLists.txt");
    let text = std::fs::read_to_string(&lists).map_err(|e| {
        format!(
            "--src {}: {}: {e} (not a mimalloc-bench checkout?)",
            src.display(),
            lists.display()
        )
    })?;
    let copy = dir.join("src");
    let out = dir.join("build");
    let _ = std::fs::remove_dir_all(&copy);
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    command(Command::new("cp").arg("-a").arg(&bench).arg(&copy), "cp")?;
    std::fs::write(copy.join("CMakeLists.txt"), without_downloaded_parts(&text))
        .map_err(|e| format!("{}: {e}", copy.display()))?;
    command(
        Command::new("cmake")
            .arg("-S")
            .arg(&copy)
            .arg("-B")
            .arg(&out)
            .arg("-DCMAKE_BUILD_TYPE=Release"),
        "cmake (apt-get install cmake)",
    )?;
    let jobs = super::machine::cores().to_string();
    command(
        Command::new("cmake")
            .arg("--build")
            .arg(&out)
            .args(["-j", &jobs]),
        "cmake --build",
    )?;
    Ok(out)
}

/// bench/CMakeLists.txt without the targets whose sources `bench.sh` downloads (shbench) and
/// without the security tests (not benchmarks).
fn without_downloaded_parts(text: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in text.lines() {
        let t = line.trim();
        if t == "if(NOT APPLE)" {
            skipping = true;
            continue;
        }
        if skipping {
            if t == "endif()" {
                skipping = false;
            }
            continue;
        }
        if t.starts_with("add_subdirectory(security)") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Runs `cmd` to completion; its output is kept for the error.
fn command(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let tail: String = String::from_utf8_lossy(&out.stderr)
        .lines()
        .rev()
        .take(5)
        .collect::<Vec<_>>()
        .join(" | ");
    Err(format!("{what} failed ({}): {tail}", out.status))
}

/// `{procs}` and `{src}` in an argument.
fn expand(arg: &str, src: &Path, procs: &str) -> String {
    arg.replace("{procs}", procs)
        .replace("{src}", &src.display().to_string())
}

/// Runs `p` once under `c` (in `build`, as `bench.sh` runs it in its build directory), timed
/// by GNU time, killed after [`TIMEOUT_S`].
fn run_once(p: &Program, c: &Config, build: &Path, src: &Path, procs: &str) -> Result<Run, String> {
    let times = build.join(format!(".time-{}", p.name));
    let mut cmd = clean_command("timeout");
    cmd.arg(TIMEOUT_S)
        .arg("/usr/bin/time")
        .args(["-f", "%e %M", "-o"])
        .arg(&times)
        .arg(build.join(p.exe))
        .args(p.args.iter().map(|a| expand(a, src, procs)))
        .current_dir(build);
    c.apply(&mut cmd)?;
    match p.stdin {
        Some(f) => {
            let file = std::fs::File::open(expand(f, src, procs))
                .map_err(|e| format!("{}: {e}", expand(f, src, procs)))?;
            cmd.stdin(file);
        }
        None => {
            cmd.stdin(Stdio::null());
        }
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run timeout /usr/bin/time: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("exit {}", out.status));
    }
    let measured = std::fs::read_to_string(&times).map_err(|e| format!("GNU time: {e}"))?;
    let mut fields = measured
        .lines()
        .last()
        .unwrap_or_default()
        .split_whitespace();
    let wall: f64 = fields
        .next()
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| format!("GNU time wrote {measured:?}"))?;
    let maxrss_kb: u64 = fields
        .next()
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| format!("GNU time wrote {measured:?}"))?;
    let seconds = relative_time(p.metric, &stdout)
        .map(|t| t.unwrap_or(wall))
        .map_err(|e| format!("{}: {e}", p.name))?;
    Ok(Run { seconds, maxrss_kb })
}

/// The time `bench.sh` reports for `metric` given the program's output (`None`: wall time).
fn relative_time(metric: Metric, out: &str) -> Result<Option<f64>, String> {
    let after = |tag: &str| {
        out.lines().find_map(|l| {
            let at = l.find(tag)? + tag.len();
            number(&l[at..])
        })
    };
    let found = |v: Option<f64>| v.ok_or_else(|| format!("no {metric:?} figure in {out:?}"));
    Ok(match metric {
        Metric::Wall => None,
        Metric::Larson => Some(found(after(" time: "))?),
        Metric::Xmalloc => Some(found(after("rtime: "))?),
        Metric::Rptest => {
            let ops = found(out.lines().find_map(|l| {
                let end = l.find(" memory ops")?;
                let digits = l[..end].rsplit("...").next()?;
                number(digits)
            }))?;
            Some(2_000_000.0 / ops.max(1.0))
        }
        Metric::GlibcThread => {
            let iterations = found(out.lines().find_map(number))?;
            Some(1e9 / iterations.max(1.0))
        }
    })
}

/// The number at the start of `s` (after blanks).
fn number(s: &str) -> Option<f64> {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    s[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times_are_read_as_bench_sh_reads_them() {
        let larson = "Throughput =  1234 operations per second, relative time: 1.234s.";
        assert_eq!(relative_time(Metric::Larson, larson), Ok(Some(1.234)));
        assert_eq!(
            relative_time(Metric::Xmalloc, "rtime: 5.01, free: 3"),
            Ok(Some(5.01))
        );
        let rp = "Bench...1000000 memory ops/CPU second";
        assert_eq!(relative_time(Metric::Rptest, rp), Ok(Some(2.0)));
        assert_eq!(
            relative_time(Metric::GlibcThread, "500000000 iterations"),
            Ok(Some(2.0))
        );
        assert_eq!(relative_time(Metric::Wall, "anything"), Ok(None));
        assert!(relative_time(Metric::Larson, "no figure").is_err());
    }

    #[test]
    fn the_downloaded_and_security_targets_are_left_out() {
        let text =
            "add_executable(a a.c)\nif(NOT APPLE)\n  add_executable(sh6bench x.c)\nendif()\n\
                    add_executable(b b.c)\nadd_subdirectory(security)\n";
        assert_eq!(
            without_downloaded_parts(text),
            "add_executable(a a.c)\nadd_executable(b b.c)\n"
        );
    }
}
