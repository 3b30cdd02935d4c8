//! The commission and suite workflows, front-end neutral: the suite's benchmarks in order within a
//! time budget, each measured again while it comes out `disturbed` or `unstable`
//! (`until_settled`), every attempt stored the moment it finishes (`stored_suite`); `commission`
//! (the inventory stored before any benchmark starts, the quick suite, the verdict); and the views
//! of one run, a suite and a commission. The caller owns the interrupt flag (set by its signal
//! handler), the store ([`Stores`]) and the exit status.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kiln_db::{RunStatus, SavedInventory};
use kiln_inventory::Inventory;
use kiln_sku::spec::LoadedSpec;
use serde::Serialize;

use crate::runs::{self, Outcome, Report};
use crate::stored::{store_inventory, store_outcome, Stores};
use crate::views::View;

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

/// Runs the suite; with a stored inventory, each run is stored as it finishes, so that a failure
/// or a kill later loses only the benchmark that was running. Each outcome with its run's id.
///
/// # Errors
/// A benchmark that could not run, or the store's.
pub fn stored_suite(
    stores: &impl Stores,
    inv: &Inventory,
    saved: Option<&SavedInventory>,
    quick: bool,
    budget: Option<u64>,
    dirs: SuiteDirs,
    interrupted: &AtomicBool,
) -> Result<Vec<(Outcome, Option<String>)>> {
    let mut done = Vec::new();
    run_suite(inv, quick, budget, dirs, interrupted, &mut |outcome| {
        let id = saved.map(|s| store_outcome(stores, inv, s, &outcome)).transpose()?;
        done.push((outcome, id));
        Ok(())
    })?;
    Ok(done)
}

/// What `commission` does besides taking the inventory.
pub struct Plan {
    /// Benchmarks are skipped (`--no-bench`), or measure another machine than this one (an
    /// inventory of a snapshot under `--root`): then none run.
    pub no_bench: bool,
    pub live: bool,
    /// The quick suite's time budget, in seconds.
    pub budget: Option<u64>,
    /// The data drives' directories, for `kiln bench data` in the suite.
    pub data_dirs: Vec<PathBuf>,
    /// A check of the spec may be skipped (`--allow-skip`).
    pub allow_skip: bool,
    /// Where the store is, as the view names it.
    pub database: PathBuf,
}

/// `kiln commission`: the inventory stored before any benchmark starts, the quick suite (each run
/// stored as it finishes), and the verdict of `spec` (or why there is none) stored with them.
///
/// # Errors
/// The store's, or a benchmark that could not run.
pub fn commission(
    stores: &impl Stores,
    inv: Inventory,
    spec: std::result::Result<LoadedSpec, String>,
    plan: &Plan,
    interrupted: &AtomicBool,
) -> Result<Commission> {
    let saved = store_inventory(stores, &inv)?;
    let done = if plan.no_bench || !plan.live {
        Vec::new()
    } else {
        let dirs = SuiteDirs { disk: None, data: plan.data_dirs.clone() };
        stored_suite(stores, &inv, Some(&saved), true, plan.budget, dirs, interrupted)?
    };
    let failed_check = done.iter().any(|(o, _)| o.failed_check());
    let benchmarks = done
        .into_iter()
        .map(|(o, id)| CommissionRun {
            benchmark: o.benchmark(),
            status: o.status,
            run_id: id.unwrap_or_default(),
            headline: o.headline,
        })
        .collect();
    let (judgement, verdict_id, no_verdict) = match spec {
        Ok(spec) => {
            let ids = crate::judging::Stored { inventory_id: &saved.inventory_id, host_id: &saved.host_id };
            let (v, id) = crate::judging::judge_stored(stores, &inv, &ids, &spec, plan.allow_skip, true, true)?;
            (Some(v), id, None)
        }
        Err(why) => (None, None, Some(why)),
    };
    let stored = Stored {
        database: plan.database.clone(),
        inventory_id: saved.inventory_id,
        host_id: saved.host_id,
        new_host: saved.new_host,
    };
    Ok(Commission {
        kind: "commission",
        inventory: inv,
        benchmarks,
        stored,
        judgement,
        no_verdict,
        verdict_id,
        live: plan.live,
        failed_check,
        acted: None,
    })
}

/// Where the suite's storage benchmarks write.
#[derive(Debug, Clone, Default)]
pub struct SuiteDirs {
    /// The disk benchmark's scratch file's directory (default: the temporary directory).
    pub disk: Option<PathBuf>,
    /// The data drives' directories: `kiln bench data` runs there when any is given.
    pub data: Vec<PathBuf>,
}

/// The suite's benchmarks, each stored (through `keep`) the moment it finishes.
pub fn run_suite(
    inv: &Inventory,
    quick: bool,
    budget: Option<u64>,
    dirs: SuiteDirs,
    interrupted: &AtomicBool,
    keep: &mut dyn FnMut(Outcome) -> Result<()>,
) -> Result<()> {
    // The largest training throughput the suite measured (tokens/s): the rate its data must flow.
    let tokens_per_s = std::cell::Cell::new(0.0f64);
    let keep = &mut |outcome: Outcome| {
        if matches!(outcome.benchmark(), "train" | "gpu-train") && outcome.status.is_result() {
            for m in outcome.metrics.iter().filter(|m| m.name.ends_with("tokens_per_s")) {
                tokens_per_s.set(tokens_per_s.get().max(m.value));
            }
        }
        keep(outcome)
    };
    let started = Instant::now();
    let started_at = kiln_text::timefmt::now_rfc3339();
    let budget = Duration::from_secs(budget.unwrap_or(if quick { 110 } else { 1800 }));
    let over = |name: &str| {
        let out = started.elapsed() > budget;
        if out {
            eprintln!("kiln: time budget of {} s spent; {name} skipped", budget.as_secs());
        }
        out
    };
    let spent = || started.elapsed() > budget || interrupted.load(Ordering::Relaxed);
    // The harness first: a stack other than the one the applied images pin (a NCCL upgraded by
    // hand, a driver installed but not rebooted into) measures kiln's fault, not the hardware's.
    let pins = kiln_provision::software::pin_faults(&kiln_provision::plan::Target::new(std::path::Path::new("/")));
    if !pins.is_empty() {
        eprintln!("kiln: the software stack is not what the applied images pin: {}", pins.join("; "));
        keep(runs::harness_fault("image pins", &pins.join("; ")))?;
    }
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
    if !over("sdc") && !interrupted.load(Ordering::Relaxed) {
        keep(runs::sdc(inv, if quick { 5.0 } else { 60.0 }, interrupted))?;
    }
    if !inv.gpus.devices.is_empty() && !over("gpu gemm") && !interrupted.load(Ordering::Relaxed) {
        gpu_suite(inv, quick, &over, &spent, interrupted, keep)?;
    }
    if !over("disk") && !interrupted.load(Ordering::Relaxed) {
        let dir = dirs.disk.unwrap_or_else(std::env::temp_dir);
        let config = kiln_bench::disk::Config {
            size_bytes: if quick { 256 << 20 } else { 4 << 30 },
            seconds: if quick { 1.0 } else { 10.0 },
            queue_depths: vec![1, 32],
        };
        keep(runs::disk(&dir, config, false, interrupted)?)?;
    }
    if !dirs.data.is_empty() && !over("data") && !interrupted.load(Ordering::Relaxed) {
        // uint16 token ids: two bytes a token, at what the suite's own training consumed.
        let rate = Some(tokens_per_s.get() * 2.0).filter(|r| *r > 0.0);
        let config = kiln_bench::data::Config {
            readers: 4 * dirs.data.len(),
            dirs: dirs.data,
            layout: kiln_bench::data::Layout::Tokens,
            dataset_bytes: if quick { 512 << 20 } else { 8 << 30 },
            shard_bytes: 64 << 20,
            engine: kiln_bench::data::Engine::Threads,
            buffered: false,
            prefetch: 64,
            batch: 8,
            accelerators: inv.gpus.devices.len().max(1),
            rate,
            seconds: if quick { 2.0 } else { 10.0 },
        };
        keep(runs::data(config, interrupted)?)?;
    }
    // The error counters again, so that the verdict judges what the suite's load caused.
    if let Some(outcome) = runs::counters_after(inv, started_at, started.elapsed().as_secs_f64()) {
        keep(outcome)?;
    }
    Ok(())
}

/// The suite's GPU benchmarks (gemm, memory, p2p, collectives, train), each repeated until
/// settled while the budget lasts.
fn gpu_suite(
    inv: &Inventory,
    quick: bool,
    over: &dyn Fn(&str) -> bool,
    spent: &dyn Fn() -> bool,
    interrupted: &AtomicBool,
    keep: &mut dyn FnMut(Outcome) -> Result<()>,
) -> Result<()> {
    match runs::gpu::prepare(inv, interrupted) {
        // NVML sees GPUs that kiln-gpu cannot measure: kiln's own stack is at fault, and the
        // verdict must say so rather than accept the box without its GPU benchmarks.
        // Interrupted while asking kiln-gpu for its devices: nobody's fault, nothing to store.
        Err(_) if interrupted.load(Ordering::Relaxed) => {}
        Err(skip) => {
            eprintln!("kiln: the GPU benchmarks cannot run: {skip}");
            keep(runs::harness_fault("kiln-gpu", &skip.to_string()))?;
        }
        Ok(prepared) => {
            let gpus: Vec<usize> = inv.gpus.devices.iter().map(|d| d.index as usize).collect();
            if let Err(why) = runs::gpu::known_answers(&prepared, &gpus, interrupted) {
                eprintln!("kiln: the GPU benchmarks cannot be trusted: {why}");
                keep(runs::harness_fault("known answers", &why))?;
                return Ok(());
            }
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
            let measure = || Ok(runs::gpu::gemm(inv, &prepared, config.clone(), interrupted));
            until_settled(SUITE_ATTEMPTS, &spent, measure, keep)?;
            if !over("gpu memory") && !interrupted.load(Ordering::Relaxed) {
                let config = runs::gpu::MemoryConfig {
                    mib: 1024,
                    reps: if quick { 10 } else { 20 },
                    gpus: inv.gpus.devices.iter().map(|d| d.index as usize).collect(),
                    timeout_s: 300,
                };
                let measure = || Ok(runs::gpu::memory(inv, &prepared, config.clone(), interrupted));
                until_settled(SUITE_ATTEMPTS, &spent, measure, keep)?;
            }
            let gpus: Vec<usize> = inv.gpus.devices.iter().map(|d| d.index as usize).collect();
            if gpus.len() > 1 && !over("gpu p2p") && !interrupted.load(Ordering::Relaxed) {
                let config = runs::gpu::P2pConfig {
                    mib: 256,
                    reps: if quick { 10 } else { 20 },
                    gpus: gpus.clone(),
                    timeout_s: 600,
                };
                let measure = || Ok(runs::gpu::p2p(inv, &prepared, config.clone(), interrupted));
                until_settled(SUITE_ATTEMPTS, &spent, measure, keep)?;
            }
            if gpus.len() > 1 && !over("gpu collectives") && !interrupted.load(Ordering::Relaxed) {
                let config = runs::gpu::CollectivesConfig {
                    collectives: kiln_gpu::collectives::NCCL_COLLECTIVES.to_vec(),
                    min_bytes: 8,
                    max_bytes: if quick { 1 << 30 } else { 8 << 30 },
                    iterations: 20,
                    gpus,
                    timeout_s: 900,
                };
                let measure = || Ok(runs::gpu::collectives(inv, &prepared, config.clone(), interrupted));
                until_settled(SUITE_ATTEMPTS, &spent, measure, keep)?;
            }
            if !over("gpu train") && !interrupted.load(Ordering::Relaxed) {
                let config = runs::gpu::TrainConfig {
                    size: "gpt2".into(),
                    steps: Some(if quick { 10 } else { 20 }),
                    batch: None,
                    dtype: "bf16".into(),
                    gpus: inv.gpus.devices.iter().map(|d| d.index as usize).collect(),
                    timeout_s: 1800,
                    data_parallel: false,
                };
                let measure = || Ok(runs::gpu::train(inv, &prepared, config.clone(), interrupted));
                until_settled(SUITE_ATTEMPTS, &spent, measure, keep)?;
            }
        }
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
pub trait Attempt {
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
pub fn until_settled<T: Attempt>(
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

/// `kiln commission --json`.
#[derive(Serialize)]
pub struct Commission {
    pub kind: &'static str,
    pub inventory: Inventory,
    pub benchmarks: Vec<CommissionRun>,
    pub stored: Stored,
    /// The verdict (`verdict`, `spec`, `counts`, `checks` at the top level), when one was reached.
    #[serde(flatten)]
    pub judgement: Option<kiln_sku::verdict::Verdict>,
    /// Why there is no verdict (no spec applies, or `--no-verdict`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_verdict: Option<String>,
    pub verdict_id: Option<String>,
    #[serde(skip)]
    pub live: bool,
    /// A benchmark's own check failed (a wrong result, say).
    #[serde(skip)]
    pub failed_check: bool,
    /// What was done about the verdict where the cluster is scheduled (`crate::act`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acted: Option<crate::act::Acted>,
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
        let mut text = kiln_inventory::summary::summary(&self.inventory);
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
        if let Some(acted) = &self.acted {
            text.push_str(&acted.render());
        }
        text
    }
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
