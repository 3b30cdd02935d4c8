//! The network adapter: TCP throughput and round trips against a serving kiln.

use std::time::Duration;

use kiln_db::{Direction, Metric};

use super::{samples_of, status_of, unsettled, Outcome, Report};
use kiln_inventory::telemetry::Sampler;
use kiln_text::timefmt::now_rfc3339;
use kiln_text::Progress;

/// TCP throughput and latency against a serving kiln.
///
/// # Errors
/// The server cannot be reached, or a connection breaks.
pub fn net(server: &str, config: kiln_bench::net::Config) -> anyhow::Result<Outcome> {
    let started_at = now_rfc3339();
    let progress = Progress::new();
    let sampler = Sampler::start(Duration::from_millis(500));
    let result = kiln_bench::net::measure(server, &config, |p| progress.update(&format!("net {p}")));
    progress.finish();
    let telemetry = sampler.stop();
    let report = result.map_err(|e| {
        anyhow::anyhow!("network benchmark against {server} (is `kiln bench net --serve` running there?): {e}")
    })?;
    let unstable = unsettled(&report.throughput);
    let t = &report.throughput;
    let metric =
        |name: &str, value, unit: &str, direction| Metric { name: name.into(), value, unit: unit.into(), direction };
    Ok(Outcome {
        status: status_of(unstable),
        status_reason: None,
        started_at,
        config: serde_json::json!({ "server": report.server, "config": config }),
        headline: format!("net to {}: {:.2} Gb/s, round trip p50 {:.1} us", report.server, t.median, report.rtt_us.median),
        text: format!(
            "net to {}: {} streams, {} x {} s\nthroughput {:.2} Gb/s (95% CI {:.2}..{:.2}, CV {:.1} %){}\nround trip (64 B) p50 {:.1} us, p99 {:.1} us\n",
            report.server,
            config.streams,
            config.repetitions,
            config.seconds_per_repetition,
            t.median,
            t.median_ci.0,
            t.median_ci.1,
            t.cv * 100.0,
            if unstable { ", unstable" } else { "" },
            report.rtt_us.median,
            report.rtt_p99_us
        ),
        metrics: vec![
            metric("net.tcp_throughput_gbps", t.median, "Gb/s", Direction::Higher),
            metric("net.tcp_rtt_p50_us", report.rtt_us.median, "us", Direction::Lower),
            metric("net.tcp_rtt_p99_us", report.rtt_p99_us, "us", Direction::Lower),
        ],
        samples: samples_of("net.tcp_throughput_gbps", &report.throughput_gbps).collect(),
        report: Report::Net(report),
        telemetry,
    })
}
