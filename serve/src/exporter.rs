//! `kiln agent --metrics ADDR`: live host and GPU telemetry for Prometheus, as dcgm-exporter and
//! node-exporter give, read at each scrape: the CPU time by mode and the mean clock, memory, load,
//! and for each NVIDIA GPU (NVML) its clocks, power, temperature, utilisation, memory and whether
//! its clocks are held back. The GPU readings are those benchmark telemetry samples
//! ([`kiln_inventory::telemetry::sample_gpus`]), so a dashboard and a run's evidence agree.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type F64Gauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Mode {
    mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Gpu {
    gpu: String,
    uuid: String,
    name: String,
}

/// The GPU readings exported, as telemetry names them: (telemetry name, metric name, help).
const GPU_METRICS: [(&str, &str, &str); 8] = [
    ("sm_clock_mhz", "gpu_sm_clock_mhz", "SM clock"),
    ("memory_clock_mhz", "gpu_memory_clock_mhz", "Memory clock"),
    ("power_watts", "gpu_power_watts", "Power draw"),
    ("temperature_c", "gpu_temperature_celsius", "GPU temperature"),
    ("utilization_percent", "gpu_utilization_percent", "Time a kernel was running, over the last sample period"),
    ("throttled_power", "gpu_throttled_power", "1 when the clocks are held back by the power cap or brake"),
    ("throttled_thermal", "gpu_throttled_thermal", "1 when the clocks are held back by heat"),
    ("throttled_hw_slowdown", "gpu_throttled_hw_slowdown", "1 when the hardware slowdown is engaged"),
];

/// What a scrape reads from: NVML when it loaded.
struct Sources {
    nvml: Option<nvml_wrapper::Nvml>,
    nvml_error: Option<String>,
}

/// One scrape, encoded.
fn scrape(src: &Sources) -> Result<String> {
    let mut registry = Registry::with_prefix("kiln");
    let cpu = Family::<Mode, Counter<f64, AtomicU64>>::default();
    registry.register("host_cpu_seconds", "CPU time of all CPUs by mode, from /proc/stat", cpu.clone());
    if let Ok(stat) = std::fs::read_to_string("/proc/stat") {
        let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
        if let Some(line) = stat.lines().next().and_then(|l| l.strip_prefix("cpu ")) {
            let modes = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"];
            for (mode, v) in modes.iter().zip(line.split_whitespace()) {
                if let Ok(ticks) = v.parse::<u64>() {
                    cpu.get_or_create(&Mode { mode: mode.to_string() }).inc_by(ticks as f64 / tick);
                }
            }
        }
    }
    let gauge = |registry: &mut Registry, name: &str, help: &str, value: Option<f64>| {
        if let Some(v) = value {
            let g = F64Gauge::default();
            g.set(v);
            registry.register(name, help, g);
        }
    };
    let meminfo = kiln_inventory::memory::parse_meminfo(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default());
    let bytes = |key: &str| meminfo.iter().find(|(k, _)| k == key).map(|(_, v)| *v as f64);
    gauge(&mut registry, "host_memory_total_bytes", "Memory the kernel manages", bytes("MemTotal"));
    gauge(&mut registry, "host_memory_available_bytes", "Memory available to new work", bytes("MemAvailable"));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<f64> = load.split_whitespace().take(3).filter_map(|v| v.parse().ok()).collect();
    gauge(&mut registry, "host_load1", "Load average over 1 minute", load.first().copied());
    gauge(&mut registry, "host_cpu_frequency_mhz", "Mean current CPU clock", kiln_inventory::telemetry::mean_mhz());

    let up = Gauge::<i64>::default();
    up.set(i64::from(src.nvml.is_some()));
    registry.register("nvml_up", "1 when NVML loaded and answers", up);
    if let Some(nvml) = &src.nvml {
        gpus(&mut registry, nvml);
    } else if let Some(e) = &src.nvml_error {
        tracing::debug!("no GPU metrics: {e}");
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).context("encoding the metrics")?;
    Ok(text)
}

fn gpus(registry: &mut Registry, nvml: &nvml_wrapper::Nvml) {
    let mut samples = Vec::new();
    kiln_inventory::telemetry::sample_gpus(nvml, 0, &mut samples);
    let count = nvml.device_count().unwrap_or(0);
    let labels: Vec<Gpu> = (0..count)
        .map(|i| {
            let d = nvml.device_by_index(i).ok();
            Gpu {
                gpu: i.to_string(),
                uuid: d.as_ref().and_then(|d| d.uuid().ok()).unwrap_or_default(),
                name: d.as_ref().and_then(|d| d.name().ok()).unwrap_or_default(),
            }
        })
        .collect();
    let gpu_count = Gauge::<i64>::default();
    gpu_count.set(i64::from(count));
    registry.register("gpus", "GPUs NVML sees", gpu_count);
    for (telemetry, metric, help) in GPU_METRICS {
        let family = Family::<Gpu, F64Gauge>::default();
        for (_, source, _, value) in samples.iter().filter(|s| s.2 == telemetry) {
            let Some(i) = source.strip_prefix("gpu").and_then(|i| i.parse::<usize>().ok()) else { continue };
            if let Some(l) = labels.get(i) {
                family.get_or_create(l).set(*value);
            }
        }
        registry.register(metric, help, family);
    }
    let (used, total) = (Family::<Gpu, F64Gauge>::default(), Family::<Gpu, F64Gauge>::default());
    for (i, l) in labels.iter().enumerate() {
        if let Ok(m) = nvml.device_by_index(i as u32).and_then(|d| d.memory_info()) {
            used.get_or_create(l).set(m.used as f64);
            total.get_or_create(l).set(m.total as f64);
        }
    }
    registry.register("gpu_memory_used_bytes", "GPU memory in use", used);
    registry.register("gpu_memory_total_bytes", "GPU memory", total);
}

/// Serves `/metrics` on `listen` until SIGTERM or SIGINT; NVML from `nvml_lib` (default
/// `libnvidia-ml.so.1`; a box without it exports the host only).
pub fn run(listen: SocketAddr, nvml_lib: Option<PathBuf>) -> Result<()> {
    let lib = nvml_lib.unwrap_or_else(|| PathBuf::from("libnvidia-ml.so.1"));
    let (nvml, nvml_error) = match nvml_wrapper::Nvml::builder().lib_path(lib.as_os_str()).init() {
        Ok(n) => (Some(n), None),
        Err(e) => {
            eprintln!("kiln agent: no GPU metrics: NVML ({}) did not load: {e}", lib.display());
            (None, Some(e.to_string()))
        }
    };
    let sources = Arc::new(Sources { nvml, nvml_error });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the exporter's runtime")?;
    rt.block_on(async move {
        let app = Router::new()
            .route(
                "/metrics",
                get(async move || {
                    let src = sources.clone();
                    match tokio::task::spawn_blocking(move || scrape(&src)).await {
                        Ok(Ok(text)) => (
                            [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
                            text,
                        )
                            .into_response(),
                        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")).into_response(),
                        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
                    }
                }),
            )
            .route("/", get(|| async { "kiln agent: metrics at /metrics\n" }));
        let stop = crate::shutdown_signal()?;
        let listener = crate::listen(listen).with_context(|| format!("listening on {listen}"))?;
        eprintln!("kiln agent: listening on http://{}/metrics", listener.local_addr()?);
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                stop.await;
            })
            .await
            .context("serving the metrics")
    })
}
