//! The storage adapter: O_DIRECT sequential and random I/O on a directory or a block device.

use std::time::Duration;

use kiln_db::{Direction, Metric, RunStatus};

use super::{Outcome, Report};
use crate::render::Progress;
use crate::telemetry::Sampler;
use crate::timefmt::now_rfc3339;

/// Storage benchmark on a directory or device.
///
/// # Errors
/// As `kiln_bench::disk::measure`.
pub fn disk(
    path: &std::path::Path,
    config: kiln_bench::disk::Config,
    destructive: bool,
    stop: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<Outcome> {
    let started_at = now_rfc3339();
    let progress = Progress::new();
    let sampler = Sampler::start(Duration::from_millis(500));
    let result = kiln_bench::disk::measure(path, &config, destructive, stop, |p| progress.update(&format!("disk {p}")));
    progress.finish();
    let telemetry = sampler.stop();
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
