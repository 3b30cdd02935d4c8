//! Dense matrix multiply through candle, per dtype and size, in GFLOP/s and as a share of the
//! processor's measured FMA peak (`fma_peak`: every core running independent FMA chains, the
//! ceiling a GEMM can approach).

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::stats::{summarize, Summary};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GemmResult {
    pub dtype: String,
    pub n: usize,
    /// What multiplied: "candle" (kiln's built-in path) or a library found at run time
    /// ("onednn", "openblas", "blis"; `blas`), so that no comparison mixes two kernels silently.
    #[serde(default = "candle")]
    pub backend: String,
    /// The library's version and, where it says, the kernel it chose.
    #[serde(default)]
    pub implementation: Option<String>,
    pub gflops: Vec<f64>,
    pub summary: Summary,
    /// Share of the measured peak of its type (`ceilings`): bf16 against the bf16 dot-product peak
    /// where the CPU has one, otherwise (and f16) against the f32 FMA peak.
    pub percent_of_peak: Option<f64>,
}

fn candle() -> String {
    "candle".into()
}

/// Multiplies two n×n matrices of `dtype` on the CPU `repetitions` times after a warm-up.
///
/// # Errors
/// When candle cannot multiply in that dtype on this device.
pub fn measure(
    dtype: DType,
    n: usize,
    repetitions: usize,
    peak_gflops: Option<f64>,
) -> candle_core::Result<GemmResult> {
    let device = Device::Cpu;
    let a = Tensor::randn(0f32, 1.0, (n, n), &device)?.to_dtype(dtype)?;
    let b = Tensor::randn(0f32, 1.0, (n, n), &device)?.to_dtype(dtype)?;
    // The warm-up call starts the thread pool and fills the caches.
    let seconds = timed(repetitions, || a.matmul(&b))?;
    Ok(result(&format!("{dtype:?}").to_lowercase(), n, candle(), None, &seconds, peak_gflops).expect("repetitions"))
}

/// Seconds of each of `repetitions` calls after one warm-up call, each timing the call alone
/// (what it returns is dropped outside the window); then, while the median is not yet known
/// ([`more_needed`]), more calls, up to [`MORE_REPETITIONS`] × `repetitions` in all.
fn timed<T, E>(repetitions: usize, mut call: impl FnMut() -> Result<T, E>) -> Result<Vec<f64>, E> {
    let mut seconds = Vec::new();
    let mut rep = 0;
    while rep <= repetitions || more_needed(&seconds, repetitions) {
        let t0 = Instant::now();
        let out = call()?;
        let secs = t0.elapsed().as_secs_f64();
        std::hint::black_box(out);
        if rep > 0 {
            seconds.push(secs);
        }
        rep += 1;
    }
    Ok(seconds)
}

/// At most this many times the asked repetitions are taken while the median is unsettled.
pub const MORE_REPETITIONS: usize = 4;

/// Whether a product timed `seconds` so far, asked for `repetitions`, takes another: its median's
/// interval is still too wide (a few slow calls among five decide nothing) and the cap is not
/// reached. A quiet box's heavy tail settles within a few more; a box that stays spread out is
/// `unstable` after the cap, as before.
pub fn more_needed(seconds: &[f64], repetitions: usize) -> bool {
    seconds.len() < repetitions.max(1) * MORE_REPETITIONS && summarize(seconds).is_some_and(|s| !s.settled())
}

/// An n×n×n multiply's result from the seconds of its repetitions; `None` without any.
fn result(
    dtype: &str,
    n: usize,
    backend: String,
    implementation: Option<String>,
    seconds: &[f64],
    peak_gflops: Option<f64>,
) -> Option<GemmResult> {
    let gflops: Vec<f64> = seconds.iter().map(|s| 2.0 * (n as f64).powi(3) / s / 1e9).collect();
    let summary = summarize(&gflops)?;
    Some(GemmResult {
        dtype: dtype.into(),
        n,
        backend,
        implementation,
        percent_of_peak: peak_gflops.map(|p| 100.0 * summary.median / p),
        summary,
        gflops,
    })
}

/// Seeded values in [-1, 1).
fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..len).map(|_| (crate::stats::splitmix64(&mut state) >> 40) as f32 / (1u64 << 23) as f32 - 1.0).collect()
}

/// Multiplies two n×n matrices of `dtype` ("f32", "bf16", "int8": GOP/s in `gflops`) through `lib` on `threads` threads,
/// `repetitions` times after a warm-up; each repetition times the call alone.
///
/// # Errors
/// When the library does not multiply that type, or a call fails.
pub fn measure_library(
    lib: &crate::blas::Library,
    dtype: &str,
    n: usize,
    repetitions: usize,
    threads: usize,
    peak_gflops: Option<f64>,
) -> Result<GemmResult, String> {
    if !lib.supports(dtype) {
        return Err(format!("{} does not multiply {dtype}", lib.version));
    }
    lib.set_threads(threads);
    let (a, b) = (random(n * n, 1), random(n * n, 2));
    let (seconds, implementation) = if dtype == "int8" {
        // Bytes over their whole ranges; i32 sums cannot overflow below k = 66,000.
        let a: Vec<u8> = a.iter().map(|v| ((v + 1.0) * 127.5) as u8).collect();
        let b: Vec<i8> = b.iter().map(|v| (v * 127.0) as i8).collect();
        let mut c = vec![0i32; n * n];
        let seconds = timed(repetitions, || lib.gemm_u8s8s32(n, n, n, &a, &b, &mut c))?;
        std::hint::black_box(&c);
        (seconds, lib.version.clone())
    } else if dtype == "bf16" {
        let mut mm = lib.bf16_matmul(n, n, n)?;
        mm.a_mut().iter_mut().zip(&a).for_each(|(d, s)| *d = crate::blas::to_bf16(*s));
        mm.b_mut().iter_mut().zip(&b).for_each(|(d, s)| *d = crate::blas::to_bf16(*s));
        let seconds = timed(repetitions, || mm.run())?;
        std::hint::black_box(mm.c());
        (seconds, format!("{} ({})", lib.version, mm.implementation))
    } else {
        let mut c = vec![0.0f32; n * n];
        let seconds = timed(repetitions, || lib.sgemm(n, n, n, &a, &b, &mut c))?;
        std::hint::black_box(&c);
        (seconds, lib.version.clone())
    };
    result(dtype, n, lib.kind.key().into(), Some(implementation), &seconds, peak_gflops)
        .ok_or_else(|| "no repetitions".into())
}

/// kiln's own bf16 kernel (`bf16::gemm`, AVX512-BF16) on an n×n×n product: B packed once, as a
/// layer's weights are; A's packing counted in every repetition.
///
/// # Errors
/// This CPU has no AVX512-BF16.
pub fn measure_kiln_bf16(n: usize, repetitions: usize, peak_gflops: Option<f64>) -> Result<GemmResult, String> {
    if !crate::bf16::available() {
        return Err("kiln's bf16 kernel needs AVX512-BF16".into());
    }
    let a: Vec<u16> = random(n * n, 1).into_iter().map(crate::blas::to_bf16).collect();
    let b: Vec<u16> = random(n * n, 2).into_iter().map(crate::blas::to_bf16).collect();
    let packed = crate::bf16::PackedB::new(n, n, &b);
    let mut c = vec![0f32; n * n];
    let seconds = timed(repetitions, || -> Result<(), String> {
        crate::bf16::gemm(n, &a, &packed, &mut c);
        Ok(())
    })?;
    std::hint::black_box(&c);
    let implementation = "kiln vdpbf16ps 12x32 micro-kernel".to_string();
    result("bf16", n, "kiln".into(), Some(implementation), &seconds, peak_gflops).ok_or_else(|| "no repetitions".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Repetitions continue while the median is unsettled, up to the cap; settled ones stop.
    #[test]
    fn repetitions_continue_until_the_median_is_known() {
        assert!(!more_needed(&[1.0, 1.001, 0.999, 1.0, 1.0], 5));
        // One call of five 25 % slow: the median's interval is the whole range; more are taken.
        let tail = [1.0, 1.001, 0.999, 1.25, 1.0];
        assert!(more_needed(&tail, 5));
        // Ten more quiet calls settle it.
        let mut more = tail.to_vec();
        more.extend([1.0, 0.999, 1.001, 1.0, 1.0, 1.002, 0.998, 1.0, 1.0, 1.0]);
        assert!(!more_needed(&more, 5));
        // A spread that never settles stops at the cap.
        let spread: Vec<f64> = (0..20).map(|i| 1.0 + (i % 2) as f64 * 0.2).collect();
        assert!(more_needed(&spread[..19], 5) && !more_needed(&spread, 5));
    }

    #[test]
    fn small_gemm_and_peak() {
        let peak = crate::ceilings::fma_peak(&[0], 2, 200_000);
        assert!(peak.summary.median > 0.0);
        let r = measure(DType::F32, 64, 3, Some(peak.summary.median)).unwrap();
        // Three asked; more while the median is unsettled, up to the cap.
        assert!((3..=3 * MORE_REPETITIONS).contains(&r.gflops.len()), "{}", r.gflops.len());
        assert!(r.summary.median > 0.0 && r.percent_of_peak.unwrap() > 0.0);
    }

    #[test]
    fn matmul_is_right() {
        let a = Tensor::new(&[[1f32, 2.], [3., 4.]], &Device::Cpu).unwrap();
        let c = a.matmul(&a).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(c, [[7., 10.], [15., 22.]]);
    }
}
