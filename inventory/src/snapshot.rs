//! `kiln snapshot`: what kiln reads of this machine, as a tar archive that `kiln inventory --root`
//! (and `commission --no-bench --root`) reads anywhere. A plain `tar` of `/proc` and `/sys` does
//! not work: tar trusts the files' sizes, which there are fictional (0 or 4096), so it stores empty
//! or padded files. Here every file is read to its end (capped), symbolic links are kept as links,
//! and the walk never follows a link, so sysfs's cycles cannot trap it.
//!
//! Captured: the `/proc` and `/etc` files the readers use, `/sys/devices` (without the memory block
//! and software-only trees), the `/sys/bus/pci/devices` and `/sys/class/{net,infiniband,hwmon,nvme,block,
//! dmi}` links into it, DMI tables, hugepage and THP settings, and the kernel log (as `dmesg.txt`,
//! where it can be read: it needs root). Nothing is written anywhere but the archive.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Files read one by one.
const FILES: &[&str] = &[
    "proc/cpuinfo",
    "proc/meminfo",
    "proc/cmdline",
    "proc/mounts",
    "proc/swaps",
    "proc/stat",
    "proc/sys/kernel/hostname",
    "proc/sys/kernel/osrelease",
    "proc/sys/kernel/version",
    "etc/hostname",
    "etc/machine-id",
    "etc/os-release",
    "usr/lib/os-release",
    "var/lib/dbus/machine-id",
    "sys/hypervisor/type",
    "sys/kernel/mm/transparent_hugepage/enabled",
    "sys/firmware/dmi/tables/DMI",
    "sys/firmware/dmi/tables/smbios_entry_point",
];

/// Trees walked (links kept, never followed).
const TREES: &[&str] = &[
    "sys/devices",
    "sys/bus/pci/devices",
    "sys/bus/dax/devices",
    "sys/class/net",
    "sys/class/infiniband",
    "sys/class/hwmon",
    "sys/class/nvme",
    "sys/class/block",
    "sys/class/dmi",
    "sys/kernel/mm/hugepages",
];

/// Below `sys/devices`: trees kiln never reads and that are large on big machines.
const SKIP_DIRS: &[&str] = &[
    "sys/devices/system/memory",
    "sys/devices/virtual/workqueue",
    "sys/devices/software",
    "sys/devices/tracepoint",
    "sys/devices/breakpoint",
    "sys/devices/kprobe",
    "sys/devices/uprobe",
];

/// Attribute names that are mappings, triggers or firmware images, not data.
fn skip_file(name: &str) -> bool {
    name.starts_with("resource")
        || matches!(
            name,
            "rom"
                | "remove"
                | "rescan"
                | "reset"
                | "bind"
                | "unbind"
                | "new_id"
                | "remove_id"
                | "vpd"
                | "uevent_seqnum"
        )
}

/// Directory names below a device that hold nothing kiln reads and many entries.
fn skip_dir(name: &str) -> bool {
    matches!(
        name,
        "power"
            | "msi_irqs"
            | "wakeup"
            | "trace"
            | "statistics"
            | "queues"
            | "holders"
            | "mq"
            | "integrity"
            | "subsystem"
    )
}

/// The most of one file kept.
const MAX_FILE: u64 = 4 << 20;
/// How deep below `sys/devices` the walk goes (a PCI function behind switches is ~10 levels down).
const MAX_DEPTH: usize = 24;

/// What a snapshot holds.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Captured {
    pub files: u64,
    pub links: u64,
    pub bytes: u64,
    /// Files that could not be read (root-only attributes, vanished devices), left out.
    pub unreadable: u64,
    /// Whether the kernel log was captured (`dmesg.txt`).
    pub kernel_log: bool,
}

struct Writer<'w> {
    tar: tar::Builder<&'w mut dyn Write>,
    root: PathBuf,
    stats: Captured,
    seen: std::collections::HashSet<PathBuf>,
}

impl Writer<'_> {
    fn header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h
    }

    fn dir(&mut self, rel: &Path) -> std::io::Result<()> {
        if !self.seen.insert(rel.to_path_buf()) {
            return Ok(());
        }
        if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
            self.dir(parent)?;
        }
        let mut h = Self::header(tar::EntryType::Directory, 0, 0o755);
        self.tar.append_data(&mut h, rel, std::io::empty())
    }

    fn file(&mut self, rel: &Path) -> std::io::Result<()> {
        if self.seen.contains(rel) {
            return Ok(());
        }
        let full = self.root.join(rel);
        let data = match read_capped(&full) {
            Ok(d) => d,
            Err(_) => {
                self.stats.unreadable += 1;
                return Ok(());
            }
        };
        if let Some(parent) = rel.parent() {
            self.dir(parent)?;
        }
        self.seen.insert(rel.to_path_buf());
        let mut h = Self::header(tar::EntryType::Regular, data.len() as u64, 0o444);
        self.tar.append_data(&mut h, rel, data.as_slice())?;
        self.stats.files += 1;
        self.stats.bytes += data.len() as u64;
        Ok(())
    }

    fn link(&mut self, rel: &Path, target: &Path) -> std::io::Result<()> {
        if !self.seen.insert(rel.to_path_buf()) {
            return Ok(());
        }
        if let Some(parent) = rel.parent() {
            self.dir(parent)?;
        }
        let mut h = Self::header(tar::EntryType::Symlink, 0, 0o777);
        self.tar.append_link(&mut h, rel, target)?;
        self.stats.links += 1;
        Ok(())
    }

    /// Walks `rel` without following links.
    fn tree(&mut self, rel: &Path, depth: usize) -> std::io::Result<()> {
        if depth > MAX_DEPTH || SKIP_DIRS.iter().any(|s| rel == Path::new(s)) {
            return Ok(());
        }
        let Ok(entries) = std::fs::read_dir(self.root.join(rel)) else { return Ok(()) };
        let mut names: Vec<_> = entries.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for name in names {
            let child = rel.join(&name);
            let Ok(meta) = std::fs::symlink_metadata(self.root.join(&child)) else { continue };
            let text = name.to_string_lossy();
            if meta.file_type().is_symlink() {
                if let Ok(target) = std::fs::read_link(self.root.join(&child)) {
                    self.link(&child, &target)?;
                }
            } else if meta.is_dir() {
                if !skip_dir(&text) {
                    self.dir(&child)?;
                    self.tree(&child, depth + 1)?;
                }
            } else if meta.is_file() && !skip_file(&text) && meta.permissions().mode() & 0o444 != 0 {
                // Write-only attributes are triggers, not data.
                self.file(&child)?;
            }
        }
        Ok(())
    }
}

/// Reads a file to its end (sysfs and procfs sizes are fictional), at most [`MAX_FILE`] bytes,
/// without blocking on a FIFO.
fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW).open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut data = Vec::new();
    f.take(MAX_FILE).read_to_end(&mut data)?;
    Ok(data)
}

/// Writes the snapshot of the system below `root` (`/`) to `out`.
///
/// # Errors
/// Writing the archive.
pub fn capture(root: &Path, out: &mut dyn Write, progress: &dyn Fn(&str)) -> std::io::Result<Captured> {
    let mut w = Writer {
        tar: tar::Builder::new(out),
        root: root.to_path_buf(),
        stats: Captured::default(),
        seen: Default::default(),
    };
    w.tar.mode(tar::HeaderMode::Deterministic);
    for f in FILES {
        w.file(Path::new(f))?;
    }
    for t in TREES {
        progress(&format!("snapshot: {t}"));
        let rel = Path::new(t);
        if root.join(rel).is_dir() {
            w.dir(rel)?;
            w.tree(rel, 0)?;
        }
    }
    // The kernel log, where it can be read, as the file a snapshot's readers look for.
    if root == Path::new("/") {
        if let Ok(text) = crate::kmsg::read_log() {
            let mut h = Writer::header(tar::EntryType::Regular, text.len() as u64, 0o444);
            w.tar.append_data(&mut h, "dmesg.txt", text.as_bytes())?;
            w.stats.kernel_log = true;
        }
    }
    let stats = w.stats.clone();
    w.tar.into_inner()?.flush()?;
    Ok(stats)
}
