//! The `kiln` command line. Only this file knows about clap, the tokio runtime, the log
//! subscriber, output formats and exit codes (0 ok, 1 a check failed, 2 an error).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kiln::inventory::{self, Inventory};
use kiln::render::{self, progress};
use kiln_db::{NewInventory, Store};

#[derive(Parser)]
#[command(name = "kiln", version, about = "Inventory, provision, benchmark and compare AI training servers")]
struct Cli {
    /// The results database [default: /var/lib/kiln/kiln.db as root, else ~/.local/share/kiln/kiln.db]
    #[arg(long, global = true, env = "KILN_DB", value_name = "PATH")]
    db: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// Where and how to take the inventory.
#[derive(clap::Args)]
struct Source {
    /// Read DIR/proc, DIR/sys and DIR/etc instead of the live system
    #[arg(long, default_value = "/", value_name = "DIR")]
    root: PathBuf,
    /// The NVML library to load [default: libnvidia-ml.so.1 on the live system, none for --root]
    #[arg(long, env = "KILN_NVML_LIB", value_name = "PATH")]
    nvml_lib: Option<PathBuf>,
    /// List virtual network interfaces too
    #[arg(long)]
    all: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Take the hardware inventory of this machine (or of a snapshot with --root)
    Inventory {
        #[command(flatten)]
        source: Source,
        /// Print the full JSON document instead of the summary
        #[arg(long)]
        json: bool,
        /// Store the inventory in the results database
        #[arg(long)]
        save: bool,
    },
    /// Commission this machine: inventory, the quick benchmark suite, store, and summarise (the main job)
    Commission {
        #[command(flatten)]
        source: Source,
        /// Inventory only, no benchmarks
        #[arg(long)]
        no_bench: bool,
        /// Time budget of the benchmark suite, in seconds
        #[arg(long, value_name = "SECONDS")]
        budget: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// The GPU and NIC connection matrix, like `nvidia-smi topo -m`
    Topo {
        #[command(flatten)]
        source: Source,
        #[arg(long)]
        json: bool,
    },
    /// Run a benchmark on this machine and store the run
    Bench {
        #[command(subcommand)]
        what: Bench,
    },
    /// List the stored benchmark runs, newest first
    Runs {
        #[arg(long, default_value_t = 20)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
    /// List the hosts in the results database
    Hosts {
        #[arg(long)]
        json: bool,
    },
    /// Print a stored record
    Show {
        #[command(subcommand)]
        what: Show,
    },
    /// Compare results: every configuration side by side (--by config), or two configurations, hosts or software stacks (A B)
    Compare {
        /// Two of a kind: configuration (fingerprint prefix or name), host (id prefix or host name) or software stack (fingerprint prefix); `config:`, `host:`, `software:` force the kind
        #[arg(num_args = 0..=2, value_name = "A B")]
        subjects: Vec<String>,
        /// `config`: one row per configuration fingerprint
        #[arg(long, value_name = "config")]
        by: Option<String>,
        /// Only this metric (`name` or `benchmark:name`)
        #[arg(long)]
        metric: Option<String>,
        /// Prices per configuration (TOML: "<fingerprint or name>" = price) for perf per unit price
        #[arg(long, value_name = "FILE")]
        prices: Option<PathBuf>,
        /// Merge results of different software stacks (kept apart by default)
        #[arg(long)]
        across_software: bool,
        /// Only runs within this window (30d, 12h, 2w)
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
        /// The noise threshold for a verdict, as a fraction
        #[arg(long, default_value_t = kiln::fleet::NOISE)]
        noise: f64,
        #[arg(long)]
        json: bool,
    },
    /// Hosts far from their configuration's distribution (robust z-score on the MAD), with telemetry that may explain it
    Outliers {
        #[arg(long)]
        metric: Option<String>,
        /// |z| above which a host is an outlier
        #[arg(long, default_value_t = 3.5)]
        threshold: f64,
        /// …and at least this far from the group's median, as a fraction (a tight group would otherwise flag differences nobody acts on)
        #[arg(long, default_value_t = kiln::fleet::MIN_DEVIATION)]
        min_deviation: f64,
        #[arg(long)]
        across_software: bool,
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Step changes for the worse in the nightly series, per host and per configuration; exit 1 when any
    Regressions {
        #[arg(long, default_value = "30d", value_name = "DURATION")]
        since: String,
        #[arg(long)]
        metric: Option<String>,
        #[arg(long, default_value_t = kiln::fleet::NOISE)]
        noise: f64,
        #[arg(long)]
        json: bool,
    },
    /// Write every host, inventory, run, metric, sample and telemetry record as JSON lines (to stdout)
    Export {
        /// Only runs within this window (30d, 12h, 2w)
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
        /// Write to FILE instead of stdout
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Import exports (idempotent: records already here are skipped; a malformed file imports nothing); `-` reads standard input
    Import {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// A self-contained report with plots: a host, a configuration or a run against the fleet
    Report {
        #[arg(long, value_name = "HOST", group = "subject")]
        host: Option<String>,
        #[arg(long, value_name = "CONFIG", group = "subject")]
        config: Option<String>,
        #[arg(long, value_name = "RUN", group = "subject")]
        run: Option<String>,
        /// Write HTML (inline SVG, no external assets) to FILE
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        /// Write Markdown to FILE (for a ticket)
        #[arg(long, value_name = "FILE")]
        markdown: Option<PathBuf>,
        #[arg(long, default_value = "30d", value_name = "DURATION")]
        since: String,
    },
    /// Provision from declarative image specs (images/*.toml): plan, apply, verify, status, lint, log
    Provision {
        #[command(subcommand)]
        what: Provision,
    },
}

/// Which root an image targets and where image names are looked up.
#[derive(clap::Args)]
struct ProvisionTarget {
    /// Target another root (a chroot, an image being built) instead of this machine
    #[arg(long, default_value = "/", value_name = "DIR")]
    root: PathBuf,
    /// Where image names are looked up [default: ./images, <prefix>/share/kiln/images, /usr/share/kiln/images, /etc/kiln/images]
    #[arg(long, env = "KILN_IMAGES", value_name = "DIR")]
    images: Option<PathBuf>,
    /// Change nothing: show what would be done (plan, verify, status, lint and log never change anything)
    #[arg(long)]
    dry_run: bool,
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum Provision {
    /// What applying IMAGE would change, in order, and why
    Plan {
        /// An image name (images/NAME.toml) or a path to a spec
        image: String,
        #[command(flatten)]
        target: ProvisionTarget,
    },
    /// Make the machine match IMAGE, one journaled step at a time (needs root)
    Apply {
        image: String,
        #[command(flatten)]
        target: ProvisionTarget,
        /// Continue an apply that was killed, interrupted or failed, in the same journal
        #[arg(long)]
        resume: bool,
        /// Stream each step's output to stderr
        #[arg(long, short)]
        verbose: bool,
    },
    /// Report drift from IMAGE and run its checks; exit 1 on any drift or failed check
    Verify {
        image: String,
        #[command(flatten)]
        target: ProvisionTarget,
    },
    /// The software fingerprint: kernel, driver, fabric manager, CUDA, NCCL, cuDNN, Python frameworks, images
    Status {
        #[command(flatten)]
        target: ProvisionTarget,
    },
    /// Check specs for errors and NVIDIA pin consistency [default: every image in the image directory]
    Lint {
        /// Image names or spec paths
        #[arg(value_name = "IMAGE")]
        specs: Vec<String>,
        #[command(flatten)]
        target: ProvisionTarget,
    },
    /// The journal: recent applies, or one apply's steps
    Log {
        /// Only applies of this image
        image: Option<String>,
        /// Show this apply's steps (an id or unique prefix)
        #[arg(long, value_name = "ID")]
        apply: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: i64,
        #[command(flatten)]
        target: ProvisionTarget,
    },
}

#[derive(Subcommand)]
enum Show {
    /// A stored inventory, by its id or a unique prefix of it
    Inventory {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// A stored run with its metrics, raw samples and telemetry
    Run {
        id: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// Host memory bandwidth: the STREAM kernels per NUMA node and in total
    Membw {
        /// Size of each of the three arrays [default: 4x the last-level caches, at least 64 MiB]
        #[arg(long, value_name = "MIB")]
        array_mib: Option<usize>,
        #[arg(long, default_value_t = 2)]
        warmup: usize,
        #[arg(long, default_value_t = 10)]
        repetitions: usize,
        /// Do not store the run
        #[arg(long)]
        no_save: bool,
        #[arg(long)]
        json: bool,
    },
    /// The set a commission or a nightly run uses: membw, gemm, train, disk, within a time budget
    Suite {
        /// The short set (under two minutes on a small VM)
        #[arg(long)]
        quick: bool,
        /// Stop starting benchmarks after this many seconds
        #[arg(long, value_name = "SECONDS")]
        budget: Option<u64>,
        /// Where the disk benchmark writes its temporary file [default: the temporary directory]
        #[arg(long, value_name = "DIR")]
        disk_path: Option<PathBuf>,
        #[arg(long)]
        no_save: bool,
        #[arg(long)]
        json: bool,
    },
    /// The reference training run: a GPT-style transformer trained with AdamW (candle, on the CPU)
    Train {
        /// tiny, anchor, small, gpt2, 350m, 1b
        #[arg(long, default_value = "tiny")]
        size: String,
        #[arg(long)]
        layers: Option<usize>,
        #[arg(long)]
        d_model: Option<usize>,
        #[arg(long)]
        heads: Option<usize>,
        #[arg(long)]
        seq: Option<usize>,
        #[arg(long)]
        batch: Option<usize>,
        #[arg(long)]
        steps: Option<usize>,
        #[arg(long)]
        seed: Option<u64>,
        /// Only f32 on the CPU for now
        #[arg(long, default_value = "f32")]
        dtype: String,
        /// fused: kiln's CPU kernels with hand-written backward passes; composed: candle's elementary ops
        #[arg(long, default_value = "fused")]
        kernels: kiln_bench::train::Kernels,
        #[arg(long)]
        no_save: bool,
        #[arg(long)]
        json: bool,
    },
    /// Dense matrix multiply per dtype and size, against the measured FMA peak
    Gemm {
        #[arg(long, value_delimiter = ',', default_value = "256,512,1024,2048")]
        sizes: Vec<usize>,
        #[arg(long, value_delimiter = ',', default_value = "f32,bf16,f16")]
        dtypes: Vec<String>,
        #[arg(long, default_value_t = 10)]
        repetitions: usize,
        #[arg(long)]
        no_save: bool,
        #[arg(long)]
        json: bool,
    },
    /// Network: TCP throughput and latency to another kiln (`--serve` there, `--connect` here)
    Net {
        /// Serve clients on this address until idle for --idle seconds
        #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "0.0.0.0:5201", conflicts_with = "connect")]
        serve: Option<String>,
        /// Measure against a serving kiln
        #[arg(long, value_name = "HOST:PORT")]
        connect: Option<String>,
        #[arg(long, default_value_t = 4)]
        streams: usize,
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        #[arg(long, default_value_t = 5)]
        repetitions: usize,
        /// The server stops after this many seconds without a connection
        #[arg(long, default_value_t = 600)]
        idle: u64,
        #[arg(long)]
        no_save: bool,
        #[arg(long)]
        json: bool,
    },
    /// Storage: sequential and 4 KiB random read/write, O_DIRECT, at several queue depths
    Disk {
        /// A directory (a temporary file in it, removed afterwards) or a block device
        path: PathBuf,
        /// Size of the test file or device region
        #[arg(long, default_value_t = 1024, value_name = "MIB")]
        size_mib: u64,
        /// Seconds per test
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Queue depths for the random tests
        #[arg(long, value_delimiter = ',', default_value = "1,32")]
        qd: Vec<usize>,
        /// Allow writing to a block device that holds a partition table or a filesystem
        #[arg(long)]
        destructive: bool,
        #[arg(long)]
        no_save: bool,
        #[arg(long)]
        json: bool,
    },
}

/// Set by SIGINT/SIGTERM so that long benchmarks stop cleanly and remove what they created.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

fn catch_interrupts() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

fn main() -> ExitCode {
    // candle's CPU worker threads spin 25,000 times after every elementwise op before they sleep;
    // meanwhile the matmuls run on rayon's threads, and on a small machine the spinning worker
    // takes a core from them: a CPU training step is 7-13 % faster when the workers sleep at once
    // (measured on 2 cores). Set before any thread exists; a user's own setting wins.
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", "0");
    }
    let cli = Cli::parse();
    init_logging();
    match run(cli) {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kiln: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KILN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

/// Writes to stdout; a closed pipe (`kiln ... | head`) surfaces as BrokenPipe and ends quietly.
fn emit(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    if !text.ends_with('\n') {
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

fn emit_json<T: serde::Serialize>(value: &T) -> Result<()> {
    emit(&serde_json::to_string_pretty(value)?)
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Inventory { source, json, save } => {
            let inv = take_inventory(&source)?;
            let stored = if save {
                let db = db_path(cli.db)?;
                let saved = block_on(store_inventory(&db, &inv))??;
                Some((db, saved))
            } else {
                None
            };
            if json {
                emit_json(&inv)?;
            } else {
                emit(&render::summary(&inv))?;
            }
            if let Some((path, saved)) = stored {
                eprintln!("kiln: stored inventory {} in {}", saved.inventory_id, path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Topo { source, json } => {
            let inv = take_inventory(&source)?;
            if json {
                emit_json(
                    &serde_json::json!({ "schema_version": inventory::SCHEMA_VERSION, "topology": inv.topology }),
                )?;
            } else {
                emit(&kiln::inventory::topology::render(&inv.topology))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Commission { source, json, no_bench, budget } => {
            let db = db_path(cli.db)?;
            // Open (and so check) the database first: a corrupt or foreign file should stop the
            // job before minutes of benchmarks, not after.
            block_on(async { Store::open(&db).await?.close().await })??;
            progress("taking the inventory");
            let inv = take_inventory(&source)?;
            let live = source.root == Path::new("/");
            let outcomes = if no_bench || !live {
                Vec::new()
            } else {
                catch_interrupts();
                run_suite(&inv, true, budget, None)?
            };
            progress("storing the results");
            let (saved, run_ids) = block_on(store_outcomes(&db, &inv, &outcomes))??;
            let failed = outcomes.iter().any(|o| o.failed_check);
            if json {
                let runs: Vec<serde_json::Value> = outcomes
                    .iter()
                    .zip(&run_ids)
                    .map(|(o, id)| serde_json::json!({ "benchmark": o.benchmark, "status": o.status, "run_id": id, "headline": o.headline }))
                    .collect();
                emit_json(&serde_json::json!({
                    "schema_version": inventory::SCHEMA_VERSION,
                    "kind": "commission",
                    "inventory": inv,
                    "benchmarks": runs,
                    "stored": { "database": db, "inventory_id": saved.inventory_id, "host_id": saved.host_id, "new_host": saved.new_host },
                }))?;
            } else {
                let mut text = render::summary(&inv);
                if !outcomes.is_empty() {
                    text.push_str("\nbenchmarks (quick suite)\n");
                    for (o, id) in outcomes.iter().zip(&run_ids) {
                        text.push_str(&format!(
                            "  {:<8} {:<9} {}  [run {}]\n",
                            o.benchmark,
                            o.status,
                            o.headline,
                            &id[..8]
                        ));
                    }
                } else if !live {
                    text.push_str("\nbenchmarks skipped: they measure this machine, not the snapshot under --root\n");
                }
                text.push_str(&format!(
                    "\nstored    inventory {} for {} host {}\n          in {}\n",
                    saved.inventory_id,
                    if saved.new_host { "new" } else { "known" },
                    saved.host_id,
                    db.display()
                ));
                emit(&text)?;
            }
            Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
        }
        Command::Bench { what: Bench::Membw { array_mib, warmup, repetitions, no_save, json } } => {
            preflight_db(&cli.db, no_save)?;
            anyhow::ensure!(repetitions >= 1, "--repetitions must be at least 1");
            let inv = live_inventory()?;
            let elements = match array_mib {
                Some(0) => anyhow::bail!("--array-mib must be at least 1"),
                Some(mib) => mib << 17,
                None => kiln::runs::default_membw_elements(&inv),
            };
            let outcome = kiln::runs::membw(&inv, kiln_bench::membw::Config { elements, warmup, repetitions });
            finish_bench(cli.db, &inv, outcome, no_save, json)
        }
        Command::Bench { what: Bench::Disk { path, size_mib, seconds, qd, destructive, no_save, json } } => {
            preflight_db(&cli.db, no_save)?;
            anyhow::ensure!(size_mib >= 1, "--size-mib must be at least 1");
            anyhow::ensure!(seconds > 0.0, "--seconds must be positive");
            anyhow::ensure!(
                !qd.is_empty() && qd.iter().all(|&d| (1..=256).contains(&d)),
                "--qd takes depths from 1 to 256"
            );
            catch_interrupts();
            let inv = live_inventory()?;
            let config = kiln_bench::disk::Config { size_bytes: size_mib << 20, seconds, queue_depths: qd };
            let outcome = kiln::runs::disk(&path, config, destructive, &INTERRUPTED)?;
            finish_bench(cli.db, &inv, outcome, no_save, json)
        }
        Command::Bench { what: Bench::Net { serve, connect, streams, seconds, repetitions, idle, no_save, json } } => {
            if let Some(addr) = serve {
                let listener = std::net::TcpListener::bind(&addr).with_context(|| format!("binding {addr}"))?;
                // The address first, flushed: a script (or a test) reads it to learn the port.
                emit(&format!("listening on {}", listener.local_addr()?))?;
                kiln_bench::net::serve(listener, std::time::Duration::from_secs(idle)).context("serving")?;
                return Ok(ExitCode::SUCCESS);
            }
            let Some(server) = connect else {
                anyhow::bail!("give --serve [ADDR] on one host and --connect HOST:PORT on the other")
            };
            anyhow::ensure!(
                streams >= 1 && repetitions >= 1 && seconds > 0.0,
                "--streams, --repetitions and --seconds must be positive"
            );
            preflight_db(&cli.db, no_save)?;
            let config = kiln_bench::net::Config {
                streams,
                seconds_per_repetition: seconds,
                repetitions,
                latency_messages: 2000,
            };
            let outcome = kiln::runs::net(&server, config)?;
            let inv = live_inventory()?;
            finish_bench(cli.db, &inv, outcome, no_save, json)
        }
        Command::Bench {
            what: Bench::Train { size, layers, d_model, heads, seq, batch, steps, seed, dtype, kernels, no_save, json },
        } => {
            preflight_db(&cli.db, no_save)?;
            anyhow::ensure!(
                dtype == "f32",
                "--dtype {dtype}: the CPU run trains in f32 (bf16 arrives with the CUDA build)"
            );
            let mut config = kiln_bench::train::Config::preset(&size)
                .with_context(|| format!("unknown size {size:?}: choose tiny, anchor, small, gpt2, 350m or 1b"))?;
            config.layers = layers.unwrap_or(config.layers);
            config.d_model = d_model.unwrap_or(config.d_model);
            config.heads = heads.unwrap_or(config.heads);
            config.seq = seq.unwrap_or(config.seq);
            config.batch = batch.unwrap_or(config.batch);
            config.steps = steps.unwrap_or(config.steps);
            config.warmup_steps = (config.steps / 10).max(2).min(config.steps);
            config.seed = seed.unwrap_or(config.seed);
            config.kernels = kernels;
            config.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
            let inv = live_inventory()?;
            let outcome = kiln::runs::train(&inv, &config)?;
            if outcome.failed_check {
                let r = &outcome.report["train"];
                eprintln!(
                    "kiln: the model did not learn: loss {:.3} -> {:.3}, chance {:.3}; the numerics of this machine or stack are suspect",
                    r["loss_start"].as_f64().unwrap_or(f64::NAN),
                    r["loss_end"].as_f64().unwrap_or(f64::NAN),
                    r["loss_chance"].as_f64().unwrap_or(f64::NAN)
                );
            }
            finish_bench(cli.db, &inv, outcome, no_save, json)
        }
        Command::Bench { what: Bench::Gemm { sizes, dtypes, repetitions, no_save, json } } => {
            preflight_db(&cli.db, no_save)?;
            anyhow::ensure!(
                repetitions >= 1 && !sizes.is_empty() && sizes.iter().all(|&n| n >= 1),
                "--sizes and --repetitions must be positive"
            );
            let dtypes = dtypes
                .iter()
                .map(|d| match d.as_str() {
                    "f32" => Ok(candle_core::DType::F32),
                    "bf16" => Ok(candle_core::DType::BF16),
                    "f16" => Ok(candle_core::DType::F16),
                    other => Err(anyhow::anyhow!("--dtypes: unknown dtype {other:?} (f32, bf16, f16)")),
                })
                .collect::<Result<Vec<_>>>()?;
            let inv = live_inventory()?;
            let outcome = kiln::runs::gemm(&inv, &sizes, &dtypes, repetitions);
            finish_bench(cli.db, &inv, outcome, no_save, json)
        }
        Command::Bench { what: Bench::Suite { quick, budget, disk_path, no_save, json } } => {
            preflight_db(&cli.db, no_save)?;
            catch_interrupts();
            let inv = live_inventory()?;
            let outcomes = run_suite(&inv, quick, budget, disk_path)?;
            let db = if no_save { None } else { Some(db_path(cli.db)?) };
            let stored = match &db {
                Some(db) => block_on(store_outcomes(db, &inv, &outcomes))??.1,
                None => Vec::new(),
            };
            let failed = outcomes.iter().any(|o| o.failed_check);
            if json {
                let runs: Vec<serde_json::Value> = outcomes
                    .iter()
                    .enumerate()
                    .map(|(i, o)| serde_json::json!({ "benchmark": o.benchmark, "status": o.status, "run_id": stored.get(i), "headline": o.headline, "report": o.report }))
                    .collect();
                emit_json(
                    &serde_json::json!({ "schema_version": 1, "suite": if quick { "quick" } else { "full" }, "runs": runs }),
                )?;
            } else {
                let mut text = String::new();
                for (i, o) in outcomes.iter().enumerate() {
                    text.push_str(&o.text);
                    if let Some(id) = stored.get(i) {
                        text.push_str(&format!("stored run {id}\n"));
                    }
                    text.push('\n');
                }
                emit(&text)?;
            }
            Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
        }
        Command::Runs { limit, json } => {
            let db = db_path(cli.db)?;
            let runs = query(&db, async |store: &mut Store| store.runs(limit).await)?;
            if json {
                emit_json(&serde_json::json!({ "schema_version": 1, "runs": runs }))?;
            } else if runs.is_empty() {
                emit(&format!("no runs in {} yet: run `kiln bench membw`", db.display()))?;
            } else {
                let mut text =
                    format!("{:<36}  {:<20}  {:<10}  {:<8}  {}\n", "RUN", "STARTED", "BENCHMARK", "STATUS", "HEADLINE");
                for r in &runs {
                    let headline = r.metrics.iter().find(|m| m.name.ends_with("all.triad_gbps")).or(r.metrics.first());
                    text.push_str(&format!(
                        "{:<36}  {:<20}  {:<10}  {:<8}  {}\n",
                        r.id,
                        r.started_at,
                        r.benchmark,
                        r.status,
                        headline.map(|m| format!("{} {:.2} {}", m.name, m.value, m.unit)).unwrap_or_default()
                    ));
                }
                emit(&text)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Show { what: Show::Run { id, json } } => {
            let db = db_path(cli.db)?;
            let run = query(&db, async |store: &mut Store| store.run(&id).await)?;
            if json {
                emit_json(&run)?;
            } else {
                let r = &run.run;
                let mut text = format!(
                    "run {} on {} ({}), {} {}\n{} .. {}\nconfig {}\n",
                    r.id,
                    r.hostname.as_deref().unwrap_or("?"),
                    r.host_id,
                    r.benchmark,
                    r.status,
                    r.started_at,
                    r.finished_at.as_deref().unwrap_or("?"),
                    r.config
                );
                for m in &r.metrics {
                    let n = run.samples.iter().filter(|s| s.0 == m.name).count();
                    text.push_str(&format!(
                        "  {:<32} {:>10.3} {:<6} ({} samples, {:?} is better)\n",
                        m.name, m.value, m.unit, n, m.direction
                    ));
                }
                let tel: Vec<(i64, String, String, f64)> = run.telemetry.clone();
                for line in kiln::telemetry::summarize(&tel) {
                    text.push_str(&format!("telemetry {line}\n"));
                }
                emit(&text)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Hosts { json } => {
            let db = db_path(cli.db)?;
            let hosts = query(&db, async |store: &mut Store| store.hosts().await)?;
            if json {
                emit_json(&serde_json::json!({ "schema_version": 1, "hosts": hosts }))?;
            } else if hosts.is_empty() {
                emit(&format!("no hosts in {} yet: run `kiln commission` or `kiln inventory --save`", db.display()))?;
            } else {
                let mut text =
                    format!("{:<36}  {:<16}  {:<20}  {:>4}  {}\n", "HOST", "CONFIG", "LAST SEEN", "INV", "NAME");
                for h in &hosts {
                    text.push_str(&format!(
                        "{:<36}  {:<16}  {:<20}  {:>4}  {} ({})\n",
                        h.id,
                        h.config_fingerprint,
                        h.last_seen,
                        h.inventories,
                        h.hostname.as_deref().unwrap_or("-"),
                        h.config_name
                    ));
                }
                emit(&text)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Provision { what } => provision(cli.db, what),
        Command::Compare { subjects, by, metric, prices, across_software, since, noise, json } => {
            let db = db_path(cli.db)?;
            let since = since.as_deref().map(window_start).transpose()?;
            let filter = kiln::fleet::Filter { since, metric, across_software };
            let fleet = query(&db, async |store: &mut Store| store.fleet(filter.since).await)?;
            match (by.as_deref(), subjects.as_slice()) {
                (Some("config"), []) => {
                    let prices = match prices {
                        Some(p) => kiln::fleet::parse_prices(
                            &std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?,
                        )
                        .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
                        None => Default::default(),
                    };
                    let configs = kiln::fleet::compare_configs(&fleet, &filter, &prices);
                    if json {
                        emit_json(&serde_json::json!({ "schema_version": 1, "configs": configs }))?;
                    } else {
                        emit(&kiln::fleet_view::render_configs(&configs))?;
                    }
                }
                (Some(other), _) if other != "config" => anyhow::bail!("--by {other}: only `--by config` is known"),
                (None, [a, b]) => {
                    let (sa, la) = kiln::fleet::resolve(&fleet, a).map_err(anyhow::Error::msg)?;
                    let (sb, lb) = kiln::fleet::resolve(&fleet, b).map_err(anyhow::Error::msg)?;
                    let rows =
                        kiln::fleet::compare_two(&fleet, &sa, &sb, &filter, noise).map_err(anyhow::Error::msg)?;
                    if json {
                        emit_json(&kiln::fleet::Comparison { a: la, b: lb, noise, rows })?;
                    } else {
                        emit(&kiln::fleet_view::render_comparison(&la, &lb, noise, &rows))?;
                    }
                }
                _ => anyhow::bail!("give `--by config`, or two subjects: kiln compare A B"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Outliers { metric, threshold, min_deviation, across_software, since, json } => {
            let db = db_path(cli.db)?;
            let since = since.as_deref().map(window_start).transpose()?;
            let filter = kiln::fleet::Filter { since, metric, across_software };
            let found = query(&db, async |store: &mut Store| {
                let fleet = store.fleet(filter.since).await?;
                let mut out = Vec::new();
                for o in kiln::fleet::outliers(&fleet, &filter, threshold, min_deviation) {
                    let t = kiln::fleet_view::outlier_telemetry(store, &o).await?;
                    out.push((o, t));
                }
                Ok(out)
            })?;
            if json {
                let list: Vec<serde_json::Value> =
                    found.iter().map(|(o, t)| serde_json::json!({ "outlier": o, "telemetry": t })).collect();
                emit_json(
                    &serde_json::json!({ "schema_version": 1, "threshold": threshold, "min_deviation": min_deviation, "outliers": list }),
                )?;
            } else {
                emit(&kiln::fleet_view::render_outliers(&found, threshold, min_deviation))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Regressions { since, metric, noise, json } => {
            let db = db_path(cli.db)?;
            let start = window_start(&since)?;
            let filter = kiln::fleet::Filter { since: Some(start), metric, across_software: true };
            let regs = query(&db, async |store: &mut Store| {
                let fleet = store.fleet(filter.since).await?;
                let mut regs = kiln::fleet::regressions(&fleet, &filter, noise);
                let mut cache = kiln::fleet_view::Explainer::default();
                for r in regs.iter_mut() {
                    kiln::fleet_view::explain(store, &mut cache, r).await?;
                }
                Ok(regs)
            })?;
            if json {
                emit_json(
                    &serde_json::json!({ "schema_version": 1, "since": since, "noise": noise, "regressions": regs }),
                )?;
            } else {
                emit(&kiln::fleet_view::render_regressions(
                    &regs,
                    (kiln::timefmt::now_unix() - start) as f64 / 86_400.0,
                ))?;
            }
            Ok(if regs.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Export { since, output } => {
            let db = db_path(cli.db)?;
            let since = since.as_deref().map(window_start).transpose()?.map(kiln::timefmt::rfc3339);
            let now = kiln::timefmt::now_rfc3339();
            let stats = match &output {
                Some(path) => {
                    // Into a temporary file beside the target, renamed when complete.
                    let tmp = path.with_extension("partial");
                    let file = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
                    let mut w = std::io::BufWriter::new(file);
                    let stats =
                        query(&db, async |store: &mut Store| store.export(since.as_deref(), &now, &mut w).await);
                    let stats = match stats {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = std::fs::remove_file(&tmp);
                            return Err(e);
                        }
                    };
                    w.into_inner()
                        .map_err(|e| e.into_error())
                        .and_then(|f| f.sync_all())
                        .with_context(|| format!("writing {}", tmp.display()))?;
                    std::fs::rename(&tmp, path)
                        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
                    stats
                }
                None => {
                    let stdout = std::io::stdout();
                    let mut w = std::io::BufWriter::new(stdout.lock());
                    query(&db, async |store: &mut Store| store.export(since.as_deref(), &now, &mut w).await)?
                }
            };
            progress(&format!(
                "exported {} hosts, {} inventories, {} runs, {} metrics, {} samples, {} telemetry points",
                stats.hosts, stats.inventories, stats.runs, stats.metrics, stats.samples, stats.telemetry
            ));
            Ok(ExitCode::SUCCESS)
        }
        Command::Import { files, json } => {
            let db = db_path(cli.db)?;
            let mut all = Vec::new();
            for f in &files {
                let text = if f.as_os_str() == "-" {
                    let mut buf = Vec::new();
                    std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf).context("reading standard input")?;
                    buf
                } else {
                    std::fs::read(f).with_context(|| format!("reading {}", f.display()))?
                };
                let text = String::from_utf8(text).map_err(|e| {
                    anyhow::anyhow!(
                        "{}: not UTF-8 text (byte {}); nothing was imported",
                        f.display(),
                        e.utf8_error().valid_up_to()
                    )
                })?;
                let started = std::time::Instant::now();
                let name = f.display().to_string();
                let stats = block_on(async {
                    let mut store = Store::open(&db).await?;
                    let out = store.import(&name, &text).await;
                    store.close().await?;
                    anyhow::Ok(out)
                })??
                .map_err(anyhow::Error::new)?;
                let secs = started.elapsed().as_secs_f64();
                if !json {
                    emit(&format!(
                        "{}: {} records; new: {} hosts, {} inventories, {} runs ({} metrics, {} samples, {} telemetry points); {} runs already here; {:.2} s",
                        name, stats.records, stats.hosts_new, stats.inventories_new, stats.runs_new, stats.metrics, stats.samples, stats.telemetry, stats.runs_known, secs
                    ))?;
                }
                all.push(serde_json::json!({ "file": name, "stats": stats, "seconds": secs }));
            }
            if json {
                emit_json(&serde_json::json!({ "imports": all }))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Report { host, config, run, html, markdown, since } => {
            let db = db_path(cli.db)?;
            if html.is_none() && markdown.is_none() {
                anyhow::bail!("say where the report goes: --html FILE and/or --markdown FILE");
            }
            let start = window_start(&since)?;
            let subject = match (host, config, run) {
                (Some(h), None, None) => kiln::report::Subject::Host(h),
                (None, Some(c), None) => kiln::report::Subject::Config(c),
                (None, None, Some(r)) => kiln::report::Subject::Run(r),
                _ => anyhow::bail!("give one of --host, --config or --run"),
            };
            let report = query(&db, async |store: &mut Store| kiln::report::build(store, &subject, start).await)?
                .map_err(anyhow::Error::msg)?;
            if let Some(path) = &html {
                std::fs::write(path, kiln::report::html(&report))
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            if let Some(path) = &markdown {
                std::fs::write(path, kiln::report::markdown(&report))
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Show { what: Show::Inventory { id, json } } => {
            let db = db_path(cli.db)?;
            let row = query(&db, async |store: &mut Store| store.inventory(&id).await)?;
            if json {
                emit(&row.document)?;
            } else {
                let inv: Inventory = serde_json::from_str(&row.document).with_context(|| {
                    format!("inventory {} in {} is not a document this kiln can read; try --json", row.id, db.display())
                })?;
                emit(&format!("inventory {} (collected {})\n{}", row.id, row.collected_at, render::summary(&inv)))?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn provision(db: Option<PathBuf>, what: Provision) -> Result<ExitCode> {
    use kiln::provisioning as prov;
    use kiln_provision::exec::System;
    match what {
        Provision::Plan { image, target } => {
            let image = prov::load(&image, target.images.as_deref())?;
            let (plan, _, _) = prov::make_plan(&image, &target.root, &mut System)?;
            if target.json {
                emit_json(&plan)?;
            } else {
                emit(&prov::render_plan(&plan, "to apply"))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Provision::Apply { image, target, resume, verbose } => {
            let image_arg = image;
            let image = prov::load(&image_arg, target.images.as_deref())?;
            if target.dry_run {
                let (plan, _, _) = prov::make_plan(&image, &target.root, &mut System)?;
                if target.json {
                    emit_json(&plan)?;
                } else {
                    emit(&prov::render_plan(&plan, "would run (dry run: nothing changed)"))?;
                }
                return Ok(ExitCode::SUCCESS);
            }
            let db = db_path(db)?;
            catch_interrupts();
            let opts = prov::ApplyOptions { image_arg: &image_arg, db: &db, resume, json: target.json, verbose };
            let report = prov::apply_image(&image, &target.root, &opts, &INTERRUPTED)?;
            if target.json {
                emit_json(&report)?;
            } else if report.status == "failed" {
                eprint!("{}", prov::render_apply(&report, &image_arg));
            } else {
                emit(&prov::render_apply(&report, &image_arg))?;
            }
            Ok(match report.status.as_str() {
                "succeeded" | "unchanged" => ExitCode::SUCCESS,
                _ => ExitCode::from(2),
            })
        }
        Provision::Verify { image, target } => {
            let image = prov::load(&image, target.images.as_deref())?;
            let v = prov::verify(&image, &target.root)?;
            if target.json {
                emit_json(&v)?;
            } else {
                emit(&prov::render_verification(&v))?;
            }
            Ok(if v.clean() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Provision::Status { target } => {
            let t = kiln_provision::plan::Target::new(&target.root);
            let sw = kiln_provision::software::read(&t)?;
            if target.json {
                emit_json(&sw)?;
            } else {
                emit(&prov::render_software(&sw))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Provision::Lint { specs, target } => {
            let paths: Vec<PathBuf> = if specs.is_empty() {
                let dirs = prov::image_dirs(target.images.as_deref());
                let found: Vec<PathBuf> =
                    dirs.iter().map(|d| prov::list_images(d)).find(|l| !l.is_empty()).unwrap_or_default();
                if found.is_empty() {
                    anyhow::bail!(
                        "no image specs found in {}",
                        dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
                    );
                }
                found
            } else {
                specs.iter().map(|i| prov::find_image(i, target.images.as_deref())).collect::<Result<_>>()?
            };
            let mut findings = Vec::new();
            for p in &paths {
                match kiln_provision::spec::load(p) {
                    Ok(image) => findings.extend(kiln_provision::lint::lint(&image)),
                    Err(e) => findings.extend(e.0),
                }
            }
            if target.json {
                emit_json(&serde_json::json!({ "images": paths, "findings": findings }))?;
            } else {
                let mut text: String = findings.iter().map(|f| format!("{f}\n")).collect();
                text += &format!(
                    "{} image{} linted, {} finding{}",
                    paths.len(),
                    if paths.len() == 1 { "" } else { "s" },
                    findings.len(),
                    if findings.len() == 1 { "" } else { "s" }
                );
                emit(&text)?;
            }
            Ok(if findings.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Provision::Log { image, apply, limit, target } => {
            let db = db_path(db)?;
            if let Some(id) = apply {
                let (a, steps) = query(&db, async |store: &mut Store| store.apply_journal(&id).await)?;
                if target.json {
                    emit_json(&serde_json::json!({ "apply": a, "steps": steps }))?;
                } else {
                    let mut text = format!(
                        "apply {} of {} {} to {} — {} (started {}, finished {}, resumed {} time{})\n",
                        a.id,
                        a.image,
                        a.image_version,
                        a.root,
                        a.status,
                        a.started_at,
                        a.finished_at.as_deref().unwrap_or("-"),
                        a.resumes,
                        if a.resumes == 1 { "" } else { "s" }
                    );
                    for s in &steps {
                        text += &format!(
                            "{:>3}  {:<11}  {:>8}  exit {:<4}  {}\n",
                            s.seq,
                            s.status,
                            s.duration_ms.map_or("-".into(), |d| format!("{:.1} s", d as f64 / 1000.0)),
                            s.exit_code.map_or("-".into(), |c| c.to_string()),
                            s.summary
                        );
                        if s.status == "failed" {
                            for line in s
                                .output_tail
                                .as_deref()
                                .unwrap_or("")
                                .lines()
                                .rev()
                                .take(10)
                                .collect::<Vec<_>>()
                                .into_iter()
                                .rev()
                            {
                                text += &format!("       | {line}\n");
                            }
                        }
                    }
                    emit(&text)?;
                }
            } else {
                let applies = query(&db, async |store: &mut Store| store.applies(image.as_deref(), limit).await)?;
                if target.json {
                    emit_json(&serde_json::json!({ "applies": applies }))?;
                } else if applies.is_empty() {
                    emit(&format!("no applies journaled in {}", db.display()))?;
                } else {
                    let mut text =
                        format!("{:<8}  {:<24}  {:<11}  {:<24}  {}\n", "APPLY", "STARTED", "STATUS", "IMAGE", "ROOT");
                    for a in &applies {
                        text += &format!(
                            "{:<8}  {:<24}  {:<11}  {:<24}  {}\n",
                            &a.id[..8],
                            a.started_at,
                            a.status,
                            format!("{} {}", a.image, a.image_version),
                            a.root
                        );
                    }
                    emit(&text)?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The start of a `--since` window (`30d`, `12h`, `2w`), in seconds since the epoch.
fn window_start(since: &str) -> Result<i64> {
    let length = kiln::fleet::parse_duration(since).map_err(anyhow::Error::msg)?;
    Ok(kiln::timefmt::now_unix() - length)
}

fn take_inventory(source: &Source) -> Result<Inventory> {
    let options = inventory::Options {
        nvml_library: source.nvml_lib.as_ref().map(|p| p.as_os_str().to_owned()),
        all_nics: source.all,
    };
    let inv = inventory::collect_with(&source.root, &options)?;
    for p in &inv.problems {
        tracing::debug!(path = %p.path, kind = ?p.kind, "{}", p.message);
    }
    Ok(inv)
}

async fn store_inventory(db: &Path, inv: &Inventory) -> Result<kiln_db::SavedInventory> {
    let document = serde_json::to_string(inv)?;
    let fp = &inv.fingerprints;
    let record = NewInventory {
        // A box with no identity at all is keyed by its configuration and host name, so that it
        // does not merge with every other anonymous box.
        host_identity: fp.host.clone().unwrap_or_else(|| format!("anonymous-{}", fp.config)),
        hostname: inv.os.hostname.clone(),
        collected_at: inv.collected_at.clone(),
        schema_version: i64::from(inv.schema_version),
        config_fingerprint: fp.config.clone(),
        config_name: fp.config_name.clone(),
        cpu_model: inv.cpu.model_name.clone(),
        cpu_packages: i64::from(inv.cpu.packages),
        cpu_cores: i64::from(inv.cpu.cores),
        cpu_threads: i64::from(inv.cpu.online),
        memory_bytes: inv.memory.total_bytes.map(|b| b as i64),
        kernel_release: inv.os.kernel_release.clone(),
        problem_count: inv.problems.len() as i64,
        document,
    };
    let mut store = Store::open(db).await?;
    let saved = store.save_inventory(&record).await?;
    store.close().await?;
    Ok(saved)
}

/// Opens the database before a benchmark runs, so that a bad file stops the job before the
/// minutes of measuring, not after.
fn preflight_db(db: &Option<PathBuf>, no_save: bool) -> Result<()> {
    if no_save {
        return Ok(());
    }
    let path = db_path(db.clone())?;
    block_on(async { Store::open(&path).await?.close().await })??;
    Ok(())
}

/// The inventory a benchmark runs against: the live system, NVML from `KILN_NVML_LIB` or the default.
fn live_inventory() -> Result<Inventory> {
    let nvml_lib = std::env::var_os("KILN_NVML_LIB").filter(|v| !v.is_empty()).map(PathBuf::from);
    take_inventory(&Source { root: PathBuf::from("/"), nvml_lib, all: false })
}

/// Prints a benchmark's outcome (text or JSON), stores it unless told not to, and maps a failed
/// check to exit code 1.
fn finish_bench(
    db: Option<PathBuf>,
    inv: &Inventory,
    outcome: kiln::runs::Outcome,
    no_save: bool,
    json: bool,
) -> Result<ExitCode> {
    let run_id = if no_save {
        None
    } else {
        let db = db_path(db)?;
        block_on(store_outcomes(&db, inv, std::slice::from_ref(&outcome)))??.1.pop()
    };
    if json {
        emit_json(&serde_json::json!({
            "schema_version": 1, "benchmark": outcome.benchmark, "run_id": run_id, "status": outcome.status, "report": outcome.report,
        }))?;
    } else {
        let mut text = outcome.text.clone();
        if let Some(id) = &run_id {
            text.push_str(&format!("stored run {id}\n"));
        }
        emit(&text)?;
    }
    Ok(if outcome.failed_check { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// The suite: quick for commissioning and CI-sized machines, full for nightly runs.
fn run_suite(
    inv: &Inventory,
    quick: bool,
    budget: Option<u64>,
    disk_path: Option<PathBuf>,
) -> Result<Vec<kiln::runs::Outcome>> {
    let started = std::time::Instant::now();
    let budget = std::time::Duration::from_secs(budget.unwrap_or(if quick { 110 } else { 1800 }));
    let mut outcomes = Vec::new();
    let over = |name: &str| {
        let out = started.elapsed() > budget;
        if out {
            eprintln!("kiln: time budget of {} s spent; {name} skipped", budget.as_secs());
        }
        out
    };
    if !over("membw") {
        let elements = kiln::runs::default_membw_elements(inv);
        outcomes.push(kiln::runs::membw(
            inv,
            kiln_bench::membw::Config { elements, warmup: 1, repetitions: if quick { 8 } else { 20 } },
        ));
    }
    if !over("gemm") {
        let sizes: &[usize] = if quick { &[512, 1024] } else { &[256, 512, 1024, 2048, 4096] };
        let dtypes: &[candle_core::DType] =
            if quick { &[candle_core::DType::F32] } else { &[candle_core::DType::F32, candle_core::DType::BF16] };
        outcomes.push(kiln::runs::gemm(inv, sizes, dtypes, if quick { 5 } else { 10 }));
    }
    if !over("train") {
        let config = kiln_bench::train::Config::preset(if quick { "tiny" } else { "anchor" }).expect("preset");
        outcomes.push(kiln::runs::train(inv, &config)?);
    }
    if !over("disk") && !INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed) {
        let dir = disk_path.unwrap_or_else(std::env::temp_dir);
        let config = kiln_bench::disk::Config {
            size_bytes: if quick { 256 << 20 } else { 4 << 30 },
            seconds: if quick { 1.0 } else { 10.0 },
            queue_depths: vec![1, 32],
        };
        outcomes.push(kiln::runs::disk(&dir, config, false, &INTERRUPTED)?);
    }
    Ok(outcomes)
}

/// Stores the inventory, then each outcome as a run against it; returns the stored inventory and
/// the run ids in order.
async fn store_outcomes(
    db: &Path,
    inv: &Inventory,
    outcomes: &[kiln::runs::Outcome],
) -> Result<(kiln_db::SavedInventory, Vec<String>)> {
    let saved = store_inventory(db, inv).await?;
    let mut store = Store::open(db).await?;
    let mut ids = Vec::new();
    for o in outcomes {
        ids.push(store.save_run(&o.to_run(inv, saved.host_id.clone(), saved.inventory_id.clone())).await?);
    }
    store.close().await?;
    Ok((saved, ids))
}

/// Opens the store, runs one query, closes it.
fn query<T>(db: &Path, f: impl AsyncFnOnce(&mut Store) -> kiln_db::Result<T>) -> Result<T> {
    block_on(async {
        let mut store = Store::open(db).await?;
        let out = f(&mut store).await?;
        store.close().await?;
        anyhow::Ok(out)
    })?
}

fn block_on<F: std::future::Future>(future: F) -> Result<F::Output> {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    Ok(runtime.block_on(future))
}

/// `--db`/`KILN_DB`, else the system location as root, else the user's data directory.
fn db_path(explicit: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(path) = explicit {
        return Ok(path);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(PathBuf::from("/var/lib/kiln/kiln.db"));
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .context("no --db given and neither XDG_DATA_HOME nor HOME is set; pass --db PATH")?;
    Ok(data.join("kiln/kiln.db"))
}
