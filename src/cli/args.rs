//! The command line as clap sees it: every command, flag and closed set of values, validated into
//! types before anything touches the hardware or the database.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Inventory, provision, benchmark and compare AI training servers",
    after_help = "Exit codes: 0 success (a verdict: ACCEPT), 1 a check failed (a verdict: REJECT; a regression, drift, \
                  lint findings, training that did not learn), 2 an error (bad arguments, an unreadable snapshot, a \
                  malformed spec, a corrupt database), 3 a verdict is INCONCLUSIVE (a check the spec requires could \
                  not run, or no spec applies)."
)]
pub struct Cli {
    /// The results database: a path or sqlite://PATH, or for the fleet's commands (serve, token,
    /// import and the read commands) a postgres:// URL [default: /var/lib/kiln/kiln.db as root, else
    /// ~/.local/share/kiln/kiln.db]
    #[arg(long, global = true, env = "KILN_DB", value_name = "PATH|URL", value_parser = parse_db)]
    pub db: Option<kiln_db::Location>,
    /// The fleet service (`kiln serve`): results are stored here, then uploaded to it; the read
    /// commands (hosts, runs, compare, outliers, regressions, report) ask it instead of the local
    /// database [uploads also: KILN_SERVER, else `server` in /etc/kiln/agent.toml]
    #[arg(long, global = true, value_name = "URL")]
    pub server: Option<String>,
    /// The fleet service's bearer token [also: KILN_TOKEN, else `token` in /etc/kiln/agent.toml]
    #[arg(long, global = true, value_name = "TOKEN")]
    pub token: Option<String>,
    /// Trust this CA certificate (PEM) for the fleet service's TLS instead of the web's roots
    /// [also: KILN_CA_CERT, else `ca_cert` in /etc/kiln/agent.toml]
    #[arg(long, global = true, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Print one JSON document for machines (with its `schema_version`) instead of text for people
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// `--db`: a path, `sqlite://PATH`, or a `postgres://` URL.
fn parse_db(text: &str) -> Result<kiln_db::Location, String> {
    kiln_db::Location::parse(text)
}

// Where and how to take the inventory.
#[derive(Args, Clone)]
pub struct Source {
    /// Read DIR/proc, DIR/sys and DIR/etc instead of the live system
    #[arg(long, default_value = "/", value_name = "DIR")]
    pub root: PathBuf,
    /// The NVML library to load [default: libnvidia-ml.so.1 on the live system, none for --root]
    #[arg(long, env = "KILN_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// List virtual network interfaces too
    #[arg(long)]
    pub all: bool,
}

/// `kiln bench gpu …`.
#[derive(Subcommand)]
pub enum GpuBench {
    /// Dense matrix multiply on each GPU alone and on all at once, every product checked against an
    /// f64 reference on a sampled grid and across GPUs, against the datasheet's peak
    Gemm {
        /// Data types, comma-separated: bf16, f16, f32, tf32 (f32 operands on the tensor cores), fp8
        /// (e4m3 operands, bf16 result, through cuBLASLt; skipped on GPUs before compute capability
        /// 8.9)
        #[arg(long, value_delimiter = ',', default_value = "bf16")]
        dtypes: Vec<String>,
        /// Square size n (n×n times n×n)
        #[arg(long, default_value_t = 8192)]
        n: usize,
        /// Timed multiplies per GPU (after three untimed ones)
        #[arg(long, default_value_t = 20)]
        reps: usize,
        /// Rows and columns of C the check samples (their grid is compared)
        #[arg(long, default_value_t = 32)]
        samples: usize,
        /// The GPUs to measure (NVML indices, comma-separated), or all
        #[arg(long, value_delimiter = ',', default_value = "all")]
        gpus: Vec<String>,
        /// A GPU's run is stopped and failed after this many seconds (a sweep's after this many
        /// per shape)
        #[arg(long, default_value_t = 300, value_name = "SECONDS")]
        timeout: u64,
        /// Then each GPU alone at many shapes (MAMF: the best right product is the GPU's
        /// ceiling, which the --n figure is held to); SHAPES: N or MxNxK, comma-separated
        #[arg(long, value_name = "SHAPES", num_args = 0..=1, default_missing_value = kiln_gpu::gemm::DEFAULT_SWEEP)]
        sweep: Option<String>,
        /// Instead: every GPU at once, products back to back for DURATION (90s, 10m, 1h), each
        /// GPU's product checked about every second (the first of --dtypes, at --n)
        #[arg(long, value_name = "DURATION", conflicts_with = "sweep")]
        burn: Option<String>,
        #[command(flatten)]
        store: Store,
    },
    /// Memory bandwidth: a device copy in each GPU's memory, and page-locked host↔device copies
    /// from the GPU's own NUMA node and from another, then all GPUs at once; every copy checked
    Memory {
        /// MiB per copy
        #[arg(long, default_value_t = 1024)]
        mib: usize,
        /// Timed copies per direction (after three untimed ones)
        #[arg(long, default_value_t = 20)]
        reps: usize,
        /// The GPUs to measure (NVML indices, comma-separated), or all
        #[arg(long, value_delimiter = ',', default_value = "all")]
        gpus: Vec<String>,
        /// A GPU's run is stopped and failed after this many seconds
        #[arg(long, default_value_t = 300, value_name = "SECONDS")]
        timeout: u64,
        #[command(flatten)]
        store: Store,
    },
    /// Peer to peer: the GPU × GPU copy matrix over NVLink or PCIe, every pair one way and both
    /// ways at once, with a small copy's time; a slow GPU or pair is named, every copy checked
    P2p {
        /// MiB per copy
        #[arg(long, default_value_t = 256)]
        mib: usize,
        /// Timed copies per pair and direction (after two untimed ones)
        #[arg(long, default_value_t = 20)]
        reps: usize,
        /// The GPUs to measure (NVML indices, comma-separated, two or more), or all
        #[arg(long, value_delimiter = ',', default_value = "all")]
        gpus: Vec<String>,
        /// The run is stopped and failed after this many seconds
        #[arg(long, default_value_t = 600, value_name = "SECONDS")]
        timeout: u64,
        #[command(flatten)]
        store: Store,
    },
    /// NCCL collectives over the box's GPUs: all-reduce, all-gather, reduce-scatter at sizes
    /// doubling up to --max-bytes, bus bandwidth as nccl-tests computes it, every result checked
    Collectives {
        /// Smallest message (bytes, or with K, M, G)
        #[arg(long, default_value = "8", value_parser = parse_size)]
        min_bytes: u64,
        /// Largest message (up to 16G)
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        max_bytes: u64,
        /// Collectives, comma-separated: all-reduce, all-gather, reduce-scatter [default: all three]
        #[arg(long, value_enum, value_delimiter = ',')]
        ops: Vec<CollectiveOp>,
        /// Timed calls per size at most (fewer where a size would take over half a second)
        #[arg(long, default_value_t = 20)]
        iterations: usize,
        /// The GPUs to use (NVML indices, comma-separated, two or more), or all
        #[arg(long, value_delimiter = ',', default_value = "all")]
        gpus: Vec<String>,
        /// The run is stopped and failed after this many seconds
        #[arg(long, default_value_t = 900, value_name = "SECONDS")]
        timeout: u64,
        #[command(flatten)]
        store: Store,
    },
    /// The reference training run on every chosen GPU at once, each its own replica: tokens/s,
    /// MFU against the datasheet, and the learning check per GPU
    Train {
        /// Model size: gpt2 (124 M), 350m, 1b (or the CPU's tiny, anchor, small)
        #[arg(long, default_value = "gpt2")]
        size: String,
        /// Training steps [default: the size's]
        #[arg(long)]
        steps: Option<usize>,
        /// Sequences per step [default: the size's]
        #[arg(long)]
        batch: Option<usize>,
        /// How the products run: bf16 (mixed precision: f32 parameters, bf16 operands), tf32 (f32
        /// operands on the tensor cores) or f32
        #[arg(long, default_value = "bf16")]
        dtype: String,
        /// The GPUs to train on (NVML indices, comma-separated), or all
        #[arg(long, value_delimiter = ',', default_value = "all")]
        gpus: Vec<String>,
        /// A GPU's run is stopped and failed after this many seconds
        #[arg(long, default_value_t = 1800, value_name = "SECONDS")]
        timeout: u64,
        /// One model over the GPUs, each training on its slice of every step's batch, the
        /// gradients all-reduced through NCCL (instead of a replica per GPU)
        #[arg(long)]
        data_parallel: bool,
        #[command(flatten)]
        store: Store,
    },
}

// What every benchmark command shares.
#[derive(Args, Clone, Copy)]
pub struct Store {
    /// Do not store the run (nor open the database)
    #[arg(long)]
    pub no_save: bool,
}

// How a box is judged: which spec, and what a verdict may leave out.
#[derive(Args, Clone, Default)]
pub struct Judge {
    /// The SKU spec to judge against [default: the one spec whose [match] fits this box, among the
    /// built-in specs and those in --specs]
    #[arg(long, value_name = "FILE")]
    pub spec: Option<PathBuf>,
    /// More specs to choose from (a file there replaces a built-in spec of the same name)
    #[arg(long, value_name = "DIR", default_value = "/etc/kiln/specs")]
    pub specs: Vec<PathBuf>,
    /// ACCEPT even when checks the spec requires could not run (they stay listed as skipped)
    #[arg(long)]
    pub allow_skip: bool,
    /// Also write the verdict as OCP Test & Validation JSON lines to FILE (`-` for stdout)
    #[arg(long, value_name = "FILE")]
    pub ocp: Option<PathBuf>,
}

// A `--since` window: 30d, 12h, 2w.
#[derive(Args, Clone)]
pub struct Window {
    /// Only runs within this window (30d, 12h, 2w)
    #[arg(long, value_name = "DURATION")]
    pub since: Option<String>,
}

#[derive(Subcommand)]
#[command(defer = true)]
pub enum SpecCmd {
    /// Load specs strictly (units, dimensions, sources, metrics): exit 1 on any finding
    Lint {
        /// Spec files [default: the built-in specs]
        files: Vec<PathBuf>,
    },
    /// The published reference figures the built-in specs' floors are fractions of: each with its
    /// source, kind and the conditions it holds for (specs/references.toml)
    References {
        /// Only this SKU's (a built-in spec's name, or a prefix of it: "hgx-h100")
        sku: Option<String>,
    },
    /// Write a spec from this box (or --root), or from the accepted boxes of one configuration in
    /// the database, with performance floors at a fraction of the measured medians
    Capture {
        #[command(flatten)]
        source: Source,
        /// Take the performance figures from this stored inventory's runs (default: the newest
        /// inventory of this box in the database, if any)
        #[arg(long, value_name = "ID", conflicts_with = "config")]
        inventory: Option<String>,
        /// Use the accepted boxes of this configuration fingerprint (prefix) instead of one box
        #[arg(long, value_name = "FINGERPRINT")]
        config: Option<String>,
        /// Floors at this fraction of the measured medians
        #[arg(long, default_value_t = 0.9, value_name = "FRACTION")]
        fraction: f64,
        /// The spec's name [default: from the configuration]
        #[arg(long)]
        name: Option<String>,
        /// Write to FILE instead of stdout
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

// `defer`: a subcommand's arguments are built only when it is the one being run (clap's
// `Command::defer`); building every command's arguments cost each invocation ~0.5 ms.
#[derive(Subcommand)]
#[command(defer = true)]
pub enum Command {
    /// Take the hardware inventory of this machine (or of a snapshot with --root)
    Inventory {
        #[command(flatten)]
        source: Source,
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
        /// A directory on a data drive (repeat for each): the suite then asks whether the drives
        /// keep the accelerators busy (`kiln bench data`, at the rate of the suite's training run)
        #[arg(long = "data-dir", value_name = "DIR")]
        data_dirs: Vec<PathBuf>,
        #[command(flatten)]
        judge: Judge,
        /// Do not judge (inventory and benchmarks only; the exit code is the benchmarks')
        #[arg(long, conflicts_with_all = ["spec", "allow_skip", "ocp", "on_reject", "on_verdict"])]
        no_verdict: bool,
        #[command(flatten)]
        act: Act,
    },
    /// Judge a stored inventory (and the benchmark runs taken with it) against a spec again, without
    /// touching the box: exit 0 ACCEPT, 1 REJECT, 3 INCONCLUSIVE
    Verdict {
        /// The inventory's id (or a unique prefix), as `kiln hosts` and `kiln commission` show it
        #[arg(long, value_name = "ID")]
        inventory: String,
        /// Judge performance too only when runs were taken with the inventory (default); with this
        /// flag, hardware and health only
        #[arg(long)]
        no_perf: bool,
        /// Do not store the verdict
        #[arg(long)]
        no_save: bool,
        /// Every check, not only those that did not pass
        #[arg(long, short)]
        verbose: bool,
        #[command(flatten)]
        judge: Judge,
    },
    /// SKU specs: check them, or write one from a golden box
    Spec {
        #[command(subcommand)]
        what: SpecCmd,
    },
    /// Capture what kiln reads of this machine (/proc, /sys, /etc files, the kernel log) as a tar
    /// archive, for `kiln inventory --root DIR` elsewhere: `mkdir box && tar -xf box.tar -C box`
    Snapshot {
        /// The archive to write (`-` for stdout)
        #[arg(long, short, value_name = "FILE.tar")]
        output: PathBuf,
    },
    /// The GPU and NIC connection matrix, like `nvidia-smi topo -m`
    Topo {
        #[command(flatten)]
        source: Source,
    },
    /// Run a benchmark on this machine and store the run
    Bench {
        #[command(subcommand)]
        what: Bench,
    },
    /// List the stored benchmark runs, newest first
    Runs {
        /// At most this many runs
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
    /// List the hosts in the results database
    Hosts,
    /// Print a stored record
    Show {
        #[command(subcommand)]
        what: Show,
    },
    /// Compare results: every configuration side by side (--by config), or two configurations, hosts or
    /// software stacks (A B)
    Compare {
        /// Two of a kind: configuration (fingerprint prefix or name), host (id prefix or host name) or
        /// software stack (fingerprint prefix); `config:`, `host:`, `software:` force the kind
        #[arg(num_args = 0..=2, value_name = "A B")]
        subjects: Vec<String>,
        /// One row per configuration fingerprint
        #[arg(long, value_enum, value_name = "WHAT")]
        by: Option<By>,
        /// Only this metric (`name` or `benchmark:name`)
        #[arg(long)]
        metric: Option<String>,
        /// Prices per configuration (TOML: "<fingerprint or name>" = price) for perf per unit price
        #[arg(long, value_name = "FILE")]
        prices: Option<PathBuf>,
        /// Merge results of different software stacks (kept apart by default)
        #[arg(long)]
        across_software: bool,
        #[command(flatten)]
        window: Window,
        /// The noise threshold for a verdict, as a fraction
        #[arg(long, default_value_t = kiln_app::fleet::NOISE)]
        noise: f64,
    },
    /// Hosts far from their configuration's distribution (robust z-score on the MAD), with telemetry that
    /// may explain it
    Outliers {
        /// Only this metric (`name` or `benchmark:name`)
        #[arg(long)]
        metric: Option<String>,
        /// |z| above which a host is an outlier
        #[arg(long, default_value_t = 3.5)]
        threshold: f64,
        /// …and at least this far from the group's median, as a fraction (a tight group would otherwise
        /// flag differences nobody acts on)
        #[arg(long, default_value_t = kiln_app::fleet::MIN_DEVIATION)]
        min_deviation: f64,
        /// Merge results of different software stacks (kept apart by default)
        #[arg(long)]
        across_software: bool,
        #[command(flatten)]
        window: Window,
    },
    /// Step changes for the worse in the nightly series, per host and per configuration; exit 1 when any
    Regressions {
        /// Look at runs within this window (30d, 12h, 2w)
        #[arg(long, default_value = "30d", value_name = "DURATION")]
        since: String,
        /// Only this metric (`name` or `benchmark:name`)
        #[arg(long)]
        metric: Option<String>,
        /// The noise threshold, as a fraction: smaller changes are never flagged
        #[arg(long, default_value_t = kiln_app::fleet::NOISE)]
        noise: f64,
    },
    /// Write every host, inventory, run, metric, sample and telemetry record as JSON lines (to stdout)
    Export {
        #[command(flatten)]
        window: Window,
        /// Write to FILE instead of stdout
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Import exports (idempotent: records already here are skipped; a malformed file imports nothing);
    /// `-` reads standard input
    Import {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// A self-contained report with plots: a host, a configuration or a run against the fleet
    Report {
        /// Report on this host (id prefix or host name)
        #[arg(long, value_name = "HOST", group = "subject")]
        host: Option<String>,
        /// Report on this configuration (fingerprint prefix or name)
        #[arg(long, value_name = "CONFIG", group = "subject")]
        config: Option<String>,
        /// Report on this run (id or unique prefix)
        #[arg(long, value_name = "RUN", group = "subject")]
        run: Option<String>,
        /// Report on this cluster run (`kiln cluster …`; id or unique prefix): the pair matrix as a
        /// heat map from every rank's stored row, the collectives, the scaling curve
        #[arg(long, value_name = "ID", group = "subject")]
        cluster: Option<String>,
        /// Write HTML (inline SVG, no external assets) to FILE
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        /// Write Markdown to FILE (for a ticket)
        #[arg(long, value_name = "FILE")]
        markdown: Option<PathBuf>,
        /// History and fleet results within this window (30d, 12h, 2w)
        #[arg(long, default_value = "30d", value_name = "DURATION")]
        since: String,
    },
    /// Provision from declarative image specs (images/*.toml): plan, apply, verify, status, lint, log
    Provision {
        #[command(subcommand)]
        what: Provision,
    },
    /// Run the fleet service: agents upload results (POST /api/v1/records), readers ask the fleet
    /// (GET /api/v1/hosts, runs, compare, outliers, regressions, report), a dashboard (GET /) and
    /// Prometheus metrics (GET /metrics); stops on SIGTERM or SIGINT
    Serve {
        /// The address and port to listen on
        #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR:PORT")]
        listen: std::net::SocketAddr,
        /// Serve HTTPS with this certificate chain (PEM)
        #[arg(long, requires = "tls_key", value_name = "PEM")]
        tls_cert: Option<PathBuf>,
        /// …and this private key (PEM)
        #[arg(long, requires = "tls_cert", value_name = "PEM")]
        tls_key: Option<PathBuf>,
        /// Refuse uploads larger than this (answered 413)
        #[arg(long, default_value_t = 256, value_name = "MIB")]
        max_upload_mib: usize,
        /// Let anyone read the fleet (API reads, dashboard, metrics) without a token; uploads still
        /// need one
        #[arg(long)]
        anonymous_read: bool,
        /// After SIGTERM, how long requests in flight may take before they are cut off
        #[arg(long, default_value_t = 30, value_name = "SECONDS")]
        shutdown_deadline: u64,
        /// Read-only database connections (fleet questions run on them at once)
        #[arg(long, default_value_t = 4, value_name = "N")]
        readers: usize,
    },
    /// The fleet service's bearer tokens (kept in --db): create, list, revoke
    Token {
        #[command(subcommand)]
        what: TokenCmd,
    },
    /// A long-running exporter of live host and GPU (NVML) telemetry for Prometheus, as
    /// dcgm-exporter gives; stops on SIGTERM or SIGINT
    Agent {
        /// Serve /metrics on this address and port
        #[arg(long, value_name = "ADDR:PORT")]
        metrics: std::net::SocketAddr,
        /// The NVML library to load [default: libnvidia-ml.so.1]
        #[arg(long, env = "KILN_NVML_LIB", value_name = "PATH")]
        nvml_lib: Option<PathBuf>,
    },
    /// Tests across servers, run as every rank of a job that `srun`, `mpirun` or `torchrun` started
    /// (one rank per node); needs a kiln built with `--features mpi`
    Cluster {
        /// A rank that sees nothing move for this long (a rank died or hangs and the launcher did
        /// not end the job) says where it waited and exits 2, which ends the job
        #[arg(long, global = true, default_value_t = 120.0, value_name = "SECONDS")]
        stall_timeout: f64,
        #[command(subcommand)]
        what: ClusterCmd,
    },
    /// Send every result waiting for the fleet service now (after a failed upload, or to a new server)
    Sync {
        /// Queue every result this database holds first (those stored before a fleet service was
        /// configured, or for a new server); the server keeps each record once
        #[arg(long)]
        all: bool,
    },
    /// The results database itself
    Db {
        #[command(subcommand)]
        what: Db,
    },
}

#[derive(Subcommand)]
#[command(defer = true)]
pub enum Db {
    /// A full integrity check (`PRAGMA integrity_check`), read-only; exit 1 on any problem
    Check,
}

/// How `kiln compare` groups.
#[derive(ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum By {
    /// One row per configuration fingerprint
    Config,
}

impl From<By> for kiln_app::views::By {
    fn from(by: By) -> Self {
        match by {
            By::Config => kiln_app::views::By::Config,
        }
    }
}

// Which root an image targets and where image names are looked up.
#[derive(Args)]
pub struct ProvisionTarget {
    /// Target another root (a chroot, an image being built) instead of this machine
    #[arg(long, default_value = "/", value_name = "DIR")]
    pub root: PathBuf,
    /// Where image names are looked up [default: ./images, <prefix>/share/kiln/images,
    /// /usr/share/kiln/images, /etc/kiln/images]
    #[arg(long, env = "KILN_IMAGES", value_name = "DIR")]
    pub images: Option<PathBuf>,
    /// Change nothing: show what would be done (plan, verify, status, lint and log never change anything)
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Subcommand)]
#[command(defer = true)]
pub enum Provision {
    /// What applying IMAGE would change, in order, and why
    Plan {
        /// An image name (images/NAME.toml) or a path to a spec
        image: String,
        #[command(flatten)]
        target: ProvisionTarget,
    },
    /// Make the machine match IMAGE, one journaled step at a time (needs root)
    Apply {
        /// An image name (images/NAME.toml) or a path to a spec
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
        /// An image name (images/NAME.toml) or a path to a spec
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
        /// At most this many applies
        #[arg(long, default_value_t = 20)]
        limit: i64,
        #[command(flatten)]
        target: ProvisionTarget,
    },
}

#[derive(Subcommand)]
#[command(defer = true)]
pub enum Show {
    /// A stored inventory, by its id or a unique prefix of it
    Inventory {
        /// The inventory's id or a unique prefix of it
        id: String,
    },
    /// A stored run with its configuration, software stack, metrics, raw samples and telemetry
    Run {
        /// The run's id or a unique prefix of it
        id: String,
    },
}

/// Data types of the GEMM benchmark.
#[derive(ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dtype {
    F32,
    Bf16,
    F16,
    /// u8 × i8 → i32 (VNNI), through oneDNN where installed; in GOP/s
    Int8,
}

impl Dtype {
    /// The name results and metrics use.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::Int8 => "int8",
        }
    }
}

/// The training run's preset sizes.
#[derive(ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum Size {
    /// d_model 64, 2 layers, seq 64: seconds on a CPU (CI)
    Tiny,
    /// 3.3 M parameters: the model the PyTorch anchor trains
    Anchor,
    /// d_model 512, 8 layers, seq 256
    Small,
    /// GPT-2 small, 124 M parameters
    Gpt2,
    /// 350 M parameters
    #[value(name = "350m")]
    M350,
    /// 1 B parameters
    #[value(name = "1b")]
    B1,
}

impl Size {
    pub fn name(self) -> &'static str {
        match self {
            Size::Tiny => "tiny",
            Size::Anchor => "anchor",
            Size::Small => "small",
            Size::Gpt2 => "gpt2",
            Size::M350 => "350m",
            Size::B1 => "1b",
        }
    }
}

#[derive(Subcommand)]
#[command(defer = true)]
pub enum Bench {
    /// Host memory bandwidth: the STREAM kernels per NUMA node and in total
    Membw {
        /// Size of each of the three arrays [default: 4x the last-level caches, at least 256 MiB]
        #[arg(long, value_name = "MIB")]
        array_mib: Option<usize>,
        /// Untimed rounds before the measured ones
        #[arg(long, default_value_t = 2)]
        warmup: usize,
        /// Measured rounds
        #[arg(long, default_value_t = 10)]
        repetitions: usize,
        #[command(flatten)]
        store: Store,
    },
    /// The set a commission or a nightly run uses: membw, gemm, train, sdc, disk, within a time budget
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
        /// A directory on a data drive (repeat for each): `kiln bench data` there, at the rate of
        /// the suite's training run
        #[arg(long = "data-dir", value_name = "DIR")]
        data_dirs: Vec<PathBuf>,
        #[command(flatten)]
        store: Store,
    },
    /// The reference training run: a GPT-style transformer trained with AdamW (candle, on the CPU)
    Train {
        /// The model and batch preset; the flags below override its parts
        #[arg(long, value_enum, default_value = "tiny")]
        size: Size,
        /// Transformer blocks
        #[arg(long)]
        layers: Option<usize>,
        /// Width of the residual stream
        #[arg(long)]
        d_model: Option<usize>,
        /// Attention heads (must divide --d-model)
        #[arg(long)]
        heads: Option<usize>,
        /// Tokens per sequence
        #[arg(long)]
        seq: Option<usize>,
        /// Sequences per step
        #[arg(long)]
        batch: Option<usize>,
        /// Optimiser steps
        #[arg(long)]
        steps: Option<usize>,
        /// Seed of the corpus and the parameters (the same seed gives the same loss curve)
        #[arg(long)]
        seed: Option<u64>,
        /// Only f32 on the CPU for now
        #[arg(long, value_enum, default_value = "f32")]
        dtype: Dtype,
        /// fused: kiln's CPU kernels with hand-written backward passes; composed: candle's elementary ops
        #[arg(long, default_value = "fused")]
        kernels: kiln_bench::train::Kernels,
        /// What the fused path's dense layers multiply with: auto (OpenBLAS, else oneDNN, where
        /// installed; else candle), candle, openblas or onednn; the choice is stored with the run
        #[arg(long, default_value = "auto")]
        gemm: kiln_bench::train::Gemm,
        /// Read each step's batch from shards written under DIR (a scratch directory, removed
        /// afterwards), through the input pipeline: the step times then include waiting on storage
        #[arg(long, value_name = "DIR")]
        data: Option<PathBuf>,
        #[command(flatten)]
        store: Store,
    },
    /// Dense matrix multiply per dtype and size, against the measured FMA peak
    Gemm {
        /// Square sizes n (n×n times n×n), comma-separated
        #[arg(long, value_delimiter = ',', default_value = "256,512,1024,2048")]
        sizes: Vec<usize>,
        /// Data types, comma-separated
        #[arg(long, value_enum, value_delimiter = ',', default_value = "f32,bf16,f16")]
        dtypes: Vec<Dtype>,
        /// Measured multiplies per size
        #[arg(long, default_value_t = 10)]
        repetitions: usize,
        /// Maintained libraries to measure beside candle, found at run time: `all` (every one
        /// installed), `none`, or some of openblas, blis, onednn
        #[arg(long, value_delimiter = ',', default_value = "all")]
        libraries: Vec<String>,
        #[command(flatten)]
        store: Store,
    },
    /// The GPU benchmarks, measured by kiln-gpu (found beside kiln, on PATH, or named by KILN_GPU);
    /// skipped, with the reason and exit status 3, where there is no NVIDIA GPU, driver or kiln-gpu
    Gpu {
        #[command(subcommand)]
        what: GpuBench,
    },
    /// A screen for silent data corruption: every CPU runs the same deterministic kernels (FMA
    /// chains, a GEMM, integer multiplies, CRC-32, SHA-256, AES-GCM, deflate), compared bit for bit
    /// across CPUs and against known answers; a CPU that differs is named and fails the run
    Sdc {
        /// How long every CPU runs the kernels
        #[arg(long, default_value_t = 30.0, value_name = "S")]
        seconds: f64,
        #[command(flatten)]
        store: Store,
    },
    /// Network: TCP throughput and latency to another kiln (`--serve` there, `--connect` here)
    Net {
        /// Serve clients on this address until idle for --idle seconds
        #[arg(
            long,
            value_name = "ADDR",
            num_args = 0..=1,
            default_missing_value = "0.0.0.0:5201",
            conflicts_with = "connect"
        )]
        serve: Option<String>,
        /// Measure against a serving kiln
        #[arg(long, value_name = "HOST:PORT")]
        connect: Option<String>,
        /// Parallel TCP streams
        #[arg(long, default_value_t = 4)]
        streams: usize,
        /// Seconds per repetition
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// Measured repetitions
        #[arg(long, default_value_t = 5)]
        repetitions: usize,
        /// The server stops after this many seconds without a connection
        #[arg(long, default_value_t = 600)]
        idle: u64,
        #[command(flatten)]
        store: Store,
    },
    /// Storage that feeds training: a dataset on DIRs read by a loader like training's into
    /// emulated accelerators; their utilisation (AU), delivered vs needed, the bottleneck
    Data {
        /// Directories to hold the dataset (one per drive, or a striped volume); a scratch
        /// directory in each, removed afterwards
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// tokens (large shards read sequentially, shards shuffled) or samples (100 KB-1 MB
        /// records in shuffled order)
        #[arg(long, default_value = "tokens")]
        layout: String,
        /// The dataset's size over all DIRs
        #[arg(long, default_value_t = 4096, value_name = "MIB")]
        size_mib: u64,
        /// Bytes per shard file
        #[arg(long, default_value_t = 64, value_name = "MIB")]
        shard_mib: u64,
        /// Reader threads, or reads in flight with --engine uring [default: 4 per directory]
        #[arg(long)]
        readers: Option<usize>,
        /// threads (blocking reads, as PyTorch's DataLoader workers) or uring (one thread keeping
        /// --readers reads in flight through io_uring)
        #[arg(long, default_value = "threads")]
        engine: String,
        /// Read through the page cache, as a framework's loader does, each read's pages evicted
        /// after it (as from a dataset far larger than memory), instead of O_DIRECT
        #[arg(long)]
        buffered: bool,
        /// Samples read ahead of the accelerators
        #[arg(long, default_value_t = 64)]
        prefetch: usize,
        /// Samples per batch
        #[arg(long, default_value_t = 8)]
        batch: usize,
        /// Emulated accelerators [default: this box's GPUs, else 1]
        #[arg(long)]
        accelerators: Option<usize>,
        /// What all accelerators together consume, in GB/s [default: what this box's latest
        /// stored training run implies: its tokens/s × --bytes-per-token]
        #[arg(long, value_name = "GB/S")]
        rate: Option<f64>,
        /// Bytes of one token in the shards (uint16 token ids: 2)
        #[arg(long, default_value_t = 2)]
        bytes_per_token: u32,
        /// Seconds per pass
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        #[command(flatten)]
        store: Store,
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
        #[command(flatten)]
        store: Store,
    },
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's own consistency checks over every command, deferred ones built too.
    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}

#[derive(Subcommand)]
#[command(defer = true)]
pub enum TokenCmd {
    /// Make a token and print it once (only its hash is stored)
    Create {
        /// A name for people: the box, the team or the service that uses it (unique among live tokens)
        #[arg(long)]
        name: String,
        /// agent: uploads its own host's results; reader: reads the fleet; admin: reads, and uploads for any
        /// host; importer: loads exports of any hosts (another site's), without reading
        #[arg(long, value_enum, default_value = "agent")]
        role: TokenRole,
        /// The identity of the one host an agent token speaks for (`kiln inventory --json`'s
        /// fingerprints.host); without it, the host of the token's first upload
        #[arg(long, value_name = "IDENTITY")]
        host: Option<String>,
    },
    /// List the tokens (never their secrets)
    List,
    /// Revoke a token by name or id: it stops working at once
    Revoke {
        #[arg(value_name = "NAME|ID")]
        name_or_id: String,
    },
}

/// What a verdict sets off where the cluster is scheduled [also: `on_reject`, `slurm_node` and
/// `on_verdict` in /etc/kiln/agent.toml]
#[derive(Args, Clone, Debug, Default)]
pub struct Act {
    /// drain: on REJECT, drain this node in Slurm (`scontrol update … State=DRAIN`, the first failing
    /// check as the reason), and on a later ACCEPT resume it if kiln drained it (never a node drained
    /// by someone else); nothing: leave the scheduler alone
    #[arg(long, value_enum, value_name = "ACTION")]
    pub on_reject: Option<OnReject>,
    /// The node's name in Slurm [default: this host's name up to its first dot]
    #[arg(long, value_name = "NAME")]
    pub slurm_node: Option<String>,
    /// A shell command run after the verdict with its JSON document on standard input (KILN_VERDICT
    /// and KILN_VERDICT_ID in its environment); its exit status is recorded
    #[arg(long, value_name = "COMMAND")]
    pub on_verdict: Option<String>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnReject {
    Drain,
    Nothing,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum TokenRole {
    Agent,
    Reader,
    Admin,
    Importer,
}

#[derive(Subcommand)]
#[command(defer = true)]
pub enum ClusterCmd {
    /// Where this process sits in its job (launcher, rank, world size, local rank), and whether this
    /// kiln has MPI
    Env,
    /// Bandwidth both ways and round trips between every pair of nodes, per NIC (rail), in a
    /// round-robin tournament (each node in one pair at a time); names the slow node, NIC or link
    /// and its direction: exit 1 when one is slow
    Fabric {
        /// Parallel TCP streams per measurement
        #[arg(long, default_value_t = 4)]
        streams: usize,
        /// Seconds per repetition and direction
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
        /// Repetitions per direction (their median is the link's figure)
        #[arg(long, default_value_t = 3)]
        repetitions: usize,
        /// Interfaces to test, one rail each, matched by position across nodes (repeat the flag)
        /// [default: the default route's]
        #[arg(long = "iface", value_name = "NAME")]
        interfaces: Vec<String>,
        /// Make the test's sockets in this network namespace; `{rank}` and `{local_rank}` are
        /// replaced (e.g. /run/netns/rail{local_rank})
        #[arg(long, value_name = "PATH")]
        netns: Option<String>,
        /// The spec's floor for one link: below it a link is slow whatever its peers do
        #[arg(long, value_name = "GBPS")]
        min_gbps: Option<f64>,
        #[command(flatten)]
        store: Store,
    },
    /// The reference training run, data-parallel (gradients all-reduced every step) on 1, 2, 4 … N
    /// ranks with the same batch per rank (weak scaling): tokens/s per rank, scaling efficiency and
    /// the all-reduce's share of a step
    Train {
        /// The model and batch preset
        #[arg(long, value_enum, default_value = "tiny")]
        size: Size,
        /// Optimiser steps at each rank count [default: the preset's]
        #[arg(long)]
        steps: Option<usize>,
        /// Sequences per step per rank [default: the preset's]
        #[arg(long)]
        batch: Option<usize>,
        /// Train on each rank's GPU through kiln-gpu, NCCL summing the gradients (rank 0's NCCL id
        /// handed to every rank over MPI), instead of on the CPUs over MPI
        #[arg(long)]
        nccl: bool,
        /// With --nccl: how the products run, bf16 (mixed precision), tf32 or f32 [default: bf16]
        #[arg(long, requires = "nccl")]
        dtype: Option<String>,
        #[command(flatten)]
        store: Store,
    },
    /// All-reduce, all-gather, reduce-scatter and all-to-all across every rank at each size, with
    /// algorithm and bus bandwidth as nccl-tests computes them (MPI on CPU ranks)
    Collectives {
        /// Smallest message (bytes, or with K, M, G)
        #[arg(long, default_value = "8", value_parser = parse_size)]
        min_bytes: u64,
        /// Largest message
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        max_bytes: u64,
        /// Collectives, comma-separated [default: all four]
        #[arg(long, value_enum, value_delimiter = ',')]
        ops: Vec<CollectiveOp>,
        /// Timed iterations per size at most
        #[arg(long, default_value_t = 20)]
        iterations: usize,
        /// Untimed iterations per size
        #[arg(long, default_value_t = 5)]
        warmup: usize,
        /// Fewer iterations where a size would take longer than this
        #[arg(long, default_value_t = 0.5, value_name = "SECONDS")]
        seconds_per_size: f64,
        /// Through NCCL on each rank's GPU (its local rank's, or the one CUDA_VISIBLE_DEVICES
        /// leaves it), run by kiln-gpu, instead of MPI on its CPUs
        #[arg(long)]
        nccl: bool,
        #[command(flatten)]
        store: Store,
    },
}

fn parse_size(s: &str) -> Result<u64, String> {
    kiln_cluster::parse_size(s)
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum CollectiveOp {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
}

impl From<CollectiveOp> for kiln_bench::cluster::Collective {
    fn from(op: CollectiveOp) -> Self {
        use kiln_bench::cluster::Collective;
        match op {
            CollectiveOp::AllReduce => Collective::AllReduce,
            CollectiveOp::AllGather => Collective::AllGather,
            CollectiveOp::ReduceScatter => Collective::ReduceScatter,
            CollectiveOp::AllToAll => Collective::AllToAll,
        }
    }
}
