//! `kiln inventory` and `kiln topo`, and taking and storing an inventory for the other commands.

use std::path::{Path, PathBuf};

use anyhow::Result;
use kiln_app::stored::store_inventory;
use serde::Serialize;

use super::args::Source;
use super::{Ctx, Output, View};
use kiln_inventory::{self as inventory, topology::Topology, Inventory};

/// `kiln inventory`: the document, optionally stored.
pub fn inventory(source: &Source, save: bool, ctx: &Ctx) -> Result<Output> {
    let inv = take_inventory(source)?;
    if save {
        let saved = store_inventory(ctx, &inv)?;
        eprintln!("kiln: stored inventory {} in {}", saved.inventory_id, ctx.db_path()?.display());
    }
    ctx.output(&inv)
}

/// `kiln topo --json`.
#[derive(Serialize)]
pub struct Topo {
    pub topology: Topology,
}

impl View for Topo {
    fn render(&self) -> String {
        inventory::topology::render(&self.topology)
    }
}

pub fn topo(source: &Source, ctx: &Ctx) -> Result<Output> {
    let inv = take_inventory(source)?;
    ctx.output(&Topo { topology: inv.topology })
}

/// The inventory below `source.root`; its problems are logged at debug level.
pub fn take_inventory(source: &Source) -> Result<Inventory> {
    let options = inventory::Options {
        nvml_library: source.nvml_lib.as_ref().map(|p| p.as_os_str().to_owned()),
        all_nics: source.all,
    };
    let inv = inventory::collect_with(&source.root, &options)?;
    for p in &inv.problems {
        tracing::debug!(path = %p.path, kind = ?p.kind, "{}", p.message);
    }
    Ok(inv)
}

/// The inventory a benchmark runs against: the live system, NVML from `KILN_NVML_LIB` or the default.
pub fn live_inventory() -> Result<Inventory> {
    let nvml_lib = std::env::var_os("KILN_NVML_LIB").filter(|v| !v.is_empty()).map(PathBuf::from);
    take_inventory(&Source { root: PathBuf::from("/"), nvml_lib, all: false })
}

/// Whether the inventory is of this machine rather than a snapshot.
pub fn is_live(source: &Source) -> bool {
    source.root == Path::new("/")
}

/// `kiln snapshot --json`.
#[derive(Serialize)]
pub struct Snapshotted {
    pub kind: &'static str,
    pub output: PathBuf,
    #[serde(flatten)]
    pub captured: kiln_inventory::snapshot::Captured,
}

impl View for Snapshotted {
    fn render(&self) -> String {
        let c = &self.captured;
        format!(
            "wrote {}: {} files ({} KiB) and {} links{}{}\nread it anywhere: mkdir box && tar -xf {} -C box && kiln inventory --root box",
            self.output.display(),
            c.files,
            c.bytes / 1024,
            c.links,
            if c.unreadable > 0 { format!("; {} files unreadable (root-only or vanished) left out", c.unreadable) } else { String::new() },
            if c.kernel_log { "; the kernel log as dmesg.txt" } else { "; no kernel log (reading it needs root)" },
            self.output.display()
        )
    }
}

/// `kiln snapshot -o FILE.tar`.
pub fn snapshot(output: &Path, ctx: &Ctx) -> Result<Output> {
    let progress = kiln_text::Progress::new();
    let captured = super::outfile::write_output(output, |w| {
        Ok(kiln_inventory::snapshot::capture(Path::new("/"), w, &|p| progress.update(p))?)
    })?;
    progress.finish();
    let view = Snapshotted { kind: "snapshot", output: output.to_path_buf(), captured };
    if output.as_os_str() == "-" {
        // The archive went to stdout: the summary goes to stderr.
        return Ok(ctx.output(&view)?.on_stderr());
    }
    ctx.output(&view)
}
