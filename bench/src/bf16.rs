//! kiln's own bf16 GEMM on AVX512-BF16: `vdpbf16ps` dot products of bf16 pairs into f32, so that
//! a bf16 product runs at the bf16 rate where no maintained library is installed (candle converts
//! bf16 to f32 and runs at the f32 rate or below: 0.3× oneDNN here).
//!
//! `C (m×n, f32) = A (m×k, bf16) · B (k×n, bf16)`, row-major. Both operands are packed with k in
//! pairs (the dot product's unit): B in panels of 32 columns, A in micro-panels of 12 rows, k in
//! blocks of 256 pairs so that a B panel block (32 KiB) stays in L2 and an A micro-panel (12 KiB)
//! in L1. The micro-kernel keeps a 12×32 f32 tile in 24 zmm registers; row blocks run in parallel
//! on rayon's pool. Edges (m, n, k not multiples of the blocks) are padded with zeros in the packed
//! copies and cut when the tile is written back.

/// Rows of the micro-kernel's tile.
const MR: usize = 12;
/// Columns of a B panel: two zmm of 16 f32 lanes.
const NR: usize = 32;
/// Pairs of k per block.
const KC: usize = 256;
/// B panels per group: 16 × 32 KiB, within a core's L2.
const NC_PANELS: usize = 16;

/// Whether this CPU runs the kernel (AVX512-BF16 on x86-64).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512bf16") && std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Two bf16 values as the 32-bit lane `vdpbf16ps` reads: `lo` first in memory.
fn pair(lo: u16, hi: u16) -> u32 {
    u32::from(lo) | (u32::from(hi) << 16)
}

/// B packed: for each k block, for each panel of 32 columns, `pairs × 32` lanes.
pub struct PackedB {
    k: usize,
    n: usize,
    panels: usize,
    data: Vec<u32>,
}

impl PackedB {
    /// Packs the `k×n` row-major bf16 matrix `b`.
    ///
    /// # Panics
    /// `b` shorter than `k × n`.
    pub fn new(k: usize, n: usize, b: &[u16]) -> PackedB {
        assert!(b.len() >= k * n, "B holds {} values, not {k}×{n}", b.len());
        let pairs = k.div_ceil(2);
        let panels = n.div_ceil(NR);
        let mut data = vec![0u32; pairs.div_ceil(KC) * KC * panels * NR];
        let at = |row: usize, col: usize| if row < k && col < n { b[row * n + col] } else { 0 };
        for kb in 0..pairs.div_ceil(KC) {
            for p in 0..panels {
                let base = (kb * panels + p) * KC * NR;
                for kk in 0..KC {
                    let row = 2 * (kb * KC + kk);
                    for j in 0..NR {
                        let col = p * NR + j;
                        data[base + kk * NR + j] = pair(at(row, col), at(row + 1, col));
                    }
                }
            }
        }
        PackedB { k, n, panels, data }
    }
}

/// A's rows `rows` packed for one k block: `KC` pairs × `MR` rows, pair-major.
fn pack_a(a: &[u16], k: usize, rows: std::ops::Range<usize>, kb: usize, out: &mut [u32; KC * MR]) {
    for kk in 0..KC {
        let col = 2 * (kb * KC + kk);
        for r in 0..MR {
            let row = rows.start + r;
            let at = |c: usize| if row < rows.end && c < k { a[row * k + c] } else { 0 };
            out[kk * MR + r] = pair(at(col), at(col + 1));
        }
    }
}

/// `c = a · b` for `a` `m×k` row-major bf16 and `b` packed; `c` `m×n` f32, overwritten.
///
/// For each k block, A's rows are packed once (in parallel), then the B panels are taken in groups
/// of `NC_PANELS` (512 KiB, within L2) and every row block runs over the group in parallel: a
/// group is read from L2 by every row block rather than all of B from L3 (at 4096³ that was
/// 0.66× oneDNN; with groups, see the benchmark).
///
/// # Panics
/// The kernel is not available on this CPU, or the slices are shorter than their shapes.
pub fn gemm(m: usize, a: &[u16], b: &PackedB, c: &mut [f32]) {
    use rayon::prelude::*;
    assert!(available(), "bf16::gemm needs AVX512-BF16");
    let (k, n) = (b.k, b.n);
    assert!(a.len() >= m * k && c.len() >= m * n, "A or C shorter than {m}×{k}, {m}×{n}");
    let blocks = b.k.div_ceil(2).div_ceil(KC);
    let row_blocks = m.div_ceil(MR);
    let mut packed: Vec<[u32; KC * MR]> = vec![[0u32; KC * MR]; row_blocks];
    for kb in 0..blocks {
        packed.par_iter_mut().enumerate().for_each(|(rb, out)| pack_a(a, k, rb * MR..(rb * MR + MR).min(m), kb, out));
        for group in (0..b.panels).step_by(NC_PANELS) {
            let panels = group..(group + NC_PANELS).min(b.panels);
            c[..m * n].par_chunks_mut(MR * n).zip(packed.par_iter()).for_each(|(c_rows, block)| {
                let rows = c_rows.len() / n;
                let mut tile = [0f32; MR * NR];
                for p in panels.clone() {
                    let cols = p * NR..(p * NR + NR).min(n);
                    if kb == 0 {
                        tile.fill(0.0);
                    } else {
                        for r in 0..rows {
                            tile[r * NR..r * NR + cols.len()]
                                .copy_from_slice(&c_rows[r * n + cols.start..r * n + cols.end]);
                        }
                    }
                    let panel = &b.data[(kb * b.panels + p) * KC * NR..][..KC * NR];
                    // SAFETY: available() was checked above; the kernel reads exactly KC × MR
                    // and KC × NR lanes of the fixed-size blocks it is given.
                    unsafe { micro_kernel(block, panel, &mut tile) };
                    for r in 0..rows {
                        c_rows[r * n + cols.start..r * n + cols.end]
                            .copy_from_slice(&tile[r * NR..r * NR + cols.len()]);
                    }
                }
            });
        }
    }
}

/// `tile += A-block · B-panel-block`: 12 rows × 32 columns in 24 accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512bf16,avx512f")]
unsafe fn micro_kernel(a: &[u32; KC * MR], b: &[u32], tile: &mut [f32; MR * NR]) {
    use std::arch::x86_64::*;
    assert!(b.len() >= KC * NR);
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for (r, row) in acc.iter_mut().enumerate() {
        // SAFETY: each row of the tile holds 32 f32, two unaligned 16-lane loads.
        unsafe {
            row[0] = _mm512_loadu_ps(tile.as_ptr().add(r * NR));
            row[1] = _mm512_loadu_ps(tile.as_ptr().add(r * NR + 16));
        }
    }
    for kk in 0..KC {
        // SAFETY: kk < KC, and the panel block holds KC × 32 lanes (asserted above).
        let (b0, b1) = unsafe {
            let p = b.as_ptr().add(kk * NR) as *const __m512i;
            (
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p)),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.add(1))),
            )
        };
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: both types are 512 bits of plain data.
            let x = unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(a[kk * MR + r] as i32)) };
            row[0] = _mm512_dpbf16_ps(row[0], x, b0);
            row[1] = _mm512_dpbf16_ps(row[1], x, b1);
        }
    }
    for (r, row) in acc.iter().enumerate() {
        // SAFETY: as the loads above.
        unsafe {
            _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR), row[0]);
            _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR + 16), row[1]);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn micro_kernel(_: &[u32; KC * MR], _: &[u32], _: &mut [f32; MR * NR]) {
    unreachable!("bf16::gemm checks available() first")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blas::{from_bf16, to_bf16};

    /// Against the plain triple loop on the same bf16 values (f32 sums), on shapes off every
    /// block edge: odd k, m not a multiple of 12, n not of 32, and k over one block.
    #[test]
    fn matches_the_reference_on_ragged_shapes() {
        if !available() {
            eprintln!("bf16::matches_the_reference_on_ragged_shapes: SKIPPED — the CPU has no AVX512-BF16");
            return;
        }
        for &(m, n, k) in &[(1, 1, 1), (13, 33, 7), (25, 70, 515), (12, 32, 512), (40, 17, 1030)] {
            let a: Vec<u16> = (0..m * k).map(|i| to_bf16(((i * 7919) % 17) as f32 / 8.0 - 1.0)).collect();
            let b: Vec<u16> = (0..k * n).map(|i| to_bf16(((i * 104_729) % 13) as f32 / 6.0 - 1.0)).collect();
            let (af, bf): (Vec<f32>, Vec<f32>) =
                (a.iter().map(|&v| from_bf16(v)).collect(), b.iter().map(|&v| from_bf16(v)).collect());
            let want = crate::blas::reference(m, n, k, &af, &bf);
            let mut got = vec![f32::NAN; m * n];
            gemm(m, &a, &PackedB::new(k, n, &b), &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 1e-3 * (1.0 + w.abs()), "{m}×{n}×{k} at {i}: {g} vs {w}");
            }
        }
    }
}
