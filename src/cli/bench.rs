//! `kiln bench …` and `kiln commission`: run benchmarks on this host, store each run the moment it
//! finishes, and print what was measured.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use super::args::{self, Bench, Dtype, GpuBench, Judge, Source};
use super::inventory::{is_live, live_inventory, take_inventory};
use super::{catch_interrupts, preflight, Ctx, Exit, Output, View, INTERRUPTED};
use kiln_app::commission::{stored_suite, BenchRun, Plan, SuiteEntry, SuiteRun};
use kiln_app::runs::{self, Outcome, Report};
use kiln_app::stored::{store_inventory, store_outcome};
use kiln_inventory::Inventory;
use kiln_text::progress;

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
        data @ Bench::Data { .. } => data_bench(ctx, data),
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
        Bench::Sdc { seconds, store } => {
            preflight(ctx, store)?;
            anyhow::ensure!(seconds > 0.0 && seconds.is_finite(), "--seconds must be positive");
            catch_interrupts();
            let inv = live_inventory()?;
            let outcome = runs::sdc(&inv, seconds, &INTERRUPTED);
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
        Bench::Train { size, layers, d_model, heads, seq, batch, steps, seed, dtype, kernels, gemm, data, store } => {
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
            config.data = data;
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
        Bench::Suite { quick, budget, disk_path, data_dirs, store } => {
            suite(ctx, quick, budget, disk_path, data_dirs, store)
        }
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
            // kiln-gpu's own check of what each GPU will be asked.
            let (size, dtype) = (size.clone(), dtype.clone());
            use kiln_gpu::request::Check;
            kiln_gpu::request::TrainArgs { size, steps: *steps, batch: *batch, dtype, ..Default::default() }.check()?;
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

/// Stores the run unless told not to, and prints it; a failed check exits 1.
/// `kiln bench data`.
fn data_bench(ctx: &Ctx, bench: Bench) -> Result<Output> {
    let Bench::Data {
        dirs,
        layout,
        size_mib,
        shard_mib,
        readers,
        engine,
        buffered,
        prefetch,
        batch,
        accelerators,
        rate,
        bytes_per_token,
        seconds,
        store,
    } = bench
    else {
        unreachable!("called with Bench::Data")
    };
    preflight(ctx, store)?;
    let layout = kiln_bench::data::Layout::parse(&layout)
        .ok_or_else(|| anyhow::anyhow!("--layout {layout:?}: tokens or samples"))?;
    let engine = kiln_bench::data::Engine::parse(&engine)
        .ok_or_else(|| anyhow::anyhow!("--engine {engine:?}: threads or uring"))?;
    anyhow::ensure!(shard_mib >= 1 && size_mib >= shard_mib, "--size-mib must hold at least one --shard-mib shard");
    anyhow::ensure!(seconds > 0.0 && seconds.is_finite(), "--seconds must be positive");
    anyhow::ensure!(prefetch >= 1 && batch >= 1, "--prefetch and --batch must be at least 1");
    anyhow::ensure!(rate.is_none_or(|r| r > 0.0 && r.is_finite()), "--rate is in GB/s and must be positive");
    catch_interrupts();
    let inv = live_inventory()?;
    let rate = match rate {
        Some(r) => Some(r * 1e9),
        None => implied_rate(ctx, &inv, bytes_per_token),
    };
    let config = kiln_bench::data::Config {
        readers: readers.unwrap_or(4 * dirs.len()).max(1),
        engine,
        buffered,
        dirs,
        layout,
        dataset_bytes: size_mib << 20,
        shard_bytes: shard_mib << 20,
        prefetch,
        batch,
        accelerators: accelerators.unwrap_or(inv.gpus.devices.len()).max(1),
        rate,
        seconds,
    };
    let outcome = runs::data(config, &INTERRUPTED)?;
    finish(ctx, &inv, outcome, store)
}

/// Bytes per second this box's latest stored training run implies: its largest tokens/s (all GPUs
/// together where it has that figure) × `bytes_per_token`. `None` without a database or a run.
fn implied_rate(ctx: &Ctx, inv: &Inventory, bytes_per_token: u32) -> Option<f64> {
    let host = inv.os.hostname.clone()?;
    let runs = ctx.with_store(async |store| kiln_db::Queries::runs(store, 2000).await).ok()?;
    let run = runs
        .iter()
        .filter(|r| r.hostname.as_deref() == Some(host.as_str()) && r.status.is_result())
        .filter(|r| matches!(r.benchmark.as_str(), "gpu-train" | "train"))
        .max_by(|a, b| a.started_at.cmp(&b.started_at))?;
    let tokens = run.metrics.iter().filter(|m| m.name.ends_with("tokens_per_s")).map(|m| m.value).fold(0.0, f64::max);
    (tokens > 0.0).then(|| {
        eprintln!(
            "kiln: the accelerators' rate from run {} ({}): {tokens:.0} tokens/s × {bytes_per_token} bytes",
            kiln_text::short(&run.id),
            run.benchmark
        );
        tokens * f64::from(bytes_per_token)
    })
}

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

fn suite(
    ctx: &Ctx,
    quick: bool,
    budget: Option<u64>,
    disk_path: Option<PathBuf>,
    data_dirs: Vec<PathBuf>,
    store: args::Store,
) -> Result<Output> {
    let dirs = kiln_app::commission::SuiteDirs { disk: disk_path, data: data_dirs };
    preflight(ctx, store)?;
    catch_interrupts();
    let inv = live_inventory()?;
    let saved = if store.no_save { None } else { Some(store_inventory(ctx, &inv)?) };
    let done = stored_suite(ctx, &inv, saved.as_ref(), quick, budget, dirs, &INTERRUPTED)?;
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

/// What a verdict sets off: the flags, else the agent file's `on_reject`, `slurm_node` and
/// `on_verdict`.
///
/// # Errors
/// An agent file that does not read, or an `on_reject` in it that is neither `drain` nor `nothing`.
pub fn actions(act: args::Act) -> Result<kiln_app::act::Actions> {
    let file = kiln_serve::upload::AgentFile::read()?;
    let (path, file) = match file {
        Some((path, file)) => (path.display().to_string(), file),
        None => (String::new(), kiln_serve::upload::AgentFile::default()),
    };
    let drain = match (act.on_reject, file.on_reject.as_deref()) {
        (Some(flag), _) => flag == args::OnReject::Drain,
        (None, None | Some("nothing")) => false,
        (None, Some("drain")) => true,
        (None, Some(other)) => anyhow::bail!("{path}: on_reject = {other:?}: expected \"drain\" or \"nothing\""),
    };
    Ok(kiln_app::act::Actions {
        drain,
        slurm_node: act.slurm_node.or(file.slurm_node),
        on_verdict: act.on_verdict.or(file.on_verdict),
    })
}

/// Whether and how long `commission` benchmarks.
pub struct Suite {
    pub no_bench: bool,
    pub budget: Option<u64>,
    /// The data drives' directories (`--data-dir`).
    pub data_dirs: Vec<PathBuf>,
}

/// `kiln commission`: the inventory (stored before any benchmark starts), the quick suite (each
/// run stored as it finishes), the verdict; the workflow is `kiln_app::commission::commission`.
pub fn commission(
    source: &Source,
    suite: Suite,
    judge: &Judge,
    no_verdict: bool,
    acts: kiln_app::act::Actions,
    ctx: &Ctx,
) -> Result<Output> {
    ctx.open_store()?;
    progress("taking the inventory");
    let inv = take_inventory(source)?;
    // The spec is chosen (and a malformed one refused) before minutes of benchmarks.
    let spec = if no_verdict { Err("--no-verdict".to_string()) } else { super::verdict::choose_spec(judge, &inv)? };
    let plan = Plan {
        no_bench: suite.no_bench,
        live: is_live(source),
        budget: suite.budget,
        data_dirs: suite.data_dirs,
        allow_skip: judge.allow_skip,
        database: ctx.db_path()?,
    };
    if !plan.no_bench && plan.live {
        catch_interrupts();
    }
    let mut view = kiln_app::commission::commission(ctx, inv, spec, &plan, &INTERRUPTED)?;
    if let Some(v) = &view.judgement {
        super::verdict::write_ocp(judge, v, &view.inventory)?;
        if acts.drain || acts.on_verdict.is_some() {
            let acted = kiln_app::act::act(v, view.verdict_id.as_deref(), &acts);
            if acted.slurm.as_ref().is_some_and(|s| s.error.is_some())
                || acted.on_verdict.as_ref().is_some_and(|h| h.error.is_some() || h.exit != Some(0))
            {
                eprint!("kiln: warning: {}", acted.render());
            }
            view.acted = Some(acted);
        }
    }
    // The verdict decides the exit; without one (no spec applies), the box is not judged: 3,
    // unless --no-verdict asked for none.
    let exit = match (&view.judgement, no_verdict) {
        (Some(v), _) => super::verdict::exit_of(v.verdict),
        (None, true) => Exit::check(view.failed_check),
        (None, false) => Exit::Inconclusive,
    };
    let exit = if view.failed_check && exit == Exit::Ok { Exit::CheckFailed } else { exit };
    Ok(ctx.output(&view)?.with_exit(exit))
}
