//! Host memory bandwidth with the four STREAM kernels (copy, scale, add, triad), per NUMA node
//! (threads pinned to the node's CPUs, arrays first touched by those threads so they are local)
//! and over the whole machine. Bytes are counted as STREAM counts them: 16 per element for copy
//! and scale, 24 for add and triad.

use std::sync::Barrier;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::stats::{pin_to_cpu, summarize, Summary};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kernel {
    Copy,
    Scale,
    Add,
    Triad,
}

impl Kernel {
    pub const ALL: [Kernel; 4] = [Kernel::Copy, Kernel::Scale, Kernel::Add, Kernel::Triad];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Copy => "copy",
            Kernel::Scale => "scale",
            Kernel::Add => "add",
            Kernel::Triad => "triad",
        }
    }

    fn bytes_per_element(self) -> usize {
        match self {
            Kernel::Copy | Kernel::Scale => 16,
            Kernel::Add | Kernel::Triad => 24,
        }
    }
}

/// One placement to measure: a name ("node0", "all") and the CPUs its threads run on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scope {
    pub name: String,
    pub cpus: Vec<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    /// Elements of f64 in each of the three arrays (split across the threads).
    pub elements: usize,
    pub warmup: usize,
    pub repetitions: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KernelResult {
    pub kernel: Kernel,
    /// GB/s (10^9 bytes per second) of every repetition.
    pub samples_gbps: Vec<f64>,
    pub summary: Summary,
    pub best_gbps: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScopeResult {
    pub scope: String,
    pub threads: usize,
    pub kernels: Vec<KernelResult>,
}

/// `dst[i] = f(x[i], y[i])`, written with non-temporal stores where the CPU has them: the
/// destination bypasses the caches, so no read-for-ownership doubles the write traffic. This is
/// what compiled STREAM does on x86, and what it counts.
#[inline(always)]
fn stream_store(dst: &mut [f64], x: &[f64], y: &[f64], f: impl Fn(f64, f64) -> f64) {
    let n = dst.len().min(x.len()).min(y.len());
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_set_pd, _mm_sfence, _mm_stream_pd};
        // Scalar until the destination is 16-byte aligned, then pairs with streaming stores.
        let mut i = 0;
        while i < n && !(dst.as_ptr() as usize + i * 8).is_multiple_of(16) {
            dst[i] = f(x[i], y[i]);
            i += 1;
        }
        while i + 2 <= n {
            let (v0, v1) = (f(x[i], y[i]), f(x[i + 1], y[i + 1]));
            // SAFETY: i + 1 < n, and dst + i is 16-byte aligned by the loop above.
            unsafe { _mm_stream_pd(dst.as_mut_ptr().add(i), _mm_set_pd(v1, v0)) };
            i += 2;
        }
        for j in i..n {
            dst[j] = f(x[j], y[j]);
        }
        // SAFETY: a store fence has no preconditions; it orders the streaming stores.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    for i in 0..n {
        dst[i] = f(x[i], y[i]);
    }
}

#[inline(never)]
fn run_kernel(kernel: Kernel, a: &mut [f64], b: &mut [f64], c: &mut [f64], scalar: f64) {
    match kernel {
        Kernel::Copy => stream_store(c, a, a, |x, _| x),
        Kernel::Scale => stream_store(b, c, c, |x, _| scalar * x),
        Kernel::Add => stream_store(c, a, b, |x, y| x + y),
        Kernel::Triad => stream_store(a, b, c, |x, y| x + scalar * y),
    }
}

/// The time a multi-threaded kernel took: from the first worker's start to the last worker's end,
/// each read by the worker itself around its own work, so the window cannot miss any of it (a
/// coordinator reading the clock after a barrier can wake after fast workers are done, and then
/// reports bandwidth no memory has).
pub fn window(spans: &[(Instant, Instant)]) -> f64 {
    let (Some(first), Some(last)) = (spans.iter().map(|s| s.0).min(), spans.iter().map(|s| s.1).max()) else {
        return 0.0;
    };
    last.saturating_duration_since(first).as_secs_f64()
}

/// Measures one scope: a thread per CPU, each owning a slice of the arrays.
pub fn measure(scope: &Scope, config: &Config, mut progress: impl FnMut(usize, usize)) -> ScopeResult {
    let threads = scope.cpus.len().max(1);
    let per_thread = (config.elements / threads).max(1);
    let rounds = config.warmup + config.repetitions;
    let start = Barrier::new(threads + 1);
    let done = Barrier::new(threads + 1);
    // Per worker, the (start, end) of every kernel it ran, in order.
    let spans: Vec<Vec<(Instant, Instant)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let cpu = scope.cpus.get(t).copied();
                let (start, done) = (&start, &done);
                s.spawn(move || {
                    if let Some(cpu) = cpu {
                        pin_to_cpu(cpu);
                    }
                    // First touch after pinning: the pages land on this thread's NUMA node.
                    let mut a = vec![1.0f64; per_thread];
                    let mut b = vec![2.0f64; per_thread];
                    let mut c = vec![0.0f64; per_thread];
                    let mut spans = Vec::with_capacity(rounds * Kernel::ALL.len());
                    for _ in 0..rounds {
                        for kernel in Kernel::ALL {
                            start.wait();
                            let t0 = Instant::now();
                            run_kernel(kernel, &mut a, &mut b, &mut c, 3.0);
                            spans.push((t0, Instant::now()));
                            done.wait();
                        }
                    }
                    std::hint::black_box((&a, &b, &c));
                    spans
                })
            })
            .collect();
        for round in 0..rounds {
            for _ in Kernel::ALL {
                start.wait();
                done.wait();
            }
            progress(round + 1, rounds);
        }
        workers.into_iter().map(|w| w.join().expect("a membw worker panicked")).collect()
    });
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); Kernel::ALL.len()];
    for round in config.warmup..rounds {
        for (k, slot) in times.iter_mut().enumerate() {
            let i = round * Kernel::ALL.len() + k;
            let these: Vec<(Instant, Instant)> = spans.iter().map(|w| w[i]).collect();
            slot.push(window(&these));
        }
    }
    let elements = per_thread * threads;
    let kernels = Kernel::ALL
        .iter()
        .zip(times)
        .map(|(&kernel, secs)| {
            let gbps: Vec<f64> =
                secs.iter().map(|s| (kernel.bytes_per_element() * elements) as f64 / s / 1e9).collect();
            KernelResult {
                kernel,
                best_gbps: gbps.iter().copied().fold(0.0, f64::max),
                summary: summarize(&gbps).expect("at least one repetition"),
                samples_gbps: gbps,
            }
        })
        .collect();
    ScopeResult { scope: scope.name.clone(), threads, kernels }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_compute_stream_results() {
        let (mut a, mut b, mut c) = (vec![1.0; 8], vec![2.0; 8], vec![0.0; 8]);
        run_kernel(Kernel::Copy, &mut a, &mut b, &mut c, 3.0);
        assert_eq!(c[0], 1.0);
        run_kernel(Kernel::Scale, &mut a, &mut b, &mut c, 3.0);
        assert_eq!(b[0], 3.0);
        run_kernel(Kernel::Add, &mut a, &mut b, &mut c, 3.0);
        assert_eq!(c[0], 4.0);
        run_kernel(Kernel::Triad, &mut a, &mut b, &mut c, 3.0);
        assert_eq!(a[0], 15.0);
    }

    /// The window spans every worker's work: the earliest start to the latest end, whatever order
    /// the workers ran in and however late anyone else looked at the clock.
    #[test]
    fn the_window_cannot_miss_work() {
        let t = Instant::now();
        let at = |ms: u64| t + std::time::Duration::from_millis(ms);
        let spans = [(at(5), at(30)), (at(0), at(10)), (at(12), at(40))];
        assert!((window(&spans) - 0.040).abs() < 1e-9);
        assert_eq!(window(&[]), 0.0);
    }

    #[test]
    fn measures_every_kernel_with_every_repetition() {
        let scope = Scope { name: "all".into(), cpus: vec![0] };
        let config = Config { elements: 1 << 14, warmup: 1, repetitions: 3 };
        let mut calls = 0;
        let r = measure(&scope, &config, |_, _| calls += 1);
        assert_eq!(calls, 4);
        assert_eq!(r.kernels.len(), 4);
        for k in &r.kernels {
            assert_eq!(k.samples_gbps.len(), 3);
            assert!(k.summary.median > 0.0 && k.best_gbps >= k.summary.median);
        }
    }
}
