//! `kiln bench …` and `kiln commission`: run benchmarks on this host, store each run the moment it
//! finishes, and print what was measured.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kiln_db::{RunStatus, SavedInventory};
use serde::Serialize;

use super::args::{self, Bench, Dtype, GpuBench, Judge, Source};
use super::inventory::{is_live, live_inventory, store_inventory, take_inventory};
use super::{Ctx, Exit, Output, View};
use crate::inventory::Inventory;
use crate::render::progress;
use crate::runs::{self, Outcome, Report};

/// Set by SIGINT/SIGTERM so that long benchmarks stop cleanly and remove what they created.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// From now on SIGINT and SIGTERM set [`INTERRUPTED`] instead of killing kiln.
pub fn catch_interrupts() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        if let Err(e) = unsafe { signal(sig, SigHandler::Handler(on_signal)) } {
            tracing::warn!(%e, ?sig, "cannot catch the signal; it will stop kiln at once");
        }
    }
}

/// One benchmark's result: `kiln bench X --json`.
#[derive(Serialize)]
pub struct BenchRun<'a> {
    pub benchmark: &'static str,
    pub run_id: Option<String>,
    pub status: RunStatus,
    pub report: &'a Report,
    #[serde(skip)]
    pub text: &'a str,
}

impl<'a> BenchRun<'a> {
    /// What a finished run shows: its outcome, and its id where it was stored.
    pub fn of(outcome: &'a Outcome, run_id: Option<String>) -> BenchRun<'a> {
        BenchRun {
            benchmark: outcome.benchmark(),
            run_id,
            status: outcome.status,
            report: &outcome.report,
            text: &outcome.text,
        }
    }
}

impl View for BenchRun<'_> {
    fn render(&self) -> String {
        let mut text = self.text.to_string();
        if let Some(id) = &self.run_id {
            text.push_str(&format!("stored run {id}\n"));
        }
        text
    }
}

/// `kiln bench suite --json`.
#[derive(Serialize)]
pub struct SuiteRun<'a> {
    pub suite: &'static str,
    pub runs: Vec<SuiteEntry<'a>>,
}

#[derive(Serialize)]
pub struct SuiteEntry<'a> {
    pub benchmark: &'static str,
    pub status: RunStatus,
    pub run_id: Option<String>,
    pub headline: &'a str,
    pub report: &'a Report,
    #[serde(skip)]
    pub text: &'a str,
}

impl View for SuiteRun<'_> {
    fn render(&self) -> String {
        let mut text = String::new();
        for r in &self.runs {
            text.push_str(r.text);
            if let Some(id) = &r.run_id {
                text.push_str(&format!("stored run {id}\n"));
            }
            text.push('\n');
        }
        text
    }
}

pub fn run(what: Bench, ctx: &Ctx) -> Result<Output> {
    match what {
        Bench::Membw { array_mib, warmup, repetitions, store } => {
            preflight(ctx, store)?;
            anyhow::ensure!(repetitions >= 1, "--repetitions must be at least 1");
            let inv = live_inventory()?;
            let elements = match array_mib {
                Some(0) => anyhow::bail!("--array-mib must be at least 1"),
                Some(mib) => mib << 17,
                None => runs::default_membw_elements(&inv),
            };
            let outcome = runs::membw(&inv, kiln_bench::membw::Config { elements, warmup, repetitions });
            finish(ctx, &inv, outcome, store)
        }
        Bench::Disk { path, size_mib, seconds, qd, destructive, store } => {
            preflight(ctx, store)?;
            anyhow::ensure!(size_mib >= 1, "--size-mib must be at least 1");
            anyhow::ensure!(seconds > 0.0, "--seconds must be positive");
            anyhow::ensure!(
                !qd.is_empty() && qd.iter().all(|&d| (1..=256).contains(&d)),
                "--qd takes depths from 1 to 256"
            );
            catch_interrupts();
            let inv = live_inventory()?;
            let config = kiln_bench::disk::Config { size_bytes: size_mib << 20, seconds, queue_depths: qd };
            let outcome = runs::disk(&path, config, destructive, &INTERRUPTED)?;
            finish(ctx, &inv, outcome, store)
        }
        Bench::Net { serve, connect, streams, seconds, repetitions, idle, store } => {
            if let Some(addr) = serve {
                return serve_net(&addr, idle);
            }
            let Some(server) = connect else {
                anyhow::bail!("give --serve [ADDR] on one host and --connect HOST:PORT on the other")
            };
            anyhow::ensure!(
                streams >= 1 && repetitions >= 1 && seconds > 0.0,
                "--streams, --repetitions and --seconds must be positive"
            );
            preflight(ctx, store)?;
            let config = kiln_bench::net::Config {
                streams,
                seconds_per_repetition: seconds,
                repetitions,
                latency_messages: 2000,
            };
            let outcome = runs::net(&server, config)?;
            let inv = live_inventory()?;
            finish(ctx, &inv, outcome, store)
        }
        Bench::Train { size, layers, d_model, heads, seq, batch, steps, seed, dtype, kernels, gemm, store } => {
            preflight(ctx, store)?;
            anyhow::ensure!(
                dtype == Dtype::F32,
                "--dtype {}: the CPU run trains in f32 (bf16 arrives with the CUDA build)",
                format!("{dtype:?}").to_lowercase()
            );
            let mut config = kiln_bench::train::Config::preset(size.name()).context("a preset of every size")?;
            config.layers = layers.unwrap_or(config.layers);
            config.d_model = d_model.unwrap_or(config.d_model);
            config.heads = heads.unwrap_or(config.heads);
            config.seq = seq.unwrap_or(config.seq);
            config.batch = batch.unwrap_or(config.batch);
            config.steps = steps.unwrap_or(config.steps);
            config.warmup_steps = (config.steps / 10).max(2).min(config.steps);
            config.seed = seed.unwrap_or(config.seed);
            config.kernels = kernels;
            // The composed path is candle's reference: it multiplies with candle.
            config.gemm =
                if kernels == kiln_bench::train::Kernels::Fused { gemm } else { kiln_bench::train::Gemm::Candle };
            config.gemm.library()?;
            config.validate()?;
            anyhow::ensure!(
                config.steps >= kiln_bench::train::MIN_STEPS_FOR_VERDICT,
                "--steps {}: a run needs at least {} steps for its learning check to mean anything",
                config.steps,
                kiln_bench::train::MIN_STEPS_FOR_VERDICT
            );
            let inv = live_inventory()?;
            let outcome = runs::train(&inv, &config)?;
            if let Report::Train(t) = &outcome.report {
                if !t.train.learned {
                    let r = &t.train;
                    eprintln!(
                        "kiln: the model did not learn: loss {:.3} -> {:.3}, above the bar of {:.3} for {} steps \
                         (chance {:.3}); the numerics of this machine or stack are suspect",
                        r.loss_start, r.loss_end, r.loss_bar, r.config.steps, r.loss_chance
                    );
                }
            }
            finish(ctx, &inv, outcome, store)
        }
        Bench::Gemm { sizes, dtypes, repetitions, libraries, store } => {
            preflight(ctx, store)?;
            anyhow::ensure!(
                repetitions >= 1 && !sizes.is_empty() && sizes.iter().all(|&n| n >= 1),
                "--sizes and --repetitions must be positive"
            );
            let libraries = gemm_libraries(&libraries)?;
            let dtypes: Vec<&str> = dtypes.iter().map(|d| d.name()).collect();
            let inv = live_inventory()?;
            let outcome = runs::gemm(&inv, &sizes, &dtypes, repetitions, &libraries);
            finish(ctx, &inv, outcome, store)
        }
        Bench::Suite { quick, budget, disk_path, store } => suite(ctx, quick, budget, disk_path, store),
        Bench::Gpu { what } => gpu(what, ctx),
    }
}

/// `kiln bench gpu …`: skipped with the reason where the box cannot run it.
fn gpu(what: GpuBench, ctx: &Ctx) -> Result<Output> {
    let (benchmark, store, gpus) = checked_gpu_options(&what)?;
    preflight(ctx, store)?;
    catch_interrupts();
    let inv = live_inventory()?;
    let gpus = if inv.gpus.devices.is_empty() { Vec::new() } else { gpu_indices(gpus, &inv)? };
    let prepared = match runs::gpu::prepare(&inv, &INTERRUPTED) {
        Ok(p) => p,
        Err(skip) => return skipped(ctx, benchmark, skip),
    };
    let pair_needed = matches!(
        what,
        GpuBench::P2p { .. } | GpuBench::Collectives { .. } | GpuBench::Train { data_parallel: true, .. }
    );
    if pair_needed && gpus.len() < 2 {
        let why = format!("{benchmark} needs two GPUs or more; given {gpus:?}");
        return skipped(ctx, benchmark, runs::gpu::Skip(why));
    }
    let outcome = run_gpu(what, &inv, &prepared, gpus)?;
    anyhow::ensure!(
        !INTERRUPTED.load(Ordering::Relaxed),
        "interrupted before the GPU benchmark finished; nothing stored"
    );
    finish(ctx, &inv, outcome, store)
}

/// A GPU benchmark's options checked before anything runs: its name, how it stores, its `--gpus`.
fn checked_gpu_options(what: &GpuBench) -> Result<(&'static str, args::Store, &Vec<String>)> {
    Ok(match what {
        GpuBench::Gemm { dtypes, n, reps, samples, gpus, timeout, sweep, burn, store } => {
            if let Some(duration) = burn {
                runs::gpu::parse_duration(duration).context("--burn")?;
            }
            if let Some(shapes) = sweep {
                for shape in shapes.split(',') {
                    kiln_gpu::gemm::Shape::parse(shape).context("--sweep")?;
                }
            }
            for d in dtypes {
                anyhow::ensure!(
                    ["bf16", "f16", "f32", "tf32", "fp8"].contains(&d.as_str()),
                    "--dtypes {d}: bf16, f16, f32, tf32 or fp8"
                );
            }
            anyhow::ensure!((16..=65_536).contains(n), "--n {n}: between 16 and 65536");
            anyhow::ensure!(*reps >= 1 && *timeout >= 1, "--reps and --timeout must be positive");
            anyhow::ensure!((1..=*n).contains(samples), "--samples {samples}: between 1 and --n");
            (if burn.is_some() { "gpu-burn" } else { "gpu-gemm" }, *store, gpus)
        }
        GpuBench::Memory { mib, reps, gpus, timeout, store } => {
            anyhow::ensure!((1..=65_536).contains(mib), "--mib {mib}: between 1 and 65536");
            anyhow::ensure!(*reps >= 1 && *timeout >= 1, "--reps and --timeout must be positive");
            ("gpu-memory", *store, gpus)
        }
        GpuBench::P2p { mib, reps, gpus, timeout, store } => {
            anyhow::ensure!((1..=16_384).contains(mib), "--mib {mib}: between 1 and 16384");
            anyhow::ensure!(*reps >= 1 && *timeout >= 1, "--reps and --timeout must be positive");
            ("gpu-p2p", *store, gpus)
        }
        GpuBench::Collectives { min_bytes, max_bytes, ops, iterations, gpus, timeout, store } => {
            anyhow::ensure!(
                (4..=*max_bytes).contains(min_bytes) && *max_bytes <= 16 << 30,
                "--min-bytes and --max-bytes: from 4 bytes to 16G, the smaller first"
            );
            anyhow::ensure!(*iterations >= 1 && *timeout >= 1, "--iterations and --timeout must be positive");
            anyhow::ensure!(
                !ops.iter().any(|o| matches!(o, args::CollectiveOp::AllToAll)),
                "--ops all-to-all: NCCL has no all-to-all call (it is point-to-point sends); all-reduce, \
                 all-gather or reduce-scatter"
            );
            ("gpu-collectives", *store, gpus)
        }
        GpuBench::Train { size, steps, batch, dtype, gpus, timeout, store, .. } => {
            let options = kiln_gpu::train::Options {
                device: 0,
                size: size.clone(),
                steps: *steps,
                batch: *batch,
                precision: kiln_gpu::gemm::Precision::parse(dtype).context("--dtype")?,
                as_rank: None,
            };
            options.config()?;
            anyhow::ensure!(*timeout >= 1, "--timeout must be positive");
            ("gpu-train", *store, gpus)
        }
    })
}

/// Runs a GPU benchmark whose options are checked on `gpus`.
fn run_gpu(what: GpuBench, inv: &Inventory, prepared: &runs::gpu::Prepared, gpus: Vec<usize>) -> Result<Outcome> {
    Ok(match what {
        GpuBench::Gemm { dtypes, n, samples, burn: Some(duration), .. } => {
            let config = runs::gpu::BurnConfig {
                dtype: dtypes[0].clone(),
                n,
                seconds: runs::gpu::parse_duration(&duration)?,
                samples,
                gpus,
            };
            runs::gpu::burn(inv, prepared, config, &INTERRUPTED)
        }
        GpuBench::Gemm { dtypes, n, reps, samples, timeout, sweep, burn: None, .. } => {
            let config = runs::gpu::GemmConfig { dtypes, n, reps, samples, gpus, timeout_s: timeout, sweep };
            runs::gpu::gemm(inv, prepared, config, &INTERRUPTED)
        }
        GpuBench::Memory { mib, reps, timeout, .. } => {
            let config = runs::gpu::MemoryConfig { mib, reps, gpus, timeout_s: timeout };
            runs::gpu::memory(inv, prepared, config, &INTERRUPTED)
        }
        GpuBench::P2p { mib, reps, timeout, .. } => {
            let config = runs::gpu::P2pConfig { mib, reps, gpus, timeout_s: timeout };
            runs::gpu::p2p(inv, prepared, config, &INTERRUPTED)
        }
        GpuBench::Collectives { min_bytes, max_bytes, ops, iterations, timeout, .. } => {
            let collectives = if ops.is_empty() {
                kiln_gpu::collectives::NCCL_COLLECTIVES.to_vec()
            } else {
                ops.into_iter().map(Into::into).collect()
            };
            let config = runs::gpu::CollectivesConfig {
                collectives,
                min_bytes,
                max_bytes,
                iterations,
                gpus,
                timeout_s: timeout,
            };
            runs::gpu::collectives(inv, prepared, config, &INTERRUPTED)
        }
        GpuBench::Train { size, steps, batch, dtype, timeout, data_parallel, .. } => {
            let config = runs::gpu::TrainConfig { size, steps, batch, dtype, gpus, timeout_s: timeout, data_parallel };
            runs::gpu::train(inv, prepared, config, &INTERRUPTED)
        }
    })
}

/// `--gpus`: `all` (every GPU NVML sees), or NVML indices it sees.
fn gpu_indices(values: &[String], inv: &Inventory) -> Result<Vec<usize>> {
    let known: Vec<usize> = inv.gpus.devices.iter().map(|d| d.index as usize).collect();
    if let [one] = values {
        if one == "all" {
            return Ok(known);
        }
    }
    let mut chosen = Vec::new();
    for v in values {
        let i: usize = v.trim().parse().with_context(|| format!("--gpus {v}: give all, or GPU indices"))?;
        anyhow::ensure!(known.contains(&i), "--gpus {i}: NVML sees GPUs {known:?}");
        if !chosen.contains(&i) {
            chosen.push(i);
        }
    }
    Ok(chosen)
}

/// A benchmark that cannot run on this box, and why.
#[derive(Serialize)]
pub struct Skipped {
    pub benchmark: &'static str,
    pub skipped: String,
}

impl View for Skipped {
    fn render(&self) -> String {
        format!("{}: skipped: {}\n", self.benchmark, self.skipped)
    }
}

/// Says why a benchmark was skipped; exit 3, so that a script tells "not measured" from "measured".
fn skipped(ctx: &Ctx, benchmark: &'static str, why: runs::gpu::Skip) -> Result<Output> {
    Ok(ctx.output(&Skipped { benchmark, skipped: why.0 })?.with_exit(Exit::Inconclusive))
}

/// `--libraries`: `all`, `none`, or library keys.
fn gemm_libraries(values: &[String]) -> Result<runs::Libraries> {
    let known = kiln_bench::blas::Kind::ALL.map(kiln_bench::blas::Kind::key);
    match values {
        [one] if one == "all" => Ok(runs::Libraries::All),
        [one] if one == "none" => Ok(runs::Libraries::Only(Vec::new())),
        keys => {
            for k in keys {
                anyhow::ensure!(
                    known.contains(&k.as_str()),
                    "--libraries {k}: give all, none, or some of {}",
                    known.join(", ")
                );
            }
            Ok(runs::Libraries::Only(keys.to_vec()))
        }
    }
}

fn serve_net(addr: &str, idle: u64) -> Result<Output> {
    let listener = std::net::TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
    // The address first, flushed: a script (or a test) reads it to learn the port.
    Output::new(format!("listening on {}", listener.local_addr()?)).print()?;
    kiln_bench::net::serve(listener, Duration::from_secs(idle)).context("serving")?;
    Ok(Output::empty(Exit::Ok))
}

/// Opens the database before a benchmark runs, so that a bad file — or a full disk — stops the job
/// before the minutes of measuring, not after.
pub(crate) fn preflight(ctx: &Ctx, store: args::Store) -> Result<()> {
    if store.no_save {
        return Ok(());
    }
    let path = ctx.db_path()?;
    if let Some(free) = kiln_db::free_bytes(&path) {
        if free < MIN_FREE {
            anyhow::bail!(
                "{}: the filesystem holding the database has {} KiB free, under the {} MiB a benchmark's results \
                 may need; nothing was measured: free space there, or point --db elsewhere (--no-save measures \
                 without storing)",
                path.display(),
                free / 1024,
                MIN_FREE >> 20
            );
        }
    }
    ctx.open_store()
}

/// The room a benchmark wants before it starts: a run with its samples and telemetry, the
/// inventory it is stored with, and the write-ahead log's copies of both, with a margin.
const MIN_FREE: u64 = 16 << 20;

/// Stores the run unless told not to, and prints it; a failed check exits 1.
fn finish(ctx: &Ctx, inv: &Inventory, outcome: Outcome, store: args::Store) -> Result<Output> {
    let run_id = if store.no_save {
        None
    } else {
        let saved = store_inventory(ctx, inv)?;
        Some(store_outcome(ctx, inv, &saved, &outcome)?)
    };
    let view = BenchRun::of(&outcome, run_id);
    Ok(ctx.output(&view)?.with_exit(Exit::check(outcome.failed_check())))
}

/// Stores one outcome as a run against a stored inventory; returns the run's id.
pub(crate) fn store_outcome(ctx: &Ctx, inv: &Inventory, saved: &SavedInventory, outcome: &Outcome) -> Result<String> {
    let run = outcome.to_run(inv, saved.host_id.clone(), saved.inventory_id.clone());
    ctx.with_store(async |store| store.save_run(&run).await)
}

/// The suite's benchmarks, each stored (through `keep`) the moment it finishes.
fn run_suite(
    inv: &Inventory,
    quick: bool,
    budget: Option<u64>,
    disk_path: Option<PathBuf>,
    keep: &mut dyn FnMut(Outcome) -> Result<()>,
) -> Result<()> {
    let started = Instant::now();
    let budget = Duration::from_secs(budget.unwrap_or(if quick { 110 } else { 1800 }));
    let over = |name: &str| {
        let out = started.elapsed() > budget;
        if out {
            eprintln!("kiln: time budget of {} s spent; {name} skipped", budget.as_secs());
        }
        out
    };
    let spent = || started.elapsed() > budget || INTERRUPTED.load(Ordering::Relaxed);
    if !over("membw") {
        let elements = runs::default_membw_elements(inv);
        let repetitions = if quick { 8 } else { 20 };
        let config = kiln_bench::membw::Config { elements, warmup: 1, repetitions };
        until_settled(SUITE_ATTEMPTS, &spent, || Ok(runs::membw(inv, config.clone())), keep)?;
    }
    if !over("gemm") {
        let sizes: &[usize] = if quick { &[512, 1024] } else { &[256, 512, 1024, 2048, 4096] };
        let dtypes: &[&str] = if quick { &["f32"] } else { &["f32", "bf16"] };
        let repetitions = if quick { 5 } else { 10 };
        let libraries = runs::Libraries::All;
        until_settled(SUITE_ATTEMPTS, &spent, || Ok(runs::gemm(inv, sizes, dtypes, repetitions, &libraries)), keep)?;
    }
    if !over("train") {
        let mut config = kiln_bench::train::Config::preset(if quick { "tiny" } else { "anchor" }).context("preset")?;
        config.gemm = kiln_bench::train::Gemm::Auto;
        until_settled(SUITE_ATTEMPTS, &spent, || runs::train(inv, &config), keep)?;
    }
    if !inv.gpus.devices.is_empty() && !over("gpu gemm") && !INTERRUPTED.load(Ordering::Relaxed) {
        match runs::gpu::prepare(inv, &INTERRUPTED) {
            Err(skip) => eprintln!("kiln: gpu gemm skipped: {skip}"),
            Ok(prepared) => {
                let config = runs::gpu::GemmConfig {
                    dtypes: if quick {
                        vec!["bf16".into()]
                    } else {
                        ["bf16", "f16", "f32", "tf32"].map(String::from).to_vec()
                    },
                    n: 8192,
                    reps: if quick { 10 } else { 20 },
                    samples: 32,
                    gpus: inv.gpus.devices.iter().map(|d| d.index as usize).collect(),
                    timeout_s: 300,
                    // The full suite measures each GPU's ceiling too.
                    sweep: (!quick).then(|| kiln_gpu::gemm::DEFAULT_SWEEP.to_string()),
                };
                let measure = || Ok(runs::gpu::gemm(inv, &prepared, config.clone(), &INTERRUPTED));
                until_settled(SUITE_ATTEMPTS, &spent, measure, keep)?;
                if !over("gpu memory") && !INTERRUPTED.load(Ordering::Relaxed) {
                    let config = runs::gpu::MemoryConfig {
                        mib: 1024,
                        reps: if quick { 10 } else { 20 },
                        gpus: inv.gpus.devices.iter().map(|d| d.index as usize).collect(),
                        timeout_s: 300,
                    };
                    let measure = || Ok(runs::gpu::memory(inv, &prepared, config.clone(), &INTERRUPTED));
                    until_settled(SUITE_ATTEMPTS, &spent, measure, keep)?;
                }
                let gpus: Vec<usize> = inv.gpus.devices.iter().map(|d| d.index as usize).collect();
                if gpus.len() > 1 && !over("gpu p2p") && !INTERRUPTED.load(Ordering::Relaxed) {
                    let config = runs::gpu::P2pConfig {
                        mib: 256,
                        reps: if quick { 10 } else { 20 },
                        gpus: gpus.clone(),
                        timeout_s: 600,
                    };
                    let measure = || Ok(runs::gpu::p2p(inv, &prepared, config.clone(), &INTERRUPTED));
                    until_settled(SUITE_ATTEMPTS, &spent, measure, keep)?;
                }
                if gpus.len() > 1 && !over("gpu collectives") && !INTERRUPTED.load(Ordering::Relaxed) {
                    let config = runs::gpu::CollectivesConfig {
                        collectives: kiln_gpu::collectives::NCCL_COLLECTIVES.to_vec(),
                        min_bytes: 8,
                        max_bytes: if quick { 256 << 20 } else { 8 << 30 },
                        iterations: 20,
                        gpus,
                        timeout_s: 900,
                    };
                    let measure = || Ok(runs::gpu::collectives(inv, &prepared, config.clone(), &INTERRUPTED));
                    until_settled(SUITE_ATTEMPTS, &spent, measure, keep)?;
                }
                if !over("gpu train") && !INTERRUPTED.load(Ordering::Relaxed) {
                    let config = runs::gpu::TrainConfig {
                        size: "gpt2".into(),
                        steps: Some(if quick { 10 } else { 20 }),
                        batch: None,
                        dtype: "bf16".into(),
                        gpus: inv.gpus.devices.iter().map(|d| d.index as usize).collect(),
                        timeout_s: 1800,
                        data_parallel: false,
                    };
                    let measure = || Ok(runs::gpu::train(inv, &prepared, config.clone(), &INTERRUPTED));
                    until_settled(SUITE_ATTEMPTS, &spent, measure, keep)?;
                }
            }
        }
    }
    if !over("disk") && !INTERRUPTED.load(Ordering::Relaxed) {
        let dir = disk_path.unwrap_or_else(std::env::temp_dir);
        let config = kiln_bench::disk::Config {
            size_bytes: if quick { 256 << 20 } else { 4 << 30 },
            seconds: if quick { 1.0 } else { 10.0 },
            queue_depths: vec![1, 32],
        };
        keep(runs::disk(&dir, config, false, &INTERRUPTED)?)?;
    }
    Ok(())
}

/// How often the suite measures a benchmark whose run was `disturbed` or `unstable` before it
/// gives up on a result (Phoronix Test Suite's rule: repeat until stable or out of budget).
pub const SUITE_ATTEMPTS: usize = 3;

/// Whether a run's status asks for another attempt: someone shared the CPUs, or the samples
/// spread too far.
fn unsettled(status: RunStatus) -> bool {
    matches!(status, RunStatus::Disturbed | RunStatus::Unstable)
}

/// What [`until_settled`] needs of a run.
trait Attempt {
    fn status(&self) -> RunStatus;
    fn benchmark(&self) -> &'static str;
    /// Adds a line to the run's text and headline.
    fn annotate(&mut self, line: &str);
}

impl Attempt for Outcome {
    fn status(&self) -> RunStatus {
        self.status
    }

    fn benchmark(&self) -> &'static str {
        Outcome::benchmark(self)
    }

    fn annotate(&mut self, line: &str) {
        self.text.push_str(&format!("{line}\n"));
        self.headline = format!("{} ({line})", self.headline);
    }
}

/// Measures until a run is settled (neither disturbed nor unstable), `attempts` are spent or
/// `spent()` says the budget is; every attempt is kept (stored as what it is: a disturbed run is
/// never a result) and an unsettled one says what happens next.
fn until_settled<T: Attempt>(
    attempts: usize,
    spent: &dyn Fn() -> bool,
    mut measure: impl FnMut() -> Result<T>,
    keep: &mut dyn FnMut(T) -> Result<()>,
) -> Result<()> {
    for attempt in 1..=attempts.max(1) {
        let mut outcome = measure()?;
        let settled = !unsettled(outcome.status());
        let last = settled || attempt >= attempts || spent();
        if !settled {
            let next = if !last {
                "measuring it again".to_string()
            } else if attempt >= attempts {
                format!("no settled result after {attempts} attempts")
            } else {
                "the time budget is spent: no settled result".to_string()
            };
            let line = format!("attempt {attempt} of {attempts} was {}; {next}", outcome.status());
            eprintln!("kiln: {} {line}", outcome.benchmark());
            outcome.annotate(&line);
        }
        keep(outcome)?;
        if last {
            break;
        }
    }
    Ok(())
}

/// Runs the suite; with a store, the inventory is stored first and each run as it finishes, so
/// that a failure or a kill later loses only the benchmark that was running.
fn stored_suite(
    ctx: &Ctx,
    inv: &Inventory,
    saved: Option<&SavedInventory>,
    quick: bool,
    budget: Option<u64>,
    disk_path: Option<PathBuf>,
) -> Result<Vec<(Outcome, Option<String>)>> {
    let mut done = Vec::new();
    run_suite(inv, quick, budget, disk_path, &mut |outcome| {
        let id = saved.map(|s| store_outcome(ctx, inv, s, &outcome)).transpose()?;
        done.push((outcome, id));
        Ok(())
    })?;
    Ok(done)
}

fn suite(
    ctx: &Ctx,
    quick: bool,
    budget: Option<u64>,
    disk_path: Option<PathBuf>,
    store: args::Store,
) -> Result<Output> {
    preflight(ctx, store)?;
    catch_interrupts();
    let inv = live_inventory()?;
    let saved = if store.no_save { None } else { Some(store_inventory(ctx, &inv)?) };
    let done = stored_suite(ctx, &inv, saved.as_ref(), quick, budget, disk_path)?;
    let failed = done.iter().any(|(o, _)| o.failed_check());
    let runs = done
        .iter()
        .map(|(o, id)| SuiteEntry {
            benchmark: o.benchmark(),
            status: o.status,
            run_id: id.clone(),
            headline: &o.headline,
            report: &o.report,
            text: &o.text,
        })
        .collect();
    let view = SuiteRun { suite: if quick { "quick" } else { "full" }, runs };
    Ok(ctx.output(&view)?.with_exit(Exit::check(failed)))
}

/// `kiln commission --json`.
#[derive(Serialize)]
pub struct Commission {
    pub kind: &'static str,
    pub inventory: Inventory,
    pub benchmarks: Vec<CommissionRun>,
    pub stored: Stored,
    /// The verdict (`verdict`, `spec`, `counts`, `checks` at the top level), when one was reached.
    #[serde(flatten)]
    pub judgement: Option<crate::verdict::Verdict>,
    /// Why there is no verdict (no spec applies, or `--no-verdict`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_verdict: Option<String>,
    pub verdict_id: Option<String>,
    #[serde(skip)]
    pub live: bool,
}

#[derive(Serialize)]
pub struct CommissionRun {
    pub benchmark: &'static str,
    pub status: RunStatus,
    pub run_id: String,
    pub headline: String,
}

#[derive(Serialize)]
pub struct Stored {
    pub database: PathBuf,
    pub inventory_id: String,
    pub host_id: String,
    pub new_host: bool,
}

impl View for Commission {
    fn render(&self) -> String {
        let mut text = crate::render::summary(&self.inventory);
        if !self.benchmarks.is_empty() {
            text.push_str("\nbenchmarks (quick suite)\n");
            for b in &self.benchmarks {
                text.push_str(&format!(
                    "  {:<8} {:<9} {}  [run {}]\n",
                    b.benchmark,
                    b.status,
                    b.headline,
                    &b.run_id[..8]
                ));
            }
        } else if !self.live {
            text.push_str("\nbenchmarks skipped: they measure this machine, not the snapshot under --root\n");
        }
        let s = &self.stored;
        text.push_str(&format!(
            "\nstored    inventory {} for {} host {}\n          in {}\n",
            s.inventory_id,
            if s.new_host { "new" } else { "known" },
            s.host_id,
            s.database.display()
        ));
        match (&self.judgement, &self.no_verdict) {
            (Some(v), _) => {
                text.push('\n');
                text.push_str(&v.render(false));
            }
            (None, Some(why)) => text.push_str(&format!("\nno verdict: {why}\n")),
            (None, None) => {}
        }
        text
    }
}

/// `kiln commission`: the inventory (stored before any benchmark starts), the quick suite (each
/// run stored as it finishes), the summary.
/// Whether and how long `commission` benchmarks.
pub struct Suite {
    pub no_bench: bool,
    pub budget: Option<u64>,
}

pub fn commission(source: &Source, suite: Suite, judge: &Judge, no_verdict: bool, ctx: &Ctx) -> Result<Output> {
    let Suite { no_bench, budget } = suite;
    ctx.open_store()?;
    progress("taking the inventory");
    let inv = take_inventory(source)?;
    // The spec is chosen (and a malformed one refused) before minutes of benchmarks.
    let spec = if no_verdict { Err("--no-verdict".to_string()) } else { super::verdict::choose_spec(judge, &inv)? };
    let saved = store_inventory(ctx, &inv)?;
    let live = is_live(source);
    let done = if no_bench || !live {
        Vec::new()
    } else {
        catch_interrupts();
        stored_suite(ctx, &inv, Some(&saved), true, budget, None)?
    };
    let failed = done.iter().any(|(o, _)| o.failed_check());
    let benchmarks = done
        .into_iter()
        .map(|(o, id)| CommissionRun {
            benchmark: o.benchmark(),
            status: o.status,
            run_id: id.unwrap_or_default(),
            headline: o.headline,
        })
        .collect();
    let (judgement, verdict_id, why_none) = match spec {
        Ok(spec) => {
            let stored = super::verdict::Stored { inventory_id: &saved.inventory_id, host_id: &saved.host_id };
            let (v, id) = super::verdict::judge_stored(ctx, &inv, &stored, &spec, judge, true, true)?;
            (Some(v), id, None)
        }
        Err(why) => (None, None, Some(why)),
    };
    // The verdict decides the exit; without one (no spec applies), the box is not judged: 3,
    // unless --no-verdict asked for none.
    let exit = match (&judgement, no_verdict) {
        (Some(v), _) => super::verdict::exit_of(v.verdict),
        (None, true) => Exit::check(failed),
        (None, false) => Exit::Inconclusive,
    };
    let stored = Stored {
        database: ctx.db_path()?,
        inventory_id: saved.inventory_id,
        host_id: saved.host_id,
        new_host: saved.new_host,
    };
    let view = Commission {
        kind: "commission",
        inventory: inv,
        benchmarks,
        stored,
        judgement,
        no_verdict: why_none,
        verdict_id,
        live,
    };
    let exit = if failed && exit == Exit::Ok { Exit::CheckFailed } else { exit };
    Ok(ctx.output(&view)?.with_exit(exit))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(RunStatus, Vec<String>);

    impl Attempt for Fake {
        fn status(&self) -> RunStatus {
            self.0
        }
        fn benchmark(&self) -> &'static str {
            "membw"
        }
        fn annotate(&mut self, line: &str) {
            self.1.push(line.to_string());
        }
    }

    /// Runs `until_settled` over a scripted series of statuses; what was kept.
    fn settle(script: &[RunStatus], attempts: usize, budget_after: usize) -> Vec<(RunStatus, Vec<String>)> {
        let measured = std::cell::Cell::new(0);
        let mut kept = Vec::new();
        let spent = || measured.get() >= budget_after;
        until_settled(
            attempts,
            &spent,
            || {
                measured.set(measured.get() + 1);
                Ok(Fake(script[measured.get() - 1], Vec::new()))
            },
            &mut |f: Fake| {
                kept.push((f.0, f.1));
                Ok(())
            },
        )
        .unwrap();
        kept
    }

    #[test]
    fn disturbed_runs_are_repeated_until_settled_or_spent() {
        use RunStatus::{Disturbed, Invalid, Ok, Unstable};
        // Settled at once: one run, nothing said.
        assert_eq!(settle(&[Ok], 3, 99), [(Ok, vec![])]);
        // Disturbed, then unstable, then settled: all three kept, each unsettled one says so.
        let kept = settle(&[Disturbed, Unstable, Ok], 3, 99);
        assert_eq!(kept.iter().map(|k| k.0).collect::<Vec<_>>(), [Disturbed, Unstable, Ok]);
        assert_eq!(kept[0].1, ["attempt 1 of 3 was disturbed; measuring it again"]);
        assert!(kept[2].1.is_empty());
        // Never settled: the last attempt says the attempts are spent.
        let kept = settle(&[Disturbed; 3], 3, 99);
        assert_eq!(kept[2].1, ["attempt 3 of 3 was disturbed; no settled result after 3 attempts"]);
        // The budget ends the repeats early, and says so.
        let kept = settle(&[Disturbed; 3], 3, 1);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].1, ["attempt 1 of 3 was disturbed; the time budget is spent: no settled result"]);
        // A failed check is not repeated: it is an answer.
        assert_eq!(settle(&[Invalid], 3, 99).len(), 1);
    }
}
