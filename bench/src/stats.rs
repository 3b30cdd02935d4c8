//! Summary statistics over raw benchmark samples, after hyperfine and criterion: keep every sample,
//! report the median with a bootstrap confidence interval, and call a result unstable when that
//! interval is too wide for the median to be known ([`Summary::settled`]): the coefficient of
//! variation of heavy-tailed timings (a quiet guest's steps: min 8.0 ms, median 8.6, max 39)
//! condemns runs whose median is known to a fraction of a percent, so it is reported, not judged.

use serde::{Deserialize, Serialize};

/// `Default`: the summary of no samples (every figure 0).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub mean: f64,
    pub stddev: f64,
    pub min: f64,
    pub max: f64,
    /// Coefficient of variation: stddev / mean.
    pub cv: f64,
    /// 95 % bootstrap confidence interval of the median.
    pub median_ci: (f64, f64),
    /// Samples further than 3 scaled MADs from the median.
    pub outliers: usize,
}

/// The widest the median's 95 % bootstrap interval may reach from the median, on either side, as a
/// share of it, for the result to be settled: the median known to within ±2.5 %.
pub const MAX_MEDIAN_UNCERTAINTY: f64 = 0.025;

impl Summary {
    /// How far the median's 95 % interval reaches from the median, on its wider side, as a share
    /// of the median (0 for a constant sample; infinite for a zero median with any spread).
    pub fn median_uncertainty(&self) -> f64 {
        let reach = (self.median - self.median_ci.0).max(self.median_ci.1 - self.median);
        if reach <= 0.0 {
            0.0
        } else {
            reach / self.median.abs()
        }
    }

    /// Whether the median is known well enough to be a result: its interval within
    /// [`MAX_MEDIAN_UNCERTAINTY`] of it. A few wild samples among many do not move a median, so they
    /// do not unsettle it; a spread-out or two-valued sample, or a handful that disagree, does.
    pub fn settled(&self) -> bool {
        self.median_uncertainty() <= MAX_MEDIAN_UNCERTAINTY
    }
}

/// The median of a slice (sorted internally); `NaN` for an empty slice.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    median_sorted(&v)
}

/// The median by selection (linear time); reorders the slice.
pub fn median_in_place(v: &mut [f64]) -> f64 {
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    let (lower, mid, _) = v.select_nth_unstable_by(n / 2, f64::total_cmp);
    let mid = *mid;
    if n % 2 == 1 {
        mid
    } else {
        let below = lower.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (below + mid) / 2.0
    }
}

fn median_sorted(v: &[f64]) -> f64 {
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median absolute deviation, scaled by 1.4826 to estimate σ for normal data.
pub fn mad(values: &[f64]) -> f64 {
    let m = median(values);
    let deviations: Vec<f64> = values.iter().map(|v| (v - m).abs()).collect();
    1.4826 * median(&deviations)
}

/// SplitMix64: a small, seedable generator, so that intervals, corpora and random offsets are
/// reproducible.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The value at quantile `q` (0..=1) of an ascending slice, nearest rank; 0 for an empty slice.
pub fn percentile_sorted(sorted: &[f64], q: f64) -> f64 {
    sorted.get(((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1))).copied().unwrap_or(0.0)
}

/// Pins the calling thread to one CPU; a refusal (cpuset, container) leaves it floating.
pub fn pin_to_cpu(cpu: u32) -> bool {
    // SAFETY: cpu_set_t is plain data, and the call only affects the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Percentile bootstrap of the median: `resamples` resamplings with a fixed seed.
pub fn bootstrap_median_ci(values: &[f64], resamples: usize, seed: u64) -> (f64, f64) {
    if values.len() < 2 {
        let m = median(values);
        return (m, m);
    }
    let mut rng = seed;
    let mut medians = Vec::with_capacity(resamples);
    let mut buf = vec![0.0; values.len()];
    for _ in 0..resamples {
        for slot in buf.iter_mut() {
            *slot = values[(splitmix64(&mut rng) % values.len() as u64) as usize];
        }
        buf.sort_by(f64::total_cmp);
        medians.push(median_sorted(&buf));
    }
    medians.sort_by(f64::total_cmp);
    let at = |q: f64| medians[((q * (resamples - 1) as f64).round() as usize).min(resamples - 1)];
    (at(0.025), at(0.975))
}

/// Bootstrap interval of median(b) / median(a): both samples resampled with replacement,
/// `resamples` times; `level` is the two-sided coverage (0.95, 0.99). Reproducible for a seed.
pub fn bootstrap_ratio_ci(a: &[f64], b: &[f64], resamples: usize, seed: u64, level: f64) -> (f64, f64) {
    if a.is_empty() || b.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mut state = seed;
    let (mut ra, mut rb) = (vec![0.0; a.len()], vec![0.0; b.len()]);
    let mut ratios = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        for x in ra.iter_mut() {
            *x = a[(splitmix64(&mut state) % a.len() as u64) as usize];
        }
        for x in rb.iter_mut() {
            *x = b[(splitmix64(&mut state) % b.len() as u64) as usize];
        }
        ratios.push(median_in_place(&mut rb) / median_in_place(&mut ra));
    }
    ratios.sort_by(f64::total_cmp);
    let tail = (1.0 - level) / 2.0;
    let at = |q: f64| ratios[((q * (resamples - 1) as f64).round() as usize).min(resamples - 1)];
    (at(tail), at(1.0 - tail))
}

/// The Hodges–Lehmann estimate of the ratio `after / before` (the median of all pairwise ratios,
/// taken on the log scale) with its distribution-free Moses confidence interval from the
/// Mann–Whitney statistic's normal approximation; `z` is the two-sided critical value (2.576 for
/// 99 %). `None` unless every value is positive. Exact rank statistics in O(n₁n₂) (selection): for
/// nightly series far cheaper than resampling.
pub fn shift_ratio_ci(before: &[f64], after: &[f64], z: f64) -> Option<(f64, f64, f64)> {
    if before.is_empty()
        || after.is_empty()
        || before.iter().chain(after).any(|v| v.is_nan() || *v <= 0.0 || v.is_infinite())
    {
        return None;
    }
    let lb: Vec<f64> = before.iter().map(|v| v.ln()).collect();
    let mut d = Vec::with_capacity(before.len() * after.len());
    for a in after {
        let la = a.ln();
        d.extend(lb.iter().map(|b| la - b));
    }
    let (n1, n2) = (before.len() as f64, after.len() as f64);
    let len = d.len();
    let cut = (n1 * n2 / 2.0 - z * (n1 * n2 * (n1 + n2 + 1.0) / 12.0).sqrt()).floor().max(0.0) as usize;
    let cut = cut.min((len - 1) / 2);
    // Three order statistics of the differences (the median, the `cut`-th from each end), found by
    // selection in O(n₁n₂) rather than a sort: `cut` ≤ the median's index ≤ `len - 1 - cut`.
    let m = len / 2;
    let (lower, &mut mid, upper) = d.select_nth_unstable_by(m, f64::total_cmp);
    let median = if len % 2 == 1 { mid } else { (lower.iter().copied().fold(f64::NEG_INFINITY, f64::max) + mid) / 2.0 };
    let lo = if cut == m { mid } else { *lower.select_nth_unstable_by(cut, f64::total_cmp).1 };
    let hi = match len - 1 - cut - m {
        0 => mid,
        above => *upper.select_nth_unstable_by(above - 1, f64::total_cmp).1,
    };
    Some((median.exp(), lo.exp(), hi.exp()))
}

/// Whether [`shift_ratio_ci`]'s interval certainly reaches down to `lower_at_most` and up to
/// `upper_at_least` (both positive; with `upper_at_least <= lower_at_most`, it overlaps that band), decided
/// without building and sorting the n₁n₂ pairwise ratios: the interval's ends are order statistics
/// of those ratios, and how many ratios lie at or below `lo` (at or above `hi`) is counted in
/// O(n log n) by walking the two sorted samples. Where this says `true`, the interval's lower end
/// is at most `lower_at_most` and its upper end at least `upper_at_least`; `false` means "not certain" (compute it). The
/// fleet's change detection asks this of every series before the exact interval (most series
/// have no change worth computing it for).
pub fn shift_ci_overlaps(before: &[f64], after: &[f64], z: f64, lower_at_most: f64, upper_at_least: f64) -> bool {
    if before.is_empty() || after.is_empty() || before.iter().chain(after).any(|v| !(v.is_finite() && *v > 0.0)) {
        return false;
    }
    let mut lb: Vec<f64> = before.iter().map(|v| v.ln()).collect();
    let mut la: Vec<f64> = after.iter().map(|v| v.ln()).collect();
    lb.sort_unstable_by(f64::total_cmp);
    la.sort_unstable_by(f64::total_cmp);
    let (n1, n2) = (before.len() as f64, after.len() as f64);
    let len = before.len() * after.len();
    let cut = (n1 * n2 / 2.0 - z * (n1 * n2 * (n1 + n2 + 1.0) / 12.0).sqrt()).floor().max(0.0) as usize;
    let cut = cut.min((len - 1) / 2);
    // A margin keeps rounding (ln, exp) from deciding a tie.
    let (l, h) = (lower_at_most.ln() - 1e-9, upper_at_least.ln() + 1e-9);
    // Pairs with la - lb <= l: for each a, the b's with lb >= la - l (a suffix of lb, moving right).
    let mut at_or_below = 0usize;
    let mut j = 0;
    for &a in &la {
        while j < lb.len() && lb[j] < a - l {
            j += 1;
        }
        at_or_below += lb.len() - j;
    }
    // Pairs with la - lb >= h: for each a, the b's with lb <= la - h (a prefix of lb).
    let mut at_or_above = 0usize;
    let mut k = 0;
    for &a in &la {
        while k < lb.len() && lb[k] <= a - h {
            k += 1;
        }
        at_or_above += k;
    }
    // The interval is [d(cut), d(len-1-cut)] of the sorted differences d.
    at_or_below > cut && at_or_above > cut
}

/// Summarises samples; `None` for an empty slice.
pub fn summarize(values: &[f64]) -> Option<Summary> {
    if values.is_empty() {
        return None;
    }
    let n = values.len();
    let mean = values.iter().sum::<f64>() / n as f64;
    let var = if n > 1 { values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64 } else { 0.0 };
    let stddev = var.sqrt();
    let med = median(values);
    let spread = mad(values);
    let outliers = if spread > 0.0 { values.iter().filter(|v| ((*v - med) / spread).abs() > 3.0).count() } else { 0 };
    Some(Summary {
        n,
        median: med,
        mean,
        stddev,
        min: values.iter().copied().fold(f64::INFINITY, f64::min),
        max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        cv: if mean != 0.0 { stddev / mean.abs() } else { 0.0 },
        median_ci: bootstrap_median_ci(values, 2000, 0x6b696c6e),
        outliers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median_in_place(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median_in_place(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn summary_of_constant_samples() {
        let s = summarize(&[5.0; 10]).unwrap();
        assert_eq!((s.median, s.stddev, s.cv, s.outliers), (5.0, 0.0, 0.0, 0));
        assert_eq!(s.median_ci, (5.0, 5.0));
    }

    #[test]
    fn interval_contains_median_and_outlier_is_flagged() {
        let mut v: Vec<f64> = (0..50).map(|i| 100.0 + (i % 7) as f64).collect();
        v.push(1000.0);
        let s = summarize(&v).unwrap();
        assert!(s.median_ci.0 <= s.median && s.median <= s.median_ci.1);
        assert_eq!(s.outliers, 1);
        assert!(s.cv > 0.1, "one wild sample makes the run unstable: cv {}", s.cv);
    }

    /// A quiet guest's training steps (the shape: most near 8.6 ms, a heavy tail to 39 ms)
    /// settle although their CV is far above 5 %; a two-valued sample, a spread-out one and a
    /// handful that disagree do not.
    #[test]
    fn a_heavy_tail_settles_and_a_spread_does_not() {
        let mut state = 3u64;
        let mut steps: Vec<f64> = (0..100).map(|_| 8.4 + (splitmix64(&mut state) % 400) as f64 / 1000.0).collect();
        for (i, slow) in [39.0, 31.0, 24.0, 18.0, 15.0, 12.5].into_iter().enumerate() {
            steps[i * 13] = slow;
        }
        let s = summarize(&steps).unwrap();
        assert!(s.cv > 0.05, "the tail makes the CV large: {}", s.cv);
        assert!(s.settled(), "the median is known: {:?} ({:.4})", s.median_ci, s.median_uncertainty());
        let two_valued: Vec<f64> = (0..100).map(|i| if i % 2 == 0 { 8.0 } else { 9.0 }).collect();
        assert!(!summarize(&two_valued).unwrap().settled());
        let spread: Vec<f64> = (0..30).map(|i| 80.0 + i as f64 * 1.5).collect();
        assert!(!summarize(&spread).unwrap().settled());
        // Five repetitions, one 20 % slow: with so few the median's interval is the whole range.
        assert!(!summarize(&[300.0, 301.0, 299.0, 240.0, 300.5]).unwrap().settled());
        assert!(summarize(&[300.0, 301.0, 299.0, 302.0, 300.5]).unwrap().settled());
        assert!(summarize(&[5.0; 4]).unwrap().settled());
    }

    #[test]
    fn shift_interval() {
        let before = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8, 100.1];
        let after: Vec<f64> = before.iter().map(|v| v * 0.9).collect();
        let (est, lo, hi) = shift_ratio_ci(&before, &after, 2.576).unwrap();
        assert!((est - 0.9).abs() < 0.005 && lo <= est && est <= hi && hi < 1.0, "{est} [{lo}, {hi}]");
        assert!(shift_ratio_ci(&[0.0, 1.0], &[1.0], 1.96).is_none());
    }

    /// Selection finds the same three order statistics as sorting every difference would, for odd
    /// and even counts, ties, and a `cut` at the median.
    #[test]
    fn the_interval_by_selection_equals_the_interval_by_sorting() {
        let mut state = 11u64;
        for case in 0..2_000 {
            let (n1, n2) = (1 + case % 23, 1 + (case * 5) % 19);
            let mut draw = || 50.0 + ((splitmix64(&mut state) >> 11) % [1000, 7][case % 2]) as f64;
            let before: Vec<f64> = (0..n1).map(|_| draw()).collect();
            let after: Vec<f64> = (0..n2).map(|_| draw()).collect();
            let z = [2.576, 1.96, 0.0, 9.0][case % 4];
            let mut d: Vec<f64> = after.iter().flat_map(|a| before.iter().map(move |b| a.ln() - b.ln())).collect();
            d.sort_unstable_by(f64::total_cmp);
            let (f1, f2) = (n1 as f64, n2 as f64);
            let cut = ((f1 * f2 / 2.0 - z * (f1 * f2 * (f1 + f2 + 1.0) / 12.0).sqrt()).floor().max(0.0) as usize)
                .min((d.len() - 1) / 2);
            let sorted = (median_sorted(&d).exp(), d[cut].exp(), d[d.len() - 1 - cut].exp());
            assert_eq!(shift_ratio_ci(&before, &after, z), Some(sorted), "case {case}: {n1}×{n2}, cut {cut}");
        }
    }

    /// The shortcut agrees with the exact interval wherever it claims an overlap, and claims it
    /// for most series that overlap.
    #[test]
    fn the_overlap_shortcut_never_contradicts_the_interval() {
        let mut state = 7u64;
        let mut claimed = 0;
        let mut overlapping = 0;
        for case in 0..3_000 {
            let (n1, n2) = (6 + case % 40, 6 + (case * 7) % 40);
            let step = [1.0, 1.005, 1.01, 1.02, 1.05, 0.95, 0.99][case % 7];
            let noise = [0.002, 0.01, 0.03][case % 3];
            let mut draw = |scale: f64| {
                let u = (splitmix64(&mut state) >> 11) as f64 / (1u64 << 53) as f64;
                scale * (1.0 + noise * (u - 0.5) * 3.4)
            };
            let before: Vec<f64> = (0..n1).map(|_| draw(100.0)).collect();
            let after: Vec<f64> = (0..n2).map(|_| draw(100.0 * step)).collect();
            let (_, lo, hi) = shift_ratio_ci(&before, &after, 2.576).unwrap();
            let exact = lo <= 1.01 && hi >= 0.99;
            let quick = shift_ci_overlaps(&before, &after, 2.576, 1.01, 0.99);
            assert!(!quick || exact, "case {case}: the shortcut claimed an overlap the interval does not have");
            overlapping += usize::from(exact);
            claimed += usize::from(quick);
        }
        assert!(claimed * 10 >= overlapping * 9, "{claimed} of {overlapping}: the shortcut should catch nearly all");
    }

    #[test]
    fn bootstrap_is_reproducible() {
        let v: Vec<f64> = (0..30).map(|i| (i * 37 % 11) as f64).collect();
        assert_eq!(bootstrap_median_ci(&v, 500, 1), bootstrap_median_ci(&v, 500, 1));
    }
}
