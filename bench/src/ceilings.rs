//! The processor's compute ceilings per data type, measured, and the clock they ran at.
//!
//! For each data type the CPU has a multiply-accumulate instruction for (f32 FMA, bf16 dot
//! products with `vdpbf16ps`, int8 dot products with `vpdpbusd`), every allowed CPU runs
//! independent chains of the widest form at once: the rate no GEMM of that type can beat, since a
//! GEMM also loads, packs and stores. A dependent chain of register adds (one cycle each on every
//! x86-64 and Arm core) on every CPU at once measures the all-core clock, and from the two the
//! operations per cycle per CPU, which count the execution units: a Zen 5 core shows 64 f32
//! FLOP/cycle, two 512-bit FMA units.
//!
//! Not measured: AMX tiles (Rust's AMX intrinsics are not stable; where the CPU has them, bf16 and
//! int8 are bounded by Intel's per-core tile figures at the measured clock), AVX-VNNI without
//! AVX-512, and f16 arithmetic (AVX512-FP16); a GEMM in f16 is bounded by twice the f32 rate where
//! the CPU has AVX512-FP16, else by the f32 rate.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::stats::{pin_to_cpu, summarize, Summary};

/// The f32 FMA peak: every allowed CPU running independent FMA chains of the widest form.
///
/// In JSON ([`PeakWire`]) `gflops` and `summary` are the rates kiln states and judges by (each
/// CPU's own time, [`own_rate`]), `window_gflops` and `window_summary` the wall-clock window's.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(into = "PeakWire", from = "PeakWire")]
pub struct PeakResult {
    /// GFLOP/s (f32) with every thread running independent FMA chains, over the window from the
    /// first thread's start to the last one's end.
    pub gflops: Vec<f64>,
    pub summary: Summary,
    /// "avx512f", "avx2+fma" or "scalar": the widest instructions used.
    pub isa: String,
    /// GFLOP/s of all CPUs at the best rate one of them showed over its own CPU time: the
    /// ceiling's basis (`ceilings::best_rate`).
    #[serde(default)]
    pub best_gflops: f64,
    /// Per repetition, every CPU's rate over its own CPU time, summed (see
    /// `ceilings::own_rate`): what the stored peak and MFU divide by.
    #[serde(default)]
    pub own_gflops: Vec<f64>,
}

impl PeakResult {
    /// The peak as the cores deliver it (`ceilings::own_rate`).
    pub fn rate(&self) -> f64 {
        own_rate(&self.own_gflops, self.best_gflops, self.summary.median)
    }
}

/// A peak as JSON carries it: the figure kiln uses under the obvious names (`gflops`, `summary`:
/// `report.peak.summary.median` is the peak kiln states and judges against), the wall-clock
/// window's named for what it is. A report stored before (`gflops` and `summary` the window's,
/// `own_gflops` beside them) reads as it meant.
#[derive(Serialize, Deserialize)]
struct PeakWire {
    /// Per repetition, every CPU's rate over its own CPU time, summed.
    gflops: Vec<f64>,
    /// Of `gflops`; `null` for a report from before the own-time rates were kept.
    summary: Option<Summary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window_gflops: Option<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window_summary: Option<Summary>,
    isa: String,
    #[serde(default)]
    best_gflops: f64,
    /// Only in reports from before this layout.
    #[serde(default, skip_serializing)]
    own_gflops: Vec<f64>,
}

impl From<PeakResult> for PeakWire {
    fn from(p: PeakResult) -> PeakWire {
        PeakWire {
            summary: summarize(&p.own_gflops),
            gflops: p.own_gflops,
            window_gflops: Some(p.gflops),
            window_summary: Some(p.summary),
            isa: p.isa,
            best_gflops: p.best_gflops,
            own_gflops: Vec::new(),
        }
    }
}

impl From<PeakWire> for PeakResult {
    fn from(w: PeakWire) -> PeakResult {
        let (window, summary, own) = match w.window_gflops {
            Some(window) => (window, w.window_summary, w.gflops),
            None => (w.gflops, w.summary, w.own_gflops),
        };
        PeakResult {
            // A malformed stored report without samples reads as the summary of none, rather than
            // not at all.
            summary: summary.or_else(|| summarize(&window)).unwrap_or_default(),
            gflops: window,
            isa: w.isa,
            best_gflops: w.best_gflops,
            own_gflops: own,
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_chains_avx512(iterations: u64) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    let mut acc = [_mm512_set1_ps(1.0); 12];
    for _ in 0..iterations {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    acc.iter().map(|x| _mm512_reduce_add_ps(*x)).sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_chains_avx2(iterations: u64) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); 12];
    for _ in 0..iterations {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut out = [0f32; 8];
    let mut sum = 0.0;
    for x in acc {
        // SAFETY: `out` holds the 8 floats the store writes.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), x) };
        sum += out.iter().sum::<f32>();
    }
    sum
}

fn fma_chains_scalar(iterations: u64) -> f32 {
    let mut acc = [1.0f32; 16];
    for _ in 0..iterations {
        for x in acc.iter_mut() {
            *x = x.mul_add(0.999_999, 1e-7);
        }
    }
    acc.iter().sum()
}

/// f32 lanes of one FMA instruction of the peak's instruction set (`PeakResult::isa`).
pub fn f32_lanes(isa: &str) -> f64 {
    match isa {
        "avx512f" => 16.0,
        "avx2+fma" => 8.0,
        _ => 1.0,
    }
}

/// The instruction set used for the peak, and FLOPs per iteration of one thread: its chains
/// (12 vector, 16 scalar) × lanes × 2.
fn isa() -> (&'static str, f64) {
    let flops = |name: &'static str, chains: f64| (name, chains * f32_lanes(name) * 2.0);
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return flops("avx512f", 12.0);
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return flops("avx2+fma", 12.0);
        }
    }
    flops("scalar", 16.0)
}

fn run_chains(iterations: u64) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        let (name, _) = isa();
        // SAFETY: the features were detected at run time just above.
        unsafe {
            match name {
                "avx512f" => return fma_chains_avx512(iterations),
                "avx2+fma" => return fma_chains_avx2(iterations),
                _ => {}
            }
        }
    }
    fma_chains_scalar(iterations)
}

/// Measures the f32 FMA peak over `cpus` (one pinned thread each, all at once).
pub fn fma_peak(cpus: &[u32], repetitions: usize, iterations: u64) -> PeakResult {
    let (name, flops_per_iter) = isa();
    let threads = cpus.len().max(1) as f64;
    let timed = on_all_cpus(cpus, repetitions, || {
        std::hint::black_box(run_chains(iterations));
    });
    let per_thread = iterations as f64 * flops_per_iter;
    let gflops: Vec<f64> = timed.iter().map(|t| per_thread * threads / t.window / 1e9).collect();
    PeakResult {
        summary: summarize(&gflops).expect("repetitions"),
        gflops,
        isa: name.to_string(),
        best_gflops: best_rate(&timed, per_thread) / 1e9,
        own_gflops: timed.iter().map(|t| t.own_rate(per_thread) / 1e9).collect(),
    }
}

/// A GEMM figure may exceed its type's measured peak by this factor before it is impossible: the
/// peak's repetitions and the GEMM's are taken seconds apart, and a clock can move that much.
pub const CEILING_MARGIN: f64 = 1.05;

/// One data type's measured peak on all the CPUs at once. In JSON ([`TypePeakWire`]), as
/// [`PeakResult`]: `gops` and `summary` the own-time rates kiln uses, `window_*` the window's.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(into = "TypePeakWire", from = "TypePeakWire")]
pub struct TypePeak {
    /// "f32", "bf16" or "int8".
    pub dtype: String,
    /// The instruction the chains ran ("vdpbf16ps zmm").
    pub instruction: String,
    /// Giga-operations per second (FLOP for floating point, multiply-adds × 2 for int8), one
    /// value per repetition, over the window.
    pub gops: Vec<f64>,
    pub summary: Summary,
    /// Operations per cycle per CPU at the measured all-core clock.
    pub per_cycle: Option<f64>,
    /// Giga-operations per second of all CPUs at the best rate one of them showed over its own
    /// CPU time: the basis of the ceiling (see `best_rate`).
    #[serde(default)]
    pub best_gops: f64,
    /// Per repetition, every CPU's rate over its own CPU time, summed (`Timed::own_rate`): the
    /// peak as the cores deliver it, which other work taking turns on the CPUs does not lower.
    #[serde(default)]
    pub own_gops: Vec<f64>,
}

/// The peak "% of peak", MFU, the operations per cycle and the stored peak metrics use: the median
/// of the per-repetition rates over each thread's own CPU time, which other work taking turns on
/// the CPUs does not lower (the window median does: it read 75–264 GFLOP/s on one busy machine);
/// a report from before those were kept falls back to the best CPU's rate, then the window.
pub fn own_rate(own: &[f64], best: f64, window_median: f64) -> f64 {
    if own.is_empty() {
        if best > 0.0 {
            best
        } else {
            window_median
        }
    } else {
        crate::stats::median(own)
    }
}

impl TypePeak {
    /// See [`own_rate`].
    pub fn rate(&self) -> f64 {
        own_rate(&self.own_gops, self.best_gops, self.summary.median)
    }
}

/// A [`TypePeak`] as JSON carries it (see [`PeakWire`]).
#[derive(Serialize, Deserialize)]
struct TypePeakWire {
    dtype: String,
    instruction: String,
    /// Per repetition, every CPU's rate over its own CPU time, summed.
    gops: Vec<f64>,
    summary: Option<Summary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window_gops: Option<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window_summary: Option<Summary>,
    per_cycle: Option<f64>,
    #[serde(default)]
    best_gops: f64,
    /// Only in reports from before this layout.
    #[serde(default, skip_serializing)]
    own_gops: Vec<f64>,
}

impl From<TypePeak> for TypePeakWire {
    fn from(p: TypePeak) -> TypePeakWire {
        TypePeakWire {
            dtype: p.dtype,
            instruction: p.instruction,
            summary: summarize(&p.own_gops),
            gops: p.own_gops,
            window_gops: Some(p.gops),
            window_summary: Some(p.summary),
            per_cycle: p.per_cycle,
            best_gops: p.best_gops,
            own_gops: Vec::new(),
        }
    }
}

impl From<TypePeakWire> for TypePeak {
    fn from(w: TypePeakWire) -> TypePeak {
        let (window, summary, own) = match w.window_gops {
            Some(window) => (window, w.window_summary, w.gops),
            None => (w.gops, w.summary, w.own_gops),
        };
        TypePeak {
            dtype: w.dtype,
            instruction: w.instruction,
            summary: summary.or_else(|| summarize(&window)).unwrap_or_default(),
            gops: window,
            per_cycle: w.per_cycle,
            best_gops: w.best_gops,
            own_gops: own,
        }
    }
}

/// The all-core clock, measured by a chain of dependent register adds on every CPU at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Clock {
    pub mhz: Vec<f64>,
    pub summary: Summary,
}

/// One repetition of [`on_all_cpus`]: the window over all threads, and each thread's own wall
/// and CPU time.
pub(crate) struct Timed {
    pub window: f64,
    pub threads: Vec<f64>,
    /// Each thread's CPU time: its rate over this is what its core delivers while it runs,
    /// whatever else shared the core by turns.
    pub cpu: Vec<f64>,
}

/// The calling thread's CPU time in seconds; `None` where the clock is not available.
fn thread_cpu_seconds() -> Option<f64> {
    use nix::time::{clock_gettime, ClockId};
    let t = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).ok()?;
    Some(t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
}

/// Runs `work` on every CPU at once (one pinned thread each), `repetitions` times after one
/// warm-up. The window opens before the first thread is spawned and closes after the last has
/// finished, so it cannot miss work; each thread also times its own part, in wall and CPU time.
pub(crate) fn on_all_cpus(cpus: &[u32], repetitions: usize, work: impl Fn() + Sync) -> Vec<Timed> {
    let threads = cpus.len().max(1);
    let mut timed = Vec::new();
    for rep in 0..=repetitions {
        let t0 = Instant::now();
        let own: Vec<(f64, f64)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let cpu = cpus.get(t).copied();
                    let work = &work;
                    s.spawn(move || {
                        if let Some(c) = cpu {
                            pin_to_cpu(c);
                        }
                        let (start, cpu_start) = (Instant::now(), thread_cpu_seconds());
                        work();
                        let wall = start.elapsed().as_secs_f64();
                        let cpu = cpu_start.zip(thread_cpu_seconds()).map_or(wall, |(a, b)| b - a);
                        (wall, cpu)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        });
        if rep > 0 {
            let (threads, cpu) = own.into_iter().unzip();
            timed.push(Timed { window: t0.elapsed().as_secs_f64(), threads, cpu });
        }
    }
    timed
}

impl Timed {
    /// Every thread's rate over its own CPU time, summed: what the CPUs deliver while they run,
    /// each at its own speed (a hybrid CPU's small cores count as small), whatever else took turns
    /// on them.
    pub(crate) fn own_rate(&self, ops_per_thread: f64) -> f64 {
        self.cpu.iter().filter(|s| **s > 0.0).map(|s| ops_per_thread / s).sum()
    }
}

/// The best rate any one thread showed over its own CPU time, times the number of threads: what
/// all the CPUs deliver at the best any of them did (the ceiling; a peak measured while other
/// work shared the CPUs by turns is low, this is not).
pub(crate) fn best_rate(timed: &[Timed], ops_per_thread: f64) -> f64 {
    let threads = timed.first().map_or(1, |t| t.cpu.len().max(1)) as f64;
    let best = timed.iter().flat_map(|t| &t.cpu).filter(|s| **s > 0.0).map(|s| ops_per_thread / s).fold(0.0, f64::max);
    best * threads
}

/// Adds executed by [`add_chain`] per iteration, one cycle each.
const ADDS_PER_ITERATION: u64 = 100;

/// `iterations` × 100 dependent register-register adds (register operands: some cores fold
/// add-immediate chains at rename, none fold these).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn add_chain(iterations: u64) -> u64 {
    let (mut x, mut n) = (0u64, iterations.max(1));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: register arithmetic only; no memory, no stack.
    unsafe {
        std::arch::asm!(
            "2:", ".rept 100", "add {x}, {y}", ".endr", "dec {n}", "jnz 2b",
            x = inout(reg) x, y = in(reg) 1u64, n = inout(reg) n, options(nomem, nostack),
        );
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: register arithmetic only; no memory, no stack.
    unsafe {
        std::arch::asm!(
            "2:", ".rept 100", "add {x}, {x}, {y}", ".endr", "subs {n}, {n}, #1", "b.ne 2b",
            x = inout(reg) x, y = in(reg) 1u64, n = inout(reg) n, options(nomem, nostack),
        );
    }
    std::hint::black_box(n);
    x
}

/// The all-core clock in MHz; `None` on architectures without the add chain.
pub fn clock(cpus: &[u32], repetitions: usize, iterations: u64) -> Option<Clock> {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let timed = on_all_cpus(cpus, repetitions, || {
            std::hint::black_box(add_chain(iterations));
        });
        // A clock is each core's own: the median of the threads' own rates, so that one thread
        // the scheduler delayed does not read as a slow clock.
        let cycles = (iterations * ADDS_PER_ITERATION) as f64;
        let mhz: Vec<f64> = timed
            .iter()
            .map(|t| crate::stats::median(&t.threads.iter().map(|s| cycles / s / 1e6).collect::<Vec<_>>()))
            .collect();
        Some(Clock { summary: summarize(&mhz)?, mhz })
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (cpus, repetitions, iterations);
        None
    }
}

/// Independent accumulators per thread: more than latency × throughput of every core's dot
/// product unit (6 × 2 on Zen 5), so the chains measure throughput, not latency.
#[cfg(target_arch = "x86_64")]
const CHAINS: usize = 16;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512bf16,avx512f")]
fn bf16_chains(iterations: u64) -> f32 {
    use std::arch::x86_64::*;
    // Pairs of bf16 ones and tiny values, so the sums grow slowly and stay finite.
    let a: __m512bh = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1.0), _mm512_set1_ps(1.0));
    let b: __m512bh = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-6), _mm512_set1_ps(1e-6));
    let mut acc = [_mm512_setzero_ps(); CHAINS];
    for _ in 0..iterations {
        for x in acc.iter_mut() {
            *x = _mm512_dpbf16_ps(*x, a, b);
        }
    }
    acc.iter().map(|x| _mm512_reduce_add_ps(*x)).sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512vnni,avx512f")]
fn int8_chains(iterations: u64) -> i64 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_epi8(1), _mm512_set1_epi8(1));
    let mut acc = [_mm512_setzero_si512(); CHAINS];
    for _ in 0..iterations {
        for x in acc.iter_mut() {
            *x = _mm512_dpbusd_epi32(*x, a, b);
        }
    }
    acc.iter().map(|x| i64::from(_mm512_reduce_add_epi32(*x))).sum()
}

/// The bf16 and int8 peaks this CPU has instructions for (none on other architectures).
pub fn low_precision_peaks(cpus: &[u32], repetitions: usize, iterations: u64) -> Vec<TypePeak> {
    let threads = cpus.len().max(1) as f64;
    let mut peaks = Vec::new();
    // A peak is all CPUs together over the one window, as a GEMM on all of them is timed.
    let mut push = |dtype: &str, instruction: &str, ops_per_iteration: f64, timed: Vec<Timed>| {
        let gops: Vec<f64> =
            timed.iter().map(|t| iterations as f64 * ops_per_iteration * threads / t.window / 1e9).collect();
        let per_thread = iterations as f64 * ops_per_iteration;
        let best_gops = best_rate(&timed, per_thread) / 1e9;
        let own_gops = timed.iter().map(|t| t.own_rate(per_thread) / 1e9).collect();
        if let Some(summary) = summarize(&gops) {
            peaks.push(TypePeak {
                dtype: dtype.into(),
                instruction: instruction.into(),
                gops,
                summary,
                per_cycle: None,
                best_gops,
                own_gops,
            });
        }
    };
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512bf16") && std::arch::is_x86_feature_detected!("avx512f") {
            // 16 lanes × 2 bf16 products, each a multiply and an add.
            let timed = on_all_cpus(cpus, repetitions, || {
                // SAFETY: the features were detected at run time just above.
                std::hint::black_box(unsafe { bf16_chains(iterations) });
            });
            push("bf16", "vdpbf16ps zmm", (CHAINS * 16 * 2 * 2) as f64, timed);
        }
        if std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512f") {
            // 16 lanes × 4 u8·i8 products, each a multiply and an add.
            let timed = on_all_cpus(cpus, repetitions, || {
                // SAFETY: the features were detected at run time just above.
                std::hint::black_box(unsafe { int8_chains(iterations) });
            });
            push("int8", "vpdpbusd zmm", (CHAINS * 16 * 4 * 2) as f64, timed);
        }
    }
    // Other architectures have no kernels here yet: nothing is measured.
    let _ = (&mut push, repetitions);
    peaks
}

/// The f32 peak as a [`TypePeak`].
pub fn f32_peak(peak: &PeakResult) -> TypePeak {
    let instruction = match peak.isa.as_str() {
        "avx512f" => "vfmadd231ps zmm",
        "avx2+fma" => "vfmadd231ps ymm",
        _ => "fused multiply-add (scalar)",
    };
    TypePeak {
        dtype: "f32".into(),
        instruction: instruction.into(),
        gops: peak.gflops.clone(),
        summary: peak.summary.clone(),
        per_cycle: None,
        best_gops: peak.best_gflops,
        own_gops: peak.own_gflops.clone(),
    }
}

/// Fills in each peak's operations per cycle per CPU at the measured clock.
pub fn per_cycle(peaks: &mut [TypePeak], clock: Option<&Clock>, cpus: usize) {
    let Some(mhz) = clock.map(|c| c.summary.median).filter(|m| *m > 0.0) else { return };
    for p in peaks {
        // What a core does per cycle while it runs, like the clock (each thread's own).
        p.per_cycle = Some(p.rate() * 1e3 / mhz / cpus.max(1) as f64);
    }
}

/// What bounds a GEMM beyond the measured peaks: units the chains do not measure, and what a
/// datasheet bound for them needs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unmeasured {
    /// AVX512-FP16: f16 arithmetic at twice the f32 lanes.
    pub avx512fp16: bool,
    /// AMX tiles with bf16 (`TDPBF16PS`) and int8 (`TDPBUSD`) dot products.
    pub amx_bf16: bool,
    pub amx_int8: bool,
    /// CPUs the GEMMs run on (an upper bound on the cores: hyperthreads share a core's tiles).
    pub cpus: usize,
    /// The highest all-core clock measured, MHz.
    pub clock_mhz: Option<f64>,
}

/// Intel's figures for one core's AMX tile unit (TMUL), per cycle: 1,024 bf16 FLOP (`TDPBF16PS`)
/// and 2,048 int8 operations (`TDPBUSD`) — the Sapphire Rapids and later datasheets. Not
/// measured: Rust's AMX intrinsics are unstable and no machine here has AMX.
pub const AMX_BF16_FLOP_PER_CYCLE: f64 = 1024.0;
pub const AMX_INT8_OP_PER_CYCLE: f64 = 2048.0;

/// The fastest a GEMM in `dtype` ("f32", "bf16", "f16", "int8") can run here, in GFLOP/s (GOP/s),
/// and what it rests on: the fastest peak that computes in that type, at its best CPU's rate,
/// or, on a CPU with AMX, the tiles' datasheet rate at the measured clock where that is higher
/// (oneDNN runs bf16 and int8 on the tiles), with the margin.
/// `None` when nothing bounds the type.
pub fn gemm_ceiling(dtype: &str, peaks: &[TypePeak], cpu: &Unmeasured) -> Option<(f64, String)> {
    let best =
        |d: &str| peaks.iter().find(|p| p.dtype == d).map(|p| (p.best_gops.max(p.summary.max), p.instruction.clone()));
    let faster = |a: Option<(f64, String)>, b: Option<(f64, String)>| match (a, b) {
        (Some(a), Some(b)) => Some(if a.0 >= b.0 { a } else { b }),
        (a, b) => a.or(b),
    };
    let amx = |has: bool, per_cycle: f64, instruction: &str| {
        let mhz = cpu.clock_mhz.filter(|_| has)?;
        let rate = cpu.cpus.max(1) as f64 * mhz * per_cycle / 1e3;
        Some((rate, format!("AMX {instruction}, {per_cycle:.0}/cycle per core (Intel's figure, not measured) at {mhz:.0} MHz × {} CPUs", cpu.cpus)))
    };
    let f32_peak = best("f32");
    let (gflops, basis) = match dtype {
        "f32" => f32_peak?,
        // A bf16 GEMM computes with bf16 dot products, on AMX tiles, or converts to f32: the
        // fastest bounds it.
        "bf16" => faster(faster(best("bf16"), f32_peak), amx(cpu.amx_bf16, AMX_BF16_FLOP_PER_CYCLE, "TDPBF16PS"))?,
        "int8" => faster(best("int8"), amx(cpu.amx_int8, AMX_INT8_OP_PER_CYCLE, "TDPBUSD"))?,
        "f16" => {
            let (g, i) = f32_peak?;
            if cpu.avx512fp16 {
                (2.0 * g, format!("2 x {i} (AVX512-FP16 has twice the f32 lanes; not measured)"))
            } else {
                (g, i)
            }
        }
        _ => return None,
    };
    let measured = !basis.starts_with("AMX");
    Some((
        gflops * CEILING_MARGIN,
        format!(
            "{basis}{}, {gflops:.1} G{}/s, + {:.0} %",
            if measured { ", every CPU at the best rate one showed" } else { "" },
            if dtype == "int8" { "OP" } else { "FLOP" },
            (CEILING_MARGIN - 1.0) * 100.0
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peak(dtype: &str, max: f64) -> TypePeak {
        TypePeak {
            dtype: dtype.into(),
            instruction: format!("{dtype} op"),
            gops: vec![max * 0.9, max],
            summary: summarize(&[max * 0.9, max]).unwrap(),
            per_cycle: None,
            best_gops: 0.0,
            own_gops: Vec::new(),
        }
    }

    #[test]
    fn clock_is_plausible() {
        let c = clock(&[0], 2, 200_000).expect("x86-64 or aarch64");
        // Any core of the last twenty years runs between 0.5 and 7 GHz.
        assert!((500.0..7000.0).contains(&c.summary.median), "{c:?}");
    }

    #[test]
    fn low_precision_peaks_match_the_cpu() {
        let peaks = low_precision_peaks(&[0], 2, 100_000);
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(peaks.iter().any(|p| p.dtype == "bf16"), std::arch::is_x86_feature_detected!("avx512bf16"));
            assert_eq!(peaks.iter().any(|p| p.dtype == "int8"), std::arch::is_x86_feature_detected!("avx512vnni"));
        }
        for p in &peaks {
            assert!(p.summary.median > 0.0 && p.gops.len() == 2, "{p:?}");
        }
    }

    /// In JSON the peak kiln states is `summary.median` (the own-time rates), the window's is
    /// `window_summary`; what is written reads back the same, and a report stored before this
    /// layout reads as it meant.
    #[test]
    fn the_json_names_the_peak_kiln_uses_summary() {
        let peak = PeakResult {
            gflops: vec![305.0, 310.0, 314.0],
            summary: summarize(&[305.0, 310.0, 314.0]).unwrap(),
            isa: "avx2+fma".into(),
            best_gflops: 450.0,
            own_gflops: vec![427.0, 440.0, 446.0],
        };
        let json = serde_json::to_value(&peak).unwrap();
        assert_eq!(json["summary"]["median"], 440.0);
        assert_eq!(json["summary"]["median"].as_f64(), Some(peak.rate()));
        assert_eq!(json["gflops"], serde_json::json!([427.0, 440.0, 446.0]));
        assert_eq!(json["window_summary"]["median"], 310.0);
        let back: PeakResult = serde_json::from_value(json).unwrap();
        assert_eq!((back.gflops, back.own_gflops, back.summary.median), (peak.gflops, peak.own_gflops, 310.0));
        let old = serde_json::json!({
            "gflops": [305.0, 310.0, 314.0], "summary": serde_json::to_value(&peak.summary).unwrap(),
            "isa": "avx2+fma", "best_gflops": 450.0, "own_gflops": [427.0, 440.0, 446.0]
        });
        let read: PeakResult = serde_json::from_value(old).unwrap();
        assert_eq!((read.summary.median, read.rate()), (310.0, 440.0));
        let typed = f32_peak(&read);
        let json = serde_json::to_value(&typed).unwrap();
        assert_eq!(
            (json["summary"]["median"].as_f64(), json["window_summary"]["median"].as_f64()),
            (Some(440.0), Some(310.0))
        );
        let back: TypePeak = serde_json::from_value(json).unwrap();
        assert_eq!((back.rate(), back.gops, back.own_gops), (440.0, typed.gops, typed.own_gops));
    }

    #[test]
    fn best_rate_is_the_best_thread_over_its_cpu_time() {
        let timed = vec![
            Timed { window: 2.5, threads: vec![2.0, 2.4], cpu: vec![1.0, 2.0] },
            Timed { window: 1.2, threads: vec![1.0, 1.1], cpu: vec![0.5, 1.0] },
        ];
        // 100 operations per thread; the best thread did them in 0.5 s of CPU: 200/s, × 2.
        assert_eq!(best_rate(&timed, 100.0), 400.0);
        // Each thread at its own rate, summed: 100/1 + 100/2 in the first repetition.
        assert_eq!(timed[0].own_rate(100.0), 150.0);
    }

    /// A peak measured while another thread takes turns on the same CPU reads about half over
    /// the window, but neither its rate nor its ceiling (over the thread's own CPU time) drops.
    #[test]
    fn a_shared_cpu_halves_the_peak_not_the_ceiling() {
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (shared, ceiling, own) = std::thread::scope(|s| {
            s.spawn(|| {
                pin_to_cpu(0);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
            let peak = fma_peak(&[0], 3, 20_000_000);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            (peak.summary.median, peak.best_gflops, peak.rate())
        });
        eprintln!("shared CPU: window {shared:.1}, own rate {own:.1}, ceiling {ceiling:.1} GFLOP/s");
        assert!(ceiling > 1.4 * shared, "ceiling {ceiling:.1} vs peak {shared:.1} GFLOP/s on a shared CPU");
        assert!(own > 1.4 * shared, "own rate {own:.1} vs window {shared:.1} GFLOP/s on a shared CPU");
    }

    #[test]
    fn ceilings_by_type() {
        let peaks = vec![peak("f32", 100.0), peak("bf16", 200.0)];
        let plain = Unmeasured { cpus: 2, clock_mhz: Some(3000.0), ..Unmeasured::default() };
        let fp16 = Unmeasured { avx512fp16: true, ..plain };
        assert_eq!(gemm_ceiling("f32", &peaks, &plain).unwrap().0, 105.0);
        assert_eq!(gemm_ceiling("bf16", &peaks, &plain).unwrap().0, 210.0);
        assert_eq!(gemm_ceiling("f16", &peaks, &plain).unwrap().0, 105.0);
        assert_eq!(gemm_ceiling("f16", &peaks, &fp16).unwrap().0, 210.0);
        // Without a bf16 unit, bf16 runs at f32 speed at best.
        assert_eq!(gemm_ceiling("bf16", &peaks[..1], &plain).unwrap().0, 105.0);
        assert_eq!(gemm_ceiling("f64", &peaks, &plain), None);
        // int8 has only its own peak.
        assert_eq!(gemm_ceiling("int8", &peaks, &plain), None);
        assert_eq!(gemm_ceiling("int8", &[peak("int8", 800.0)], &plain).unwrap().0, 840.0);
        assert_eq!(gemm_ceiling("f32", &[], &plain), None);
    }

    /// On a CPU with AMX, oneDNN runs bf16 and int8 on the tiles, far above the AVX-512 chains:
    /// the ceiling is the tiles' datasheet rate at the measured clock, and says so.
    #[test]
    fn amx_raises_the_bf16_and_int8_ceilings_to_the_tiles_rate() {
        let peaks = vec![peak("f32", 100.0), peak("bf16", 200.0), peak("int8", 400.0)];
        let amx =
            Unmeasured { amx_bf16: true, amx_int8: true, cpus: 2, clock_mhz: Some(2000.0), ..Unmeasured::default() };
        // 2 CPUs × 2,000 MHz × 1,024 FLOP/cycle = 4,096 GFLOP/s; int8 twice that; + 5 %.
        let (bf16, basis) = gemm_ceiling("bf16", &peaks, &amx).unwrap();
        assert!((bf16 - 4096.0 * CEILING_MARGIN).abs() < 1e-6, "{bf16}");
        assert!(basis.starts_with("AMX TDPBF16PS, 1024/cycle per core (Intel's figure, not measured)"), "{basis}");
        let (int8, _) = gemm_ceiling("int8", &peaks, &amx).unwrap();
        assert!((int8 - 8192.0 * CEILING_MARGIN).abs() < 1e-6, "{int8}");
        // f32 does not run on the tiles; without a measured clock the tiles bound nothing.
        assert_eq!(gemm_ceiling("f32", &peaks, &amx).unwrap().0, 105.0);
        let no_clock = Unmeasured { clock_mhz: None, ..amx };
        assert_eq!(gemm_ceiling("bf16", &peaks, &no_clock).unwrap().0, 210.0);
    }

    #[test]
    fn operations_per_cycle() {
        let mut peaks = vec![peak("f32", 256.0)];
        let clock = Clock { mhz: vec![4000.0], summary: summarize(&[4000.0]).unwrap() };
        per_cycle(&mut peaks, Some(&clock), 2);
        // median of (230.4, 256) = 243.2 GFLOP/s over 2 CPUs at 4 GHz.
        assert!((peaks[0].per_cycle.unwrap() - 30.4).abs() < 1e-9);
        // With a best-CPU rate, that one: 256 GFLOP/s over 2 CPUs at 4 GHz.
        peaks[0].best_gops = 256.0;
        per_cycle(&mut peaks, Some(&clock), 2);
        assert!((peaks[0].per_cycle.unwrap() - 32.0).abs() < 1e-9);
    }
}
