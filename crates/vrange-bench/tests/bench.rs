//! `vrange-bench SUITE --quick`: every suite runs, prints its machine and an aligned table of
//! the expected shape whose numbers are present and sane (positive, finite), and writes the
//! same table in Markdown, its CSV files and an SVG plot marked as a smoke test with the
//! machine on it. Nothing here checks that anything is fast: quick runs are smoke tests.
//! Suites that need root or a memory cgroup print `skipped: <reason>`; so does this test then,
//! unless `CI` is set, where it fails. The suites run one at a time (`serial`): they measure,
//! and two at once would share the machine's cores.

mod common;
use common::vrange_bench;

use vrange_testkit::build::shim;
use vrange_testkit::scratch::Scratch;
use vrange_testkit::{is_root, serial, skip};

struct Out {
    /// What the command printed.
    text: String,
    /// The suite's report in Markdown (`SUITE.md`).
    md: String,
    /// Where it wrote its files, removed on drop.
    dir: Scratch,
}

fn bench(suite: &str, extra: &[&str]) -> Out {
    let dir = Scratch::new(&format!("bench-{suite}"));
    let out = vrange_bench()
        .args([suite, "--quick", "--out"])
        .arg(dir.path())
        .arg("--lib")
        .arg(shim())
        .args(extra)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "vrange-bench {suite} failed ({}):\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let machine = std::fs::read_to_string(dir.join("machine.md")).unwrap();
    for key in ["cores", "kernel", "THP"] {
        assert!(
            machine.contains(&format!("| {key} |")),
            "no machine line {key}:\n{machine}"
        );
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{key} "))),
            "no machine line {key}:\n{text}"
        );
    }
    let md = std::fs::read_to_string(dir.join(format!("{suite}.md")))
        .unwrap_or_else(|e| panic!("{suite}.md: {e}\n{text}"));
    Out { text, md, dir }
}

/// The rows (cells trimmed) of the first Markdown table whose header starts with `first`,
/// in the suite's report; the same table printed on the terminal must be aligned and hold
/// the same cells.
fn table(out: &Out, first: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let (header, rows) = markdown_table(&out.md, first);
    aligned_table(&out.text, &header, &rows);
    (header, rows)
}

/// The rows (cells trimmed) of the first Markdown table whose header starts with `first`.
fn markdown_table(text: &str, first: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with(&format!("| {first} |")))
        .unwrap_or_else(|| panic!("no table starting with {first:?}:\n{text}"));
    let cells = |l: &str| -> Vec<String> {
        let inner = l.trim().trim_start_matches('|').trim_end_matches('|');
        inner.split(" | ").map(|c| c.trim().to_string()).collect()
    };
    let header = cells(lines[start]);
    assert!(
        lines[start + 1].starts_with("|---|"),
        "no separator under the header"
    );
    let rows: Vec<Vec<String>> = lines[start + 2..]
        .iter()
        .take_while(|l| l.starts_with('|'))
        .map(|l| cells(l))
        .collect();
    for r in &rows {
        assert_eq!(
            r.len(),
            header.len(),
            "row {r:?} does not match header {header:?}"
        );
    }
    assert!(!rows.is_empty(), "table {first:?} has no rows");
    (header, rows)
}

/// Column spans (start, end) in characters: the runs of dashes of a table's rule.
fn spans(rule: &[char]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, &c) in rule.iter().chain([&' ']).enumerate() {
        match (c, start) {
            ('-', None) => start = Some(i),
            (' ', Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// The cell of `line` in column span `(start, end)`, trimmed.
fn cut(line: &[char], (start, end): (usize, usize)) -> String {
    let end = end.min(line.len());
    line.get(start..end.max(start))
        .unwrap_or(&[])
        .iter()
        .collect::<String>()
        .trim()
        .to_string()
}

/// The terminal table with this header: the header, a rule of dashes per column, a line per
/// row. Every cell lies within its column's dashes with spaces either side, on every line,
/// and reads the same as in Markdown; only a note row's last cell (skipped, failed) may run
/// past its column.
fn aligned_table(text: &str, header: &[String], rows: &[Vec<String>]) {
    let lines: Vec<Vec<char>> = text.lines().map(|l| l.chars().collect()).collect();
    let is_rule = |l: &[char]| l.first() == Some(&'-') && l.iter().all(|c| *c == '-' || *c == ' ');
    let start = (0..lines.len().saturating_sub(1))
        .find(|&i| {
            let s = spans(&lines[i + 1]);
            is_rule(&lines[i + 1])
                && s.len() == header.len()
                && s.iter()
                    .zip(header)
                    .all(|(&sp, h)| cut(&lines[i], sp) == *h)
        })
        .unwrap_or_else(|| panic!("no aligned table with header {header:?}:\n{text}"));
    let spans = spans(&lines[start + 1]);
    for (k, row) in rows.iter().enumerate() {
        let line = &lines[start + 2 + k];
        let shown: String = line.iter().collect();
        let given = row.iter().rposition(|c| !c.is_empty()).map_or(0, |i| i + 1);
        for (c, cell) in row.iter().enumerate().take(given) {
            let (s, e) = spans[c];
            if c + 1 == given {
                // The last cell given: it may be a note running on to the end of the line.
                let rest = cut(line, (s, line.len()));
                assert_eq!(&rest, cell, "row {k} of {header:?}:\n{shown}");
            } else {
                assert_eq!(&cut(line, (s, e)), cell, "row {k} column {c}:\n{shown}");
                assert_eq!(
                    line.get(e),
                    Some(&' '),
                    "cell runs past its column:\n{shown}"
                );
            }
            assert!(s == 0 || line[s - 1] == ' ', "cell starts early:\n{shown}");
        }
    }
}

/// The first number in a cell ("1.23 µs (45.6)" → 1.23, "102,640 kB" → 102640).
fn num(cell: &str) -> Option<f64> {
    let start = cell.find(|c: char| c.is_ascii_digit())?;
    let s: String = cell[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ',')
        .filter(|c| *c != ',')
        .collect();
    s.parse().ok()
}

fn positive(cell: &str, what: &str) -> f64 {
    let v = num(cell).unwrap_or_else(|| panic!("{what}: no number in {cell:?}"));
    assert!(v.is_finite() && v > 0.0, "{what}: {cell:?} is not positive");
    v
}

/// `name` exists in the output directory; a CSV has a header and rows of numbers or words,
/// with no NaN or infinity.
fn files(out: &Out, names: &[&str]) {
    for name in names {
        let path = out.dir.join(name);
        if !name.contains('.') {
            assert!(path.is_file(), "{} missing", path.display());
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), out.text));
        if name.ends_with(".svg") {
            assert!(
                text.starts_with("<svg") && text.trim_end().ends_with("</svg>"),
                "{name}"
            );
            // A quick run's plot says it is not a measurement, and where it was made.
            assert!(
                text.contains("SMOKE TEST (--quick): not a measurement"),
                "{name} is not marked as a smoke test"
            );
            let kernel = vrange_sys::procfs::kernel_release().unwrap();
            let machine = format!("{} cores", std::thread::available_parallelism().unwrap());
            assert!(
                text.contains(&machine) && text.contains(&format!("Linux {}", kernel.trim())),
                "{name} does not name the machine"
            );
        } else {
            assert!(text.lines().count() >= 2, "{name} has no rows:\n{text}");
            let lower = text.to_lowercase();
            assert!(
                !lower.contains("nan") && !lower.contains("inf,"),
                "{name}:\n{text}"
            );
        }
    }
}

/// The index of the column `name` in a table's header.
fn column(header: &[String], name: &str) -> usize {
    header
        .iter()
        .position(|h| h == name)
        .unwrap_or_else(|| panic!("no column {name:?} in {header:?}"))
}

/// `suite` at --quick, for a suite that needs root and a memory cgroup; `None` once skipped,
/// here or by the suite itself (`skipped: SUITE` in its output).
fn bench_in_cgroups(suite: &str) -> Option<Out> {
    if let Some(why) = needs_cgroups() {
        skip(&why);
        return None;
    }
    let out = bench(suite, &[]);
    if out.text.contains(&format!("skipped: {suite}")) {
        skip(format!("{suite} suite skipped (see its output)"));
        return None;
    }
    Some(out)
}

fn needs_cgroups() -> Option<String> {
    if !is_root() {
        return Some("not root".into());
    }
    if vrange_sys::cgroup::MemCgroup::current().is_none() {
        return Some("no memory cgroup".into());
    }
    None
}

#[test]
fn ebizzy_quick_runs_every_allocator() {
    let _s = serial();
    let out = bench("ebizzy", &["--seconds", "0.2"]);
    let (header, rows) = table(&out, "allocator");
    assert_eq!(header[2], "threads");
    assert_eq!(header[3], "median records/s");
    let mut ran = 0;
    for r in rows.iter().filter(|r| !r[3].starts_with("skipped")) {
        positive(&r[3], "records/s");
        positive(&r[4], "records/CPU-s");
        ran += 1;
    }
    for must in ["glibc", "vrange-malloc"] {
        assert!(
            rows.iter().any(|r| r[0] == must && num(&r[3]).is_some()),
            "{must} did not run:\n{}",
            out.text
        );
    }
    assert!(ran >= 4, "{}", out.text);
    let (_, published) = table(&out, "published");
    assert!(published.iter().any(|r| r[0].contains("MADV_FREE")));
    files(
        &out,
        &[
            "ebizzy.csv",
            "ebizzy-runs.csv",
            "ebizzy.svg",
            "churn",
            "machine.md",
        ],
    );
}

#[test]
fn markcost_quick_measures_every_method() {
    let _s = serial();
    let out = bench("markcost", &[]);
    let (header, rows) = table(&out, "size");
    assert_eq!(
        &header[1..6],
        ["managed", "hybrid", "lazy", "madv_free", "dontneed_refault"]
    );
    assert_eq!(rows.len(), 3);
    for r in &rows {
        for cell in &r[1..header.len()] {
            positive(cell, &header[1]);
        }
    }
    files(&out, &["markcost.csv", "markcost.svg"]);
}

#[test]
fn pairs_quick_costs_every_allocator_at_each_size() {
    let _s = serial();
    let out = bench("pairs", &["--threads", "1,2"]);
    let (header, rows) = table(&out, "size");
    assert_eq!(header[1], "threads");
    assert_eq!(header.last().unwrap(), "vrange-malloc / glibc");
    assert_eq!(rows.len(), 6, "three sizes at 1 and 2 threads");
    let ours = header.iter().position(|h| h == "vrange-malloc").unwrap();
    for r in &rows {
        positive(&r[2], "glibc");
        positive(&r[ours], "vrange-malloc");
        positive(r.last().unwrap(), "vrange-malloc / glibc");
    }
    files(&out, &["pairs.csv"]);
}

#[test]
fn lazyfree_quick_times_madv_free_by_folio_size() {
    let _s = serial();
    let out = bench("lazyfree", &[]);
    let (_, rows) = table(&out, "folio size");
    assert!(
        rows.len() >= 2 || out.text.contains("skipped"),
        "{}",
        out.text
    );
    assert_eq!(rows[0][0], "4KiB");
    for r in &rows {
        positive(&r[2], "MADV_FREE time");
        positive(&r[3], "per GiB");
    }
    if out.text.contains("skipped: mTHP") {
        vrange_testkit::skip_lacking(
            "mTHP (Linux 6.8)",
            vrange::features().mthp_sizes.is_empty(),
            "mTHP sizes not measured (see the output)",
        );
    }
    files(&out, &["lazyfree.csv", "lazyfree.svg"]);
}

#[test]
fn pagetable_quick_reports_vmpte_per_method() {
    let _s = serial();
    let out = bench("pagetable", &[]);
    let (header, rows) = table(&out, "method");
    assert_eq!(header[1], "VmPTE at the end");
    assert_eq!(rows.len(), 4);
    for r in rows.iter().filter(|r| !r[1].starts_with("skipped")) {
        positive(&r[1], "VmPTE");
        positive(&r[2], "VmPTE max");
        positive(&r[5], "time");
    }
    if let Some(r) = rows.iter().find(|r| r[1].starts_with("skipped")) {
        skip(&r[1]);
    }
    files(&out, &["pagetable.csv", "pagetable.svg"]);
}

#[test]
fn pressure_quick_runs_the_peak_and_the_next_process() {
    let _s = serial();
    let Some(out) = bench_in_cgroups("pressure") else {
        return;
    };
    let (header, rows) = table(&out, "allocator");
    assert_eq!(header[2], "next process");
    assert_eq!(rows.len(), 2, "quick: glibc and vrange-malloc");
    for r in &rows {
        positive(&r[3], "next time");
        assert!(num(&r[4]).is_some(), "OOM kills: {:?}", r[4]);
    }
    files(&out, &["pressure.csv", "pressure-rss.csv", "pressure.svg"]);
}

#[test]
fn refill_quick_reads_the_compressed_file_every_way() {
    let _s = serial();
    if let Some(why) = needs_cgroups() {
        return skip(&why);
    }
    let out = bench("refill", &[]);
    let (header, rows) = table(&out, "method");
    assert_eq!(header[1], "random reads/s");
    assert_eq!(rows.len(), 5, "{}", out.text);
    assert!(
        rows[0][1].starts_with("did not finish"),
        "ordinary memory cannot hold four times the limit: {:?}",
        rows[0]
    );
    let col = |name: &str| column(&header, name);
    for r in &rows[1..] {
        positive(&r[1], "random reads/s");
        positive(&r[2], "sequential MB/s");
        assert_eq!(r[col("OOM kills")], "0", "no OOM kill: {r:?}");
    }
    // Both refill regions: the refill thread's and the one filled on the faulting thread.
    positive(&rows[3][col("fills")], "fills");
    positive(&rows[4][col("fills")], "fills");
    let (fh, frows) = table(&out, "one fault on a missing page, fill included");
    assert_eq!(fh[1], "per fault");
    assert_eq!(frows.len(), 3);
    for r in &frows {
        positive(&r[1], "per fault");
    }
    files(&out, &["refill.csv", "refill.svg"]);
}

#[test]
fn cache_quick_compares_the_hot_path_and_runs_the_scenario() {
    let _s = serial();
    if let Some(why) = needs_cgroups() {
        return skip(&why);
    }
    let out = bench("cache", &[]);
    let (header, rows) = table(&out, "value");
    assert_eq!(header[2], "vrange-cache");
    assert!(rows.len() >= 6, "{}", out.text);
    for r in &rows[..6] {
        for cell in &r[2..6] {
            positive(cell, "ns per hit");
        }
    }
    // The scenario's table: one miss cost (--quick), three peers.
    let (header, rows) = table(&out, "miss cost");
    let col = |name: &str| column(&header, name);
    let vr = rows
        .iter()
        .find(|r| r[col("peer")].starts_with("vrange-cache"))
        .unwrap_or_else(|| panic!("no vrange-cache row:\n{}", out.text));
    assert_eq!(vr[col("OOM kills")], "0", "{vr:?}");
    assert_eq!(rows.len(), 3, "three peers");
    assert!(rows.iter().all(|r| r[0] == "0 µs"), "{rows:?}");
    for r in &rows {
        assert_eq!(r[col("wrong values")], "0", "{r:?}");
    }
    // The hit ratio on the synthetic trace: every cache at five memory sizes.
    let (header, rows) = table(&out, "memory");
    assert_eq!(header[1], "vrange-cache");
    assert_eq!(rows.len(), 5, "{}", out.text);
    for r in &rows {
        for cell in &r[1..5] {
            let ratio = positive(cell, "hit ratio");
            assert!(ratio <= 100.0, "{r:?}");
        }
    }
    files(
        &out,
        &[
            "cache-hot.csv",
            "cache-scenario.csv",
            "cache-seconds.csv",
            "cache.svg",
            "cache-trace.csv",
            "cache-trace.svg",
            "trace-synthetic.txt",
        ],
    );
}

/// `--trace FILE` in ARC's format: a loop over 16384 blocks (64 MiB of 4 KiB values), five
/// times, replayed alone. Each size is a quarter of the footprint at most, so an exact LRU
/// evicts every block before its next request: it never hits. The others are measured, not
/// predicted.
#[test]
fn cache_trace_replays_an_arc_file_alone() {
    let dir = Scratch::new("bench-trace");
    let trace = dir.join("loop.arc");
    // Each loop in two requests of 8192 blocks.
    let lines: String = (0..10)
        .map(|i| format!("{} 8192 0 {i}\n", (i % 2) * 8192))
        .collect();
    std::fs::write(&trace, lines).unwrap();
    let out = bench("cache", &["--trace", trace.to_str().unwrap()]);
    assert!(
        out.text.contains("81920 requests, 16384 distinct keys"),
        "{}",
        out.text
    );
    assert!(
        !out.md.contains("| requests/s"),
        "the scenario ran:\n{}",
        out.md
    );
    let (header, rows) = table(&out, "memory");
    let lru = column(&header, "lru");
    assert_eq!(rows.len(), 5);
    for r in &rows {
        assert_eq!(r[lru], "0.0 %", "{r:?}");
    }
    files(&out, &["cache-trace.csv", "cache-trace.svg"]);
}

/// The SQLite service beside its neighbour: SQLite's own cache at two sizes and
/// `vrange_sqlite_pcache()`, loaded from the libvrange.so beside the command (built here for
/// this profile, as the C ABI's test builds it).
#[test]
fn sqlite_quick_runs_the_service_on_each_cache() {
    let _s = serial();
    let profile = vrange_testkit::build::profile();
    vrange_testkit::build::cargo_build("vrange-ffi", &profile.name)
        .unwrap_or_else(|e| panic!("building libvrange.so failed: {e}"));
    let Some(out) = bench_in_cgroups("sqlite") else {
        return;
    };
    let (header, rows) = table(&out, "peer");
    let col = |name: &str| column(&header, name);
    assert_eq!(rows.len(), 3, "three caches:\n{}", out.text);
    assert!(
        rows[2][0].starts_with("vrange_sqlite_pcache()"),
        "{:?}",
        rows[2]
    );
    for r in &rows {
        positive(&r[col("operations/s")], "operations/s");
        assert_eq!(r[col("wrong rows")], "0", "{r:?}");
    }
    assert_eq!(rows[2][col("OOM kills")], "0", "{:?}", rows[2]);
    files(&out, &["sqlite-seconds.csv", "sqlite.svg"]);
}

#[test]
fn coordinate_quick_compares_reclaimers_coordinator_and_kills() {
    let _s = serial();
    let Some(out) = bench_in_cgroups("coordinate") else {
        return;
    };
    let (header, rows) = table(&out, "configuration");
    let col = |name: &str| column(&header, name);
    let labels = [
        "per-process reclaimers",
        "coordinator",
        "shared, per-process reclaimers",
        "shared, coordinator",
        "kill-based (kernel OOM killer)",
    ];
    assert_eq!(
        rows.len(),
        labels.len(),
        "{} configurations:\n{}",
        labels.len(),
        out.text
    );
    for (row, label) in rows.iter().zip(labels) {
        assert_eq!(row[0], label, "{row:?}");
        assert!(num(&row[col("OOM kills")]).is_some(), "{row:?}");
        positive(&row[col("hit rate")], "hit rate");
        assert_eq!(row[col("wrong values")], "0", "{row:?}");
    }
    // The coordinator lets no participant be killed, with the caches in private or in shared
    // memory (which only a purger can give back without swap).
    for purged in [&rows[1], &rows[3]] {
        assert_eq!(purged[col("OOM kills")], "0", "{purged:?}");
        assert_eq!(purged[col("participants killed")], "0", "{purged:?}");
    }
    assert!(
        out.md
            .contains("How fast a purge reaches the neighbour with the caches in shared memory"),
        "the report says how fast a purge of shared memory reaches the neighbour"
    );
    let (_, per) = table(&out, "participant");
    assert_eq!(per.len(), 4, "four participants");
    assert!(
        out.md.contains("kernel OOM killer alone"),
        "the report names the kill-based baseline"
    );
    files(
        &out,
        &[
            "coordinate.csv",
            "coordinate-seconds.csv",
            "coordinate-participants.csv",
            "coordinate.svg",
        ],
    );
}

#[test]
fn proactive_quick_runs_every_configuration() {
    let _s = serial();
    let Some(out) = bench_in_cgroups("proactive") else {
        return;
    };
    let (header, rows) = table(&out, "configuration");
    let col = |name: &str| column(&header, name);
    let labels = [
        "(a) nothing proactive",
        "(b) senpai-style, plain cache (no vrange)",
        "(b′) senpai-style beside vrange-cache",
        "(c) vrange daemon --proactive",
    ];
    assert_eq!(rows.len(), labels.len(), "{}", out.text);
    for (row, label) in rows.iter().zip(labels) {
        assert_eq!(row[0], label, "{row:?}");
        positive(&row[col("mean memory")], "mean memory");
        positive(&row[col("requests/s")], "requests/s");
        positive(&row[col("hit rate")], "hit rate");
        assert!(num(&row[col("OOM kills")]).is_some(), "{row:?}");
        assert_eq!(row[col("wrong values")], "0", "{row:?}");
    }
    // vrange's configurations kill nothing.
    for row in [&rows[0], &rows[3]] {
        assert_eq!(row[col("OOM kills")], "0", "{row:?}");
    }
    let (_, targets) = table(&out, "target");
    assert!(targets.len() >= 5, "{targets:?}");
    files(&out, &["proactive-seconds.csv", "proactive.svg"]);
}

#[test]
fn tradeoff_quick_puts_every_configuration_on_both_axes() {
    let _s = serial();
    let Some(out) = bench_in_cgroups("tradeoff") else {
        return;
    };
    let (header, rows) = table(&out, "allocator");
    let col = |name: &str| column(&header, name);
    let ops = col("ops/s");
    // Every configuration has its row; one whose allocator is not installed says so, any
    // other ran (a failed one fails this test).
    let ran: Vec<&Vec<String>> = rows
        .iter()
        .filter(|r| !(r[ops].starts_with("skipped") && r[ops].contains("installed")))
        .collect();
    for r in &ran {
        positive(&r[ops], &format!("ops/s of {r:?}"));
        assert_eq!(r[col("threads")], "1", "quick: one thread: {r:?}");
        assert!(num(&r[col("peak RSS")]).is_some(), "{r:?}");
        assert!(num(&r[col("returned within 1 s")]).is_some(), "{r:?}");
        assert!(num(&r[col("OOM kills (all runs)")]).is_some(), "{r:?}");
        assert!(!r[col("neighbour")].is_empty(), "{r:?}");
    }
    let configs = |allocator: &str| ran.iter().filter(|r| r[0] == allocator).count();
    assert_eq!(configs("glibc"), 2, "glibc as shipped and with huge pages");
    assert_eq!(
        configs("vrange-malloc"),
        5,
        "hybrid, arming at once, without THP, managed, lazy"
    );
    for peer in ["jemalloc", "mimalloc"] {
        let n = configs(peer);
        assert!(
            n == 0 || n == 3,
            "{peer}: as shipped, eager, huge pages: {n}"
        );
    }
    files(
        &out,
        &[
            "tradeoff.csv",
            "tradeoff-runs.csv",
            "tradeoff-rss.csv",
            "tradeoff.svg",
            "tradeoff",
        ],
    );
}

#[test]
fn stress_quick_runs_every_scenario_without_an_oom_kill() {
    let _s = serial();
    // A kill or a failed trial makes the suite, and so `bench`, fail: that is its point.
    let Some(out) = bench_in_cgroups("stress") else {
        return;
    };
    let (header, rows) = table(&out, "scenario");
    let col = |name: &str| column(&header, name);
    let names: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        names,
        [
            "burst",
            "python-bytearrays",
            "tradeoff",
            "idle-peak",
            "cache",
            "sqlite"
        ]
    );
    for r in rows.iter().filter(|r| !r[1].starts_with("skipped")) {
        assert_eq!(r[col("trials")], "3", "quick: three trials: {r:?}");
        assert_eq!(r[col("OOM kills")], "0", "{r:?}");
        assert_eq!(r[col("failed trials")], "0", "{r:?}");
    }
    let burst = &rows[0];
    positive(&burst[col("reaction (median)")], "time to arm the region");
    assert!(out.md.contains("target met"), "{}", out.text);
    files(&out, &["stress.csv", "stress-trials.csv", "tradeoff"]);
}
