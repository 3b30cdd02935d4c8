//! The training-input adapter (`kiln bench data`): the dataset on the given directories, a loader
//! like training's feeding emulated accelerators (`kiln_bench::data`), and what it answers: the
//! accelerators' utilisation at the rate they need, delivered against needed throughput per
//! directory and in all, read latency, the readers' CPU and the bottleneck, stored as a `data` run.

use std::time::Duration;

use kiln_db::{Direction, Metric, RunStatus};

use super::{Outcome, Report};
use kiln_inventory::telemetry::Sampler;
use kiln_text::timefmt::now_rfc3339;
use kiln_text::Progress;

fn metric(name: String, value: f64, unit: &str, direction: Direction) -> Metric {
    Metric { name, value, unit: unit.into(), direction }
}

/// `kiln bench data`.
///
/// # Errors
/// As `kiln_bench::data::measure`.
pub fn data(config: kiln_bench::data::Config, stop: &std::sync::atomic::AtomicBool) -> anyhow::Result<Outcome> {
    let started_at = now_rfc3339();
    let progress = Progress::new();
    let sampler = Sampler::start(Duration::from_millis(500));
    let result = kiln_bench::data::measure(&config, stop, |p| progress.update(&format!("data {p}")));
    progress.finish();
    let telemetry = sampler.stop();
    let dirs: Vec<String> = config.dirs.iter().map(|d| d.display().to_string()).collect();
    let report = result.map_err(|e| anyhow::anyhow!("data benchmark on {}: {e}", dirs.join(", ")))?;
    let flat = &report.flat_out;
    let mut metrics = vec![
        metric("data.max_gbps".into(), flat.delivered_gbps, "GB/s", Direction::Higher),
        metric("data.max_samples_per_s".into(), flat.samples_per_s, "samples/s", Direction::Higher),
        metric("data.max_rate_au90_gbps".into(), report.max_rate_au90_gbps, "GB/s", Direction::Higher),
        metric("data.read_p50_us".into(), flat.read_p50_us, "us", Direction::Lower),
        metric("data.read_p99_us".into(), flat.read_p99_us, "us", Direction::Lower),
        metric("data.reader_cpu_cores".into(), flat.reader_cpu_cores, "cores", Direction::Lower),
    ];
    if let Some(f) = flat.from_storage {
        metrics.push(metric("data.from_storage".into(), f, "ratio", Direction::None));
    }
    for (i, d) in flat.dirs.iter().enumerate() {
        metrics.push(metric(format!("data.dir{i}.max_gbps"), d.gbps, "GB/s", Direction::Higher));
        metrics.push(metric(format!("data.dir{i}.read_p99_us"), d.read_p99_us, "us", Direction::Lower));
    }
    if let Some(p) = &report.at_rate {
        metrics.push(metric("data.au".into(), p.au, "ratio", Direction::Higher));
        metrics.push(metric("data.needed_gbps".into(), p.needed_gbps, "GB/s", Direction::None));
        metrics.push(metric("data.delivered_gbps".into(), p.delivered_gbps, "GB/s", Direction::Higher));
    }
    let text = render(&report, &config);
    let headline = match &report.at_rate {
        Some(p) => format!(
            "data {}: AU {:.1} % at {:.3} GB/s needed ({:.3} delivered); up to {:.3} GB/s at AU ≥ 90 %{}",
            dirs.join(", "),
            100.0 * p.au,
            p.needed_gbps,
            p.delivered_gbps,
            report.max_rate_au90_gbps,
            report.bottleneck.as_ref().map_or(String::new(), |b| format!("; bottleneck: {b}"))
        ),
        None => format!(
            "data {}: {:.3} GB/s flat out; accelerators needing up to {:.3} GB/s compute ≥ 90 % of the time",
            dirs.join(", "),
            flat.delivered_gbps,
            report.max_rate_au90_gbps
        ),
    };
    Ok(Outcome {
        status: RunStatus::Ok,
        status_reason: None,
        started_at,
        config: serde_json::json!({ "config": config, "direct": report.direct }),
        headline,
        text,
        report: Report::Data(report),
        metrics,
        samples: Vec::new(),
        telemetry,
    })
}

fn render(r: &kiln_bench::data::Report, config: &kiln_bench::data::Config) -> String {
    let readers = match r.engine {
        kiln_bench::data::Engine::Threads => format!("{} reader thread(s)", config.readers),
        kiln_bench::data::Engine::Uring => format!("io_uring, {} reads in flight", config.readers),
    };
    let reads = match (r.direct, config.buffered) {
        (true, _) => "O_DIRECT: the page cache is not measured",
        (false, true) => "buffered, each read's pages evicted after it",
        (false, false) => "buffered (a filesystem refused O_DIRECT), each read's pages evicted after it",
    };
    let mut text = format!(
        "data: {:?} layout, {} MiB in {} shard(s) over {} director{}, {readers}, prefetch {}, batch {}, {} accelerator(s); {reads}\n",
        r.layout,
        r.dataset_bytes >> 20,
        r.shards,
        config.dirs.len(),
        if config.dirs.len() == 1 { "y" } else { "ies" },
        config.prefetch,
        config.batch,
        config.accelerators,
    );
    let mut pass = |name: &str, p: &kiln_bench::data::Pass| {
        text.push_str(&format!(
            "{name}: delivered {:.3} GB/s ({:.0} samples/s){}, reads p50 {:.0} µs p99 {:.0} µs, readers' CPU {:.2} cores\n",
            p.delivered_gbps,
            p.samples_per_s,
            if p.needed_gbps > 0.0 {
                format!(" of {:.3} needed: AU {:.1} %", p.needed_gbps, 100.0 * p.au)
            } else {
                String::new()
            },
            p.read_p50_us,
            p.read_p99_us,
            p.reader_cpu_cores
        ));
        if let Some(f) = p.from_storage {
            let whence =
                if f < 0.5 { ": memory served the rest (a tmpfs, or the page cache), not a drive" } else { "" };
            text.push_str(&format!("  from the storage: {:.0} % of the bytes read{whence}\n", 100.0 * f));
        }
        for d in &p.dirs {
            text.push_str(&format!(
                "  {}{}: {:.3} GB/s, {} reads, p50 {:.0} µs, p99 {:.0} µs{}\n",
                d.dir,
                d.device.as_ref().map_or(String::new(), |dev| format!(" ({dev})")),
                d.gbps,
                d.reads,
                d.read_p50_us,
                d.read_p99_us,
                if d.direct { "" } else { " (buffered)" }
            ));
        }
    };
    pass("flat out", &r.flat_out);
    if let Some(p) = &r.at_rate {
        pass("at the accelerators' rate", p);
    }
    text.push_str(&format!("largest rate at AU ≥ 90 %: {:.3} GB/s (flat-out delivery / 0.9)\n", r.max_rate_au90_gbps));
    match (&r.at_rate, &r.bottleneck) {
        (Some(_), Some(b)) => text.push_str(&format!("bottleneck: {b}\n")),
        (Some(_), None) => text.push_str("the storage keeps the accelerators ≥ 90 % busy\n"),
        (None, _) => text.push_str("no rate given (--rate) and no training run stored: AU not judged\n"),
    }
    text
}
