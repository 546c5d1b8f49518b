//! `vrange-bench`: the classic experiments, with the peers measured in the same run.
//!
//! `vrange-bench SUITE [--quick] [--out DIR] ...` (`cargo run --release -p vrange-bench --
//! SUITE`): one file per suite (`cache` and `coordinate` are directories) (`ebizzy`,
//! `pressure`, `lazyfree`, `pagetable`, `refill`, `cache`, `coordinate`, `proactive`, `pairs`,
//! `tradeoff`, `stress`, `markcost`); the shared pieces are the machine description (`machine`), CSV and
//! number formats (`report`), the SVG plots (`plot`), the allocators compared and how they are
//! preloaded (`alloc`), the C workloads (`c/`, compiled by build.rs and carried in the binary:
//! `workload`), and the neighbour and services of the cache and coordinate scenarios
//! (`neighbour`, `service`), a coordinator in a thread (`coordinator`); child processes, memory cgroups and hogs are vrange-testkit's, as
//! the tests' are. Every suite prints the machine first, then aligned tables with the
//! published numbers beside ours where they exist, and writes the same report in Markdown
//! (`SUITE.md`), CSV files and an SVG plot into `--out`. A suite that cannot run here (no root,
//! no memory cgroup) prints `skipped: <reason>` and still succeeds; a measurement that fails
//! is an error (exit status 1).
//!
//! Processes that must run in a cgroup of their own (the page-table loop, the memory hog of
//! `ebizzy --pressure`, the cache suite's service and its neighbour, the coordinate suite's
//! participants and neighbour, the stress suite's load and burst holder) are this executable
//! again, with the hidden `role` subcommand.
//!
//! Not published and never installed: the `vrange` command ships none of this (no peers, no
//! workloads, no hidden subcommand). It prints as the command does, through vrange-print
//! (printing, tables, times); it depends on no front-end, the command included.

// ci: host only: the unit tests are formatting and arithmetic

// vrange-print's printing macros (a closed pipe ends the process quietly) replace std's in every
// module.
#[macro_use]
extern crate vrange_print;

use vrange_print::{clock, table};

mod alloc;
mod cache;
mod coordinate;
mod coordinator;
mod ebizzy;
mod lazyfree;
mod machine;
mod markcost;
mod mimalloc_bench;
mod neighbour;
mod pagetable;
mod pairs;
mod plot;
mod pressure;
mod proactive;
mod refill;
mod report;
mod service;
mod sqlite;
mod stress;
mod tradeoff;
mod workload;

use clap::{Parser, Subcommand};
use report::Table;
use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::OnceLock;

/// A suite, as `vrange-bench SUITE` names it.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// ebizzy 0.3's malloc/memcpy/free loop, every allocator, by thread count.
    Ebizzy,
    /// A peak process frees memory, the next one needs it in a small memory cgroup.
    Pressure,
    /// MADV_FREE of 1 GiB by folio size, beside the mTHP lazyfree series' numbers.
    Lazyfree,
    /// Page-table memory left after touching and freeing 50 GiB, per method.
    Pagetable,
    /// The cost of one mark+unmark pair by range size, per policy.
    Markcost,
    /// A zstd-compressed file read through a refill region, beside its peers, in a small cgroup.
    Refill,
    /// vrange-cache beside moka, quick_cache and lru: hits, inserts, and a service whose
    /// neighbour takes memory in a small cgroup.
    Cache,
    /// Processes with volatile caches and a growing neighbour in one memory cgroup: their own
    /// reclaimers, the coordinator, or the kernel OOM killer alone.
    Coordinate,
    /// A service's memory over five minutes with nothing proactive, a senpai-style controller
    /// and the coordinator's proactive mode (`vrange daemon --proactive`), in a memory cgroup.
    Proactive,
    /// SQLite on vrange_sqlite_pcache() against SQLite's own page cache (default and sized for
    /// all memory), a service whose neighbour takes memory in a small cgroup.
    Sqlite,
    /// The cost of one malloc+free pair of 64 KiB, 512 KiB and 2 MiB blocks, every allocator.
    Pairs,
    /// Churn throughput against memory given back to a neighbour in the same memory cgroup
    /// within 1 s, every allocator with and without huge pages.
    Tradeoff,
    /// Memory back before anyone is OOM-killed: N trials (20; --quick 3) of each adversarial
    /// scenario (a burst right after a mark, Python's bytearrays under the shim, the tradeoff
    /// neighbour, an idle peak process's next one, the cache and SQLite neighbours) on a busy
    /// machine, default settings; any OOM kill fails the suite.
    Stress,
    /// Every suite above, in that order.
    All,
    /// The allocator field's own programs (mimalloc-bench's bench/, from the checkout `--src`
    /// names), every allocator as shipped: time and peak RSS. Not part of `all`.
    #[value(name = "mimalloc-bench")]
    MimallocBench,
}

impl Suite {
    /// The suites `all` runs, in its order (markcost last: it changes this process's
    /// reclaimer settings).
    const ALL: [Suite; 13] = [
        Suite::Ebizzy,
        Suite::Pressure,
        Suite::Lazyfree,
        Suite::Pagetable,
        Suite::Refill,
        Suite::Cache,
        Suite::Coordinate,
        Suite::Proactive,
        Suite::Sqlite,
        Suite::Pairs,
        Suite::Tradeoff,
        Suite::Stress,
        Suite::Markcost,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Suite::Ebizzy => "ebizzy",
            Suite::Pressure => "pressure",
            Suite::Lazyfree => "lazyfree",
            Suite::Pagetable => "pagetable",
            Suite::Markcost => "markcost",
            Suite::Refill => "refill",
            Suite::Cache => "cache",
            Suite::Coordinate => "coordinate",
            Suite::Proactive => "proactive",
            Suite::Sqlite => "sqlite",
            Suite::Pairs => "pairs",
            Suite::Tradeoff => "tradeoff",
            Suite::Stress => "stress",
            Suite::MimallocBench => "mimalloc-bench",
            Suite::All => "all",
        }
    }
}

/// The command line: a suite and its options, or (hidden) a role.
#[derive(Parser)]
#[command(
    name = "vrange-bench",
    version,
    about = "vrange's benchmark suites: the classic volatile-range experiments beside their \
             published numbers, peers measured in the same run",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    disable_help_subcommand = true
)]
struct Cli {
    #[command(flatten)]
    args: Args,
    #[command(subcommand)]
    internal: Option<Internal>,
}

#[derive(Subcommand)]
enum Internal {
    /// A process a suite starts in a cgroup of its own: `role ROLE ARGS` (internal).
    #[command(hide = true)]
    Role {
        role: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// The options; each suite uses those that concern it and ignores the rest.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The suite to run.
    #[arg(value_enum, required = true)]
    pub suite: Option<Suite>,
    /// Short runs (a smoke test; the numbers are not a measurement).
    #[arg(long)]
    pub quick: bool,
    /// Where the reports (Markdown), CSV files and plots go.
    #[arg(long, default_value = "vrange-bench")]
    pub out: PathBuf,
    /// libvrange_malloc.so to preload (default: beside this executable, where cargo puts both).
    #[arg(long)]
    pub lib: Option<PathBuf>,
    /// ebizzy, pairs, tradeoff: thread counts, comma-separated (default: ebizzy 1, 2, 4, ... and
    /// the core count; pairs 1, 2, 16; tradeoff 1, 2).
    #[arg(long, value_delimiter = ',')]
    pub threads: Option<Vec<usize>>,
    /// ebizzy: number of chunks (default 10, as ebizzy 0.3).
    #[arg(long)]
    pub chunks: Option<usize>,
    /// ebizzy: chunk size, a size such as 512K or 1MiB (default 512K, as ebizzy 0.3).
    #[arg(long, value_name = "SIZE", value_parser = chunk_size_arg)]
    pub chunk_size: Option<usize>,
    /// ebizzy: seconds per run (default 2; --quick 0.3).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// ebizzy, tradeoff: runs per cell, the median is reported (default 5; --quick 1);
    /// stress: trials per scenario (default 20; --quick 3).
    #[arg(long)]
    pub reps: Option<usize>,
    /// stress: only these scenarios, comma-separated (default: every one); to reproduce one.
    #[arg(long, value_delimiter = ',', value_name = "NAME",
          value_parser = clap::builder::PossibleValuesParser::new(stress::SCENARIOS))]
    pub scenarios: Option<Vec<String>>,
    /// ebizzy: ebizzy 0.3's never-advancing generator: every thread copies chunk 0.
    #[arg(long)]
    pub classic: bool,
    /// ebizzy: a second process fills the workload's memory cgroup while it runs.
    #[arg(long)]
    pub pressure: bool,
    /// pagetable: 2 MiB blocks touched and freed per method (default 25600 = 50 GiB).
    #[arg(long)]
    pub blocks: Option<usize>,
    /// cache: only the hit ratio on this key trace (ARC's format, or one key per line as
    /// LIRS's traces; `synthetic`: the built-in Zipf-and-scan trace), every cache at the same
    /// memory (default: every part, the hit ratio on the synthetic trace).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// mimalloc-bench: a checkout of github.com/daanx/mimalloc-bench whose bench/ programs are
    /// built and run (nothing is downloaded).
    #[arg(long, value_name = "DIR")]
    pub src: Option<PathBuf>,
    /// cache: the scenario's miss costs, microseconds of CPU work per miss, comma-separated
    /// (default 0,20,200; --quick 0). The first is also the plot's.
    #[arg(long, value_delimiter = ',', value_name = "MICROSECONDS",
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub miss_cost: Option<Vec<u64>>,
    /// cache: only these parts, comma-separated (default: every one).
    #[arg(long, value_delimiter = ',', value_name = "PART",
          value_parser = clap::builder::PossibleValuesParser::new(["hot", "scenario", "trace"]))]
    pub parts: Option<Vec<String>>,
    /// cache: the bytes of each value of the trace, a size such as 4K (default 4K, a block).
    #[arg(long, value_name = "SIZE", value_parser = chunk_size_arg)]
    pub value_size: Option<usize>,
}

/// `--chunk-size`, `--value-size`: a size in vrange's one grammar (`512K`, `1MiB`: powers of
/// 1024, as `vrange_sys::settings::parse_size` reads them), positive and a multiple of 8 (the
/// workloads copy and check 8-byte words).
fn chunk_size_arg(s: &str) -> Result<usize, String> {
    let n = vrange_sys::settings::parse_size(s.as_bytes()).map_err(|e| e.to_string())?;
    match usize::try_from(n) {
        Ok(n) if n > 0 && n % 8 == 0 => Ok(n),
        _ => Err("not a positive multiple of 8 bytes".into()),
    }
}

/// What a suite gets: its options, a place for its files, and where its report goes.
pub struct Ctx {
    pub args: Args,
    pub out: PathBuf,
    /// The machine and the date, for the plots (tables have the machine table above them).
    about: String,
    /// The running suite's report in Markdown, written as `SUITE.md` when it ends: the
    /// terminal gets aligned text, files get what documents can quote.
    doc: RefCell<String>,
}

impl Ctx {
    pub fn quick(&self) -> bool {
        self.args.quick
    }

    /// libvrange_malloc.so: `--lib`, else beside this executable (`cargo build --release -p
    /// vrange-malloc-preload` puts it beside target/release/vrange-bench). The suites never
    /// build it: they measure the shim that is there.
    pub fn lib(&self) -> Result<PathBuf, String> {
        static LIB: OnceLock<Result<PathBuf, String>> = OnceLock::new();
        LIB.get_or_init(|| match &self.args.lib {
            Some(p) if p.exists() => Ok(p.clone()),
            Some(p) => Err(format!("--lib {}: no such file", p.display())),
            None => {
                let exe = std::env::current_exe().unwrap_or_else(|_| "vrange-bench".into());
                let so = exe.with_file_name("libvrange_malloc.so");
                if so.exists() {
                    Ok(so)
                } else {
                    Err(format!(
                        "libvrange_malloc.so not found beside {}; build it with `cargo build \
                         --release -p vrange-malloc-preload` (cargo puts it beside \
                         target/release/vrange-bench), or pass --lib",
                        exe.display()
                    ))
                }
            }
        })
        .clone()
    }

    /// A paragraph of the report: printed, and kept for `SUITE.md`.
    pub fn say(&self, text: impl AsRef<str>) {
        println!("{}", text.as_ref());
        let mut doc = self.doc.borrow_mut();
        doc.push_str(text.as_ref().trim_start_matches('\n'));
        doc.push_str("\n\n");
    }

    /// A table of the report: aligned text on the terminal, Markdown in `SUITE.md`.
    pub fn table(&self, t: &Table) {
        t.print();
        let mut doc = self.doc.borrow_mut();
        doc.push_str(&t.to_markdown());
        doc.push('\n');
    }

    /// Says why (part of) a suite did not run. Where the environment cannot support it, that
    /// is not a failure.
    pub fn skipped(&self, what: &str, why: &str) {
        self.say(format!("skipped: {what}: {why}"));
    }

    /// Whether a child memory cgroup can be made here (one is made and removed); if not, says
    /// that `what` is skipped and why.
    pub fn memory_cgroups(&self, what: &str) -> bool {
        match vrange_testkit::cgroup::try_child("vrange-bench-probe", 64 << 20) {
            Ok(_) => true,
            Err(why) => {
                self.skipped(what, &why);
                false
            }
        }
    }

    /// A plot's frame: its title, the machine and date, and the smoke-test marking of
    /// `--quick`.
    pub fn figure(&self, title: impl Into<String>) -> plot::Figure {
        plot::Figure {
            title: title.into(),
            about: self.about.clone(),
            smoke: self.quick(),
        }
    }
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.internal {
        Some(Internal::Role { role: name, args }) => role(&name, &args),
        None => run(cli.args),
    };
    std::process::exit(code);
}

/// Runs the suite of `args` (every suite for `all`); the exit status.
fn run(args: Args) -> i32 {
    if args.suite == Some(Suite::MimallocBench) && args.src.is_none() {
        eprintln!(
            "vrange-bench mimalloc-bench: --src DIR is required: a checkout of \
             github.com/daanx/mimalloc-bench (nothing is downloaded)"
        );
        return 2;
    }
    let suites: Vec<Suite> = match args.suite {
        Some(Suite::All) => Suite::ALL.to_vec(),
        Some(one) => vec![one],
        None => unreachable!("clap requires a suite without a subcommand"),
    };
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        eprintln!("vrange-bench: cannot create {}: {e}", args.out.display());
        return 1;
    }
    let out = std::fs::canonicalize(&args.out).unwrap_or_else(|_| args.out.clone());
    let machine = machine::Machine::probe();
    machine.report(&out);
    let about = format!(
        "{}; {}",
        machine.summary(),
        crate::clock::Local::now().date()
    );
    let ctx = Ctx {
        args,
        out,
        about,
        doc: RefCell::default(),
    };
    let mut failed = Vec::new();
    for suite in suites {
        let name = suite.name();
        let heading = if ctx.quick() {
            format!("{name} (quick: a smoke test, not a measurement)")
        } else {
            name.to_string()
        };
        println!("\n{heading}\n{}", "=".repeat(heading.chars().count()));
        ctx.doc.replace(format!("## {heading}\n\n"));
        let started = std::time::Instant::now();
        let result = match suite {
            Suite::Ebizzy => ebizzy::run(&ctx),
            Suite::Pressure => pressure::run(&ctx),
            Suite::Lazyfree => lazyfree::run(&ctx),
            Suite::Pagetable => pagetable::run(&ctx),
            Suite::Markcost => markcost::run(&ctx),
            Suite::Refill => refill::run(&ctx),
            Suite::Cache => cache::run(&ctx),
            Suite::Coordinate => coordinate::run(&ctx),
            Suite::Proactive => proactive::run(&ctx),
            Suite::Sqlite => sqlite::run(&ctx),
            Suite::Pairs => pairs::run(&ctx),
            Suite::Tradeoff => tradeoff::run(&ctx),
            Suite::Stress => stress::run(&ctx),
            Suite::MimallocBench => mimalloc_bench::run(&ctx),
            Suite::All => unreachable!("expanded above"),
        };
        if let Err(e) = &result {
            ctx.say(format!("{name}: FAILED: {e}"));
            eprintln!("vrange-bench {name}: {e}");
            failed.push(format!("{name}: {e}"));
        }
        if let Err(e) = report::write_file(&ctx.out, &format!("{name}.md"), &ctx.doc.take()) {
            eprintln!("vrange-bench {name}: {e}");
            failed.push(format!("{name}: {e}"));
        }
        if result.is_ok() {
            report::progress(format!(
                "{name}: done in {:.1} s",
                started.elapsed().as_secs_f64()
            ));
        }
    }
    // Repeated at the end, where a log's tail shows it: a suite's failure is otherwise
    // buried under the suites that ran after it.
    if !failed.is_empty() {
        eprintln!("\nvrange-bench: {} failed:", failed.len());
        for f in &failed {
            eprintln!("  {f}");
        }
    }
    i32::from(!failed.is_empty())
}

/// `vrange-bench role ROLE ARGS`: the processes the suites start in cgroups of their own.
fn role(role: &str, args: &[String]) -> i32 {
    match role {
        "pagetable" => pagetable::role(args),
        "refill" => refill::role(args),
        "cache" => cache::role(args),
        "coordinate-participant" => coordinate::participant_role(args),
        "coordinate-partner" => coordinate::partner_role(args),
        "neighbour" => neighbour::role(args),
        "hog" => ebizzy::hog_role(args),
        "stress" => stress::role(args),
        _ => {
            eprintln!("vrange-bench role: unknown role {role:?}");
            2
        }
    }
}
