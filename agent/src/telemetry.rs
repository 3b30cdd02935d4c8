//! Telemetry sampled in the background while a benchmark runs, so that a slow result can say why:
//! CPU utilisation (from /proc/stat) and mean CPU frequency (cpufreq, else cpuinfo); for each
//! NVIDIA GPU through NVML, SM and memory clocks, power, temperature, utilisation and whether the
//! clocks were held back by the power cap, heat or a hardware slowdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// (milliseconds since start, source, name, value).
pub type Sample = (i64, String, String, f64);

pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<Sample>>,
}

/// (busy, total) jiffies of the aggregate "cpu" line.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).unwrap_or(&0);
    Some((total - idle, total))
}

fn mean_mhz() -> Option<f64> {
    let mut sum = 0.0;
    let mut n = 0;
    if let Ok(entries) = std::fs::read_dir("/sys/devices/system/cpu") {
        for e in entries.flatten() {
            let p = e.path().join("cpufreq/scaling_cur_freq");
            if let Some(khz) = std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse::<f64>().ok()) {
                sum += khz / 1000.0;
                n += 1;
            }
        }
    }
    if n == 0 {
        let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
        for l in info.lines().filter(|l| l.starts_with("cpu MHz")) {
            if let Some(v) = l.split(':').nth(1).and_then(|v| v.trim().parse::<f64>().ok()) {
                sum += v;
                n += 1;
            }
        }
    }
    (n > 0).then(|| sum / n as f64)
}

/// One round of GPU readings; unsupported readings are simply absent.
fn sample_gpus(nvml: &nvml_wrapper::Nvml, t: i64, out: &mut Vec<Sample>) {
    use nvml_wrapper::bitmasks::device::ThrottleReasons;
    use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
    let count = nvml.device_count().unwrap_or(0);
    for i in 0..count {
        let Ok(d) = nvml.device_by_index(i) else { continue };
        let source = format!("gpu{i}");
        let mut push = |name: &str, v: Option<f64>| {
            if let Some(v) = v {
                out.push((t, source.clone(), name.to_string(), v));
            }
        };
        push("sm_clock_mhz", d.clock_info(Clock::SM).ok().map(f64::from));
        push("memory_clock_mhz", d.clock_info(Clock::Memory).ok().map(f64::from));
        push("power_watts", d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0));
        push("temperature_c", d.temperature(TemperatureSensor::Gpu).ok().map(f64::from));
        push("utilization_percent", d.utilization_rates().ok().map(|u| f64::from(u.gpu)));
        if let Ok(r) = d.current_throttle_reasons() {
            let flag = |b: bool| Some(if b { 1.0 } else { 0.0 });
            push(
                "throttled_power",
                flag(r.intersects(ThrottleReasons::SW_POWER_CAP | ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN)),
            );
            push(
                "throttled_thermal",
                flag(r.intersects(ThrottleReasons::SW_THERMAL_SLOWDOWN | ThrottleReasons::HW_THERMAL_SLOWDOWN)),
            );
            push("throttled_hw_slowdown", flag(r.contains(ThrottleReasons::HW_SLOWDOWN)));
        }
    }
}

impl Sampler {
    /// Starts sampling every `interval` on a background thread; with an NVML library, the GPUs too.
    pub fn start(interval: Duration) -> Sampler {
        Self::start_with(interval, None)
    }

    pub fn start_with(interval: Duration, nvml_library: Option<std::ffi::OsString>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let start = Instant::now();
            let mut out = Vec::new();
            let nvml = nvml_library.and_then(|lib| nvml_wrapper::Nvml::builder().lib_path(&lib).init().ok());
            let mut last = cpu_jiffies();
            while !flag.load(Ordering::Relaxed) {
                // Sleep in small steps so that stop() returns promptly.
                let until = Instant::now() + interval;
                while Instant::now() < until && !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let t = start.elapsed().as_millis() as i64;
                let now = cpu_jiffies();
                if let (Some((b0, t0)), Some((b1, t1))) = (last, now) {
                    if t1 > t0 {
                        out.push((
                            t,
                            "cpu".to_string(),
                            "utilization_percent".to_string(),
                            100.0 * (b1 - b0) as f64 / (t1 - t0) as f64,
                        ));
                    }
                }
                last = now;
                if let Some(mhz) = mean_mhz() {
                    out.push((t, "cpu".to_string(), "frequency_mhz".to_string(), mhz));
                }
                if let Some(nvml) = &nvml {
                    sample_gpus(nvml, t, &mut out);
                }
            }
            out
        });
        Sampler { stop, handle }
    }

    pub fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// One line per series: "cpu utilization_percent: median 98.5, min 90.1 (12 samples)".
pub fn summarize(samples: &[Sample]) -> Vec<String> {
    let mut series: std::collections::BTreeMap<(String, String), Vec<f64>> = Default::default();
    for (_, source, name, v) in samples {
        series.entry((source.clone(), name.clone())).or_default().push(*v);
    }
    series
        .into_iter()
        .filter_map(|((source, name), v)| {
            // Throttle flags read as a share of the run ("gpu3 throttled_power 40 % of the run").
            if name.starts_with("throttled_") {
                let share = 100.0 * v.iter().sum::<f64>() / v.len() as f64;
                return Some(format!("{source} {name}: {share:.0} % of the run ({} samples)", v.len()));
            }
            let s = kiln_bench::stats::summarize(&v)?;
            Some(format!(
                "{source} {name}: median {:.1}, min {:.1}, max {:.1} ({} samples)",
                s.median, s.min, s.max, s.n
            ))
        })
        .collect()
}
