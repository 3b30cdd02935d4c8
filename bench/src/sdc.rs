//! A screen for silent data corruption: one core in a thousand in a large fleet computes wrong
//! without crashing (Meta, "Silent Data Corruptions at Scale", 2021; Google, "Cores that don't
//! count", 2021; OpenDCDiag is the open tool). Every allowed logical CPU, pinned, runs the same
//! deterministic kernels on the same inputs round after round for the time given — vector FMA
//! chains in f32 and f64, a blocked f32 GEMM, 64-bit integer multiply chains, CRC-32 (carry-less
//! multiply), SHA-256 (SHA extensions where the CPU has them), AES-256-GCM sealed and opened, and
//! a deflate round trip — and each result is reduced to a digest. A round's digests are compared
//! bit for bit across the CPUs that ran it, and round 0's against the known answers built into
//! kiln ([`KNOWN`]); a round trip (AES-GCM, deflate) that does not give back its input is wrong on
//! its own. A CPU that differs is named with the kernel, the round and the first output word that
//! differs (the round computed again on it and on a CPU that agreed).
//!
//! Every kernel fixes its order of operations (IEEE fused multiply-adds are correctly rounded), so
//! the same input gives the same bits on every correct x86-64 or Arm core, whatever vector width
//! the code was built for.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::stats::{pin_to_cpu, splitmix64};

/// The kernels, in the order each round runs them.
pub const KERNELS: [&str; 8] = ["fma_f32", "fma_f64", "gemm_f32", "int_mul", "crc32", "sha256", "aes_gcm", "deflate"];

/// Round 0's digest of each kernel on a correct CPU (the same on every architecture: see the
/// module's note). A test recomputes them; a CPU that gives another is wrong.
pub const KNOWN: [(&str, u64); 8] = [
    ("fma_f32", 0x52d7_2f7f_af3b_c6e6),
    ("fma_f64", 0x8006_897b_ce36_cbf7),
    ("gemm_f32", 0x278f_6222_b7ed_c8b5),
    ("int_mul", 0x3431_9614_e594_c086),
    ("crc32", 0x14fd_8c98_f787_2623),
    ("sha256", 0x7c18_7128_4a5f_8465),
    ("aes_gcm", 0x376a_1213_09dc_51ff),
    ("deflate", 0x3b38_3770_b680_a55b),
];

/// What one kernel computed in one round: its digest and every output word, for finding the first
/// that differs.
pub struct Output {
    pub digest: u64,
    pub words: Vec<u64>,
}

/// FNV-1a over 64-bit words: the digest of an output.
fn digest(words: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// `n` seeded values in [-1, 1) for round `round` of a kernel.
fn inputs(round: u64, salt: u64, n: usize) -> Vec<f64> {
    let mut state = round.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ salt;
    (0..n).map(|_| (splitmix64(&mut state) >> 11) as f64 / (1u64 << 52) as f64 - 1.0).collect()
}

/// `n` seeded bytes for round `round`: text-like, so that deflate has something to find.
fn bytes(round: u64, n: usize) -> Vec<u8> {
    let mut state = round ^ 0x5dc;
    let words = [&b"kiln "[..], b"silent ", b"data ", b"corruption ", b"core ", b"screen ", b"0123456789 "];
    let mut out = Vec::with_capacity(n + 16);
    while out.len() < n {
        let r = splitmix64(&mut state);
        out.extend_from_slice(words[(r % words.len() as u64) as usize]);
        out.push((r >> 32) as u8);
    }
    out.truncate(n);
    out
}

/// Runs one kernel's round; `Err` when a round trip did not give back its input.
pub fn run(kernel: &str, round: u64) -> Result<Output, String> {
    let words = match kernel {
        "fma_f32" => fma_f32(round),
        "fma_f64" => fma_f64(round),
        "gemm_f32" => gemm_f32(round),
        "int_mul" => int_mul(round),
        "crc32" => crc32(round),
        "sha256" => sha256(round),
        "aes_gcm" => aes_gcm(round)?,
        "deflate" => deflate(round)?,
        other => return Err(format!("no kernel {other}")),
    };
    Ok(Output { digest: digest(&words), words })
}

const CHAIN_LANES: usize = 64;
/// Steps of each FMA chain: with the other sizes below, each kernel takes about 0.2–1 ms a round
/// on a 2024 x86 core, so that a round spends its time across every unit, not in one kernel.
const CHAIN_STEPS: usize = 65_536;
/// Steps of each integer chain.
const INT_STEPS: u64 = 16_384;

/// 32 independent f32 rotations, 65,536 steps each (the vector FMA units and multipliers): each
/// step turns the pair (x, y) by its lane's angle, x ← x·c − y·s, y ← y·c + x·s, as a multiply
/// and a fused multiply-add each. A rotation keeps the pair's length, so one wrong bit anywhere
/// in the chain is carried to the end (an affine chain x ← x·a + b with |a| < 1 converges and
/// forgets it).
fn fma_f32(round: u64) -> Vec<u64> {
    let v = inputs(round, 1, 3 * CHAIN_LANES);
    let (mut x, mut y): (Vec<f32>, Vec<f32>) = (
        v[..CHAIN_LANES].iter().map(|v| *v as f32).collect(),
        v[CHAIN_LANES..2 * CHAIN_LANES].iter().map(|v| *v as f32).collect(),
    );
    let (c, s): (Vec<f32>, Vec<f32>) =
        v[2 * CHAIN_LANES..].iter().map(|t| turn(*t)).map(|(c, s)| (c as f32, s as f32)).unzip();
    rotate(&mut x, &mut y, &c, &s, CHAIN_STEPS / 2);
    x.iter().chain(&y).map(|v| u64::from(v.to_bits())).collect()
}

/// A lane of the rotations: f32 or f64, with its fused multiply-add.
trait Lane: Copy + std::ops::Mul<Output = Self> + std::ops::Neg<Output = Self> {
    fn fma(self, a: Self, b: Self) -> Self;
}

impl Lane for f32 {
    #[inline(always)]
    fn fma(self, a: f32, b: f32) -> f32 {
        self.mul_add(a, b)
    }
}

impl Lane for f64 {
    #[inline(always)]
    fn fma(self, a: f64, b: f64) -> f64 {
        self.mul_add(a, b)
    }
}

/// `steps` turns of every lane's pair, through the AVX2 and FMA build where the CPU has them.
#[cfg(target_arch = "x86_64")]
fn rotate<T: Lane>(x: &mut [T], y: &mut [T], c: &[T], s: &[T], steps: usize) {
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were detected just above.
        unsafe { rotate_avx2(x, y, c, s, steps) }
    } else {
        rotate_any(x, y, c, s, steps);
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn rotate<T: Lane>(x: &mut [T], y: &mut [T], c: &[T], s: &[T], steps: usize) {
    rotate_any(x, y, c, s, steps);
}

/// The same steps compiled for AVX2 and FMA: `mul_add` becomes `vfmadd` on a vector of lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rotate_avx2<T: Lane>(x: &mut [T], y: &mut [T], c: &[T], s: &[T], steps: usize) {
    rotate_any(x, y, c, s, steps);
}

#[inline(always)]
fn rotate_any<T: Lane>(x: &mut [T], y: &mut [T], c: &[T], s: &[T], steps: usize) {
    for _ in 0..steps {
        for (((x, y), c), s) in x.iter_mut().zip(y.iter_mut()).zip(c).zip(s) {
            let (x0, y0) = (*x, *y);
            *x = x0.fma(*c, -(y0 * *s));
            *y = y0.fma(*c, x0 * *s);
        }
    }
}

/// A rotation's cosine and sine from t, by the rational parametrisation ((1 − t²)/(1 + t²),
/// 2t/(1 + t²)): basic operations only, correctly rounded everywhere, where a library's cos and
/// sin differ between C libraries and would change the known answers.
fn turn(t: f64) -> (f64, f64) {
    let d = 1.0 + t * t;
    ((1.0 - t * t) / d, 2.0 * t / d)
}

/// The f64 rotations (the double-precision datapath).
fn fma_f64(round: u64) -> Vec<u64> {
    let v = inputs(round, 2, 3 * CHAIN_LANES);
    let (mut x, mut y) = (v[..CHAIN_LANES].to_vec(), v[CHAIN_LANES..2 * CHAIN_LANES].to_vec());
    let (c, s): (Vec<f64>, Vec<f64>) = v[2 * CHAIN_LANES..].iter().map(|t| turn(*t)).unzip();
    rotate(&mut x, &mut y, &c, &s, CHAIN_STEPS / 4);
    x.iter().chain(&y).map(|v| v.to_bits()).collect()
}

const GEMM_N: usize = 128;

/// C = A·B for 128×128 f32 matrices, each C element accumulated in k order by fused multiply-adds
/// (the loads, the FMA units and the register file under a GEMM's access pattern).
fn gemm_f32(round: u64) -> Vec<u64> {
    let n = GEMM_N;
    let a: Vec<f32> = inputs(round, 3, n * n).into_iter().map(|v| v as f32).collect();
    let b: Vec<f32> = inputs(round, 4, n * n).into_iter().map(|v| v as f32).collect();
    let mut c = vec![0f32; n * n];
    gemm_rows(&a, &b, &mut c);
    c.iter().map(|v| u64::from(v.to_bits())).collect()
}

#[cfg(target_arch = "x86_64")]
fn gemm_rows(a: &[f32], b: &[f32], c: &mut [f32]) {
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were detected just above.
        unsafe { gemm_rows_avx2(a, b, c) }
    } else {
        gemm_rows_any(a, b, c);
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn gemm_rows(a: &[f32], b: &[f32], c: &mut [f32]) {
    gemm_rows_any(a, b, c);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gemm_rows_avx2(a: &[f32], b: &[f32], c: &mut [f32]) {
    gemm_rows_any(a, b, c);
}

/// Row i of C: for each k, C[i][·] += A[i][k] · B[k][·] — every element's sum in k order.
#[inline(always)]
fn gemm_rows_any(a: &[f32], b: &[f32], c: &mut [f32]) {
    let n = GEMM_N;
    for i in 0..n {
        let row = &mut c[i * n..(i + 1) * n];
        for k in 0..n {
            let aik = a[i * n + k];
            for (c, b) in row.iter_mut().zip(&b[k * n..(k + 1) * n]) {
                *c = aik.mul_add(*b, *c);
            }
        }
    }
}

/// 64 chains of 64-bit multiplies, rotates and adds (the integer multiplier and ALUs).
fn int_mul(round: u64) -> Vec<u64> {
    let mut state = round ^ 0x1d;
    let mut x: Vec<u64> = (0..CHAIN_LANES).map(|_| splitmix64(&mut state) | 1).collect();
    for step in 0..INT_STEPS {
        for (i, x) in x.iter_mut().enumerate() {
            *x = x.wrapping_mul(0x2545_f491_4f6c_dd1d).rotate_left(17).wrapping_add(step ^ i as u64);
        }
    }
    x
}

/// Bytes hashed (CRC-32, SHA-256), sealed (AES-GCM) and compressed (deflate) each round.
const HASHED: usize = 512 << 10;
const SEALED: usize = 128 << 10;
const DEFLATED: usize = 16 << 10;

/// CRC-32 of 512 KiB in 16 pieces (crc32fast: carry-less multiplication where the CPU has it).
fn crc32(round: u64) -> Vec<u64> {
    let data = bytes(round, HASHED);
    data.chunks(HASHED / 16).map(|c| u64::from(crc32fast::hash(c))).collect()
}

/// SHA-256 of 512 KiB in 16 pieces (the SHA extensions where the CPU has them).
fn sha256(round: u64) -> Vec<u64> {
    use sha2::Digest;
    let data = bytes(round ^ 0x5a, HASHED);
    data.chunks(HASHED / 16)
        .flat_map(|c| {
            let d = sha2::Sha256::digest(c);
            d.chunks(8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default())).collect::<Vec<_>>()
        })
        .collect()
}

/// 128 KiB sealed with AES-256-GCM (AES-NI and carry-less multiply) and opened again: the
/// ciphertext and tag are the output; what opens must be the input.
fn aes_gcm(round: u64) -> Result<Vec<u64>, String> {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let data = bytes(round ^ 0xa5, SEALED);
    let mut state = round ^ 0xae5;
    let key_bytes: Vec<u8> = (0..4).flat_map(|_| splitmix64(&mut state).to_le_bytes()).collect();
    let nonce: [u8; 12] = std::array::from_fn(|i| (round as u8).wrapping_add(i as u8));
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key_bytes).map_err(|_| "AES key".to_string())?);
    let mut sealed = data.clone();
    key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut sealed)
        .map_err(|_| "AES-GCM seal failed".to_string())?;
    let mut opened = sealed.clone();
    let plain = key
        .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut opened)
        .map_err(|_| "AES-GCM open refused its own ciphertext (the tag did not verify)".to_string())?;
    if plain != data.as_slice() {
        return Err("AES-GCM open did not give back the input".into());
    }
    Ok(sealed.chunks(8).map(|w| u64::from_le_bytes(std::array::from_fn(|i| w.get(i).copied().unwrap_or(0)))).collect())
}

/// 16 KiB compressed with deflate and decompressed: the compressed bytes are the output; what
/// comes back must be the input.
fn deflate(round: u64) -> Result<Vec<u64>, String> {
    use std::io::{Read, Write};
    let data = bytes(round ^ 0xde, DEFLATED);
    let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(6));
    z.write_all(&data).map_err(|e| e.to_string())?;
    let packed = z.finish().map_err(|e| e.to_string())?;
    let mut back = Vec::with_capacity(data.len());
    flate2::read::DeflateDecoder::new(packed.as_slice()).read_to_end(&mut back).map_err(|e| e.to_string())?;
    if back != data {
        return Err("deflate round trip did not give back the input".into());
    }
    Ok(packed.chunks(8).map(|w| u64::from_le_bytes(std::array::from_fn(|i| w.get(i).copied().unwrap_or(0)))).collect())
}

/// How the screen runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    pub seconds: f64,
    /// Test builds only: a fault to inject (`KILN_SDC_INJECT=CPU:KERNEL`, honoured where debug
    /// assertions are on): that CPU's output of that kernel gets its lowest bit flipped.
    #[serde(skip)]
    pub inject: Option<(u32, String)>,
}

/// One CPU that computed wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Wrong {
    pub cpu: u32,
    pub kernel: String,
    pub round: u64,
    /// What was wrong: the digest against the known answer or the CPUs that agreed, the first
    /// output word that differs, or a round trip that did not come back.
    pub what: String,
}

/// Per kernel, what the screen did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KernelStats {
    pub kernel: String,
    /// Rounds run, over every CPU.
    pub rounds: u64,
    /// Median seconds of one round on one CPU.
    pub seconds_per_round: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub cpus: Vec<u32>,
    pub seconds: f64,
    /// Rounds each CPU completed (every kernel once per round), by CPU.
    pub rounds: BTreeMap<u32, u64>,
    pub kernels: Vec<KernelStats>,
    /// Rounds compared across at least two CPUs, or against a known answer.
    pub compared: u64,
    pub wrong: Vec<Wrong>,
    /// CPUs that could not be pinned (their work ran wherever the scheduler put it).
    pub unpinned: Vec<u32>,
}

/// What one CPU's thread brings back: per round, each kernel's digest or round-trip failure, and
/// each kernel's round times.
struct Worker {
    cpu: u32,
    pinned: bool,
    digests: Vec<Vec<Result<u64, String>>>,
    times: Vec<Vec<f64>>,
}

fn inject(config: &Config, cpu: u32, kernel: &str, out: &mut Result<Output, String>) {
    if !cfg!(debug_assertions) {
        return;
    }
    if let (Some((c, k)), Ok(o)) = (&config.inject, out.as_mut()) {
        if *c == cpu && k == kernel {
            if let Some(w) = o.words.first_mut() {
                *w ^= 1;
            }
            o.digest = digest(&o.words);
        }
    }
}

/// Runs the screen on `cpus` for `config.seconds`; `progress(seconds done)` about every second.
pub fn screen(cpus: &[u32], config: &Config, stop: &AtomicBool, progress: impl Fn(f64) + Sync) -> Report {
    let deadline = Instant::now() + Duration::from_secs_f64(config.seconds.max(0.0));
    let started = Instant::now();
    let workers: Vec<Worker> = std::thread::scope(|s| {
        let handles: Vec<_> = cpus
            .iter()
            .enumerate()
            .map(|(i, &cpu)| {
                let progress = &progress;
                s.spawn(move || {
                    let pinned = pin_to_cpu(cpu);
                    let mut w = Worker { cpu, pinned, digests: Vec::new(), times: vec![Vec::new(); KERNELS.len()] };
                    let mut last_said = Instant::now();
                    // Round 0 always runs, whatever the time: it is checked against the known answers.
                    while w.digests.is_empty() || (Instant::now() < deadline && !stop.load(Ordering::Relaxed)) {
                        let round = w.digests.len() as u64;
                        let mut row = Vec::with_capacity(KERNELS.len());
                        for (k, kernel) in KERNELS.iter().enumerate() {
                            let t = Instant::now();
                            let mut out = run(kernel, round);
                            w.times[k].push(t.elapsed().as_secs_f64());
                            inject(config, cpu, kernel, &mut out);
                            row.push(out.map(|o| o.digest));
                        }
                        w.digests.push(row);
                        if i == 0 && last_said.elapsed() >= Duration::from_secs(1) {
                            progress(started.elapsed().as_secs_f64());
                            last_said = Instant::now();
                        }
                    }
                    w
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    judge(cpus, config, &workers, started.elapsed().as_secs_f64())
}

/// Compares every round across the CPUs that ran it and round 0 against the known answers.
fn judge(cpus: &[u32], config: &Config, workers: &[Worker], seconds: f64) -> Report {
    let mut wrong: Vec<Wrong> = Vec::new();
    // Rounds the CPUs disagreed on with no majority (two CPUs, one each): decided below.
    let mut ties: Vec<(usize, &str, Vec<u32>)> = Vec::new();
    let mut compared = 0;
    let most = workers.iter().map(|w| w.digests.len()).max().unwrap_or(0);
    for round in 0..most {
        let ran: Vec<&Worker> = workers.iter().filter(|w| w.digests.len() > round).collect();
        for (k, kernel) in KERNELS.iter().enumerate() {
            let known = (round == 0).then_some(KNOWN[k].1);
            if ran.len() < 2 && known.is_none() {
                continue;
            }
            compared += 1;
            // The answer: the known one, else the digest most CPUs gave (a tie has none).
            let mut votes: BTreeMap<u64, usize> = BTreeMap::new();
            for w in &ran {
                if let Ok(d) = w.digests[round][k] {
                    *votes.entry(d).or_default() += 1;
                }
            }
            let top = votes.values().copied().max().unwrap_or(0);
            let majority = (votes.values().filter(|n| **n == top).count() == 1 && top * 2 > ran.len())
                .then(|| votes.iter().find(|(_, n)| **n == top).map(|(d, _)| *d))
                .flatten();
            let answer = known.or(majority);
            for w in &ran {
                let what = match (&w.digests[round][k], answer) {
                    (Err(e), _) => Some(e.clone()),
                    (Ok(d), Some(a)) if *d != a => Some(first_difference(config, w.cpu, workers, kernel, round, *d, a)),
                    _ => None,
                };
                if let Some(what) = what {
                    wrong.push(Wrong { cpu: w.cpu, kernel: kernel.to_string(), round: round as u64, what });
                }
            }
            if answer.is_none() && votes.len() > 1 {
                ties.push((round, kernel, ran.iter().map(|w| w.cpu).collect()));
            }
        }
    }
    // A disagreement with no majority is put on the CPUs already found wrong where there was an
    // answer; where none of them was, every CPU of it is suspect.
    let proven: std::collections::BTreeSet<u32> = wrong.iter().map(|w| w.cpu).collect();
    for (round, kernel, cpus) in ties {
        let (blamed, what): (Vec<u32>, String) = if cpus.iter().any(|c| proven.contains(c)) {
            let others: Vec<String> = cpus.iter().filter(|c| !proven.contains(c)).map(|c| format!("CPU {c}")).collect();
            let blamed = cpus.into_iter().filter(|c| proven.contains(c)).collect();
            (
                blamed,
                format!(
                    "differs from {} (no majority; this CPU was wrong where there was an answer)",
                    others.join(", ")
                ),
            )
        } else {
            let n = cpus.len();
            (cpus, format!("the {n} CPUs disagree with no majority: each is suspect"))
        };
        for cpu in blamed {
            wrong.push(Wrong { cpu, kernel: kernel.to_string(), round: round as u64, what: what.clone() });
        }
    }
    let kernels = KERNELS
        .iter()
        .enumerate()
        .map(|(k, kernel)| {
            let mut t: Vec<f64> = workers.iter().flat_map(|w| w.times[k].iter().copied()).collect();
            KernelStats {
                kernel: kernel.to_string(),
                rounds: t.len() as u64,
                seconds_per_round: crate::stats::median_in_place(&mut t),
            }
        })
        .collect();
    Report {
        cpus: cpus.to_vec(),
        seconds,
        rounds: workers.iter().map(|w| (w.cpu, w.digests.len() as u64)).collect(),
        kernels,
        compared,
        wrong,
        unpinned: workers.iter().filter(|w| !w.pinned).map(|w| w.cpu).collect(),
    }
}

/// The round computed again on `cpu` and compared word by word with the known-good output
/// (computed again on a CPU whose digest was the answer): the first word that differs. A CPU that
/// computes right the second time had a fault that comes and goes, and is said so.
fn first_difference(
    config: &Config,
    cpu: u32,
    workers: &[Worker],
    kernel: &str,
    round: usize,
    got: u64,
    answer: u64,
) -> String {
    let k = KERNELS.iter().position(|n| *n == kernel).unwrap_or(0);
    let good_cpu = workers.iter().find(|w| w.digests.get(round).is_some_and(|r| r[k] == Ok(answer))).map(|w| w.cpu);
    let Some(good_cpu) = good_cpu else {
        return format!("digest {got:#018x}, the known answer {answer:#018x} (no CPU gave it)");
    };
    let on = |c: u32| {
        std::thread::scope(|s| {
            s.spawn(|| {
                pin_to_cpu(c);
                let mut out = run(kernel, round as u64);
                inject(config, c, kernel, &mut out);
                out
            })
            .join()
            .ok()
        })
    };
    let head = format!("digest {got:#018x} where CPU {good_cpu} and the answer give {answer:#018x}");
    let (Some(Ok(bad)), Some(Ok(good))) = (on(cpu), on(good_cpu)) else {
        return head;
    };
    match bad.words.iter().zip(&good.words).position(|(a, b)| a != b) {
        Some(i) => format!("{head}: output word {i} is {:#018x}, expected {:#018x}", bad.words[i], good.words[i]),
        None => format!("{head}; computed again it was right (a fault that comes and goes)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel is deterministic, and round 0 gives the known answer on this CPU.
    #[test]
    fn kernels_are_deterministic_and_give_the_known_answers() {
        let got: Vec<(&str, u64)> = KNOWN.iter().map(|(kernel, _)| (*kernel, run(kernel, 0).unwrap().digest)).collect();
        for ((kernel, known), (_, digest)) in KNOWN.iter().zip(&got) {
            let again = run(kernel, 0).unwrap();
            assert_eq!(again.digest, *digest, "{kernel}");
            assert!(!again.words.is_empty(), "{kernel}");
            assert_eq!(digest, known, "{kernel}: the known answer (this CPU gives {got:#x?})");
            assert_ne!(run(kernel, 1).unwrap().digest, *digest, "{kernel}: rounds differ");
        }
    }

    /// The vector path (AVX2 and FMA, where this CPU has them) and the portable one give the same
    /// bits: the known answers hold on CPUs without FMA units too.
    #[test]
    fn vector_and_portable_paths_agree() {
        let v = inputs(7, 1, 3 * CHAIN_LANES);
        let start = || -> (Vec<f32>, Vec<f32>) {
            (
                v[..CHAIN_LANES].iter().map(|v| *v as f32).collect(),
                v[CHAIN_LANES..2 * CHAIN_LANES].iter().map(|v| *v as f32).collect(),
            )
        };
        let (c, s): (Vec<f32>, Vec<f32>) =
            v[2 * CHAIN_LANES..].iter().map(|t| turn(*t)).map(|(c, s)| (c as f32, s as f32)).unzip();
        let (mut x1, mut y1) = start();
        let (mut x2, mut y2) = start();
        rotate(&mut x1, &mut y1, &c, &s, CHAIN_STEPS / 2);
        rotate_any(&mut x2, &mut y2, &c, &s, CHAIN_STEPS / 2);
        assert_eq!((x1, y1), (x2, y2));
        let (a, b) = (inputs(7, 3, GEMM_N * GEMM_N), inputs(7, 4, GEMM_N * GEMM_N));
        let (a, b): (Vec<f32>, Vec<f32>) =
            (a.iter().map(|v| *v as f32).collect(), b.iter().map(|v| *v as f32).collect());
        let (mut c1, mut c2) = (vec![0f32; GEMM_N * GEMM_N], vec![0f32; GEMM_N * GEMM_N]);
        gemm_rows(&a, &b, &mut c1);
        gemm_rows_any(&a, &b, &mut c2);
        assert_eq!(c1, c2);
    }

    /// A wrong result injected on one CPU (a test build) is found and named with the kernel and
    /// the first wrong word; the CPU that computed right is not named; without the fault, nothing.
    #[cfg(debug_assertions)]
    #[test]
    fn an_injected_fault_names_its_cpu_and_kernel() {
        let cpus: Vec<u32> = vec![0, 1];
        let stop = AtomicBool::new(false);
        let clean = screen(&cpus, &Config { seconds: 0.3, inject: None }, &stop, |_| {});
        assert!(clean.wrong.is_empty(), "{:?}", clean.wrong);
        assert!(clean.compared >= KERNELS.len() as u64);
        let config = Config { seconds: 0.3, inject: Some((1, "gemm_f32".into())) };
        let faulty = screen(&cpus, &config, &stop, |_| {});
        assert!(!faulty.wrong.is_empty());
        assert!(faulty.wrong.iter().all(|w| w.cpu == 1 && w.kernel == "gemm_f32"), "{:?}", faulty.wrong);
        let first = &faulty.wrong[0];
        assert_eq!(first.round, 0);
        assert!(first.what.contains("output word 0 is"), "{}", first.what);
    }
}

#[cfg(test)]
mod timing {
    /// `cargo test --release -p kiln-bench --lib sdc::timing -- --ignored --nocapture`: each
    /// kernel's time per round on this CPU.
    #[test]
    #[ignore]
    fn kernel_times() {
        for kernel in super::KERNELS {
            let t = std::time::Instant::now();
            for r in 0..20 {
                super::run(kernel, r).unwrap();
            }
            println!("{kernel}: {:.3} ms", t.elapsed().as_secs_f64() * 1e3 / 20.0);
        }
    }
}
