//! Fused CPU kernels for the training benchmark, as candle custom ops with real backward passes.
//!
//! Composed from candle's elementary ops, one transformer step is ~150 ops over fresh buffers,
//! many of them reductions over leading dimensions that candle walks element by element with a
//! division per element. Each kernel here does in one pass over rows what took several ops:
//!
//! - [`add_bias`]: `x + bias` broadcast over rows; backward sums the rows in vector lanes;
//! - [`bias_gelu`]: `gelu_tanh(x + bias)` (tanh approximation, as `gelu(x, approximate="tanh")`);
//! - [`layer_norm`]: LayerNorm over the last dimension with weight and bias;
//! - [`attention`]: causal multi-head self-attention straight from the fused QKV projection;
//! - [`residual`]: `x + y + bias`, a residual connection with its layer's bias;
//! - [`library_matmul`]: a dense layer's product through OpenBLAS or oneDNN where installed;
//! - [`cross_entropy`]: mean negative log-likelihood of targets under softmax(logits);
//! - [`AdamW`]: decoupled weight decay, bias-corrected moments and global-norm clipping, in place.
//!
//! Every backward pass is written out by hand; `train::tests` checks each kernel's values and
//! gradients against the composed candle ops, and that every parameter receives a gradient.
//! Rows are spread over the rayon pool that candle's matmul uses. The elementwise maths (`exp`,
//! sigmoid) is branch-free so it vectorises; x86-64 with AVX2 and FMA gets an 8-lane build.

use std::cell::RefCell;

use candle_core::backend::BackendStorage;
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Device, InplaceOp2, Layout, Result, Shape, Storage,
    Tensor, Var,
};
use rayon::prelude::*;

/// Elements per rayon task: enough work that a task costs more than handing it out.
const GRAIN: usize = 1 << 14;

fn rows_per_task(cols: usize) -> usize {
    (GRAIN / cols.max(1)).max(1)
}

/// A new `len`-element buffer filled in parallel, whole rows of `cols` at a time:
/// `fill(start, out)` writes `out`, the buffer's elements from `start` on.
fn fill_rows(len: usize, cols: usize, fill: impl Fn(usize, &mut [f32]) + Sync) -> Vec<f32> {
    let chunk = rows_per_task(cols) * cols;
    let mut out = vec![0f32; len];
    out.par_chunks_mut(chunk).enumerate().for_each(|(i, o)| fill(i * chunk, o));
    out
}

fn cpu_f32<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(values) = storage else {
        bail!("{op}: the fused CPU kernels take f32 tensors, not {:?}", storage.dtype())
    };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&values[start..end]),
        None => bail!("{op}: expects a contiguous tensor"),
    }
}

fn tensor_f32<'a>(storage: &'a Storage, layout: &Layout, op: &str) -> Result<&'a [f32]> {
    match storage {
        Storage::Cpu(cpu) => cpu_f32(cpu, layout, op),
        _ => bail!("{op}: the fused kernels run on the CPU only"),
    }
}

/// Runs `f` with the f32 values of `t` (made contiguous first when it is not).
fn with_values<R>(t: &Tensor, op: &str, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    f(tensor_f32(&storage, layout, op)?)
}

fn cpu_tensor(values: Vec<f32>, shape: &Shape) -> Result<Tensor> {
    Tensor::from_vec(values, shape.clone(), &Device::Cpu)
}

/// Compiles `$body` twice: for the target's baseline and, on x86-64, with AVX2 and FMA enabled
/// (chosen at run time), so that the loops vectorise 8 lanes wide where the CPU allows.
macro_rules! multiversion {
    (fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? $body:block) => {
        fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU has just been found to support AVX2 and FMA.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

/// e^x for x in [-86, 86] (clamped outside), relative error under 2e-7: Cephes' expf without
/// branches, so that loops over it vectorise. ln 2 is split in two for the range reduction.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(-86.0, 86.0);
    // Round to nearest by the 1.5·2^23 trick (|x·log2 e| < 2^22).
    let n = (x * std::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Sum of a slice in eight independent lanes (a strict left-to-right sum does not vectorise).
#[inline(always)]
fn sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for i in 0..8 {
            acc[i] += c[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let tail: f32 = xc.remainder().iter().zip(yc.remainder()).map(|(a, b)| a * b).sum();
    for (a, b) in xc.zip(yc) {
        for i in 0..8 {
            acc[i] += a[i] * b[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder().iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    for c in chunks {
        for i in 0..8 {
            acc[i] = acc[i].max(c[i]);
        }
    }
    acc.iter().fold(tail, |m, &v| m.max(v))
}

/// Column sums of a row-major `(rows, cols)` matrix: the gradient of a bias broadcast over rows.
fn column_sums(x: &[f32], cols: usize) -> Vec<f32> {
    multiversion! {
        fn accumulate(rows: &[f32], cols: usize, acc: &mut [f32]) {
            for row in rows.chunks_exact(cols) {
                for (a, v) in acc.iter_mut().zip(row) {
                    *a += v;
                }
            }
        }
    }
    x.par_chunks(rows_per_task(cols) * cols)
        .fold(
            || vec![0f32; cols],
            |mut acc, rows| {
                accumulate(rows, cols, &mut acc);
                acc
            },
        )
        .reduce(
            || vec![0f32; cols],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                a
            },
        )
}

fn bias_of<'a>(x: &Layout, bias: &'a [f32], op: &str) -> Result<&'a [f32]> {
    let n = bias.len();
    if n == 0 || !x.shape().elem_count().is_multiple_of(n) {
        bail!("{op}: a bias of {n} values does not repeat over a tensor of shape {:?}", x.shape())
    }
    Ok(bias)
}

/// `x + bias`, the bias (of any shape) repeated over `x`'s elements in order: a `(d)` bias over
/// `(…, d)` rows, or a `(t, d)` position table over `(b, t, d)`.
struct AddBias;

impl CustomOp2 for AddBias {
    fn name(&self) -> &'static str {
        "kiln-add-bias"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = cpu_f32(s1, l1, self.name())?;
        let bias = bias_of(l1, cpu_f32(s2, l2, self.name())?, self.name())?;
        multiversion! {
            fn add(x: &[f32], bias: &[f32], out: &mut [f32]) {
                for (o, xs) in out.chunks_exact_mut(bias.len()).zip(x.chunks_exact(bias.len())) {
                    for ((o, x), b) in o.iter_mut().zip(xs).zip(bias) {
                        *o = x + b;
                    }
                }
            }
        }
        let out = fill_rows(x.len(), bias.len(), |start, o| add(&x[start..start + o.len()], bias, o));
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        bias: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let db = with_values(grad, self.name(), |g| Ok(column_sums(g, bias.elem_count())))?;
        Ok((Some(grad.clone()), Some(cpu_tensor(db, bias.shape())?)))
    }
}

/// `x + bias`, the bias repeated over `x` (see [`AddBias`]).
///
/// # Errors
/// When the bias does not tile `x`, or either is not f32 on the CPU.
pub fn add_bias(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op2(&bias.contiguous()?, AddBias)
}

/// `x · w` through a maintained BLAS library (`blas::for_training`): `x` is `(…, k)`, `w` is
/// `(k, n)`, both contiguous f32; backward is two more products, `dx = dy · wᵀ` and
/// `dw = xᵀ · dy`, through the same library.
struct LibraryMatmul(&'static crate::blas::Library);

impl LibraryMatmul {
    fn dims(&self, x: &Shape, w: &Shape) -> Result<(usize, usize, usize)> {
        let (k, n) = w.dims2()?;
        let dims = x.dims();
        if dims.last() != Some(&k) {
            bail!("{}: x of shape {x:?} does not match weights of shape {w:?}", self.name())
        }
        Ok((x.elem_count() / k.max(1), n, k))
    }
}

impl CustomOp2 for LibraryMatmul {
    fn name(&self) -> &'static str {
        "kiln-library-matmul"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (m, n, k) = self.dims(l1.shape(), l2.shape())?;
        let (x, w) = (cpu_f32(s1, l1, self.name())?, cpu_f32(s2, l2, self.name())?);
        let mut out = vec![0f32; m * n];
        self.0.sgemm(m, n, k, x, w, &mut out).map_err(candle_core::Error::msg)?;
        let mut dims = l1.shape().dims().to_vec();
        *dims.last_mut().expect("checked in dims") = n;
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (m, n, k) = self.dims(x.shape(), w.shape())?;
        let lib = self.0;
        let dx = with_values(grad, self.name(), |dy| {
            with_values(w, self.name(), |w| {
                let mut dx = vec![0f32; m * k];
                lib.sgemm_t(false, true, m, k, n, dy, w, &mut dx).map_err(candle_core::Error::msg)?;
                Ok(dx)
            })
        })?;
        let dw = with_values(x, self.name(), |x| {
            with_values(grad, self.name(), |dy| {
                let mut dw = vec![0f32; k * n];
                lib.sgemm_t(true, false, k, n, m, x, dy, &mut dw).map_err(candle_core::Error::msg)?;
                Ok(dw)
            })
        })?;
        Ok((Some(cpu_tensor(dx, x.shape())?), Some(cpu_tensor(dw, w.shape())?)))
    }
}

/// `x · w` through `lib` (see [`LibraryMatmul`]).
///
/// # Errors
/// Shapes that do not multiply, or tensors that are not f32 on the CPU.
pub fn library_matmul(x: &Tensor, w: &Tensor, lib: &'static crate::blas::Library) -> Result<Tensor> {
    x.contiguous()?.apply_op2(&w.contiguous()?, LibraryMatmul(lib))
}

const GELU_C: f32 = 0.797_884_6; // sqrt(2 / pi)
const GELU_A: f32 = 0.044_715;

/// `gelu_tanh(x + bias)`. gelu_tanh(u) = u/2 · (1 + tanh(c(u + a u³))) = u · σ(2c(u + a u³)).
struct BiasGelu;

impl CustomOp2 for BiasGelu {
    fn name(&self) -> &'static str {
        "kiln-bias-gelu"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = cpu_f32(s1, l1, self.name())?;
        let bias = bias_of(l1, cpu_f32(s2, l2, self.name())?, self.name())?;
        multiversion! {
            fn gelu(x: &[f32], bias: &[f32], out: &mut [f32]) {
                for (o, xs) in out.chunks_exact_mut(bias.len()).zip(x.chunks_exact(bias.len())) {
                    for ((o, x), b) in o.iter_mut().zip(xs).zip(bias) {
                        let u = x + b;
                        let z = 2.0 * GELU_C * (u + GELU_A * u * u * u);
                        *o = u / (1.0 + exp(-z));
                    }
                }
            }
        }
        let out = fill_rows(x.len(), bias.len(), |start, o| gelu(&x[start..start + o.len()], bias, o));
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, bias: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        multiversion! {
            fn backward(x: &[f32], bias: &[f32], grad: &[f32], out: &mut [f32]) {
                let n = bias.len();
                for ((o, xs), gs) in out.chunks_exact_mut(n).zip(x.chunks_exact(n)).zip(grad.chunks_exact(n)) {
                    for (((o, x), b), g) in o.iter_mut().zip(xs).zip(bias).zip(gs) {
                        let u = x + b;
                        let z = 2.0 * GELU_C * (u + GELU_A * u * u * u);
                        let dz = 2.0 * GELU_C * (1.0 + 3.0 * GELU_A * u * u);
                        let s = 1.0 / (1.0 + exp(-z));
                        *o = g * (s + u * s * (1.0 - s) * dz);
                    }
                }
            }
        }
        let n = bias.elem_count();
        let dx = with_values(x, self.name(), |x| {
            with_values(bias, self.name(), |b| {
                with_values(grad, self.name(), |g| {
                    Ok(fill_rows(x.len(), n, |start, o| {
                        let rows = start..start + o.len();
                        backward(&x[rows.clone()], b, &g[rows], o)
                    }))
                })
            })
        })?;
        let db = column_sums(&dx, n);
        Ok((Some(cpu_tensor(dx, x.shape())?), Some(cpu_tensor(db, bias.shape())?)))
    }
}

/// `gelu_tanh(x + bias)`, the bias repeated over `x`'s rows.
///
/// # Errors
/// When the bias does not tile `x`, or either is not f32 on the CPU.
pub fn bias_gelu(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op2(&bias.contiguous()?, BiasGelu)
}

/// LayerNorm over the last dimension: `(x - mean) / sqrt(var + eps) · weight + bias`.
struct LayerNorm {
    eps: f32,
}

/// Mean and 1/sqrt(var + eps) of one row (two passes: the one-pass formula cancels badly).
#[inline(always)]
fn moments(row: &[f32], eps: f32) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = sum(row) / n;
    let mut acc = [0f32; 8];
    let chunks = row.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().map(|v| (v - mean) * (v - mean)).sum();
    for c in chunks {
        for i in 0..8 {
            acc[i] += (c[i] - mean) * (c[i] - mean);
        }
    }
    let var = (acc.iter().sum::<f32>() + tail) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "kiln-layer-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, w, b) = (cpu_f32(s1, l1, self.name())?, cpu_f32(s2, l2, self.name())?, cpu_f32(s3, l3, self.name())?);
        let n = *l1.dims().last().unwrap_or(&0);
        if n == 0 || w.len() != n || b.len() != n {
            bail!(
                "{}: weight ({}) and bias ({}) must match the last dimension of {:?}",
                self.name(),
                w.len(),
                b.len(),
                l1.shape()
            )
        }
        multiversion! {
            fn norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
                let n = w.len();
                for (o, row) in out.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
                    let (mean, rstd) = moments(row, eps);
                    for (((o, x), w), b) in o.iter_mut().zip(row).zip(w).zip(b) {
                        *o = (x - mean) * rstd * w + b;
                    }
                }
            }
        }
        let out = fill_rows(x.len(), n, |start, o| norm(&x[start..start + o.len()], w, b, self.eps, o));
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    #[allow(clippy::type_complexity)]
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        multiversion! {
            // dx = rstd · (g - mean(g) - x̂ · mean(g · x̂)) with g = dy · w; dw += dy · x̂; db += dy.
            fn backward(x: &[f32], w: &[f32], dy: &[f32], eps: f32, dx: &mut [f32], dw: &mut [f32], db: &mut [f32]) {
                let n = w.len();
                let mut xhat = vec![0f32; n];
                let mut g = vec![0f32; n];
                for ((row, dyr), dxr) in x.chunks_exact(n).zip(dy.chunks_exact(n)).zip(dx.chunks_exact_mut(n)) {
                    let (mean, rstd) = moments(row, eps);
                    for i in 0..n {
                        xhat[i] = (row[i] - mean) * rstd;
                        g[i] = dyr[i] * w[i];
                        dw[i] += dyr[i] * xhat[i];
                        db[i] += dyr[i];
                    }
                    let mean_g = sum(&g) / n as f32;
                    let mean_gx = dot(&g, &xhat) / n as f32;
                    for i in 0..n {
                        dxr[i] = rstd * (g[i] - mean_g - xhat[i] * mean_gx);
                    }
                }
            }
        }
        let n = w.elem_count();
        let eps = self.eps;
        let (dx, dw, db) = with_values(x, self.name(), |x| {
            with_values(w, self.name(), |w| {
                with_values(grad, self.name(), |dy| {
                    let mut dx = vec![0f32; x.len()];
                    let chunk = rows_per_task(n) * n;
                    let (dw, db) = dx
                        .par_chunks_mut(chunk)
                        .zip(x.par_chunks(chunk))
                        .zip(dy.par_chunks(chunk))
                        .fold(
                            || (vec![0f32; n], vec![0f32; n]),
                            |(mut dw, mut db), ((dx, x), dy)| {
                                backward(x, w, dy, eps, dx, &mut dw, &mut db);
                                (dw, db)
                            },
                        )
                        .reduce(
                            || (vec![0f32; n], vec![0f32; n]),
                            |(mut a, mut b), (c, d)| {
                                a.iter_mut().zip(&c).for_each(|(x, y)| *x += y);
                                b.iter_mut().zip(&d).for_each(|(x, y)| *x += y);
                                (a, b)
                            },
                        );
                    Ok((dx, dw, db))
                })
            })
        })?;
        Ok((Some(cpu_tensor(dx, x.shape())?), Some(cpu_tensor(dw, w.shape())?), Some(cpu_tensor(db, b.shape())?)))
    }
}

/// LayerNorm over the last dimension with `weight` and `bias`, eps 1e-5.
///
/// # Errors
/// When the weight or bias do not match the last dimension, or the tensors are not f32 on the CPU.
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op3(weight, bias, LayerNorm { eps: 1e-5 })
}

/// `dst = beta · lhs · rhs` for an `m × k` by `k × n` product of strided views, on this thread.
/// Rows and columns may have any strides, so heads are read in place from the fused QKV matrix.
struct Mat<'a> {
    data: &'a [f32],
    offset: usize,
    row_stride: usize,
    col_stride: usize,
}

impl Mat<'_> {
    /// Checks that an `rows × cols` view stays inside its slice.
    fn check(&self, rows: usize, cols: usize, len: usize) {
        let last = self.offset + (rows - 1) * self.row_stride + (cols - 1) * self.col_stride;
        assert!(last < len, "a {rows}×{cols} view at {} reaches {last}, past {len}", self.offset);
    }
}

fn mat(data: &[f32], offset: usize, row_stride: usize, col_stride: usize) -> Mat<'_> {
    Mat { data, offset, row_stride, col_stride }
}

/// The destination of [`gemm`]: a pointer shared by tasks that each write their own elements.
#[derive(Clone, Copy)]
struct Out {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: tasks write disjoint elements through `Out` (each head its own columns and rows), and
// the buffer outlives the parallel loop that uses it.
unsafe impl Send for Out {}
// SAFETY: as for Send: shared references only ever write disjoint elements.
unsafe impl Sync for Out {}

impl Out {
    fn new(buffer: &mut [f32]) -> Out {
        Out { ptr: buffer.as_mut_ptr(), len: buffer.len() }
    }

    /// The matrix whose element (i, j) is at `offset + i·row_stride + j`.
    fn at(self, offset: usize, row_stride: usize) -> Dst {
        Dst { out: self, offset, row_stride }
    }
}

struct Dst {
    out: Out,
    offset: usize,
    row_stride: usize,
}

/// `dst(i, j) = beta · Σ_k lhs(i, k) · rhs(k, j)` for an `m × n` result.
///
/// # Safety
/// No other thread may touch the `m × n` elements written here while this runs.
unsafe fn gemm(m: usize, n: usize, k: usize, dst: Dst, lhs: &Mat, rhs: &Mat, beta: f32) {
    lhs.check(m, k, lhs.data.len());
    rhs.check(k, n, rhs.data.len());
    mat(&[], dst.offset, dst.row_stride, 1).check(m, n, dst.out.len);
    // SAFETY: the checks above keep every element read and written inside its buffer; the caller
    // guarantees no other thread touches the elements written.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.out.ptr.add(dst.offset),
            1,
            dst.row_stride as isize,
            false,
            lhs.data.as_ptr().add(lhs.offset),
            lhs.col_stride as isize,
            lhs.row_stride as isize,
            rhs.data.as_ptr().add(rhs.offset),
            rhs.col_stride as isize,
            rhs.row_stride as isize,
            0.0,
            beta,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

multiversion! {
    // Causal softmax in place over the rows of a `t × t` matrix: row i keeps columns 0..=i.
    fn causal_softmax_rows(s: &mut [f32], t: usize) {
        for (i, row) in s.chunks_exact_mut(t).enumerate() {
            let (seen, future) = row.split_at_mut(i + 1);
            let m = max(seen);
            seen.iter_mut().for_each(|v| *v = exp(*v - m));
            let inv = 1.0 / sum(seen);
            seen.iter_mut().for_each(|v| *v *= inv);
            future.fill(0.0);
        }
    }
}

multiversion! {
    // The softmax's backward in place: dp ← scale · p ∘ (dp − Σ_j p_j dp_j) per row.
    fn softmax_backward_rows(p: &[f32], dp: &mut [f32], t: usize, scale: f32) {
        for (pr, dr) in p.chunks_exact(t).zip(dp.chunks_exact_mut(t)) {
            let s = dot(pr, dr);
            for (d, p) in dr.iter_mut().zip(pr) {
                *d = scale * p * (*d - s);
            }
        }
    }
}

/// Causal multi-head self-attention on the fused `(batch · seq, 3 · d)` QKV projection (Q, K
/// and V side by side, each split into heads of `d / heads` columns), giving `(batch · seq, d)`
/// with the heads side by side: `softmax(scale · Q Kᵀ + causal mask) · V` per sequence and head.
///
/// One node in the autograd graph instead of a dozen (splitting, transposing and copying the
/// heads, two batched matmuls, the masked softmax, merging the heads), each of whose gradients
/// candle would zero-fill and add. The backward pass recomputes the probabilities (as flash
/// attention does) rather than keep them. Sequences × heads are spread over the rayon pool,
/// each task running its small products on its own thread.
struct Attention {
    batch: usize,
    heads: usize,
    scale: f32,
}

impl Attention {
    /// (seq, d, head size) of a `(batch · seq, 3 · d)` QKV layout.
    fn dims(&self, layout: &Layout) -> Result<(usize, usize, usize)> {
        let &[rows, cols] = layout.dims() else {
            bail!("kiln-attention: expects (batch·seq, 3·d) QKV, got {:?}", layout.shape())
        };
        let d = cols / 3;
        if rows == 0 || d == 0 || cols % 3 != 0 || rows % self.batch != 0 || d % self.heads != 0 {
            bail!(
                "kiln-attention: a QKV of shape {:?} does not split into batch {} and {} heads",
                layout.shape(),
                self.batch,
                self.heads
            )
        }
        Ok((rows / self.batch, d, d / self.heads))
    }

    /// Writes the probabilities `P = softmax(scale · Q Kᵀ + mask)` of sequence `b`, head `h` into `p`.
    fn probabilities(&self, qkv: &[f32], (b, h): (usize, usize), (t, d, hd): (usize, usize, usize), p: &mut [f32]) {
        let base = b * t * 3 * d + h * hd;
        let q = mat(qkv, base, 3 * d, 1);
        let k_t = mat(qkv, base + d, 1, 3 * d);
        // SAFETY: `p` is this task's own scratch matrix.
        unsafe { gemm(t, t, hd, Out::new(p).at(0, t), &q, &k_t, self.scale) };
        causal_softmax_rows(p, t);
    }
}

impl CustomOp1 for Attention {
    fn name(&self) -> &'static str {
        "kiln-attention"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let qkv = cpu_f32(storage, layout, self.name())?;
        let (t, d, hd) = self.dims(layout)?;
        let mut y = vec![0f32; self.batch * t * d];
        let out = Out::new(&mut y);
        (0..self.batch * self.heads).into_par_iter().for_each_init(
            || vec![0f32; t * t],
            |p, task| {
                let (b, h) = (task / self.heads, task % self.heads);
                self.probabilities(qkv, (b, h), (t, d, hd), p);
                let v = mat(qkv, b * t * 3 * d + 2 * d + h * hd, 3 * d, 1);
                // SAFETY: this task alone writes rows b·t.., columns h·hd.. of y.
                unsafe { gemm(t, hd, t, out.at(b * t * d + h * hd, d), &mat(p, 0, t, 1), &v, 1.0) };
            },
        );
        Ok((CpuStorage::F32(y), Shape::from((self.batch * t, d))))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let (t, d, hd) = self.dims(arg.layout())?;
        let dqkv = with_values(arg, self.name(), |qkv| {
            with_values(grad, self.name(), |dy| {
                let mut dqkv = vec![0f32; qkv.len()];
                let out = Out::new(&mut dqkv);
                (0..self.batch * self.heads).into_par_iter().for_each_init(
                    || (vec![0f32; t * t], vec![0f32; t * t]),
                    |(p, dp), task| {
                        let (b, h) = (task / self.heads, task % self.heads);
                        let base = b * t * 3 * d + h * hd;
                        let (q, k) = (mat(qkv, base, 3 * d, 1), mat(qkv, base + d, 3 * d, 1));
                        let v_t = mat(qkv, base + 2 * d, 1, 3 * d);
                        let dy_bh = mat(dy, b * t * d + h * hd, d, 1);
                        self.probabilities(qkv, (b, h), (t, d, hd), p);
                        // SAFETY: `dp` is this task's scratch; the dQ, dK, dV blocks of sequence
                        // b, head h (rows b·t.., their own columns) are written by this task alone.
                        unsafe {
                            gemm(t, t, hd, Out::new(dp).at(0, t), &dy_bh, &v_t, 1.0); // dP = dY Vᵀ
                            softmax_backward_rows(p, dp, t, self.scale); // dS, scaled
                            let (ds, ds_t, p_t) = (mat(dp, 0, t, 1), mat(dp, 0, 1, t), mat(p, 0, 1, t));
                            gemm(t, hd, t, out.at(base, 3 * d), &ds, &k, 1.0); // dQ = dS K
                            gemm(t, hd, t, out.at(base + d, 3 * d), &ds_t, &q, 1.0); // dK = dSᵀ Q
                            gemm(t, hd, t, out.at(base + 2 * d, 3 * d), &p_t, &dy_bh, 1.0);
                            // dV = Pᵀ dY
                        }
                    },
                );
                Ok(dqkv)
            })
        })?;
        Ok(Some(cpu_tensor(dqkv, arg.shape())?))
    }
}

/// Causal multi-head self-attention of a fused `(batch · seq, 3 · d)` QKV projection, scores
/// scaled by `scale`; `(batch · seq, d)` with the heads side by side.
///
/// # Errors
/// When the QKV does not split into `batch` sequences and `heads` heads, or is not f32 on the CPU.
pub fn attention(qkv: &Tensor, batch: usize, heads: usize, scale: f64) -> Result<Tensor> {
    qkv.contiguous()?.apply_op1(Attention { batch, heads, scale: scale as f32 })
}

/// `x + y + bias`: a residual connection with the bias of the layer that produced `y`.
struct Residual;

impl CustomOp3 for Residual {
    fn name(&self) -> &'static str {
        "kiln-residual"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, y) = (cpu_f32(s1, l1, self.name())?, cpu_f32(s2, l2, self.name())?);
        let bias = bias_of(l1, cpu_f32(s3, l3, self.name())?, self.name())?;
        if l1.shape() != l2.shape() {
            bail!("{}: shapes {:?} and {:?} differ", self.name(), l1.shape(), l2.shape())
        }
        multiversion! {
            fn add(x: &[f32], y: &[f32], bias: &[f32], out: &mut [f32]) {
                let n = bias.len();
                for ((o, xs), ys) in out.chunks_exact_mut(n).zip(x.chunks_exact(n)).zip(y.chunks_exact(n)) {
                    for (((o, x), y), b) in o.iter_mut().zip(xs).zip(ys).zip(bias) {
                        *o = x + y + b;
                    }
                }
            }
        }
        let out = fill_rows(x.len(), bias.len(), |start, o| {
            let rows = start..start + o.len();
            add(&x[rows.clone()], &y[rows], bias, o)
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    #[allow(clippy::type_complexity)]
    fn bwd(
        &self,
        _x: &Tensor,
        _y: &Tensor,
        bias: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let db = with_values(grad, self.name(), |g| Ok(column_sums(g, bias.elem_count())))?;
        Ok((Some(grad.clone()), Some(grad.clone()), Some(cpu_tensor(db, bias.shape())?)))
    }
}

/// `x + y + bias`, the bias repeated over the rows.
///
/// # Errors
/// When `x` and `y` differ in shape, the bias does not tile them, or they are not f32 on the CPU.
pub fn residual(x: &Tensor, y: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op3(&y.contiguous()?, &bias.contiguous()?, Residual)
}

/// Mean cross-entropy of `(n, vocab)` logits against `(n)` u32 targets.
struct CrossEntropy;

/// log Σ exp over a row, and writes the row's softmax into `p` when given.
#[inline(always)]
fn log_sum_exp(row: &[f32], p: Option<&mut [f32]>) -> f32 {
    let m = max(row);
    match p {
        Some(p) => {
            for (p, x) in p.iter_mut().zip(row) {
                *p = exp(x - m);
            }
            let s = sum(p);
            p.iter_mut().for_each(|v| *v /= s);
            m + s.ln()
        }
        None => m + row.iter().map(|x| exp(x - m)).sum::<f32>().ln(),
    }
}

fn targets<'a>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [u32]> {
    let CpuStorage::U32(values) = storage else { bail!("kiln-cross-entropy: targets must be u32") };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&values[start..end]),
        None => bail!("kiln-cross-entropy: targets must be contiguous"),
    }
}

impl CustomOp2 for CrossEntropy {
    fn name(&self) -> &'static str {
        "kiln-cross-entropy"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = cpu_f32(s1, l1, self.name())?;
        let tgt = targets(s2, l2)?;
        let &[n, vocab] = l1.dims() else { bail!("{}: expects (n, vocab) logits, got {:?}", self.name(), l1.shape()) };
        if tgt.len() != n {
            bail!("{}: {} targets for {n} rows of logits", self.name(), tgt.len())
        }
        if let Some(bad) = tgt.iter().find(|&&t| t as usize >= vocab) {
            bail!("{}: target {bad} is outside the vocabulary of {vocab}", self.name())
        }
        multiversion! {
            fn nll(x: &[f32], tgt: &[u32], vocab: usize) -> f64 {
                x.chunks_exact(vocab).zip(tgt).map(|(row, &t)| f64::from(log_sum_exp(row, None) - row[t as usize])).sum()
            }
        }
        let rows = rows_per_task(vocab);
        let total: f64 = x.par_chunks(rows * vocab).zip(tgt.par_chunks(rows)).map(|(x, t)| nll(x, t, vocab)).sum();
        Ok((CpuStorage::F32(vec![(total / n as f64) as f32]), Shape::from(())))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        tgt: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        multiversion! {
            // d loss / d logits = (softmax - onehot(target)) · grad / n.
            fn backward(x: &[f32], tgt: &[u32], vocab: usize, scale: f32, dx: &mut [f32]) {
                for ((row, &t), d) in x.chunks_exact(vocab).zip(tgt).zip(dx.chunks_exact_mut(vocab)) {
                    log_sum_exp(row, Some(d));
                    d[t as usize] -= 1.0;
                    d.iter_mut().for_each(|v| *v *= scale);
                }
            }
        }
        let (n, vocab) = logits.dims2()?;
        let scale = grad.to_dtype(DType::F32)?.to_scalar::<f32>()? / n as f32;
        let tgt = tgt.to_vec1::<u32>()?;
        let dx = with_values(logits, self.name(), |x| {
            Ok(fill_rows(x.len(), vocab, |start, dx| {
                let end = start + dx.len();
                backward(&x[start..end], &tgt[start / vocab..end / vocab], vocab, scale, dx)
            }))
        })?;
        Ok((Some(cpu_tensor(dx, logits.shape())?), None))
    }
}

/// Mean cross-entropy of `(n, vocab)` logits against `(n)` u32 targets, a scalar.
///
/// # Errors
/// When the shapes disagree, a target is outside the vocabulary, or the logits are not f32 on the CPU.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    logits.contiguous()?.apply_op2(&targets.contiguous()?, CrossEntropy)
}

/// AdamW as candle-nn's (decoupled weight decay on every parameter, bias-corrected moments),
/// with global gradient-norm clipping folded in, updating each parameter in place in one pass
/// instead of a dozen tensor ops and fresh buffers per parameter.
pub struct AdamW {
    vars: Vec<Var>,
    moments: Vec<(Vec<f32>, Vec<f32>)>,
    step: i32,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

struct AdamStep<'a> {
    m: RefCell<&'a mut [f32]>,
    v: RefCell<&'a mut [f32]>,
    /// Multiplies the gradient (clipping).
    grad_scale: f32,
    lr: f32,
    decay: f32,
    beta1: f32,
    beta2: f32,
    /// 1 / (1 - beta^t)
    scale_m: f32,
    scale_v: f32,
    eps: f32,
}

impl InplaceOp2 for AdamStep<'_> {
    fn name(&self) -> &'static str {
        "kiln-adamw"
    }

    fn cpu_fwd(&self, s1: &mut CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<()> {
        let g = cpu_f32(s2, l2, self.name())?;
        let CpuStorage::F32(p) = s1 else { bail!("{}: parameters must be f32", self.name()) };
        let Some((start, end)) = l1.contiguous_offsets() else {
            bail!("{}: parameters must be contiguous", self.name())
        };
        let p = &mut p[start..end];
        let (mut m, mut v) = (self.m.borrow_mut(), self.v.borrow_mut());
        if p.len() != g.len() || m.len() != p.len() {
            bail!("{}: parameter of {} values, gradient of {}", self.name(), p.len(), g.len())
        }
        multiversion! {
            fn update(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: &AdamStep<'_>) {
                for (((p, g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                    let g = g * s.grad_scale;
                    *m = s.beta1 * *m + (1.0 - s.beta1) * g;
                    *v = s.beta2 * *v + (1.0 - s.beta2) * g * g;
                    let update = (*m * s.scale_m) / ((*v * s.scale_v).sqrt() + s.eps);
                    *p = *p * (1.0 - s.decay) - s.lr * update;
                }
            }
        }
        update(p, g, &mut m, &mut v, self);
        Ok(())
    }
}

impl AdamW {
    pub fn new(vars: Vec<Var>, lr: f64, beta1: f64, beta2: f64, eps: f64, weight_decay: f64) -> AdamW {
        let moments = vars.iter().map(|v| (vec![0f32; v.elem_count()], vec![0f32; v.elem_count()])).collect();
        AdamW { vars, moments, step: 0, lr, beta1, beta2, eps, weight_decay }
    }

    /// Clips the gradients to a global L2 norm of `max_norm`, then takes one AdamW step; returns
    /// the norm before clipping. A parameter without a gradient is left as it is.
    ///
    /// # Errors
    /// A gradient that is not f32 on the CPU or does not match its parameter.
    pub fn step(&mut self, grads: &candle_core::backprop::GradStore, max_norm: f64) -> Result<f64> {
        let grads: Vec<Option<Tensor>> = self
            .vars
            .iter()
            .map(|v| grads.get(v.as_tensor()).map(Tensor::contiguous).transpose())
            .collect::<Result<_>>()?;
        let squares: Vec<f64> = grads
            .par_iter()
            .map(|g| match g {
                Some(g) => with_values(g, "kiln-adamw", |g| Ok(f64::from(dot(g, g)))),
                None => Ok(0.0),
            })
            .collect::<Result<_>>()?;
        let norm = squares.iter().sum::<f64>().sqrt();
        let grad_scale = if norm > max_norm && norm.is_finite() { max_norm / norm } else { 1.0 };
        self.step += 1;
        let (lr, beta1, beta2, eps, decay) = (self.lr, self.beta1, self.beta2, self.eps, self.lr * self.weight_decay);
        let (scale_m, scale_v) = (1.0 / (1.0 - beta1.powi(self.step)), 1.0 / (1.0 - beta2.powi(self.step)));
        self.vars.par_iter().zip(self.moments.par_iter_mut()).zip(grads.par_iter()).try_for_each(
            |((var, (m, v)), g)| {
                let Some(g) = g else { return Ok(()) };
                let op = AdamStep {
                    m: RefCell::new(m),
                    v: RefCell::new(v),
                    grad_scale: grad_scale as f32,
                    lr: lr as f32,
                    decay: decay as f32,
                    beta1: beta1 as f32,
                    beta2: beta2 as f32,
                    scale_m: scale_m as f32,
                    scale_v: scale_v as f32,
                    eps: eps as f32,
                };
                var.as_tensor().inplace_op2(g, &op)
            },
        )?;
        Ok(norm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate_over_its_range() {
        let mut worst = 0f64;
        let mut x = -86.0f32;
        while x <= 86.0 {
            let (ours, exact) = (f64::from(exp(x)), f64::from(x).exp());
            worst = worst.max((ours - exact).abs() / exact);
            x += 0.001_7;
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert!(exp(-1000.0) > 0.0 && exp(-1000.0) < 1e-37 && exp(1000.0).is_finite());
    }

    #[test]
    fn attention_rows_see_only_the_past() {
        // Values that depend on the position only through the past: changing a later token's
        // Q, K and V must leave every earlier output unchanged.
        let (t, d) = (6, 8);
        let base: Vec<f32> = (0..t * 3 * d).map(|i| ((i * 37 % 11) as f32 - 5.0) / 4.0).collect();
        let mut changed = base.clone();
        changed[(t - 1) * 3 * d..].iter_mut().for_each(|v| *v += 3.0);
        let run = |v: Vec<f32>| {
            attention(&Tensor::from_vec(v, (t, 3 * d), &Device::Cpu).unwrap(), 1, 2, 0.5)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap()
        };
        let (a, b) = (run(base), run(changed));
        assert_eq!(a[..t - 1], b[..t - 1]);
        assert_ne!(a[t - 1], b[t - 1]);
        // The first position attends only to itself: its output is its own V.
        let first = attention(
            &Tensor::from_vec((0..3 * d).map(|i| i as f32).collect::<Vec<_>>(), (1, 3 * d), &Device::Cpu).unwrap(),
            1,
            2,
            1.0,
        )
        .unwrap();
        assert_eq!(first.to_vec2::<f32>().unwrap()[0], (2 * d..3 * d).map(|i| i as f32).collect::<Vec<_>>());
    }

    #[test]
    fn bad_inputs_are_refused_with_the_kernel_named() {
        let x = Tensor::zeros((4, 6), DType::F32, &Device::Cpu).unwrap();
        let err = add_bias(&x, &Tensor::zeros(5, DType::F32, &Device::Cpu).unwrap()).unwrap_err().to_string();
        assert!(err.contains("kiln-add-bias") && err.contains("does not repeat"), "{err}");
        let err = attention(&x, 3, 1, 1.0).unwrap_err().to_string();
        assert!(err.contains("does not split into batch 3"), "{err}");
        let err = residual(&x, &x.narrow(0, 0, 2).unwrap(), &Tensor::zeros(6, DType::F32, &Device::Cpu).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("differ"), "{err}");
        let tgt = Tensor::new(&[0u32, 1, 2, 9], &Device::Cpu).unwrap();
        let err = cross_entropy(&x, &tgt).unwrap_err().to_string();
        assert!(err.contains("target 9 is outside the vocabulary of 6"), "{err}");
        let err = layer_norm(
            &x,
            &Tensor::ones(5, DType::F32, &Device::Cpu).unwrap(),
            &Tensor::zeros(6, DType::F32, &Device::Cpu).unwrap(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("must match the last dimension"), "{err}");
        let err = add_bias(&x.to_dtype(DType::F64).unwrap(), &Tensor::zeros(6, DType::F64, &Device::Cpu).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("f32"), "{err}");
    }
}
