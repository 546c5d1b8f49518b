//! The machine a run measured: printed before every suite's tables and written beside the CSV
//! files, since published numbers come from other machines and only ratios carry over.

use super::report::{write_file, Table};
use std::path::Path;

pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub mem_kb: u64,
    pub swap_kb: u64,
    pub kernel: String,
    pub thp_enabled: String,
    pub thp_defrag: String,
    pub glibc: String,
}

fn first_line(path: &str) -> String {
    std::fs::read_to_string(path).map_or("?".into(), |s| {
        s.lines().next().unwrap_or("").trim().to_string()
    })
}

/// The bracketed choice of a sysfs setting (`always [madvise] never` → `madvise`).
pub fn selected(setting: &str) -> String {
    setting
        .split_whitespace()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
        .unwrap_or(setting)
        .to_string()
}

fn gib(kb: u64) -> String {
    format!("{:.1} GiB", kb as f64 / (1 << 20) as f64)
}

pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Machine {
    pub fn probe() -> Machine {
        let cpu = vrange_sys::procfs::cpu_model()
            .ok()
            .flatten()
            .unwrap_or_else(|| "?".into());
        let mem = |k| {
            vrange_sys::procfs::meminfo_kb(k)
                .ok()
                .flatten()
                .unwrap_or(0)
        };
        let glibc = std::process::Command::new("getconf")
            .arg("GNU_LIBC_VERSION")
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "?".into());
        Machine {
            cpu,
            cores: cores(),
            mem_kb: mem("MemTotal"),
            swap_kb: mem("SwapTotal"),
            kernel: vrange_sys::procfs::kernel_release().unwrap_or_else(|_| "?".into()),
            thp_enabled: selected(&first_line("/sys/kernel/mm/transparent_hugepage/enabled")),
            thp_defrag: selected(&first_line("/sys/kernel/mm/transparent_hugepage/defrag")),
            glibc,
        }
    }

    pub fn table(&self) -> Table {
        let mut t = Table::new(&["machine", "value"]);
        t.row(vec!["CPU".into(), self.cpu.clone()]);
        t.row(vec!["cores".into(), self.cores.to_string()]);
        t.row(vec!["memory".into(), gib(self.mem_kb)]);
        t.row(vec!["swap".into(), self.swap()]);
        t.row(vec!["kernel".into(), self.kernel.clone()]);
        t.row(vec![
            "THP".into(),
            format!("enabled {}, defrag {}", self.thp_enabled, self.thp_defrag),
        ]);
        t.row(vec!["libc".into(), self.glibc.clone()]);
        t
    }

    /// The machine in one line, for the plots: "AMD EPYC, 2 cores, 23.5 GiB, swap none,
    /// Linux 6.18.44, THP madvise".
    pub fn summary(&self) -> String {
        format!(
            "{}, {} cores, {}, swap {}, Linux {}, THP {}",
            self.cpu,
            self.cores,
            gib(self.mem_kb),
            self.swap(),
            self.kernel,
            self.thp_enabled,
        )
    }

    fn swap(&self) -> String {
        if self.swap_kb == 0 {
            "none".into()
        } else {
            gib(self.swap_kb)
        }
    }

    /// Prints the machine table and writes it as `machine.md` into `out`.
    pub fn report(&self, out: &Path) {
        let t = self.table();
        t.print();
        if let Err(e) = write_file(out, "machine.md", &t.to_markdown()) {
            eprintln!("vrange-bench: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn selected_setting() {
        assert_eq!(super::selected("always [madvise] never"), "madvise");
        assert_eq!(super::selected("plain"), "plain");
    }
}
