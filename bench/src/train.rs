//! The reference training benchmark: a GPT-style decoder-only transformer written with candle
//! (token and position embeddings, pre-LayerNorm blocks with causal multi-head self-attention and
//! a GELU MLP, a final norm, the LM head), trained with AdamW, linear warm-up then cosine decay,
//! and global gradient-norm clipping, on a seeded synthetic corpus with learnable structure.
//!
//! The loss must fall well below ln(vocab): the run is a numerics check of the hardware and the
//! stack, not only a speed test. Only ops with a real backward pass are used (candle 0.11's fused
//! `softmax_last_dim` and `layer_norm` pass no gradient; a test checks every parameter gets one).
//!
//! FLOPs are counted as 6·N per token (N = parameters without the embeddings, forward and backward)
//! plus 12·layers·seq·d_model per token for attention (the PaLM appendix B formula).

use std::time::Instant;

use candle_core::{DType, Device, Module, Tensor, Var, D};
use candle_nn::{embedding, linear, linear_no_bias, AdamW, Embedding, Linear, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use serde::{Deserialize, Serialize};

use crate::stats::{percentile_sorted, splitmix64, summarize, Summary};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    pub size: String,
    pub vocab: usize,
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    pub seq: usize,
    pub batch: usize,
    pub steps: usize,
    pub warmup_steps: usize,
    pub lr: f64,
    pub weight_decay: f64,
    pub grad_clip: f64,
    pub seed: u64,
}

impl Config {
    /// The named sizes: `tiny` (CI, seconds on two cores), `anchor` (the PyTorch anchor's
    /// 3.3 M-parameter model), `small` (~25 M), `gpt2` (124 M), `350m` and `1b` (for GPUs).
    pub fn preset(name: &str) -> Option<Config> {
        let (vocab, d_model, layers, heads, seq, batch, steps) = match name {
            "tiny" => (256, 64, 2, 4, 64, 8, 100),
            "anchor" => (256, 256, 4, 4, 128, 8, 40),
            "small" => (256, 512, 8, 8, 256, 8, 30),
            "gpt2" => (50257, 768, 12, 12, 1024, 8, 20),
            "350m" => (50257, 1024, 24, 16, 1024, 8, 20),
            "1b" => (50257, 2048, 16, 16, 2048, 8, 20),
            _ => return None,
        };
        Some(Config {
            size: name.to_string(),
            vocab,
            d_model,
            layers,
            heads,
            seq,
            batch,
            steps,
            warmup_steps: (steps / 10).max(2),
            lr: 3e-3,
            weight_decay: 0.1,
            grad_clip: 1.0,
            seed: 1234,
        })
    }

    pub fn validate(&self) -> Result<(), String> {
        if !self.d_model.is_multiple_of(self.heads) {
            return Err(format!("d_model {} is not a multiple of heads {}", self.d_model, self.heads));
        }
        if [self.vocab, self.d_model, self.layers, self.heads, self.seq, self.batch, self.steps].contains(&0) {
            return Err("every size must be positive".to_string());
        }
        if self.vocab < 8 {
            return Err("vocab must be at least 8 for the corpus to have structure".to_string());
        }
        Ok(())
    }
}

/// A deterministic corpus with learnable structure: a first-order Markov chain in which every
/// token has four likely successors (probabilities 0.6, 0.2, 0.1, 0.1). Its entropy is 1.09 nats,
/// far below ln(vocab), so a model that learns must get there.
pub struct Corpus {
    successors: Vec<[u32; 4]>,
    state: u64,
}

impl Corpus {
    pub const ENTROPY_NATS: f64 = 1.0889; // -(0.6 ln 0.6 + 0.2 ln 0.2 + 2 * 0.1 ln 0.1)

    pub fn new(vocab: usize, seed: u64) -> Corpus {
        let mut state = seed ^ 0x5eed;
        let successors = (0..vocab)
            .map(|_| {
                let mut s = [0u32; 4];
                for x in s.iter_mut() {
                    *x = (splitmix64(&mut state) % vocab as u64) as u32;
                }
                s
            })
            .collect();
        Corpus { successors, state: seed }
    }

    /// A batch of (inputs, targets), each `batch × seq` token ids, targets shifted by one.
    pub fn batch(&mut self, batch: usize, seq: usize) -> (Vec<u32>, Vec<u32>) {
        let (mut inputs, mut targets) = (Vec::with_capacity(batch * seq), Vec::with_capacity(batch * seq));
        for _ in 0..batch {
            let mut tok = (splitmix64(&mut self.state) % self.successors.len() as u64) as u32;
            for _ in 0..seq {
                let r = splitmix64(&mut self.state) % 10;
                let pick = match r {
                    0..=5 => 0,
                    6 | 7 => 1,
                    8 => 2,
                    _ => 3,
                };
                let next = self.successors[tok as usize][pick];
                inputs.push(tok);
                targets.push(next);
                tok = next;
            }
        }
        (inputs, targets)
    }
}

/// LayerNorm from elementary ops, so that its backward pass is real.
struct Norm {
    weight: Tensor,
    bias: Tensor,
}

impl Norm {
    fn new(d: usize, vb: VarBuilder) -> candle_core::Result<Norm> {
        Ok(Norm {
            weight: vb.get_with_hints(d, "weight", candle_nn::Init::Const(1.0))?,
            bias: vb.get_with_hints(d, "bias", candle_nn::Init::Const(0.0))?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let centered = x.broadcast_sub(&mean)?;
        let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centered.broadcast_div(&(var + 1e-5)?.sqrt()?)?;
        normed.broadcast_mul(&self.weight)?.broadcast_add(&self.bias)
    }
}

/// GELU, tanh approximation, from elementary ops: candle's fused `gelu` computes x³ with `powf`
/// per element, a tenth of a CPU training step; multiplications vectorise.
fn gelu_tanh(x: &Tensor) -> candle_core::Result<Tensor> {
    let cube = x.sqr()?.mul(x)?;
    let inner = ((x + (cube * 0.044715)?)? * (2.0f64 / std::f64::consts::PI).sqrt())?;
    let gate = (inner.tanh()? + 1.0)?;
    (x * gate)? * 0.5
}

struct Block {
    ln1: Norm,
    qkv: Linear,
    proj: Linear,
    ln2: Norm,
    fc: Linear,
    out: Linear,
    heads: usize,
}

impl Block {
    fn new(d: usize, heads: usize, vb: VarBuilder) -> candle_core::Result<Block> {
        Ok(Block {
            ln1: Norm::new(d, vb.pp("ln1"))?,
            qkv: linear(d, 3 * d, vb.pp("qkv"))?,
            proj: linear(d, d, vb.pp("proj"))?,
            ln2: Norm::new(d, vb.pp("ln2"))?,
            fc: linear(d, 4 * d, vb.pp("fc"))?,
            out: linear(4 * d, d, vb.pp("out"))?,
            heads,
        })
    }

    fn forward(&self, x: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t, d) = x.dims3()?;
        let hd = d / self.heads;
        let qkv = self.qkv.forward(&self.ln1.forward(x)?)?.reshape((b, t, 3, self.heads, hd))?;
        let part = |i| qkv.narrow(2, i, 1)?.squeeze(2)?.transpose(1, 2)?.contiguous();
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        let scores = (q.matmul(&k.t()?)? / (hd as f64).sqrt())?.broadcast_add(mask)?;
        // The composed softmax: the fused softmax_last_dim has no backward pass in candle 0.11.
        let attn = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let y = attn.matmul(&v)?.transpose(1, 2)?.reshape((b, t, d))?;
        let x = (x + self.proj.forward(&y)?)?;
        let h = gelu_tanh(&self.fc.forward(&self.ln2.forward(&x)?)?)?;
        x + self.out.forward(&h)?
    }
}

pub struct Gpt {
    tok: Embedding,
    pos: Embedding,
    blocks: Vec<Block>,
    ln_f: Norm,
    head: Linear,
    mask: Tensor,
}

impl Gpt {
    pub fn new(c: &Config, vb: VarBuilder, device: &Device) -> candle_core::Result<Gpt> {
        let mask: Vec<f32> = (0..c.seq).flat_map(|i| (0..c.seq).map(move |j| if j > i { -1e9 } else { 0.0 })).collect();
        Ok(Gpt {
            tok: embedding(c.vocab, c.d_model, vb.pp("tok"))?,
            pos: embedding(c.seq, c.d_model, vb.pp("pos"))?,
            blocks: (0..c.layers).map(|i| Block::new(c.d_model, c.heads, vb.pp(format!("block{i}")))).collect::<candle_core::Result<_>>()?,
            ln_f: Norm::new(c.d_model, vb.pp("ln_f"))?,
            head: linear_no_bias(c.d_model, c.vocab, vb.pp("head"))?,
            mask: Tensor::from_vec(mask, (c.seq, c.seq), device)?,
        })
    }

    /// Logits `(batch, seq, vocab)` for token ids `(batch, seq)`.
    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let (_, t) = ids.dims2()?;
        let positions = Tensor::arange(0u32, t as u32, ids.device())?;
        let mut x = self.tok.forward(ids)?.broadcast_add(&self.pos.forward(&positions)?)?;
        let mask = self.mask.narrow(0, 0, t)?.narrow(1, 0, t)?;
        for block in &self.blocks {
            x = block.forward(&x, &mask)?;
        }
        self.head.forward(&self.ln_f.forward(&x)?)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub config: Config,
    pub device: String,
    pub parameters: usize,
    /// Parameters without the token and position embeddings: the N of 6·N.
    pub non_embedding_parameters: usize,
    pub flops_per_token: f64,
    pub flops_formula: String,
    pub tokens_per_s: f64,
    pub samples_per_s: f64,
    /// Every step's time in seconds, warm-up steps included (they are marked by `warmup_steps_excluded`).
    pub step_times_s: Vec<f64>,
    /// Step times in seconds, warm-up steps excluded.
    pub step_s: Summary,
    pub step_p95_s: f64,
    pub step_max_s: f64,
    pub achieved_flops: f64,
    /// Achieved FLOP/s over the device's peak, when a peak is known.
    pub mfu: Option<f64>,
    pub loss_start: f64,
    pub loss_end: f64,
    pub loss_curve: Vec<f64>,
    /// ln(vocab): where an untrained model starts; and the corpus entropy it can reach.
    pub loss_chance: f64,
    pub loss_floor: f64,
    pub learned: bool,
    pub peak_rss_bytes: Option<u64>,
    pub warmup_steps_excluded: usize,
}

fn peak_rss_bytes() -> Option<u64> {
    // SAFETY: rusage is plain data that getrusage fills.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    (unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } == 0).then(|| usage.ru_maxrss as u64 * 1024)
}

/// Learning rate at `step`: linear warm-up, then cosine decay to a tenth.
pub fn learning_rate(c: &Config, step: usize) -> f64 {
    if step < c.warmup_steps {
        return c.lr * (step + 1) as f64 / c.warmup_steps as f64;
    }
    let progress = (step - c.warmup_steps) as f64 / (c.steps - c.warmup_steps).max(1) as f64;
    let floor = c.lr / 10.0;
    floor + (c.lr - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress.min(1.0)).cos())
}

/// Scales every gradient so that their global L2 norm is at most `max_norm`; returns the norm.
pub fn clip_gradients(grads: &mut candle_core::backprop::GradStore, vars: &[Var], max_norm: f64) -> candle_core::Result<f64> {
    let mut total = 0.0f64;
    for v in vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            total += g.sqr()?.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        }
    }
    let norm = total.sqrt();
    if norm > max_norm && norm.is_finite() {
        let scale = max_norm / norm;
        for v in vars {
            if let Some(g) = grads.get(v.as_tensor()) {
                let scaled = (g * scale)?;
                grads.insert(v.as_tensor(), scaled);
            }
        }
    }
    Ok(norm)
}

/// Trains for `config.steps` steps and reports. `peak_flops` is the device's peak (FLOP/s).
///
/// # Errors
/// A candle error, or a configuration that does not validate.
pub fn run(config: &Config, peak_flops: Option<f64>, mut progress: impl FnMut(usize, usize, f64)) -> candle_core::Result<Report> {
    config.validate().map_err(candle_core::Error::Msg)?;
    let device = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
    let model = Gpt::new(config, vb, &device)?;
    let vars = varmap.all_vars();
    let parameters: usize = vars.iter().map(|v| v.elem_count()).sum();
    let embeddings = (config.vocab + config.seq) * config.d_model;
    let n = parameters - embeddings;
    let flops_per_token = 6.0 * n as f64 + 12.0 * (config.layers * config.seq * config.d_model) as f64;
    let params = ParamsAdamW { lr: config.lr, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: config.weight_decay };
    let mut opt = AdamW::new(vars.clone(), params)?;
    let mut corpus = Corpus::new(config.vocab, config.seed);
    let mut losses = Vec::new();
    let mut steps = Vec::new();
    for step in 0..config.steps {
        let (inputs, targets) = corpus.batch(config.batch, config.seq);
        let t0 = Instant::now();
        let ids = Tensor::from_vec(inputs, (config.batch, config.seq), &device)?;
        let tgt = Tensor::from_vec(targets, config.batch * config.seq, &device)?;
        let logits = model.forward(&ids)?.reshape((config.batch * config.seq, config.vocab))?;
        let loss = candle_nn::loss::cross_entropy(&logits, &tgt)?;
        let mut grads = loss.backward()?;
        clip_gradients(&mut grads, &vars, config.grad_clip)?;
        opt.set_learning_rate(learning_rate(config, step));
        opt.step(&grads)?;
        let value = loss.to_scalar::<f32>()? as f64;
        steps.push(t0.elapsed().as_secs_f64());
        losses.push(value);
        progress(step + 1, config.steps, value);
        if !value.is_finite() {
            break;
        }
    }
    // Warm-up steps (allocator, thread pool, caches) are not timed.
    let excluded = (config.steps / 10).clamp(1, 3).min(steps.len().saturating_sub(1));
    let timed = &steps[excluded..];
    let step_s = summarize(timed).expect("at least one timed step");
    let mut sorted = timed.to_vec();
    sorted.sort_by(f64::total_cmp);
    let tokens = (config.batch * config.seq) as f64;
    let tokens_per_s = tokens / step_s.median;
    let tail = losses.len().min(5);
    let loss_end = losses[losses.len() - tail..].iter().sum::<f64>() / tail as f64;
    let loss_chance = (config.vocab as f64).ln();
    let achieved = flops_per_token * tokens_per_s;
    Ok(Report {
        config: config.clone(),
        device: "cpu".to_string(),
        parameters,
        non_embedding_parameters: n,
        flops_per_token,
        flops_formula: "6·N (N without embeddings) + 12·layers·seq·d_model, per token".to_string(),
        tokens_per_s,
        samples_per_s: tokens_per_s / config.seq as f64,
        step_p95_s: percentile_sorted(&sorted, 0.95),
        step_max_s: sorted[sorted.len() - 1],
        step_s,
        step_times_s: steps.clone(),
        achieved_flops: achieved,
        mfu: peak_flops.map(|p| achieved / p),
        loss_start: losses[0],
        loss_end,
        // It learned when the loss ended finite and at most 60 % of chance: far below ln(vocab).
        learned: loss_end.is_finite() && loss_end < 0.6 * loss_chance,
        loss_curve: losses,
        loss_chance,
        loss_floor: Corpus::ENTROPY_NATS,
        peak_rss_bytes: peak_rss_bytes(),
        warmup_steps_excluded: excluded,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn micro() -> Config {
        Config { steps: 1, seq: 16, batch: 2, d_model: 32, ..Config::preset("tiny").unwrap() }
    }

    #[test]
    fn every_parameter_receives_a_gradient() {
        let c = micro();
        let device = Device::Cpu;
        let varmap = VarMap::new();
        let model = Gpt::new(&c, VarBuilder::from_varmap(&varmap, DType::F32, &device), &device).unwrap();
        let mut corpus = Corpus::new(c.vocab, 7);
        let (inputs, targets) = corpus.batch(c.batch, c.seq);
        let ids = Tensor::from_vec(inputs, (c.batch, c.seq), &device).unwrap();
        let tgt = Tensor::from_vec(targets, c.batch * c.seq, &device).unwrap();
        let logits = model.forward(&ids).unwrap().reshape((c.batch * c.seq, c.vocab)).unwrap();
        let grads = candle_nn::loss::cross_entropy(&logits, &tgt).unwrap().backward().unwrap();
        let data = varmap.data().lock().unwrap();
        assert!(data.len() >= 4 + 10 * c.layers, "{} parameters", data.len());
        for (name, var) in data.iter() {
            let g = grads.get(var.as_tensor()).unwrap_or_else(|| panic!("{name} has no gradient"));
            let norm = g.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(norm > 0.0 && norm.is_finite(), "{name}: gradient norm {norm}");
        }
    }

    #[test]
    fn composed_gelu_matches_candles() {
        let x = Tensor::new(&[-3f32, -1.0, -0.1, 0.0, 0.5, 2.0, 6.0], &Device::Cpu).unwrap();
        let ours = gelu_tanh(&x).unwrap().to_vec1::<f32>().unwrap();
        let theirs = x.gelu().unwrap().to_vec1::<f32>().unwrap();
        for (a, b) in ours.iter().zip(&theirs) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn schedule_warms_up_then_decays() {
        let c = Config { steps: 100, warmup_steps: 10, lr: 1.0, ..Config::preset("tiny").unwrap() };
        assert!((learning_rate(&c, 0) - 0.1).abs() < 1e-12);
        assert!((learning_rate(&c, 9) - 1.0).abs() < 1e-12);
        assert!(learning_rate(&c, 50) < 1.0 && learning_rate(&c, 50) > 0.1);
        assert!((learning_rate(&c, 100) - 0.1).abs() < 1e-9);
    }

    #[test]
    fn clipping_bounds_the_global_norm() {
        let var = Var::new(&[3f32, 4.], &Device::Cpu).unwrap();
        let loss = var.as_tensor().sqr().unwrap().sum_all().unwrap(); // grad = 2x = (6, 8), norm 10
        let mut grads = loss.backward().unwrap();
        let norm = clip_gradients(&mut grads, &[var.clone()], 1.0).unwrap();
        assert!((norm - 10.0).abs() < 1e-5);
        let g = grads.get(var.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
        assert!((g[0] - 0.6).abs() < 1e-5 && (g[1] - 0.8).abs() < 1e-5);
    }

    #[test]
    fn corpus_is_deterministic_and_structured() {
        let (a, _) = Corpus::new(256, 1).batch(2, 32);
        let (b, _) = Corpus::new(256, 1).batch(2, 32);
        assert_eq!(a, b);
        let mut corpus = Corpus::new(256, 1);
        let (inputs, targets) = corpus.batch(1, 1000);
        // Every target is one of its input's four successors.
        for (i, t) in inputs.iter().zip(&targets) {
            assert!(corpus.successors[*i as usize].contains(t));
        }
    }

    #[test]
    fn bad_configs_are_refused() {
        assert!(Config { heads: 3, ..Config::preset("tiny").unwrap() }.validate().is_err());
        assert!(Config { steps: 0, ..Config::preset("tiny").unwrap() }.validate().is_err());
        assert!(Config::preset("huge").is_none());
    }
}
