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

/// The telemetry names of a run's contention figures (source `cpu`).
pub const OTHERS_PERCENT: &str = "others_percent";
pub const STEAL_PERCENT: &str = "steal_percent";

pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<Sample>>,
    started: Instant,
    /// The machine's and this process's CPU time when sampling began.
    baseline: Option<(MachineTicks, u64)>,
}

/// The machine's CPU time by kind, from `/proc/stat`'s aggregate line, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MachineTicks {
    /// user + nice + system + irq + softirq.
    pub busy: u64,
    /// Time the hypervisor ran something else on the CPUs it gave this guest.
    pub steal: u64,
    /// Every kind, idle included (user through steal).
    pub total: u64,
}

pub fn parse_proc_stat(text: &str) -> Option<MachineTicks> {
    let line = text.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line.split_whitespace().map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    (v.len() >= 4).then(|| MachineTicks {
        busy: at(0) + at(1) + at(2) + at(5) + at(6),
        steal: at(7),
        total: (0..8).map(at).sum(),
    })
}

/// A process's CPU time (user + system, all its threads) from its `/proc/PID/stat`, in clock ticks.
pub fn parse_pid_stat(text: &str) -> Option<u64> {
    // The command name may hold spaces and parentheses: fields count from the last ')'.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

fn ticks_now() -> Option<(MachineTicks, u64)> {
    let machine = parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)?;
    let own = parse_pid_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    Some((machine, own))
}

/// Below this much machine time (clock ticks, all CPUs together) the shares are too coarse to judge
/// (a tick is 0.5 % of it): 200 ticks is one second of a 2-CPU machine. Measured on a quiet 2-CPU
/// VM, STREAM runs of a second or more saw 1–4 % of others (kernel threads, the hypervisor).
const MIN_TICKS: u64 = 200;

/// What other processes and the hypervisor took of the machine between two readings, in percent:
/// (others, steal). Others is the machine's busy time less this process's own.
pub fn contention(before: (MachineTicks, u64), after: (MachineTicks, u64)) -> Option<(f64, f64)> {
    let total = after.0.total.checked_sub(before.0.total)?;
    if total < MIN_TICKS {
        return None;
    }
    let busy = after.0.busy.saturating_sub(before.0.busy);
    let own = after.1.saturating_sub(before.1);
    let steal = after.0.steal.saturating_sub(before.0.steal);
    let pct = |x: u64| 100.0 * x as f64 / total as f64;
    Some((pct(busy.saturating_sub(own)), pct(steal)))
}

/// (busy, total) jiffies of the aggregate "cpu" line.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let t = parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)?;
    Some((t.busy + t.steal, t.total))
}

pub fn mean_mhz() -> Option<f64> {
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
pub fn sample_gpus(nvml: &nvml_wrapper::Nvml, t: i64, out: &mut Vec<Sample>) {
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
        let baseline = ticks_now();
        let started = Instant::now();
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
        Sampler { stop, handle, started, baseline }
    }

    /// Stops sampling. The samples end with what other processes (`cpu others_percent`) and the
    /// hypervisor (`cpu steal_percent`) took of the machine over the whole run, where it ran long
    /// enough to tell.
    pub fn stop(self) -> Vec<Sample> {
        let after = ticks_now();
        let at = self.started.elapsed().as_millis() as i64;
        self.stop.store(true, Ordering::Relaxed);
        let mut samples = self.handle.join().unwrap_or_default();
        if let Some((others, steal)) = self.baseline.zip(after).and_then(|(b, a)| contention(b, a)) {
            samples.push((at, "cpu".into(), OTHERS_PERCENT.into(), others));
            samples.push((at, "cpu".into(), STEAL_PERCENT.into(), steal));
        }
        samples
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contention_shares() {
        let stat = |user: u64, idle: u64, steal: u64| {
            parse_proc_stat(&format!("cpu  {user} 0 0 {idle} 0 0 0 {steal} 0 0\ncpu0 1 2 3\n")).unwrap()
        };
        // 200 ticks of machine time: 150 busy, of which this process 100; 10 stolen.
        let before = (stat(1000, 5000, 0), 40);
        let after = (stat(1150, 5040, 10), 140);
        assert_eq!(after.0.total - before.0.total, MIN_TICKS);
        let (others, steal) = contention(before, after).unwrap();
        assert!((others - 25.0).abs() < 1e-9 && (steal - 5.0).abs() < 1e-9, "{others} {steal}");
        // Too short to tell.
        assert_eq!(contention(before, (stat(1010, 5000, 0), 50)), None);
        assert_eq!(parse_pid_stat("42 (a (b) c) R 1 2 3 4 5 6 7 8 9 10 70 30 0 0"), Some(100));
        assert_eq!(parse_pid_stat("garbage"), None);
    }
}
