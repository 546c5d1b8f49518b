//! `vrange man DIR` (hidden): writes the manual pages of the command, generated from its clap
//! definition: vrange(1) and one page per subcommand (vrange-run(1), ...). `make install` runs
//! it once, from the freshly built binary, into `$(MANDIR)/man1`; nothing needs cargo or the
//! source tree.

use std::io::Write;
use std::path::Path;

pub fn main(cli: clap::Command, dir: &Path) -> i32 {
    match write_pages(cli, dir) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!(
                "vrange man: cannot write the manual pages into {}: {e}",
                dir.display()
            );
            1
        }
    }
}

fn write_pages(cli: clap::Command, dir: &Path) -> std::io::Result<()> {
    let mut cli = cli.disable_help_subcommand(true);
    // Gives each subcommand its page name, "vrange-run".
    cli.build();
    let subcommands: Vec<clap::Command> = cli
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect();
    let names: Vec<String> = subcommands.iter().map(page_name).collect();
    write_page(&cli, &names, dir)?;
    let root = [page_name(&cli)];
    for sub in &subcommands {
        write_page(sub, &root, dir)?;
    }
    Ok(())
}

fn page_name(cmd: &clap::Command) -> String {
    cmd.get_display_name().unwrap_or(cmd.get_name()).to_string()
}

/// `cmd`'s page, `<name>.1`, ending with SEE ALSO: the pages in `related` (section 1) and
/// vrange(3), the C library.
fn write_page(cmd: &clap::Command, related: &[String], dir: &Path) -> std::io::Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    writeln!(page, ".SH \"SEE ALSO\"\n.nh")?;
    for name in related {
        writeln!(page, ".BR {name} (1),")?;
    }
    writeln!(page, ".BR vrange (3)")?;
    let path = dir.join(format!("{}.1", page_name(cmd)));
    std::fs::write(&path, page)?;
    println!("{}", path.display());
    Ok(())
}
