//! The storage adapter: O_DIRECT sequential and random I/O on a directory or a block device. Before
//! a block device is written (`--destructive`), what the system uses it for is checked here: a
//! mount, swap, or a holder (dm, md, LVM) of it or of one of its partitions refuses the run.

use std::path::Path;
use std::time::Duration;

use kiln_db::{Direction, Metric, RunStatus};

use super::{Outcome, Report};
use kiln_inventory::telemetry::Sampler;
use kiln_text::timefmt::now_rfc3339;
use kiln_text::Progress;

/// Storage benchmark on a directory or device.
///
/// # Errors
/// As `kiln_bench::disk::measure`.
pub fn disk(
    path: &Path,
    config: kiln_bench::disk::Config,
    destructive: bool,
    stop: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<Outcome> {
    if destructive {
        if let Some(why) = device_in_use(path) {
            anyhow::bail!("{}: {why}; nothing was written (unmount or release it first)", path.display());
        }
    }
    let started_at = now_rfc3339();
    let progress = Progress::new();
    let sampler = Sampler::start(Duration::from_millis(500));
    // The drive's PCIe link and every port above it, read while the drive is under load.
    let links =
        kiln_inventory::linkwatch::LinkWatch::start(Path::new("/"), kiln_inventory::linkwatch::pci_path_of(path));
    let result = kiln_bench::disk::measure(path, &config, destructive, stop, |p| progress.update(&format!("disk {p}")));
    progress.finish();
    let mut telemetry = sampler.stop();
    telemetry.extend(links.stop());
    let report = result.map_err(|e| anyhow::anyhow!("disk benchmark on {}: {e}", path.display()))?;
    let mut metrics = Vec::new();
    for t in &report.tests {
        let base = format!("disk.{}_{}k_qd{}", t.test, t.block_bytes / 1024, t.queue_depth);
        metrics.push(Metric {
            name: format!("{base}.mb_per_s"),
            value: t.mb_per_s,
            unit: "MB/s".into(),
            direction: Direction::Higher,
        });
        metrics.push(Metric {
            name: format!("{base}.iops"),
            value: t.iops,
            unit: "IOPS".into(),
            direction: Direction::Higher,
        });
        metrics.push(Metric {
            name: format!("{base}.p99_us"),
            value: t.latency_us.p99,
            unit: "us".into(),
            direction: Direction::Lower,
        });
    }
    let mut text = format!(
        "disk {} ({}), {} MiB, {} s per test\n{:<11} {:>6} {:>4} {:>10} {:>10} {:>9} {:>9} {:>9}\n",
        report.target,
        if report.direct { "O_DIRECT" } else { "buffered: the filesystem refuses O_DIRECT" },
        config.size_bytes >> 20,
        config.seconds,
        "test",
        "block",
        "QD",
        "MB/s",
        "IOPS",
        "p50 us",
        "p99 us",
        "max us"
    );
    match (&report.held, report.read_only) {
        (Some(what), true) => text.push_str(&format!("the device holds {what}: read tests only\n")),
        (None, true) => text.push_str("read tests only: writing a device needs --destructive\n"),
        (Some(what), false) => text.push_str(&format!("the device held {what}, overwritten (--destructive)\n")),
        (None, false) => {}
    }
    for t in &report.tests {
        text.push_str(&format!(
            "{:<11} {:>5}K {:>4} {:>10.1} {:>10.0} {:>9.1} {:>9.1} {:>9.1}\n",
            t.test,
            t.block_bytes / 1024,
            t.queue_depth,
            t.mb_per_s,
            t.iops,
            t.latency_us.p50,
            t.latency_us.p99,
            t.latency_us.max
        ));
    }
    let seq = report.tests.iter().find(|t| t.test == "seq_read");
    let rand = report.tests.iter().filter(|t| t.test == "rand_read").max_by(|a, b| a.queue_depth.cmp(&b.queue_depth));
    Ok(Outcome {
        status: RunStatus::Ok,
        status_reason: None,
        started_at,
        config: serde_json::json!({ "target": path, "config": config, "direct": report.direct }),
        headline: format!(
            "disk {}: sequential read {:.0} MB/s, 4K random read {:.0} IOPS at QD{}",
            report.target,
            seq.map_or(0.0, |t| t.mb_per_s),
            rand.map_or(0.0, |t| t.iops),
            rand.map_or(0, |t| t.queue_depth)
        ),
        text,
        report: Report::Disk(report),
        metrics,
        samples: Vec::new(),
        telemetry,
    })
}

/// What keeps a block device from being written, if anything: a mount or a swap area on it or on
/// one of its partitions (`/proc/mounts`, `/proc/swaps`), or a holder (dm, md, LVM) in sysfs.
/// `None` for anything that is not a block device.
pub fn device_in_use(device: &Path) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    let real = std::fs::canonicalize(device).ok()?;
    if !std::fs::metadata(&real).ok()?.file_type().is_block_device() {
        return None;
    }
    let name = real.file_name()?.to_str()?.to_string();
    let class = Path::new("/sys/class/block");
    let mut names = vec![name.clone()];
    if let Ok(entries) = std::fs::read_dir(class.join(&name)) {
        names.extend(
            entries
                .flatten()
                .filter(|e| e.path().join("partition").exists())
                .filter_map(|e| e.file_name().into_string().ok()),
        );
    }
    let ours = |dev: &str| {
        let real = std::fs::canonicalize(dev).ok();
        let base = real.as_deref().and_then(Path::file_name).and_then(|n| n.to_str()).map(str::to_string);
        base.filter(|b| names.contains(b))
    };
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    for (dev, at) in parse_mounts(&mounts) {
        if let Some(n) = ours(&dev) {
            return Some(format!("/dev/{n} is mounted at {at}"));
        }
    }
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    for dev in parse_swaps(&swaps) {
        if let Some(n) = ours(&dev) {
            return Some(format!("/dev/{n} is in use as swap"));
        }
    }
    for n in &names {
        let holders: Vec<String> = std::fs::read_dir(class.join(n).join("holders"))
            .map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
            .unwrap_or_default();
        if !holders.is_empty() {
            return Some(format!("/dev/{n} is held by {} (device mapper, md or LVM)", holders.join(", ")));
        }
    }
    None
}

/// (device, mount point) of each line of `/proc/mounts` whose source is a path; the kernel writes
/// spaces in names as `\040`.
pub fn parse_mounts(text: &str) -> Vec<(String, String)> {
    let unescape = |s: &str| s.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\");
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (dev, at) = (f.next()?, f.next()?);
            dev.starts_with('/').then(|| (unescape(dev), unescape(at)))
        })
        .collect()
}

/// The devices of `/proc/swaps` (after its header line).
pub fn parse_swaps(text: &str) -> Vec<String> {
    text.lines().skip(1).filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_and_swaps() {
        let mounts = "sysfs /sys sysfs rw 0 0\n/dev/nvme0n1p2 / ext4 rw 0 0\n/dev/sdb1 /mnt/my\\040data xfs rw 0 0\n";
        assert_eq!(
            parse_mounts(mounts),
            [("/dev/nvme0n1p2".to_string(), "/".to_string()), ("/dev/sdb1".into(), "/mnt/my data".into())]
        );
        let swaps = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/dev/sda3 partition 8388604 0 -2\n";
        assert_eq!(parse_swaps(swaps), ["/dev/sda3"]);
        assert_eq!(device_in_use(Path::new("/etc/hostname")), None, "not a block device");
    }
}
