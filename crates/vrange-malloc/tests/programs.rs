//! Real programs, unchanged, under the LD_PRELOAD shim: Python churning large buffers, SQLite
//! building and querying a database, git committing and repacking, gcc compiling a C program
//! that is then run under the shim too, and GNU sort sorting about 65 MiB. Each must exit
//! successfully with the same output as without the shim (or the known answer), and the shim's
//! exit summary (`VRANGE_MALLOC_STATS=1`) must show that it served large blocks. GNU sort
//! closes stderr in its own exit handler, before the shim's summary runs: its test is also the
//! regression test for the summary surviving that (the shim writes to a copy of stderr).
//!
//! The shim is built by the tests themselves (`vrange_testkit::build::shim`): cargo builds no cdylib for an
//! integration test. A program that is not installed makes its test print "skipped: ..." and
//! pass, unless `CI` is set: there every test must run.

// ci: guest 6.1 only: the allocator on 6.12 takes the host's paths but PT_RECLAIM's, and 6.1 has every fallback (no PT_RECLAIM, PAGEMAP_SCAN, UFFDIO_MOVE or MAP_DROPPABLE); real programs take minutes under emulation

mod common;
use common::*;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;
use vrange_testkit::proc::{output, show};
use vrange_testkit::scratch::Scratch;
use vrange_testkit::{missing, skip};

const PYTHON: &str = "/usr/bin/python3";
const SQLITE: &str = "/usr/bin/sqlite3";
const GIT: &str = "/usr/bin/git";
const GCC: &str = "/usr/bin/gcc";
const SORT: &str = "/usr/bin/sort";

/// Checks that a program succeeded under the shim and said nothing about vrange besides its
/// summaries; returns the blocks the shim served, summed over every process that printed a
/// summary (a program that runs others prints one per process).
fn check_shim_run(label: &str, cmd: &Command, out: &Output) -> u64 {
    assert!(
        out.status.success(),
        "{label} under the shim: {cmd:?} ended with {}\n{}",
        out.status,
        show(out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let complaints = vrange_complaints(&stderr);
    assert!(
        complaints.is_empty(),
        "{label} under the shim: unexpected messages {complaints:#?}\n{}",
        show(out)
    );
    let sums = summaries(&stderr);
    assert!(
        !sums.is_empty(),
        "{label} under the shim printed no summary: is the shim loaded?\n{}",
        show(out)
    );
    sums.iter().map(|s| s.allocations).sum()
}

fn check_plain_run(label: &str, cmd: &Command, out: &Output) {
    assert!(
        out.status.success(),
        "{label} without the shim: {cmd:?} ended with {}\n{}",
        out.status,
        show(out)
    );
}

/// Asserts that the shim served at least one large block for a workload that makes them.
fn assert_served(label: &str, served: u64) {
    assert!(
        served > 0,
        "{label}: the shim served no block, so the workload did not run on vrange-malloc"
    );
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Churns bytearrays and bytes of 64 KiB to 8 MiB (some kept, some dropped), grows one
/// bytearray to 12 MB by appending (realloc), joins, hashes, and builds a large list and a
/// dict; prints a checksum of everything. Deterministic.
const PYTHON_CHURN: &str = r#"
import hashlib
import random

r = random.Random(42)
h = hashlib.sha256()
live = []
digests = {}
for i in range(160):
    n = r.choice([64 << 10, 96 << 10, 256 << 10, 1 << 20, 3 << 20, 8 << 20]) + r.randrange(4096)
    b = bytearray(n)
    b[0::4096] = bytes([i & 255]) * len(range(0, n, 4096))
    b[-1] = i & 255
    h.update(b)
    live.append(bytes(b))
    if len(live) > 12:
        old = live.pop(r.randrange(len(live)))
        digests[i] = hashlib.md5(old).hexdigest()
    if i % 40 == 39:
        h.update(hashlib.sha1(b"".join(live)).digest())
        h.update(",".join(str(x) * 100 for x in range(2000)).encode())
acc = bytearray()
for k in range(300):
    acc += bytes([k & 255]) * 40000
h.update(acc)
numbers = list(range(300000))
numbers.reverse()
h.update(str(sum(numbers)).encode())
h.update(repr(sorted(digests.items())).encode())
print(h.hexdigest(), len(digests), len(acc))
"#;

#[test]
fn python_churning_large_buffers_prints_the_same_checksum() {
    if let Some(why) = missing(&[PYTHON]) {
        return skip(why);
    }
    let started = Instant::now();
    let dir = Scratch::new("python");
    let script = dir.join("churn.py");
    std::fs::write(&script, PYTHON_CHURN).unwrap();
    let python = |shim: bool| {
        let mut cmd = Command::new(PYTHON);
        // Isolated: no user site, no PYTHON* variables.
        cmd.arg("-I").arg(&script).current_dir(dir.path());
        if shim {
            with_shim(&mut cmd, &[]);
        } else {
            without_shim(&mut cmd);
        }
        let out = output(&mut cmd);
        (cmd, out)
    };
    let (cmd, plain) = python(false);
    check_plain_run("python", &cmd, &plain);
    let (cmd, shimmed) = python(true);
    let served = check_shim_run("python", &cmd, &shimmed);

    let expected = stdout(&plain);
    let fields: Vec<&str> = expected.split_whitespace().collect();
    assert!(
        fields.len() == 3 && fields[0].len() == 64 && fields[2] == "12000000",
        "unexpected output without the shim: {expected:?}"
    );
    assert_eq!(
        stdout(&shimmed),
        expected,
        "python's checksum differs under the shim"
    );
    assert_served("python", served);
    println!(
        "python: checksum {} in both runs; the shim served {served} blocks; {} ms",
        fields[0],
        started.elapsed().as_millis()
    );
}

const SQLITE_ROWS: u64 = 100_000;
/// Rows whose blobs are concatenated (in hex) into one string of about 14 MB, grown by realloc.
const SQLITE_CONCAT: u64 = 20_000;

/// Builds a table of `SQLITE_ROWS` rows with blobs of 200..499 bytes under a 64 MiB page cache
/// and in-memory temporary storage (large allocations), indexes it, checks its integrity,
/// queries aggregates and builds one large string.
fn sqlite_script() -> String {
    format!(
        "PRAGMA cache_size = -65536;\n\
         PRAGMA temp_store = MEMORY;\n\
         CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER NOT NULL, v BLOB NOT NULL);\n\
         BEGIN;\n\
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {SQLITE_ROWS})\n\
           INSERT INTO t SELECT x, (x * 7919) % 1000, randomblob(200 + x % 300) FROM c;\n\
         COMMIT;\n\
         CREATE INDEX t_k ON t(k);\n\
         PRAGMA integrity_check;\n\
         SELECT count(*), sum(k), sum(length(v)), count(DISTINCT k) FROM t;\n\
         SELECT k, count(*) FROM t WHERE k BETWEEN 10 AND 12 GROUP BY k ORDER BY k;\n\
         SELECT count(*) FROM (SELECT v FROM t ORDER BY v LIMIT 50000);\n\
         SELECT length(group_concat(hex(v), '')) FROM t WHERE id <= {SQLITE_CONCAT};\n"
    )
}

/// What `sqlite_script` must print.
fn sqlite_expected() -> String {
    let k_sum: u64 = (1..=SQLITE_ROWS).map(|x| x * 7919 % 1000).sum();
    let len_sum: u64 = (1..=SQLITE_ROWS).map(|x| 200 + x % 300).sum();
    let hex_len: u64 = (1..=SQLITE_CONCAT).map(|x| 2 * (200 + x % 300)).sum();
    format!("ok\n{SQLITE_ROWS}|{k_sum}|{len_sum}|1000\n10|100\n11|100\n12|100\n50000\n{hex_len}\n")
}

#[test]
fn sqlite_builds_indexes_and_queries_a_database() {
    if let Some(why) = missing(&[SQLITE]) {
        return skip(why);
    }
    let started = Instant::now();
    let dir = Scratch::new("sqlite");
    let script = dir.join("build.sql");
    std::fs::write(&script, sqlite_script()).unwrap();
    let sqlite = |db: &str, shim: bool| {
        let mut cmd = Command::new(SQLITE);
        cmd.args(["-batch", "-bail", db])
            .stdin(std::fs::File::open(&script).unwrap())
            .current_dir(dir.path())
            // No ~/.sqliterc.
            .env("HOME", dir.path());
        if shim {
            with_shim(&mut cmd, &[]);
        } else {
            without_shim(&mut cmd);
        }
        let out = output(&mut cmd);
        (cmd, out)
    };
    let (cmd, plain) = sqlite("plain.db", false);
    check_plain_run("sqlite3", &cmd, &plain);
    let (cmd, shimmed) = sqlite("shim.db", true);
    let served = check_shim_run("sqlite3", &cmd, &shimmed);

    let expected = sqlite_expected();
    assert_eq!(stdout(&plain), expected, "sqlite3 without the shim");
    assert_eq!(stdout(&shimmed), expected, "sqlite3 under the shim");
    assert_served("sqlite3", served);
    println!(
        "sqlite3: {SQLITE_ROWS} rows, integrity ok, aggregates as expected in both runs; the \
         shim served {served} blocks; {} ms",
        started.elapsed().as_millis()
    );
}

/// A deterministic byte stream (xorshift64*), for file contents.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Writes the files of the scratch repository: 40 text files of 5 KB to 1 MB and a 4 MiB
/// incompressible one, so that git reads, deflates and packs large buffers.
fn write_repo_files(dir: &Path) {
    for i in 0..40u64 {
        let text: String = (0..(i * i * 25 + 200))
            .map(|l| format!("file {i} line {l}: {}\n", l * 7919 % 1000))
            .collect();
        std::fs::write(dir.join(format!("f{i:02}.txt")), text).unwrap();
    }
    std::fs::write(dir.join("blob.bin"), noise(7, 4 << 20)).unwrap();
}

/// Runs the git session in a fresh repository; returns `git log`'s output and every
/// command's stderr.
fn git_session(dir: &Path, shim: bool) -> (String, String) {
    let mut log = String::new();
    let mut stderr = String::new();
    let steps: [&[&str]; 7] = [
        &["init", "-q", "-b", "main", "."],
        &["add", "-A"],
        &["commit", "-q", "-m", "vrange-malloc under git"],
        &["gc", "-q"],
        &["fsck", "--full", "--strict", "--no-progress"],
        &["log", "--format=%H %T %an <%ae> %s"],
        &["count-objects", "-v"],
    ];
    for args in steps {
        let mut cmd = Command::new(GIT);
        cmd.args([
            "-c",
            "user.name=Vrange Test",
            "-c",
            "user.email=vrange@example.invalid",
            "-c",
            "gc.auto=0",
            "-c",
            "maintenance.auto=false",
        ])
        .args(args)
        .current_dir(dir)
        // No configuration but the -c options above: nothing read or written outside `dir`.
        .env("HOME", dir)
        .env("XDG_CONFIG_HOME", dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_DATE", "2024-01-02T03:04:05Z")
        .env("GIT_COMMITTER_DATE", "2024-01-02T03:04:05Z")
        .env("LC_ALL", "C")
        .env("TZ", "UTC");
        for var in [
            "GIT_DIR",
            "GIT_WORK_TREE",
            "GIT_INDEX_FILE",
            "GIT_OBJECT_DIRECTORY",
        ] {
            cmd.env_remove(var);
        }
        let out = output(shim_if(&mut cmd, shim));
        assert!(
            out.status.success(),
            "git {} ({}): {cmd:?} ended with {}\n{}",
            args[0],
            if shim {
                "under the shim"
            } else {
                "without the shim"
            },
            out.status,
            show(&out)
        );
        stderr.push_str(&String::from_utf8_lossy(&out.stderr));
        if args[0] == "log" {
            log = stdout(&out);
        }
    }
    (log, stderr)
}

#[test]
fn git_commits_repacks_and_logs_a_repository() {
    if let Some(why) = missing(&[GIT]) {
        return skip(why);
    }
    let started = Instant::now();
    let scratch = Scratch::new("git");
    let (plain_dir, shim_dir) = (scratch.join("plain"), scratch.join("shim"));
    for d in [&plain_dir, &shim_dir] {
        std::fs::create_dir(d).unwrap();
        write_repo_files(d);
    }
    let (plain_log, _) = git_session(&plain_dir, false);
    let (shim_log, stderr) = git_session(&shim_dir, true);

    let complaints = vrange_complaints(&stderr);
    assert!(complaints.is_empty(), "git under the shim: {complaints:#?}");
    let sums = summaries(&stderr);
    assert!(
        !sums.is_empty(),
        "git under the shim printed no summary\n{stderr}"
    );
    let served: u64 = sums.iter().map(|s| s.allocations).sum();
    assert!(
        shim_log.ends_with(" Vrange Test <vrange@example.invalid> vrange-malloc under git\n")
            && shim_log.lines().count() == 1,
        "git log under the shim does not show the commit: {shim_log:?}"
    );
    // Same files, author, dates and message: the same commit and tree ids.
    assert_eq!(shim_log, plain_log, "the commit differs under the shim");
    assert_served("git", served);
    println!(
        "git: commit {} in both runs; {} git processes under the shim served {served} blocks; \
         {} ms",
        &shim_log[..12],
        sums.len(),
        started.elapsed().as_millis()
    );
}

#[test]
fn gcc_builds_a_program_that_runs_under_the_shim() {
    if let Some(why) = missing(&[GCC]) {
        return skip(why);
    }
    let started = Instant::now();
    let dir = Scratch::new("gcc");
    let exe = dir.join("big_blocks");
    let mut cmd = Command::new(GCC);
    cmd.args(["-O2", "-pthread", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(c_source("big_blocks.c"))
        .current_dir(dir.path());
    let built = output(with_shim(&mut cmd, &[]));
    let gcc_served = check_shim_run("gcc", &cmd, &built);

    let mut cmd = Command::new(&exe);
    let plain = output(without_shim(&mut cmd));
    check_plain_run("big_blocks", &cmd, &plain);
    let mut cmd = Command::new(&exe);
    let shimmed = output(with_shim(&mut cmd, &[]));
    let served = check_shim_run("big_blocks", &cmd, &shimmed);

    let expected = stdout(&plain);
    assert!(
        expected.starts_with("big_blocks ok sum="),
        "big_blocks without the shim: {expected:?}"
    );
    assert_eq!(
        stdout(&shimmed),
        expected,
        "big_blocks differs under the shim"
    );
    assert_served("gcc", gcc_served);
    assert_served("big_blocks", served);
    println!(
        "gcc: compiled and linked under the shim ({gcc_served} blocks served); the program ran \
         the same under the shim ({served} blocks served); {} ms",
        started.elapsed().as_millis()
    );
}

/// Lines in the file to sort (about 65 MiB).
const SORT_LINES: u64 = 1_250_000;

/// Writes `SORT_LINES` lines of a random key, the line number and 0..59 bytes of filler.
fn write_sort_input(path: &Path) -> u64 {
    use std::io::Write;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let filler = [b'x'; 60];
    for i in 0..SORT_LINES {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let key = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        write!(w, "{key:016x} {i} ").unwrap();
        w.write_all(&filler[..(key % 60) as usize]).unwrap();
        w.write_all(b"\n").unwrap();
    }
    w.flush().unwrap();
    std::fs::metadata(path).unwrap().len()
}

/// FNV-1a of a file, to show in the output which contents were compared.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

#[test]
fn sort_of_a_large_file_matches_plain_sort() {
    if let Some(why) = missing(&[SORT]) {
        return skip(why);
    }
    let started = Instant::now();
    let dir = Scratch::new("sort");
    let input = dir.join("input.txt");
    let size = write_sort_input(&input);
    let sort = |name: &str, preload: Option<&[&Path]>| {
        let out_file = dir.join(name);
        let mut cmd = Command::new(SORT);
        cmd.args(["-S", "64M", "-T"])
            .arg(dir.path())
            .arg("-o")
            .arg(&out_file)
            .arg(&input)
            .env("LC_ALL", "C");
        match preload {
            Some(extra) => with_shim(&mut cmd, extra),
            None => without_shim(&mut cmd),
        };
        let out = output(&mut cmd);
        (cmd, out, out_file)
    };
    let (cmd, plain, plain_file) = sort("plain.txt", None);
    check_plain_run("sort", &cmd, &plain);
    let (cmd, shimmed, shim_file) = sort("shim.txt", Some(&[]));
    let served = check_shim_run("sort", &cmd, &shimmed);

    let expected = std::fs::read(&plain_file).unwrap();
    assert_eq!(expected.len() as u64, size, "sort keeps every byte");
    {
        let label = "under the shim";
        let got = std::fs::read(&shim_file).unwrap();
        assert!(
            got == expected,
            "sort output differs {label}: {} bytes, FNV {:016x}; without the shim {} bytes, \
             FNV {:016x}",
            got.len(),
            fnv(&got),
            expected.len(),
            fnv(&expected)
        );
    }
    assert_served("sort", served);
    println!(
        "sort: {:.1} MiB, {SORT_LINES} lines, byte-identical output (FNV {:016x}) without the \
         shim and under it ({served} blocks served); {} ms",
        size as f64 / (1 << 20) as f64,
        fnv(&expected),
        started.elapsed().as_millis()
    );
}
