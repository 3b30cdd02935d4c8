//! GEMM on one device: C = A·B, A m×k and B k×n (square n×n by default) in the chosen type, the
//! same inputs on every device (generated on the host from a fixed seed), every repetition timed
//! to the device's completion, and the result **checked**: a grid of sampled rows × sampled columns of C against
//! an f64 product of the same (already rounded) inputs, so that a device that computes wrong fails
//! even when it is fast. Device-agnostic: the tests run it on the CPU.

use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

/// A product's shape: C (m×n) = A (m×k) · B (k×n).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl Shape {
    pub fn square(n: usize) -> Shape {
        Shape { m: n, n, k: n }
    }

    /// "8192" (square) or "4096x8192x2048" (m×n×k).
    pub fn parse(text: &str) -> anyhow::Result<Shape> {
        let dims: Vec<usize> = text
            .split('x')
            .map(|d| d.trim().parse::<usize>())
            .collect::<Result<_, _>>()
            .with_context(|| format!("shape {text:?}: N or MxNxK"))?;
        let shape = match dims[..] {
            [n] => Shape::square(n),
            [m, n, k] => Shape { m, n, k },
            _ => anyhow::bail!("shape {text:?}: N or MxNxK"),
        };
        for d in [shape.m, shape.n, shape.k] {
            anyhow::ensure!((16..=65_536).contains(&d), "shape {text:?}: every side between 16 and 65536");
        }
        Ok(shape)
    }

    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}x{}", self.m, self.n, self.k)
    }
}

/// A product's number format: how the operands are stored and the product computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Bf16,
    F16,
    F32,
    /// f32 operands multiplied on the tensor cores with TF32 inputs (10-bit mantissas), as
    /// cuBLAS does when allowed to reduce f32 precision.
    Tf32,
    /// e4m3 operands (FP8), products summed in f32 and the result rounded to bf16, on the tensor
    /// cores of compute capability 8.9 and newer, through cuBLASLt ([`crate::fp8`]).
    Fp8,
}

impl Precision {
    pub fn parse(text: &str) -> anyhow::Result<Precision> {
        Ok(match text {
            "bf16" => Precision::Bf16,
            "f16" => Precision::F16,
            "f32" => Precision::F32,
            "tf32" => Precision::Tf32,
            "fp8" => Precision::Fp8,
            other => anyhow::bail!("--dtype {other:?}: bf16, f16, f32, tf32 or fp8"),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
            Precision::F32 => "f32",
            Precision::Tf32 => "tf32",
            Precision::Fp8 => "fp8",
        }
    }

    /// How the operands are stored.
    pub fn storage(self) -> DType {
        match self {
            Precision::Bf16 => DType::BF16,
            Precision::F16 => DType::F16,
            Precision::F32 | Precision::Tf32 => DType::F32,
            Precision::Fp8 => DType::F8E4M3,
        }
    }

    /// The unit roundoff of an operand as the product reads it (TF32 rounds f32 inputs to a
    /// 10-bit mantissa; the other formats read their operands as stored).
    pub fn input_roundoff(self) -> f64 {
        match self {
            Precision::Tf32 => 2f64.powi(-11),
            _ => 0.0,
        }
    }

    /// The unit roundoff of the product's running sum. f32's (2⁻²⁴), except fp8's: Hopper's fp8
    /// tensor cores keep about 14 bits of a running sum (DeepSeek-V3's technical report,
    /// "increasing accumulation precision"), which cuBLAS promotes to f32 now and then but may not
    /// (its fast-accumulation mode); the check allows the worst of the two, so that a right fp8
    /// product never fails it, and a wrong one (a flipped bit, garbage) still does.
    pub fn accumulation_roundoff(self) -> f64 {
        match self {
            Precision::Fp8 => 2f64.powi(-14),
            _ => 2f64.powi(-24),
        }
    }

    /// Tells candle's CUDA backend whether f32 products may use TF32 (a no-op without CUDA).
    pub(crate) fn select(self) {
        candle_core::cuda::set_gemm_reduced_precision_f32(self == Precision::Tf32);
    }
}

/// What `kiln-gpu gemm` measures.
#[derive(Debug, Clone)]
pub struct Options {
    pub device: usize,
    pub dtype: Precision,
    pub shape: Shape,
    pub reps: usize,
    /// Rows and columns sampled for the check (their grid: samples² values of C).
    pub samples: usize,
}

/// One device's GEMM: every repetition's time and the check.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub device: usize,
    pub name: Option<String>,
    pub dtype: String,
    /// The square side where the shape is square (as asked with `--n`), else m.
    pub n: usize,
    pub shape: Shape,
    /// 2·m·n·k per repetition.
    pub flops_per_rep: f64,
    /// Each timed repetition, launch to the device's completion (after three untimed ones).
    pub seconds: Vec<f64>,
    pub tflops_median: f64,
    pub tflops_best: f64,
    pub check: Check,
}

/// The sampled check of C.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Check {
    /// Values of C compared (sampled rows × sampled columns).
    pub values: usize,
    /// The worst |C − reference| over its allowed error (≤ 1 passes).
    pub worst_ratio: f64,
    /// Where the worst value was (row, column).
    pub worst_at: (usize, usize),
    pub ok: bool,
    /// The sum of the sampled values of C: equal inputs on every device, so devices of one box
    /// should agree to within the check's tolerance (kiln compares them).
    pub sampled_sum: f64,
    /// The sum of every sampled value's allowed error: two devices that both pass may differ in
    /// `sampled_sum` by at most twice this.
    #[serde(default)]
    pub allowed_sum: f64,
}

/// Measures C = A·B on `device`.
///
/// # Errors
/// The device fails an operation (out of memory, a lost device).
pub fn measure(device: &Device, o: &Options, name: Option<String>) -> anyhow::Result<Report> {
    let Shape { m, n, k } = o.shape;
    let a = input(m, k, 1, o.dtype.storage())?.to_device(device)?;
    let b = input(k, n, 2, o.dtype.storage())?.to_device(device)?;
    timed(device, o, &a, &b, name)
}

/// A product's operands as it reads them: A and B as stored, with (fp8) Bᵀ laid out once and the
/// fp8 product's plans, so that what is timed is the product alone.
struct Operands<'a> {
    a: &'a Tensor,
    b: &'a Tensor,
    fp8: Option<(Tensor, crate::fp8::Fp8Product)>,
}

impl<'a> Operands<'a> {
    fn new(a: &'a Tensor, b: &'a Tensor, dtype: Precision) -> candle_core::Result<Operands<'a>> {
        let fp8 = match dtype {
            Precision::Fp8 => Some((crate::fp8::transposed(b)?, crate::fp8::Fp8Product::new())),
            _ => None,
        };
        Ok(Operands { a, b, fp8 })
    }

    /// C = A·B, queued on the device.
    fn product(&self) -> candle_core::Result<Tensor> {
        match &self.fp8 {
            Some((bt, op)) => op.product(self.a, bt),
            None => self.a.matmul(self.b),
        }
    }
}

/// Three untimed products, then each of `o.reps` timed to the device's completion, then the check.
fn timed(device: &Device, o: &Options, a: &Tensor, b: &Tensor, name: Option<String>) -> anyhow::Result<Report> {
    o.dtype.select();
    let operands = Operands::new(a, b, o.dtype)?;
    // Untimed: the library's first call chooses its kernels and the allocator warms up.
    let mut c = operands.product()?;
    for _ in 0..2 {
        c = operands.product()?;
    }
    device.synchronize()?;
    let mut seconds = Vec::with_capacity(o.reps);
    for _ in 0..o.reps {
        let t = Instant::now();
        c = operands.product()?;
        device.synchronize()?;
        seconds.push(t.elapsed().as_secs_f64());
    }
    let check = check(a, b, &c, o.samples, o.dtype)?;
    let flops = o.shape.flops();
    let mut sorted = seconds.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    Ok(Report {
        device: o.device,
        name,
        dtype: o.dtype.name().to_string(),
        n: o.shape.m,
        shape: o.shape,
        flops_per_rep: flops,
        tflops_median: flops / median / 1e12,
        tflops_best: flops / sorted[0] / 1e12,
        seconds,
        check,
    })
}

/// The shapes a sweep tries by default (after MAMF, "maximum achievable matmul FLOPS": the best
/// of many shapes is what the GPU can do, the ceiling a model's products are held to): squares
/// from 1024 to 16384, and 8192-wide products with a short, a long and a doubled side.
pub const DEFAULT_SWEEP: &str =
    "1024,2048,4096,6144,8192,10240,12288,16384,8192x8192x4096,8192x8192x16384,16384x8192x8192,8192x16384x8192";

/// What `kiln-gpu sweep` measures: one type at several shapes on one device.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    pub device: usize,
    pub dtype: Precision,
    pub shapes: Vec<Shape>,
    pub reps: usize,
    pub samples: usize,
}

/// `kiln-gpu sweep`'s document: every shape's product, checked, and the fastest right one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sweep {
    pub device: usize,
    pub name: Option<String>,
    pub dtype: String,
    pub results: Vec<Report>,
    /// Index in `results` of the highest median rate among the products that passed their check.
    pub best: Option<usize>,
}

/// Measures every shape of `o` on `device`. The inputs are drawn on the device (a sweep's
/// largest operands would take seconds to make on the host), so they differ between devices: a
/// sweep is checked against its own inputs, not compared across GPUs. fp8 operands are made on
/// the host and copied (candle 0.11.1 cannot cast to fp8 on a GPU: see `fp8::transposed`).
///
/// # Errors
/// The device fails an operation (out of memory, a lost device).
pub fn sweep(device: &Device, o: &SweepOptions, name: Option<String>) -> anyhow::Result<Sweep> {
    let mut results = Vec::with_capacity(o.shapes.len());
    for &shape in &o.shapes {
        let Shape { m, n, k } = shape;
        let draw = |rows: usize, cols: usize, seed: u64| match o.dtype {
            Precision::Fp8 => input(rows, cols, seed, DType::F8E4M3)?.to_device(device),
            _ => Tensor::rand(-1f32, 1f32, (rows, cols), device)?.to_dtype(o.dtype.storage()),
        };
        let (a, b) = (draw(m, k, 1)?, draw(k, n, 2)?);
        let options =
            Options { device: o.device, dtype: o.dtype, shape, reps: o.reps, samples: o.samples.min(m).min(n) };
        results.push(timed(device, &options, &a, &b, name.clone())?);
    }
    let best = results
        .iter()
        .enumerate()
        .filter(|(_, r)| r.check.ok)
        .max_by(|a, b| a.1.tflops_median.total_cmp(&b.1.tflops_median))
        .map(|(i, _)| i);
    Ok(Sweep { device: o.device, name, dtype: o.dtype.name().to_string(), results, best })
}

/// A rows×cols operand, the same on every device: a xorshift sequence from `seed` in [-1, 1),
/// rounded to `dtype` on the host.
pub fn input(rows: usize, cols: usize, seed: u64, dtype: DType) -> candle_core::Result<Tensor> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ seed.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let values: Vec<f32> = (0..rows * cols)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect();
    Tensor::from_vec(values, (rows, cols), &Device::Cpu)?.to_dtype(dtype)
}

/// The rows (or columns) the check samples: spread over the whole range, ends included.
fn sampled(n: usize, samples: usize) -> Vec<u32> {
    let samples = samples.min(n);
    if samples == 1 {
        return vec![0];
    }
    (0..samples).map(|s| ((s * (n - 1)) / (samples - 1)) as u32).collect()
}

/// The unit roundoff of a stored element of `dtype`.
fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-24),
    }
}

/// Compares the sampled grid of C with an f64 product of the same inputs. A value may be off by
/// rounding its result to the output type (u·|ref|) plus the error of an accumulation of k
/// products (a generous 16·u_acc·√k·‖products‖₂, u_acc the precision's
/// [`Precision::accumulation_roundoff`]), plus, where the product reads its operands rounded
/// (TF32: [`Precision::input_roundoff`] u_in), 2·u_in·Σ|aᵢbᵢ|; anything beyond is a wrong result.
pub fn check(a: &Tensor, b: &Tensor, c: &Tensor, samples: usize, precision: Precision) -> anyhow::Result<Check> {
    // fp8 operands are read as bf16, which holds every e4m3 value exactly — widened on the host:
    // candle 0.11.1 has no CUDA cast from fp8 under the name it asks for (see `fp8::transposed`).
    let widen = |t: &Tensor| match t.dtype() {
        DType::F8E4M3 => t.to_device(&Device::Cpu)?.to_dtype(DType::BF16),
        _ => Ok(t.clone()),
    };
    let (a, b) = (&widen(a)?, &widen(b)?);
    let input_roundoff = precision.input_roundoff();
    let (n, k) = a.dims2()?;
    let m = b.dims2()?.1;
    let rows = sampled(n, samples);
    let cols = sampled(m, samples);
    let on = |t: &[u32], of: &Tensor| Tensor::new(t, of.device());
    let a_rows: Vec<Vec<f32>> = a.index_select(&on(&rows, a)?, 0)?.to_dtype(DType::F32)?.to_vec2()?;
    let b_cols: Vec<Vec<f32>> = b.index_select(&on(&cols, b)?, 1)?.to_dtype(DType::F32)?.t()?.to_vec2()?;
    let c_grid: Vec<Vec<f32>> =
        c.index_select(&on(&rows, c)?, 0)?.index_select(&on(&cols, c)?, 1)?.to_dtype(DType::F32)?.to_vec2()?;
    let u_out = unit_roundoff(c.dtype());
    let accumulation = 16.0 * precision.accumulation_roundoff() * (k as f64).sqrt();
    let mut worst = (0.0f64, (0usize, 0usize));
    let (mut sum, mut allowed_sum) = (0.0, 0.0);
    for (ri, row) in a_rows.iter().enumerate() {
        for (ci, col) in b_cols.iter().enumerate() {
            let (mut reference, mut squares, mut absolute) = (0.0f64, 0.0f64, 0.0f64);
            for (x, y) in row.iter().zip(col) {
                let p = f64::from(*x) * f64::from(*y);
                reference += p;
                squares += p * p;
                absolute += p.abs();
            }
            let got = f64::from(c_grid[ri][ci]);
            sum += got;
            let allowed = u_out * reference.abs()
                + accumulation * squares.sqrt()
                + 2.0 * input_roundoff * absolute
                + f64::MIN_POSITIVE;
            allowed_sum += allowed;
            let ratio = if got.is_finite() { (got - reference).abs() / allowed } else { f64::INFINITY };
            if ratio > worst.0 || ratio.is_nan() {
                worst = (ratio, (rows[ri] as usize, cols[ci] as usize));
            }
        }
    }
    Ok(Check {
        values: rows.len() * cols.len(),
        worst_ratio: worst.0,
        worst_at: worst.1,
        ok: worst.0 <= 1.0,
        sampled_sum: sum,
        allowed_sum,
    })
}

/// What `kiln-gpu burn` does: products back to back on one device for `seconds`.
#[derive(Debug, Clone)]
pub struct BurnOptions {
    pub device: usize,
    pub dtype: Precision,
    pub shape: Shape,
    pub seconds: f64,
    pub samples: usize,
}

/// One second (or so) of a burn.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Interval {
    /// When it ended, seconds since the burn began.
    pub at_s: f64,
    pub products: u64,
    pub tflops: f64,
    /// The interval's last product passed the check against the f64 reference.
    pub ok: bool,
}

/// `kiln-gpu burn`'s document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Burn {
    pub device: usize,
    pub name: Option<String>,
    pub dtype: String,
    pub shape: Shape,
    pub seconds: f64,
    pub products: u64,
    pub intervals: Vec<Interval>,
    /// Intervals whose product failed the check, and when the first did.
    pub failed_checks: u64,
    pub first_failure_s: Option<f64>,
    /// The worst check of the burn (the first failing one, else the worst passing one).
    pub worst: Check,
}

/// Multiplies the same inputs back to back for `o.seconds`, each product to the device's
/// completion; about every second the rate of the products since the last and a check of the
/// latest against the f64 reference: a GPU that miscomputes when hot, or slows down, shows when.
///
/// # Errors
/// The device fails an operation (out of memory, a lost device).
pub fn burn(device: &Device, o: &BurnOptions, name: Option<String>) -> anyhow::Result<Burn> {
    let Shape { m, n, k } = o.shape;
    let a = input(m, k, 1, o.dtype.storage())?.to_device(device)?;
    let b = input(k, n, 2, o.dtype.storage())?.to_device(device)?;
    let samples = o.samples.min(m).min(n);
    o.dtype.select();
    let operands = Operands::new(&a, &b, o.dtype)?;
    let started = Instant::now();
    let (mut products, mut since) = (0u64, 0u64);
    let mut last = 0.0;
    let mut intervals = Vec::new();
    let (mut failed_checks, mut first_failure_s, mut worst): (u64, Option<f64>, Option<Check>) = (0, None, None);
    loop {
        let c = operands.product()?;
        device.synchronize()?;
        products += 1;
        since += 1;
        let now = started.elapsed().as_secs_f64();
        let done = now >= o.seconds;
        if now - last >= 1.0 || done {
            let check = check(&a, &b, &c, samples, o.dtype)?;
            let at_s = started.elapsed().as_secs_f64();
            intervals.push(Interval {
                at_s,
                products: since,
                tflops: o.shape.flops() * since as f64 / (now - last) / 1e12,
                ok: check.ok,
            });
            if !check.ok {
                failed_checks += 1;
                first_failure_s.get_or_insert(at_s);
            }
            let keep = match &worst {
                None => true,
                Some(w) if w.ok => !check.ok || check.worst_ratio > w.worst_ratio,
                Some(_) => false,
            };
            if keep {
                worst = Some(check);
            }
            (last, since) = (started.elapsed().as_secs_f64(), 0);
        }
        if done {
            break;
        }
    }
    Ok(Burn {
        device: o.device,
        name,
        dtype: o.dtype.name().to_string(),
        shape: o.shape,
        seconds: started.elapsed().as_secs_f64(),
        products,
        intervals,
        failed_checks,
        first_failure_s,
        worst: worst.expect("a burn checks at least once"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(dtype: Precision, n: usize) -> Options {
        Options { device: 0, dtype, shape: Shape::square(n), reps: 3, samples: 8 }
    }

    /// On the CPU: every type's product passes its check, every repetition is timed.
    #[test]
    fn a_right_product_passes_its_check_in_every_type() {
        for dtype in [Precision::Bf16, Precision::F16, Precision::F32, Precision::Tf32, Precision::Fp8] {
            let r = measure(&Device::Cpu, &options(dtype, 96), None).unwrap();
            assert!(r.check.ok, "{dtype:?}: {:?}", r.check);
            assert_eq!((r.seconds.len(), r.check.values), (3, 64));
            assert!(r.tflops_best >= r.tflops_median && r.tflops_median > 0.0);
        }
    }

    /// A product off by 1 % (a miscomputing device), or by one wrong value at a sampled place, fails.
    #[test]
    fn a_wrong_product_fails_its_check() {
        for precision in [Precision::Bf16, Precision::F32] {
            let dtype = precision.storage();
            let a = input(64, 64, 1, dtype).unwrap();
            let b = input(64, 64, 2, dtype).unwrap();
            let c = a.matmul(&b).unwrap();
            assert!(check(&a, &b, &c, 8, precision).unwrap().ok);
            let scaled = (c.to_dtype(DType::F32).unwrap() * 1.01).unwrap().to_dtype(dtype).unwrap();
            assert!(!check(&a, &b, &scaled, 8, precision).unwrap().ok, "{dtype:?}: 1 % off passed");
            // One value (row 9, column 18: both sampled) replaced.
            let mut values = c.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
            values[9][18] += 0.5;
            let flipped = Tensor::new(values, &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
            let found = check(&a, &b, &flipped, 8, precision).unwrap();
            assert!(!found.ok && found.worst_at == (9, 18), "{dtype:?}: {found:?}");
        }
        // fp8's allowance is wider (its running sums are coarser), but a product 10 % off, or one
        // value off by 0.5, still fails.
        let a = input(64, 64, 1, DType::F8E4M3).unwrap();
        let b = input(64, 64, 2, DType::F8E4M3).unwrap();
        let c = crate::fp8::Fp8Product::new().product(&a, &crate::fp8::transposed(&b).unwrap()).unwrap();
        assert!(check(&a, &b, &c, 8, Precision::Fp8).unwrap().ok);
        let scaled = (c.to_dtype(DType::F32).unwrap() * 1.1).unwrap().to_dtype(DType::BF16).unwrap();
        assert!(!check(&a, &b, &scaled, 8, Precision::Fp8).unwrap().ok, "fp8: 10 % off passed");
        let mut values = c.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
        values[9][18] += 0.5;
        let flipped = Tensor::new(values, &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap();
        let found = check(&a, &b, &flipped, 8, Precision::Fp8).unwrap();
        assert!(!found.ok && found.worst_at == (9, 18), "fp8: {found:?}");
    }

    /// A rectangular product and a sweep of shapes, on the CPU: every product checked, the best
    /// one named.
    #[test]
    fn rectangular_products_and_a_sweep_are_measured_and_checked() {
        let o =
            Options { device: 0, dtype: Precision::Bf16, shape: Shape { m: 48, n: 80, k: 112 }, reps: 2, samples: 8 };
        let r = measure(&Device::Cpu, &o, None).unwrap();
        assert!(r.check.ok, "{:?}", r.check);
        assert_eq!((r.shape, r.flops_per_rep), (o.shape, 2.0 * 48.0 * 80.0 * 112.0));
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let so = crate::request::checked::<crate::request::SweepArgs>(&args(
            "--dtype f32 --shapes 32,64x96x48,128 --reps 2 --samples 40",
        ))
        .unwrap();
        let sweep = sweep(&Device::Cpu, &so, None).unwrap();
        assert_eq!(sweep.results.len(), 3);
        assert!(sweep.results.iter().all(|r| r.check.ok && r.check.values <= 40 * 40));
        assert_eq!(sweep.results[0].check.values, 32 * 32, "samples capped by the shape");
        let best = sweep.best.unwrap();
        let top = sweep.results.iter().map(|r| r.tflops_median).fold(0.0, f64::max);
        assert_eq!(sweep.results[best].tflops_median, top);
        assert_eq!(crate::request::checked::<crate::request::SweepArgs>(&[]).unwrap().shapes.len(), 12);
    }

    /// A short burn on the CPU: products counted, an interval about every second, each checked.
    #[test]
    fn a_burn_counts_products_and_checks_each_interval() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let o =
            crate::request::checked::<crate::request::BurnArgs>(&args("--dtype bf16 --n 64 --seconds 2.2 --samples 8"))
                .unwrap();
        let burn = burn(&Device::Cpu, &o, None).unwrap();
        assert!(burn.seconds >= 2.2 && burn.products > 10, "{burn:?}");
        assert!((2..=4).contains(&burn.intervals.len()), "{:?}", burn.intervals);
        assert_eq!(burn.intervals.iter().map(|i| i.products).sum::<u64>(), burn.products);
        assert!(burn.intervals.iter().all(|i| i.ok && i.tflops > 0.0));
        assert_eq!((burn.failed_checks, burn.first_failure_s), (0, None));
        assert!(burn.worst.ok);
        assert!(crate::request::checked::<crate::request::BurnArgs>(&args("--seconds 0")).is_err());
        assert!(crate::request::checked::<crate::request::BurnArgs>(&args("--seconds x")).is_err());
    }

    #[test]
    fn options_are_checked() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let o = crate::request::checked::<crate::request::GemmArgs>(&args("--dtype f16 --n 4096 --reps 5 --device 3"))
            .unwrap();
        assert_eq!((o.dtype, o.shape, o.reps, o.device), (Precision::F16, Shape::square(4096), 5, 3));
        assert_eq!(
            crate::request::checked::<crate::request::GemmArgs>(&args("--dtype tf32")).unwrap().dtype.storage(),
            DType::F32
        );
        let o = crate::request::checked::<crate::request::GemmArgs>(&args("--shape 256x512x128")).unwrap();
        assert_eq!(o.shape, Shape { m: 256, n: 512, k: 128 });
        assert_eq!(o.shape.flops(), 2.0 * 256.0 * 512.0 * 128.0);
        assert!(crate::request::checked::<crate::request::GemmArgs>(&args("--shape 256x512")).is_err());
        assert!(crate::request::checked::<crate::request::GemmArgs>(&args("--shape 32x32x32 --samples 33")).is_err());
        assert_eq!(
            crate::request::checked::<crate::request::GemmArgs>(&args("--dtype fp8")).unwrap().dtype.storage(),
            DType::F8E4M3
        );
        assert!(crate::request::checked::<crate::request::GemmArgs>(&args("--dtype fp4")).is_err());
        assert!(crate::request::checked::<crate::request::GemmArgs>(&args("--n 8")).is_err());
        assert!(crate::request::checked::<crate::request::GemmArgs>(&args("--reps")).is_err());
    }
}
