//! Prometheus metrics as an operator meets them: a scrape answers at once with valid text
//! exposition (checked line by line as `promtool check metrics` does), the build and the
//! standard `process_*` self-metrics are there, participants are labelled by program and
//! cgroup (the pid only where asked), refusals say why, and a method other than GET is 405.

mod common;

use common::*;
use std::io::{Read, Write};
use std::time::{Duration, Instant};
use vrange_testkit::role::Role;
use vrange_testkit::{cgroup, serial, skip};

/// A loopback port free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP request; the whole answer.
fn http(port: u16, request: &str) -> String {
    let t0 = Instant::now();
    loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(mut c) => {
                c.write_all(request.as_bytes()).unwrap();
                let mut out = String::new();
                c.read_to_string(&mut out).unwrap();
                return out;
            }
            Err(e) if t0.elapsed() > Duration::from_secs(10) => panic!("metrics: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn scrape(port: u16) -> String {
    let answer = http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    assert!(
        head.contains(&format!("Content-Length: {}", body.len())),
        "{head}"
    );
    body.to_string()
}

fn is_name(s: &str, colons: bool) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colons && c == ':'))
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':'))
}

/// Parses `{a="x",b="y"}`: the label names, or why not.
fn labels(s: &str) -> Result<Vec<String>, String> {
    let inner = s
        .strip_prefix('{')
        .and_then(|s| s.strip_suffix('}'))
        .ok_or("labels not in braces")?;
    let mut names = Vec::new();
    let mut rest = inner;
    while !rest.is_empty() {
        let (name, after) = rest.split_once("=\"").ok_or("label without =\"")?;
        if !is_name(name, false) || name.starts_with("__") {
            return Err(format!("bad label name {name}"));
        }
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\' | '"' | 'n')) => {}
                    other => return Err(format!("bad escape {other:?}")),
                },
                Some((i, '"')) => break i,
                Some((_, '\n')) => return Err("raw newline in a label value".into()),
                Some(_) => {}
                None => return Err("unterminated label value".into()),
            }
        };
        if names.contains(&name.to_string()) {
            return Err(format!("label {name} twice"));
        }
        names.push(name.to_string());
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    Ok(names)
}

/// What `promtool check metrics` checks of text exposition 0.0.4: every line a HELP, a TYPE
/// or a sample; names and labels well formed; one TYPE and one HELP per family, before its
/// samples; a family's samples together; no series twice; counters named `_total`; values
/// numbers. Returns the problems.
fn lint(text: &str) -> Vec<String> {
    use std::collections::{HashMap, HashSet};
    let mut problems = Vec::new();
    let mut types: HashMap<String, String> = HashMap::new();
    let mut helps: HashSet<String> = HashSet::new();
    let mut done: HashSet<String> = HashSet::new();
    let mut series: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    if !text.ends_with('\n') {
        problems.push("no newline at the end".into());
    }
    for (n, line) in text.lines().enumerate() {
        let mut bad = |why: String| problems.push(format!("line {}: {why}: {line}", n + 1));
        let family = if let Some(rest) = line.strip_prefix("# ") {
            let mut w = rest.splitn(3, ' ');
            let (kw, name, arg) = (w.next(), w.next().unwrap_or(""), w.next().unwrap_or(""));
            match kw {
                Some("HELP") => {
                    if !helps.insert(name.to_string()) {
                        bad("second HELP".into());
                    }
                    if arg.is_empty() {
                        bad("empty HELP".into());
                    }
                }
                Some("TYPE") => {
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&arg) {
                        bad(format!("unknown type {arg}"));
                    }
                    if types.insert(name.to_string(), arg.to_string()).is_some() {
                        bad("second TYPE".into());
                    }
                    if series.iter().any(|s| s.split('{').next() == Some(name)) {
                        bad("TYPE after samples".into());
                    }
                    if arg == "counter" && !name.ends_with("_total") {
                        bad("counter not named _total".into());
                    }
                }
                _ => bad("unknown comment".into()),
            }
            name.to_string()
        } else {
            let Some((key, value)) = line.rsplit_once(' ') else {
                bad("no value".into());
                continue;
            };
            let name = key.split('{').next().unwrap_or_default();
            if !is_name(name, true) {
                bad("bad metric name".into());
            }
            if let Some(l) = key.find('{').map(|i| &key[i..]) {
                if let Err(why) = labels(l) {
                    bad(why);
                }
            }
            if value.parse::<f64>().is_err() && !["+Inf", "-Inf", "NaN"].contains(&value) {
                bad("value not a number".into());
            }
            if !types.contains_key(name) {
                bad("sample before its TYPE".into());
            }
            if !series.insert(key.to_string()) {
                bad("series twice".into());
            }
            name.to_string()
        };
        if current.as_ref() != Some(&family) {
            if let Some(prev) = current.take() {
                done.insert(prev);
            }
            if done.contains(&family) {
                problems.push(format!("line {}: family {family} split", n + 1));
            }
            current = Some(family);
        }
    }
    problems
}

/// The value of one series (exact name and labels).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn series_of<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .collect()
}

/// Participants' metrics used to be labelled `{pid,name}` (a new series at every restart),
/// `refused_total` had no reason, and there was no build or process information; a POST got
/// 404 and a scrape waited up to 100 ms for the server's next accept plus a delayed ACK for
/// each piece of the answer.
#[test]
fn a_scrape_is_valid_and_labels_participants_by_program_and_cgroup() {
    const TEST: &str = "a_scrape_is_valid_and_labels_participants_by_program_and_cgroup";
    if participant_role() {
        return;
    }
    let _s = serial();
    let child = match cgroup::child("vrange-coord-metrics-", 128 << 20) {
        Ok(c) => c,
        Err(why) => return skip(why),
    };
    let cg = child.cgroup().clone();
    let dir = socket_dir("metrics");
    let socket = dir.join("coordinator.sock");
    let env = [("VRANGE_COORDINATOR", socket.display().to_string())];
    let mut texts = Vec::new();
    for with_pid in [false, true] {
        let port = free_port();
        let coordinator = InProcess::start(vrange_coordinator::Options {
            metrics: Some(format!("127.0.0.1:{port}").parse().unwrap()),
            metrics_pid: with_pid,
            ..options(&socket, cg.path())
        });
        // Two processes of one program in the cgroup, one outside it (refused).
        let mut ps: Vec<Role> = (0..2)
            .map(|_| spawn(TEST, "participant", &cg, &env))
            .collect();
        let mut cmd = vrange_testkit::role::role_command(TEST, "participant");
        cmd.env("VRANGE_COORDINATOR", socket.display().to_string());
        ps.push(Role::spawn("outsider", cmd));
        for p in &mut ps {
            assert!(p.send("mark"));
            p.expect("MARKED", ANSWER);
        }
        await_participants(&socket, 2, ANSWER).expect("participants connect");
        let t0 = Instant::now();
        while vrange_coordinator::query(&socket).map_or(0, |(s, _)| s.refused) == 0 {
            assert!(t0.elapsed() < ANSWER, "the outsider is refused");
            std::thread::sleep(Duration::from_millis(50));
        }
        // Published at the next tick.
        std::thread::sleep(Duration::from_millis(200));
        let t0 = Instant::now();
        let text = scrape(port);
        println!("scrape took {:?}", t0.elapsed());
        let post = http(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
        let other = http(port, "GET /other HTTP/1.1\r\n\r\n");
        let pids: Vec<i32> = ps.iter().map(Role::pid).collect();
        drop(ps);
        drop(coordinator);
        assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
        assert!(post.contains("\r\nAllow: GET\r\n"), "{post}");
        assert!(other.starts_with("HTTP/1.1 404 "), "{other}");
        texts.push((text, pids));
    }
    drop(dir);
    cgroup::remove(child);
    for (text, pids) in &texts {
        println!("{text}");
        assert_eq!(lint(text), Vec::<String>::new(), "valid exposition");
        assert_eq!(series_of(text, "vrange_build_info").len(), 1, "{text}");
        assert!(
            value(text, "vrange_build_info{version=\"0.1.0\",").is_none(),
            "one series"
        );
        assert!(
            text.contains(&format!(
                "vrange_build_info{{version=\"{}\",",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            let v = value(text, name).unwrap_or_else(|| panic!("{name}: {text}"));
            assert!(v >= 0.0, "{name} {v}");
        }
        assert!(value(text, "process_resident_memory_bytes").unwrap() > 0.0);
        assert!(
            value(
                text,
                "vrange_coordinator_refused_total{reason=\"other_cgroup\"}"
            )
            .unwrap()
                >= 1.0
        );
        assert_eq!(
            value(
                text,
                "vrange_coordinator_refused_total{reason=\"protocol\"}"
            ),
            Some(0.0)
        );
        let _ = pids;
    }
    // Without --metrics-pid: one series for both processes of the program, by cgroup.
    let (plain, _) = &texts[0];
    let cgroup_label = format!("cgroup=\"{}\"", cg.path().display());
    let processes = series_of(plain, "vrange_participant_processes");
    assert_eq!(processes.len(), 1, "{plain}");
    assert!(processes[0].contains(&cgroup_label), "{plain}");
    assert!(processes[0].ends_with(" 2"), "{plain}");
    assert!(
        !plain.contains("pid=\""),
        "no pid label unless asked: {plain}"
    );
    // With it: one series per process, by pid.
    let (with_pid, pids) = &texts[1];
    let volatile = series_of(with_pid, "vrange_participant_volatile_bytes");
    assert_eq!(volatile.len(), 2, "{with_pid}");
    for pid in &pids[..2] {
        assert!(
            volatile
                .iter()
                .any(|l| l.contains(&format!("pid=\"{pid}\""))),
            "{with_pid}"
        );
    }
}

/// The lint itself: it must catch what it is there to catch.
#[test]
fn the_lint_catches_invalid_exposition() {
    if participant_role() {
        return;
    }
    let ok = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 2\n";
    assert_eq!(lint(ok), Vec::<String>::new());
    for bad in [
        "# TYPE a counter\na 1\n",
        "# HELP a A.\n# TYPE a gauge\na{x=\"1\"} 1\na{x=\"1\"} 2\n",
        "# HELP a A.\n# TYPE a gauge\na{x=\"\\q\"} 1\n",
        "# HELP a A.\n# TYPE a gauge\na one\n",
        "a 1\n",
        "# HELP a A.\n# TYPE a gauge\na 1\n# HELP b B.\n# TYPE b gauge\nb 1\na{y=\"2\"} 1\n",
    ] {
        assert!(!lint(bad).is_empty(), "{bad}");
    }
}
