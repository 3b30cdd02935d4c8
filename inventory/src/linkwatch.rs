//! PCIe links watched while their device is under load: the current speed and width of a device
//! and of every port on its path, read from sysfs at 10 Hz on a background thread. An idle GPU
//! drops its link to Gen1 on purpose, so only a link read under load says whether it trained down;
//! and a link that changes speed under steady load is flapping.
//!
//! Samples are kept on change (plus the first and last of each link), as run telemetry with
//! source `pcie:<address>` and names `gen` and `width`, so a stored run is evidence a verdict can
//! be re-judged from.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::pci::{is_pci_address, parse_link_speed, pcie_gen};
use crate::telemetry::Sample;

/// How often links are read.
pub const INTERVAL: Duration = Duration::from_millis(100);

pub struct LinkWatch {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<Sample>>,
}

/// The PCI path of the block device holding `path`: the root port, every bridge, and last the
/// function that serves it (an NVMe controller, an AHCI or virtio function) — the PCI addresses on
/// the sysfs path of its device number. Empty for storage not on PCI (tmpfs, overlay, a loop file).
pub fn pci_path_of(path: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else { return Vec::new() };
    let dev = if meta.file_type().is_dir() || meta.file_type().is_file() { meta.dev() } else { meta.rdev() };
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    let Ok(sys) = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")) else { return Vec::new() };
    sys.components().filter_map(|c| c.as_os_str().to_str()).filter(|c| is_pci_address(c)).map(str::to_string).collect()
}

fn read(dir: &Path, addr: &str) -> Option<(u32, u32)> {
    let base = dir.join(addr);
    let speed = std::fs::read_to_string(base.join("current_link_speed")).ok()?;
    let width = std::fs::read_to_string(base.join("current_link_width")).ok()?;
    let gen = pcie_gen(parse_link_speed(&speed)?)?;
    Some((gen, width.trim().parse().ok()?))
}

impl LinkWatch {
    /// Watches `addresses` below `root` (`/` on the live system).
    pub fn start(root: &Path, addresses: Vec<String>) -> LinkWatch {
        let dir: PathBuf = root.join("sys/bus/pci/devices");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let start = Instant::now();
            let mut out: Vec<Sample> = Vec::new();
            let mut last: Vec<Option<(u32, u32)>> = vec![None; addresses.len()];
            let mut first = true;
            loop {
                let stopping = flag.load(Ordering::Relaxed);
                let t = start.elapsed().as_millis() as i64;
                for (i, a) in addresses.iter().enumerate() {
                    let Some(now) = read(&dir, a) else { continue };
                    // On change, and the first and last reading of every link.
                    if first || stopping || last[i] != Some(now) {
                        let source = format!("pcie:{a}");
                        out.push((t, source.clone(), "gen".into(), f64::from(now.0)));
                        out.push((t, source, "width".into(), f64::from(now.1)));
                    }
                    last[i] = Some(now);
                }
                first = false;
                if stopping {
                    break;
                }
                let until = Instant::now() + INTERVAL;
                while Instant::now() < until && !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            out
        });
        LinkWatch { stop, handle }
    }

    /// Stops watching (after one last reading) and returns the samples.
    pub fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// One link's readings under load: the lowest generation and width, and how often it changed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LinkUnderLoad {
    pub address: String,
    pub min_gen: u32,
    pub min_width: u32,
    pub transitions: u32,
    pub readings: u32,
    /// The run the readings came from.
    pub run: String,
}

/// The links in run telemetry (`pcie:<address>` sources), per run and address, in time order.
pub fn links_of(run: &str, telemetry: &[Sample]) -> Vec<LinkUnderLoad> {
    let mut by: std::collections::BTreeMap<&str, Vec<(i64, &str, f64)>> = Default::default();
    for (t, source, name, v) in telemetry {
        if let Some(a) = source.strip_prefix("pcie:") {
            by.entry(a).or_default().push((*t, name.as_str(), *v));
        }
    }
    by.into_iter()
        .map(|(a, mut v)| {
            v.sort_by_key(|x| x.0);
            let gens: Vec<u32> = v.iter().filter(|x| x.1 == "gen").map(|x| x.2 as u32).collect();
            let widths: Vec<u32> = v.iter().filter(|x| x.1 == "width").map(|x| x.2 as u32).collect();
            let changes = |xs: &[u32]| xs.windows(2).filter(|w| w[0] != w[1]).count() as u32;
            LinkUnderLoad {
                address: a.to_string(),
                min_gen: gens.iter().copied().min().unwrap_or(0),
                min_width: widths.iter().copied().min().unwrap_or(0),
                transitions: changes(&gens).max(changes(&widths)),
                readings: gens.len() as u32,
                run: run.to_string(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(root: &Path, addr: &str, speed: &str, width: u32) {
        let d = root.join("sys/bus/pci/devices").join(addr);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("current_link_speed"), format!("{speed}\n")).unwrap();
        std::fs::write(d.join("current_link_width"), format!("{width}\n")).unwrap();
    }

    /// A link that trains down while watched is seen at its lowest, with its transitions.
    #[test]
    fn a_downtrain_under_load_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        set(dir.path(), "0000:01:00.0", "32.0 GT/s PCIe", 16);
        set(dir.path(), "0000:00:01.0", "32.0 GT/s PCIe", 16);
        let watch = LinkWatch::start(dir.path(), vec!["0000:00:01.0".into(), "0000:01:00.0".into()]);
        std::thread::sleep(Duration::from_millis(250));
        set(dir.path(), "0000:01:00.0", "8.0 GT/s PCIe", 16);
        std::thread::sleep(Duration::from_millis(250));
        set(dir.path(), "0000:01:00.0", "32.0 GT/s PCIe", 16);
        std::thread::sleep(Duration::from_millis(250));
        let samples = watch.stop();
        let links = links_of("r", &samples);
        assert_eq!(links.len(), 2);
        let port = &links[0];
        assert_eq!((port.address.as_str(), port.min_gen, port.transitions), ("0000:00:01.0", 5, 0));
        let dev = &links[1];
        assert_eq!((dev.min_gen, dev.min_width, dev.transitions), (3, 16, 2), "{samples:?}");
        // Kept on change: far fewer readings than 10 Hz × 0.75 s × 2 links.
        assert!(samples.len() <= 2 * 2 * 5, "{}", samples.len());
    }
}
