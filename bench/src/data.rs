//! Storage that feeds training (`kiln bench data`): does this box's storage keep its accelerators
//! busy? DLIO (MLPerf Storage) is the anchor: a dataset laid out as training reads it, a data
//! loader like training's (reader threads, a prefetch queue, shuffled order), and emulated
//! accelerators that take a batch, then "compute" for the time the real ones would; the answer is
//! the accelerator utilisation (AU: the share of time they computed rather than waited on data),
//! delivered against needed throughput, per directory and in all, read latency, the readers' CPU,
//! the bottleneck named, and the largest consumption rate the storage sustains at AU ≥ 90 %.
//!
//! Two layouts: `tokens` (LLM pre-training: large shards, each read sequentially in 1 MiB reads,
//! shards in shuffled order, many readers) and `samples` (image-style: records of 100 KB–1 MB
//! packed in shards, read one by one in shuffled order). Reads are O_DIRECT where the filesystem
//! takes it, so the page cache is not what is measured; where it refuses (tmpfs), the report says
//! the reads were buffered.
//!
//! Safety: only inside the directories given (never a block device), in a scratch directory of an
//! unpredictable name created `mkdir 0700` under each, removed with everything in it however the
//! run ends (an error, a panic, Ctrl-C through `stop`); one a killed kiln left is removed by the
//! next run.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::resource::{getrusage, UsageWho};
use serde::{Deserialize, Serialize};

use crate::stats::{percentile_sorted, splitmix64};

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: {source}", path = .0.display(), source = .1)]
    Io(PathBuf, std::io::Error),
    #[error("{path}: not a directory (kiln bench data writes its dataset only inside directories, never on a device)", path = .0.display())]
    NotADirectory(PathBuf),
    #[error("io_uring is not available here ({0}; a kernel before 5.1, io_uring_disabled, or a container's seccomp policy): use --engine threads")]
    Uring(std::io::Error),
    #[error("interrupted")]
    Interrupted,
}

/// How the dataset is laid out and read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// Large token shards, each read sequentially, shards in random order.
    Tokens,
    /// Records of 100 KB–1 MB packed in shards, read in random order.
    Samples,
}

/// How the loader's readers read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// `readers` threads, each one blocking read at a time (as PyTorch's DataLoader workers).
    #[default]
    Threads,
    /// One thread keeping `readers` reads in flight through io_uring.
    Uring,
}

impl Engine {
    pub fn parse(s: &str) -> Option<Engine> {
        match s {
            "threads" => Some(Engine::Threads),
            "uring" | "io_uring" => Some(Engine::Uring),
            _ => None,
        }
    }
}

impl Layout {
    pub fn parse(s: &str) -> Option<Layout> {
        match s {
            "tokens" => Some(Layout::Tokens),
            "samples" => Some(Layout::Samples),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    pub dirs: Vec<PathBuf>,
    pub layout: Layout,
    /// Bytes of the whole dataset, spread over `dirs`.
    pub dataset_bytes: u64,
    /// Bytes per shard file.
    pub shard_bytes: u64,
    /// Reader threads (`Engine::Threads`), or reads in flight (`Engine::Uring`).
    pub readers: usize,
    /// How the readers read.
    #[serde(default)]
    pub engine: Engine,
    /// Read through the page cache as a training framework's loader does, each read's pages
    /// evicted after it (`posix_fadvise(DONTNEED)`, as if the dataset were far larger than memory),
    /// rather than O_DIRECT.
    #[serde(default)]
    pub buffered: bool,
    /// Samples read ahead of the accelerators (the loader's queue).
    pub prefetch: usize,
    /// Samples per batch.
    pub batch: usize,
    /// Emulated accelerators, each consuming its share of `rate`.
    pub accelerators: usize,
    /// Bytes per second all accelerators together need; `None`: only the flat-out pass.
    pub rate: Option<f64>,
    /// Seconds per pass.
    pub seconds: f64,
}

/// One directory's part.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirResult {
    pub dir: String,
    /// The block device that holds the directory (`nvme0n1`, or `md0 (nvme0n1, nvme1n1)` for a
    /// volume over several), from the directory's device number and `/sys/dev/block`.
    #[serde(default)]
    pub device: Option<String>,
    /// Whether reads bypassed the page cache.
    pub direct: bool,
    pub bytes: u64,
    pub reads: u64,
    pub gbps: f64,
    pub read_p50_us: f64,
    pub read_p99_us: f64,
}

/// One pass: the loader feeding the accelerators for `seconds`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pass {
    /// Bytes per second the accelerators asked for (0: as fast as it comes).
    pub needed_gbps: f64,
    pub delivered_gbps: f64,
    pub samples_per_s: f64,
    /// Accelerator utilisation, 0–1: computing / (computing + waiting on data).
    pub au: f64,
    pub seconds: f64,
    pub read_p50_us: f64,
    pub read_p99_us: f64,
    /// CPU time of the reader threads per second of the pass: cores busy reading (io_uring: the
    /// whole process's, io_uring's kernel workers included, less the emulated accelerators').
    pub reader_cpu_cores: f64,
    /// The share of the bytes read that the storage layer fetched during the pass (`read_bytes` of
    /// each reader thread's `/proc/thread-self/io`; io_uring: the process's `/proc/self/io`): about
    /// 1 when every read reached a drive, about 0 when
    /// memory served them (a tmpfs, or the page cache); `None` where the kernel does not count.
    #[serde(default)]
    pub from_storage: Option<f64>,
    pub dirs: Vec<DirResult>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub layout: Layout,
    pub dataset_bytes: u64,
    pub shards: usize,
    /// Every read bypassed the page cache (O_DIRECT).
    pub direct: bool,
    /// How the readers read.
    #[serde(default)]
    pub engine: Engine,
    /// As fast as the loader delivers, no compute.
    pub flat_out: Pass,
    /// At the accelerators' rate, when one was given.
    pub at_rate: Option<Pass>,
    /// The largest rate at which the accelerators would still compute ≥ 90 % of the time: the
    /// flat-out delivery / 0.9 (with a full prefetch queue, AU = delivered / needed).
    pub max_rate_au90_gbps: f64,
    /// What holds the accelerators back, when they wait (AU < 90 % at the rate); `None` otherwise.
    pub bottleneck: Option<String>,
}

/// The prefix of scratch directories: `.kiln-data-<pid>-<random>`.
const SCRATCH_PREFIX: &str = ".kiln-data-";

/// Removes the scratch directories with everything in them however the run ends.
struct Scratch(Vec<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        for d in self.0.drain(..) {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Removes the scratch directories of kilns that no longer run; returns how many. Only real
/// directories (never a link someone planted in one's place).
pub fn remove_stale_scratch(dir: &Path) -> usize {
    crate::disk::orphans(dir, SCRATCH_PREFIX)
        .into_iter()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()) && std::fs::remove_dir_all(e.path()).is_ok())
        .count()
}

/// A buffer aligned for O_DIRECT.
struct Aligned(Vec<u8>, usize);

impl Aligned {
    fn new(len: usize) -> Aligned {
        let buf = vec![0u8; len + 4096];
        let off = buf.as_ptr().align_offset(4096);
        Aligned(buf, off)
    }
    fn get(&mut self, len: usize) -> &mut [u8] {
        &mut self.0[self.1..self.1 + len]
    }
}

/// One read a reader makes: which shard, where, how long.
#[derive(Clone, Copy)]
struct Read {
    shard: usize,
    offset: u64,
    len: usize,
}

/// A shard on disk.
struct Shard {
    dir: usize,
    file: File,
    direct: bool,
}

fn open_shard(path: &Path, create: bool) -> std::io::Result<(File, bool)> {
    let mut o = OpenOptions::new();
    o.read(true);
    if create {
        o.write(true).create_new(true).mode(0o600);
    }
    crate::disk::open_direct(path, &o, libc::O_NOFOLLOW)
}

/// Writes the dataset: `shards` files round-robin over the scratch directories, pseudo-random
/// bytes (nothing a drive could compress or deduplicate), 1 MiB writes.
fn write_dataset(
    scratch: &[PathBuf],
    config: &Config,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<Shard>, DataError> {
    let shards = (config.dataset_bytes / config.shard_bytes).max(scratch.len() as u64) as usize;
    let mut out = Vec::with_capacity(shards);
    let mut buf = Aligned::new(1 << 20);
    let mut seed = 0x6461_7461_u64;
    for i in 0..shards {
        if stop.load(Ordering::Relaxed) {
            return Err(DataError::Interrupted);
        }
        let dir = i % scratch.len();
        let path = scratch[dir].join(format!("shard-{i:05}.bin"));
        progress(&format!("writing the dataset: shard {}/{shards}", i + 1));
        let io = |e| DataError::Io(path.clone(), e);
        // Written through O_DIRECT (nothing left in the page cache), then reopened for reading.
        let (file, _) = open_shard(&path, true).map_err(io)?;
        let mut at = 0;
        while at < config.shard_bytes {
            for chunk in buf.get(1 << 20).chunks_exact_mut(8) {
                chunk.copy_from_slice(&splitmix64(&mut seed).to_le_bytes());
            }
            file.write_all_at(buf.get(1 << 20), at).map_err(io)?;
            at += 1 << 20;
        }
        file.sync_all().map_err(io)?;
        // Where O_DIRECT was refused the written pages sit in the page cache: evicted (clean now).
        evict(&file, 0, 0);
        drop(file);
        let (file, direct) = if config.buffered {
            let mut o = OpenOptions::new();
            o.read(true).custom_flags(libc::O_NOFOLLOW);
            (o.open(&path).map_err(io)?, false)
        } else {
            open_shard(&path, false).map_err(io)?
        };
        out.push(Shard { dir, file, direct });
    }
    Ok(out)
}

/// The reads of one epoch, in the order the loader hands them out: token shards in shuffled order,
/// each read sequentially in 1 MiB reads; or records of 100 KB–1 MB (4 KiB-aligned for O_DIRECT)
/// packed in the shards, every record in shuffled order.
fn plan(layout: Layout, shards: usize, shard_bytes: u64, seed: u64) -> Vec<Read> {
    let mut rng = seed;
    let mut shuffle = |v: &mut Vec<Read>| {
        for i in (1..v.len()).rev() {
            let j = (splitmix64(&mut rng) % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    };
    match layout {
        Layout::Tokens => {
            let mut order: Vec<Read> = (0..shards).map(|s| Read { shard: s, offset: 0, len: 0 }).collect();
            shuffle(&mut order);
            order
                .into_iter()
                .flat_map(|s| {
                    (0..shard_bytes >> 20).map(move |i| Read { shard: s.shard, offset: i << 20, len: 1 << 20 })
                })
                .collect()
        }
        Layout::Samples => {
            let mut sizes = 0x7361_6d70_u64;
            let mut reads = Vec::new();
            for shard in 0..shards {
                let mut at = 0;
                loop {
                    let len = (100_000 + splitmix64(&mut sizes) % 900_001).div_ceil(4096) * 4096;
                    if at + len > shard_bytes {
                        break;
                    }
                    reads.push(Read { shard, offset: at, len: len as usize });
                    at += len;
                }
            }
            shuffle(&mut reads);
            reads
        }
    }
}

/// What the readers saw.
#[derive(Default)]
struct Seen {
    /// Per directory: bytes, and each read's microseconds.
    bytes: Vec<u64>,
    latency: Vec<Vec<f64>>,
    cpu_seconds: f64,
    /// Bytes the storage layer fetched for these reads (`None`: not counted here).
    storage_bytes: Option<u64>,
}

impl Seen {
    fn new(dirs: usize) -> Seen {
        Seen { bytes: vec![0; dirs], latency: vec![Vec::new(); dirs], cpu_seconds: 0.0, storage_bytes: Some(0) }
    }

    fn add(&mut self, mine: &mut Seen) {
        for (d, bytes) in mine.bytes.iter().enumerate() {
            self.bytes[d] += bytes;
            self.latency[d].append(&mut mine.latency[d]);
        }
        self.cpu_seconds += mine.cpu_seconds;
        self.storage_bytes = self.storage_bytes.zip(mine.storage_bytes).map(|(a, b)| a + b);
    }

    /// A read `r` of `shard` that began at `t0` has completed (either engine): its latency and
    /// bytes are counted, then a buffered shard's pages are evicted, so that the next epoch reads
    /// the storage again, as from a dataset far larger than memory.
    fn read(&mut self, shard: &Shard, r: Read, t0: Instant) {
        self.latency[shard.dir].push(t0.elapsed().as_secs_f64() * 1e6);
        self.bytes[shard.dir] += r.len as u64;
        if !shard.direct {
            evict(&shard.file, r.offset, r.len as u64);
        }
    }
}

/// Drops a file range from the page cache (clean pages only; a hint the kernel may ignore).
fn evict(file: &File, offset: u64, len: u64) {
    let _ = nix::fcntl::posix_fadvise(
        file,
        offset as libc::off_t,
        len as libc::off_t,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    );
}

/// Bytes this thread (`/proc/thread-self/io`) or the whole process (`/proc/self/io`) has had the
/// storage layer fetch (`read_bytes`): reads that a drive served, not the page cache or a tmpfs.
fn storage_read_bytes(of: &str) -> Option<u64> {
    let text = std::fs::read_to_string(of).ok()?;
    text.lines().find_map(|l| l.strip_prefix("read_bytes:")).and_then(|v| v.trim().parse().ok())
}

/// What the readers share: the reads in order, the next one's index, and when to stop.
struct Feed<'a> {
    shards: &'a [Shard],
    order: &'a [Read],
    next: &'a AtomicUsize,
    done: &'a AtomicBool,
    stop: &'a AtomicBool,
    /// The first read that failed: its directory's index and the error.
    failed: Mutex<Option<(usize, std::io::Error)>>,
}

impl Feed<'_> {
    fn fail(&self, dir: usize, e: std::io::Error) {
        self.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert((dir, e));
    }

    fn running(&self) -> bool {
        !self.done.load(Ordering::Relaxed) && !self.stop.load(Ordering::Relaxed)
    }

    /// The next read, epoch after epoch in the same shuffled order.
    fn take(&self) -> Read {
        self.order[self.next.fetch_add(1, Ordering::Relaxed) % self.order.len()]
    }
}

/// A reader thread: one blocking read at a time, each handed to the queue.
fn thread_reader(feed: &Feed<'_>, tx: &mpsc::SyncSender<usize>, mine: &mut Seen) {
    let mut buf = Aligned::new(1 << 20);
    let storage_before = storage_read_bytes("/proc/thread-self/io");
    while feed.running() {
        let r = feed.take();
        let shard = &feed.shards[r.shard];
        let t0 = Instant::now();
        if let Err(e) = shard.file.read_exact_at(buf.get(r.len), r.offset) {
            feed.fail(shard.dir, e);
            break;
        }
        mine.read(shard, r, t0);
        if tx.send(r.len).is_err() {
            break;
        }
    }
    mine.cpu_seconds = cpu_seconds(UsageWho::RUSAGE_THREAD);
    mine.storage_bytes = storage_before.zip(storage_read_bytes("/proc/thread-self/io")).map(|(a, b)| b - a);
}

/// One thread keeping `depth` reads in flight through io_uring, each handed to the queue as it
/// completes; a failed read is recorded in `feed`, the ring's own failure returned. Every buffer outlives its read: the loop ends only when nothing is in flight, and a
/// ring that fails mid-way leaks the buffers rather than free memory the kernel may still write.
fn uring_reader(feed: &Feed<'_>, depth: usize, tx: &mpsc::SyncSender<usize>, mine: &mut Seen) -> std::io::Result<()> {
    use io_uring::{opcode, types, IoUring};
    use std::os::fd::AsRawFd;
    let depth = depth.clamp(1, 1024);
    let mut ring = IoUring::new(depth.next_power_of_two() as u32)?;
    let mut bufs: Vec<Aligned> = (0..depth).map(|_| Aligned::new(1 << 20)).collect();
    // Per slot: the read, the bytes it has so far, when it was first submitted.
    let mut slots: Vec<Option<(Read, usize, Instant)>> = vec![None; depth];
    // Slots whose read goes in next round: fresh ones, and short reads' remainders.
    let mut queued: Vec<usize> = Vec::new();
    let (mut in_flight, mut refill) = (0usize, true);
    loop {
        if refill && feed.running() {
            for (slot, state) in slots.iter_mut().enumerate().filter(|(_, s)| s.is_none()) {
                *state = Some((feed.take(), 0, Instant::now()));
                queued.push(slot);
            }
        }
        for slot in queued.drain(..) {
            let Some((r, got, _)) = slots[slot] else { continue };
            let fd = types::Fd(feed.shards[r.shard].file.as_raw_fd());
            let buf = &mut bufs[slot].get(r.len)[got..];
            let entry = opcode::Read::new(fd, buf.as_mut_ptr(), buf.len() as u32)
                .offset(r.offset + got as u64)
                .build()
                .user_data(slot as u64);
            // SAFETY: the buffer (a slot of `bufs`, never reallocated) and the file (in `shards`,
            // borrowed for this function's whole run) outlive the read: the loop waits for every
            // read in flight before returning, and leaks `bufs` where it cannot. The ring has room
            // for every slot, and the queue is submitted empty each round, so the push succeeds.
            if unsafe { ring.submission().push(&entry) }.is_ok() {
                in_flight += 1;
            } else {
                slots[slot] = None;
            }
        }
        if in_flight == 0 {
            break;
        }
        if let Err(e) = ring.submit_and_wait(1) {
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            std::mem::forget(bufs);
            return Err(e);
        }
        let finished: Vec<(usize, i32)> = ring.completion().map(|c| (c.user_data() as usize, c.result())).collect();
        for (slot, result) in finished {
            in_flight -= 1;
            let Some((r, got, t0)) = slots[slot].take() else { continue };
            if result <= 0 {
                refill = false;
                feed.fail(
                    feed.shards[r.shard].dir,
                    if result == 0 {
                        std::io::Error::from(std::io::ErrorKind::UnexpectedEof)
                    } else {
                        std::io::Error::from_raw_os_error(-result)
                    },
                );
                continue;
            }
            let got = got + result as usize;
            if got < r.len {
                if feed.running() {
                    slots[slot] = Some((r, got, t0));
                    queued.push(slot);
                }
                continue;
            }
            mine.read(&feed.shards[r.shard], r, t0);
            if tx.send(r.len).is_err() {
                refill = false;
            }
        }
    }
    Ok(())
}

/// One pass: the readers read in `order`'s order into the queue; `accelerators` threads take
/// `batch` samples, then compute for the time their share of `rate` allows.
///
/// # Errors
/// The first read that failed, with its directory's index.
fn pass(
    shards: &[Shard],
    dirs: usize,
    order: &[Read],
    config: &Config,
    rate: Option<f64>,
    stop: &AtomicBool,
) -> Result<Pass, (usize, std::io::Error)> {
    let next = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let feed = Feed { shards, order, next: &next, done: &done, stop, failed: Mutex::new(None) };
    let threads = match config.engine {
        Engine::Threads => config.readers.max(1),
        Engine::Uring => 1,
    };
    let active = AtomicUsize::new(threads);
    let (tx, rx) = mpsc::sync_channel::<usize>(config.prefetch.max(1));
    let rx = Mutex::new(rx);
    let seen = Mutex::new(Seen::new(dirs));
    let per_acc = rate.map(|r| r / config.accelerators.max(1) as f64);
    let storage_before = storage_read_bytes("/proc/self/io");
    let cpu_before = cpu_seconds(UsageWho::RUSAGE_SELF);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(config.seconds);
    let (computing, waiting, delivered, consumers_cpu) = std::thread::scope(|s| {
        for _ in 0..threads {
            let tx = tx.clone();
            let (feed, seen, active) = (&feed, &seen, &active);
            s.spawn(move || {
                let mut mine = Seen::new(dirs);
                match config.engine {
                    Engine::Threads => thread_reader(feed, &tx, &mut mine),
                    Engine::Uring => {
                        if let Err(e) = uring_reader(feed, config.readers, &tx, &mut mine) {
                            feed.fail(0, std::io::Error::new(e.kind(), format!("io_uring: {e}")));
                        }
                    }
                }
                seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).add(&mut mine);
                active.fetch_sub(1, Ordering::Relaxed);
            });
        }
        drop(tx);
        let consumers: Vec<_> = (0..config.accelerators.max(1))
            .map(|_| {
                let rx = &rx;
                s.spawn(move || accelerator(rx, config.batch, per_acc, deadline, stop))
            })
            .collect();
        let results: Vec<(f64, f64, u64, f64)> =
            consumers.into_iter().map(|h| h.join().unwrap_or((0.0, 0.0, 0, 0.0))).collect();
        done.store(true, Ordering::Relaxed);
        // Readers blocked on a full queue go on once it drains: drain it until every one has seen
        // `done` and left.
        let rx = rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while active.load(Ordering::Relaxed) > 0 {
            let _ = rx.recv_timeout(Duration::from_millis(5));
        }
        results.iter().fold((0.0, 0.0, 0u64, 0.0), |a, r| (a.0 + r.0, a.1 + r.1, a.2 + r.2, a.3 + r.3))
    });
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    if let Some(failed) = feed.failed.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
        return Err(failed);
    }
    let mut seen = seen.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    // io_uring's reads may be issued by its kernel workers, threads of this process: counted
    // process-wide (whatever else the process did meanwhile included).
    if config.engine == Engine::Uring {
        seen.cpu_seconds = (cpu_seconds(UsageWho::RUSAGE_SELF) - cpu_before - consumers_cpu).max(0.0);
        seen.storage_bytes = storage_before.zip(storage_read_bytes("/proc/self/io")).map(|(a, b)| b.saturating_sub(a));
    }
    let read_bytes: u64 = seen.bytes.iter().sum();
    let from_storage = seen.storage_bytes.filter(|_| read_bytes > 0).map(|s| s as f64 / read_bytes as f64);
    let mut all_lat: Vec<f64> = seen.latency.iter().flatten().copied().collect();
    all_lat.sort_by(f64::total_cmp);
    let dir_results = (0..dirs)
        .map(|d| {
            let mut lat = seen.latency[d].clone();
            lat.sort_by(f64::total_cmp);
            DirResult {
                dir: String::new(),
                device: None,
                direct: shards.iter().filter(|s| s.dir == d).all(|s| s.direct),
                bytes: seen.bytes[d],
                reads: lat.len() as u64,
                gbps: seen.bytes[d] as f64 / elapsed / 1e9,
                read_p50_us: percentile_sorted(&lat, 0.5),
                read_p99_us: percentile_sorted(&lat, 0.99),
            }
        })
        .collect();
    let samples = all_lat.len() as f64;
    Ok(Pass {
        needed_gbps: rate.unwrap_or(0.0) / 1e9,
        delivered_gbps: delivered as f64 / elapsed / 1e9,
        samples_per_s: samples / elapsed,
        au: if rate.is_some() && computing + waiting > 0.0 { computing / (computing + waiting) } else { 0.0 },
        seconds: elapsed,
        read_p50_us: percentile_sorted(&all_lat, 0.5),
        read_p99_us: percentile_sorted(&all_lat, 0.99),
        reader_cpu_cores: seen.cpu_seconds / elapsed,
        from_storage,
        dirs: dir_results,
    })
}

/// The block device holding `dir`: its partition's disk (`nvme0n1p2` → `nvme0n1`), and for a
/// device-mapper or RAID volume the disks under it. `None` for a filesystem without one (tmpfs,
/// overlay, NFS).
pub fn device_of(dir: &Path) -> Option<String> {
    let st = nix::sys::stat::stat(dir).ok()?;
    #[allow(clippy::unnecessary_cast)] // dev_t is not u64 everywhere
    let dev = st.st_dev as u64;
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    let sys = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    // A partition's directory sits inside its disk's.
    let disk = if sys.join("partition").exists() { sys.parent()?.to_path_buf() } else { sys };
    let name = disk.file_name()?.to_string_lossy().into_owned();
    let mut under: Vec<String> = std::fs::read_dir(disk.join("slaves"))
        .map(|e| e.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    under.sort();
    Some(if under.is_empty() { name } else { format!("{name} ({})", under.join(", ")) })
}

/// An emulated accelerator until `deadline`: takes `batch` samples from the queue, then computes
/// for as long as its share of the rate (`per_acc`, bytes/s) allows. Seconds computing, seconds
/// waiting, bytes taken, and its own CPU seconds.
fn accelerator(
    rx: &Mutex<mpsc::Receiver<usize>>,
    batch: usize,
    per_acc: Option<f64>,
    deadline: Instant,
    stop: &AtomicBool,
) -> (f64, f64, u64, f64) {
    let (mut computing, mut waiting, mut bytes) = (0.0f64, 0.0f64, 0u64);
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        let mut taken = 0u64;
        for _ in 0..batch.max(1) {
            let got = rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner).recv();
            match got {
                Ok(len) => taken += len as u64,
                Err(_) => return (computing, waiting, bytes, cpu_seconds(UsageWho::RUSAGE_THREAD)),
            }
        }
        waiting += t0.elapsed().as_secs_f64();
        bytes += taken;
        if let Some(r) = per_acc {
            let compute = taken as f64 / r;
            std::thread::sleep(Duration::from_secs_f64(compute));
            computing += compute;
        }
    }
    (computing, waiting, bytes, cpu_seconds(UsageWho::RUSAGE_THREAD))
}

/// CPU seconds this thread (`RUSAGE_THREAD`) or the whole process (`RUSAGE_SELF`) has used.
fn cpu_seconds(who: UsageWho) -> f64 {
    getrusage(who).map_or(0.0, |u| {
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
        t(u.user_time()) + t(u.system_time())
    })
}

/// What holds the accelerators back at `p` (AU below 90 %): one directory far slower than the
/// others, the readers' CPU, or the storage as a whole.
fn bottleneck(p: &Pass, readers: usize, direct: bool) -> Option<String> {
    if p.au >= 0.9 {
        return None;
    }
    if p.dirs.len() > 1 {
        let mut p50: Vec<f64> = p.dirs.iter().map(|d| d.read_p50_us).collect();
        p50.sort_by(f64::total_cmp);
        let median = p50[p50.len() / 2].max(1e-9);
        let (worst, d) = p.dirs.iter().enumerate().max_by(|a, b| a.1.read_p50_us.total_cmp(&b.1.read_p50_us))?;
        let others: Vec<f64> =
            p.dirs.iter().enumerate().filter(|(i, _)| *i != worst).map(|(_, d)| d.read_p50_us).collect();
        let others_median = others.iter().copied().fold(f64::INFINITY, f64::min).max(1e-9);
        if d.read_p50_us > 3.0 * others_median && d.read_p50_us >= median {
            let device = d.device.as_ref().map_or(String::new(), |dev| format!(" ({dev})"));
            return Some(format!(
                "the drive under {}{device}: its reads take {:.0} µs (p50) where the others' take {:.0} µs, and every reader that reaches its shards waits",
                d.dir, d.read_p50_us, others_median
            ));
        }
    }
    if p.reader_cpu_cores > 0.85 * readers as f64 {
        return Some(format!(
            "the readers' CPU: {} reader thread(s) busy {:.2} cores; add readers (--readers)",
            readers, p.reader_cpu_cores
        ));
    }
    if p.from_storage.is_some_and(|f| f < 0.5) {
        return Some(format!(
            "memory, not a drive: only {:.0} % of the bytes read came from the storage (a tmpfs, or the page cache)",
            100.0 * p.from_storage.unwrap_or(0.0)
        ));
    }
    if !direct {
        return Some("the storage, read through the page cache (each read's pages evicted after it)".into());
    }
    Some(format!(
        "the storage as a whole: every directory alike delivers {:.3} GB/s where {:.3} are needed",
        p.delivered_gbps, p.needed_gbps
    ))
}

/// Writes the dataset, runs the flat-out pass and the pass at `config.rate`, removes the dataset.
///
/// # Errors
/// A path that is not a directory, an I/O error (with the path), or `stop` set.
pub fn measure(config: &Config, stop: &AtomicBool, mut progress: impl FnMut(&str)) -> Result<Report, DataError> {
    for d in &config.dirs {
        let meta = std::fs::symlink_metadata(d).map_err(|e| DataError::Io(d.clone(), e))?;
        if !meta.is_dir() {
            return Err(DataError::NotADirectory(d.clone()));
        }
        let stale = remove_stale_scratch(d);
        if stale > 0 {
            progress(&format!("removed {stale} dataset(s) a killed kiln left in {}", d.display()));
        }
    }
    let mut seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(32);
    if config.engine == Engine::Uring {
        io_uring::IoUring::new(2).map_err(DataError::Uring)?;
    }
    let mut scratch = Scratch(Vec::new());
    for d in &config.dirs {
        let path = d.join(format!("{SCRATCH_PREFIX}{}-{:016x}", std::process::id(), splitmix64(&mut seed)));
        std::fs::DirBuilder::new().mode(0o700).create(&path).map_err(|e| DataError::Io(path.clone(), e))?;
        scratch.0.push(path);
    }
    let shard_bytes = config.shard_bytes.max(1 << 20) >> 20 << 20;
    let config = Config { shard_bytes, ..config.clone() };
    let shards = write_dataset(&scratch.0, &config, stop, &mut progress)?;
    let order = plan(config.layout, shards.len(), shard_bytes, seed);
    let name = |mut p: Pass| {
        for (i, d) in p.dirs.iter_mut().enumerate() {
            d.dir = config.dirs[i].display().to_string();
            d.device = device_of(&config.dirs[i]);
        }
        p
    };
    let run = |rate: Option<f64>| -> Result<Pass, DataError> {
        let p = pass(&shards, config.dirs.len(), &order, &config, rate, stop)
            .map_err(|(dir, e)| DataError::Io(config.dirs[dir].clone(), e))?;
        if stop.load(Ordering::Relaxed) {
            return Err(DataError::Interrupted);
        }
        Ok(name(p))
    };
    progress("reading as fast as the loader delivers");
    let flat_out = run(None)?;
    let at_rate = match config.rate {
        Some(r) => {
            progress(&format!("feeding {} accelerator(s) at {:.3} GB/s", config.accelerators, r / 1e9));
            Some(run(Some(r))?)
        }
        None => None,
    };
    let direct = shards.iter().all(|s| s.direct);
    let bottleneck = at_rate.as_ref().and_then(|p| bottleneck(p, config.readers, direct));
    drop(shards);
    drop(scratch);
    Ok(Report {
        layout: config.layout,
        dataset_bytes: (config.dataset_bytes / shard_bytes).max(config.dirs.len() as u64) * shard_bytes,
        shards: order.iter().map(|r| r.shard).max().map_or(0, |m| m + 1),
        direct,
        engine: config.engine,
        max_rate_au90_gbps: flat_out.delivered_gbps / 0.9,
        flat_out,
        at_rate,
        bottleneck,
    })
}

/// The training benchmark's input read from disk (`kiln bench train --data DIR`): the run's own
/// corpus written once as shards of token records (u16, one record per step: every sequence's
/// `seq + 1` tokens), in a scratch directory of a fresh name under `dir`, read back O_DIRECT by a
/// reader thread into a queue a few steps deep. The trainer takes each step's batch from it and the
/// time it waited counts in the step: the training benchmark then includes its input pipeline.
/// The same tokens as the in-memory corpus, so the run learns exactly as it would without a disk.
pub struct TrainInput {
    rx: Option<mpsc::Receiver<std::io::Result<(Vec<u32>, Vec<u32>)>>>,
    reader: Option<std::thread::JoinHandle<()>>,
    /// Every read bypassed the page cache.
    pub direct: bool,
    /// Bytes of one step's record on disk.
    pub record_bytes: usize,
    _scratch: Scratch,
}

impl TrainInput {
    /// Steps of input read ahead of the trainer.
    pub const PREFETCH: usize = 4;

    /// Writes `batches` (each step's (inputs, targets), `sequences × seq` tokens) under `dir` and
    /// starts reading them back.
    ///
    /// # Errors
    /// Not a directory, a token id that does not fit 16 bits, or an I/O error (with the path).
    pub fn start(
        dir: &Path,
        seq: usize,
        batches: impl Iterator<Item = (Vec<u32>, Vec<u32>)>,
    ) -> Result<TrainInput, DataError> {
        let meta = std::fs::symlink_metadata(dir).map_err(|e| DataError::Io(dir.to_path_buf(), e))?;
        if !meta.is_dir() {
            return Err(DataError::NotADirectory(dir.to_path_buf()));
        }
        remove_stale_scratch(dir);
        let mut seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let path = dir.join(format!("{SCRATCH_PREFIX}{}-{:016x}", std::process::id(), splitmix64(&mut seed)));
        std::fs::DirBuilder::new().mode(0o700).create(&path).map_err(|e| DataError::Io(path.clone(), e))?;
        let scratch = Scratch(vec![path.clone()]);
        let file_path = path.join("tokens-00000.bin");
        let io = |e| DataError::Io(file_path.clone(), e);
        let (file, _) = open_shard(&file_path, true).map_err(io)?;
        let (mut steps, mut record_bytes, mut sequences) = (0u64, 0usize, 0usize);
        for (inputs, targets) in batches {
            sequences = inputs.len() / seq.max(1);
            let mut bytes = Vec::with_capacity(2 * (inputs.len() + inputs.len() / seq.max(1)));
            for (i, t) in inputs.chunks(seq).zip(targets.chunks(seq)) {
                // A sequence's seq + 1 tokens: its inputs and the last target.
                for &tok in i.iter().chain(t.last()) {
                    let tok = u16::try_from(tok).map_err(|_| {
                        DataError::Io(
                            file_path.clone(),
                            std::io::Error::other("a token id above 65535: --data needs a vocabulary of 16 bits"),
                        )
                    })?;
                    bytes.extend_from_slice(&tok.to_le_bytes());
                }
            }
            record_bytes = bytes.len().div_ceil(4096) * 4096;
            let mut buf = Aligned::new(record_bytes);
            buf.get(bytes.len()).copy_from_slice(&bytes);
            file.write_all_at(buf.get(record_bytes), steps * record_bytes as u64).map_err(io)?;
            steps += 1;
        }
        file.sync_all().map_err(io)?;
        drop(file);
        let (file, direct) = open_shard(&file_path, false).map_err(io)?;
        let (tx, rx) = mpsc::sync_channel(Self::PREFETCH);
        let reader = std::thread::spawn(move || {
            let mut buf = Aligned::new(record_bytes);
            for step in 0..steps {
                let read = file.read_exact_at(buf.get(record_bytes), step * record_bytes as u64).map(|()| {
                    let raw = buf.get(record_bytes);
                    let tokens: Vec<u32> =
                        raw.chunks_exact(2).map(|b| u32::from(u16::from_le_bytes([b[0], b[1]]))).collect();
                    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
                    for sq in tokens.chunks_exact(seq + 1).take(sequences) {
                        inputs.extend_from_slice(&sq[..seq]);
                        targets.extend_from_slice(&sq[1..]);
                    }
                    (inputs, targets)
                });
                if tx.send(read).is_err() {
                    return;
                }
            }
        });
        Ok(TrainInput { rx: Some(rx), reader: Some(reader), direct, record_bytes, _scratch: scratch })
    }

    /// The next step's (inputs, targets) and the seconds the trainer waited for it.
    ///
    /// # Errors
    /// The read failed, or the records ran out.
    pub fn next_batch(&mut self) -> std::io::Result<(Vec<u32>, Vec<u32>, f64)> {
        let t0 = Instant::now();
        let got = self.rx.as_ref().map(mpsc::Receiver::recv);
        let (inputs, targets) = match got {
            Some(Ok(read)) => read?,
            _ => return Err(std::io::Error::other("the training input ran out of records")),
        };
        Ok((inputs, targets, t0.elapsed().as_secs_f64()))
    }
}

impl Drop for TrainInput {
    fn drop(&mut self) {
        // The reader stops at its next send once the queue is gone; then the scratch goes.
        drop(self.rx.take());
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dirs: Vec<PathBuf>, rate: Option<f64>) -> Config {
        Config {
            dirs,
            layout: Layout::Samples,
            dataset_bytes: 16 << 20,
            shard_bytes: 4 << 20,
            readers: 2,
            engine: Engine::Threads,
            buffered: false,
            prefetch: 8,
            batch: 2,
            accelerators: 2,
            rate,
            seconds: 0.5,
        }
    }

    #[test]
    fn plans_cover_every_byte_once_in_shuffled_order() {
        let tokens = plan(Layout::Tokens, 3, 4 << 20, 1);
        assert_eq!(tokens.len(), 12);
        // Each shard is read front to back, shards in some order.
        for w in tokens.chunks(4) {
            assert!(w.iter().all(|r| r.shard == w[0].shard));
            assert_eq!(w.iter().map(|r| r.offset).collect::<Vec<_>>(), [0, 1 << 20, 2 << 20, 3 << 20]);
        }
        let samples = plan(Layout::Samples, 2, 8 << 20, 1);
        assert!(samples.iter().all(|r| (100_000..=1_003_520).contains(&r.len) && r.len % 4096 == 0));
        assert!(samples.iter().all(|r| r.offset + r.len as u64 <= 8 << 20));
        let sorted = samples.windows(2).all(|w| (w[0].shard, w[0].offset) < (w[1].shard, w[1].offset));
        assert!(!sorted, "shuffled");
    }

    #[test]
    fn a_pass_reports_au_and_removes_its_dataset_even_when_interrupted() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let never = AtomicBool::new(false);
        // A rate far below what a temporary directory delivers: the accelerators never wait long.
        let r = measure(&config(vec![a.path().into(), b.path().into()], Some(20e6)), &never, |_| {}).unwrap();
        let at = r.at_rate.as_ref().unwrap();
        assert!(at.au > 0.5, "{at:?}");
        assert!(r.flat_out.delivered_gbps > 0.0 && r.flat_out.dirs.iter().all(|d| d.reads > 0), "{r:?}");
        assert!((r.max_rate_au90_gbps - r.flat_out.delivered_gbps / 0.9).abs() < 1e-12);
        for d in [a.path(), b.path()] {
            assert_eq!(std::fs::read_dir(d).unwrap().count(), 0, "the dataset is gone from {}", d.display());
        }
        let stopped = AtomicBool::new(true);
        assert!(matches!(measure(&config(vec![a.path().into()], None), &stopped, |_| {}), Err(DataError::Interrupted)));
        assert_eq!(std::fs::read_dir(a.path()).unwrap().count(), 0);
    }

    #[test]
    fn io_uring_keeps_reads_in_flight_and_delivers_like_threads() {
        let d = tempfile::tempdir().unwrap();
        let mut c = config(vec![d.path().into()], Some(20e6));
        c.engine = Engine::Uring;
        c.readers = 4;
        let r = match measure(&c, &AtomicBool::new(false), |_| {}) {
            Err(DataError::Uring(e)) => {
                println!("SKIPPED — needs io_uring ({e})");
                return;
            }
            other => other.unwrap(),
        };
        assert_eq!(r.engine, Engine::Uring);
        let flat = &r.flat_out;
        assert!(flat.delivered_gbps > 0.0 && flat.samples_per_s > 0.0 && flat.read_p50_us > 0.0, "{flat:?}");
        assert!(r.at_rate.as_ref().unwrap().au > 0.5, "{r:?}");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "the dataset is gone");
    }

    /// Whether `dir` is memory (a tmpfs).
    fn in_memory(dir: &Path) -> bool {
        use nix::sys::statfs::{statfs, TMPFS_MAGIC};
        statfs(dir).is_ok_and(|s| s.filesystem_type() == TMPFS_MAGIC)
    }

    #[test]
    fn reads_say_whether_a_drive_served_them_buffered_reads_included() {
        // A directory on a drive (the build's, beside this crate), read buffered: each read's pages
        // are evicted after it, so epoch after epoch the storage serves them again.
        let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
        std::fs::create_dir_all(&target).unwrap();
        let disk = tempfile::tempdir_in(&target).unwrap();
        if storage_read_bytes("/proc/thread-self/io").is_none() || in_memory(disk.path()) {
            println!("SKIPPED — needs a drive-backed target/ and per-thread I/O accounting");
            return;
        }
        for buffered in [false, true] {
            let mut c = config(vec![disk.path().into()], None);
            c.buffered = buffered;
            let r = measure(&c, &AtomicBool::new(false), |_| {}).unwrap();
            let from = r.flat_out.from_storage.unwrap();
            assert!(from > 0.8, "buffered {buffered}: {from} of the bytes came from the drive ({r:?})");
            assert_eq!(r.direct, !buffered);
        }
        // Memory: the bytes come from no drive, and a starved pass says so.
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() || !in_memory(shm) {
            println!("SKIPPED — needs a tmpfs at /dev/shm");
            return;
        }
        let mem = tempfile::tempdir_in(shm).unwrap();
        let r = measure(&config(vec![mem.path().into()], Some(1e15)), &AtomicBool::new(false), |_| {}).unwrap();
        assert!(r.flat_out.from_storage.unwrap() < 0.1, "{r:?}");
        assert!(r.bottleneck.as_deref().unwrap().starts_with("memory, not a drive"), "{r:?}");
    }

    #[test]
    fn a_directory_is_mapped_to_its_block_device() {
        let target = Path::new(env!("CARGO_MANIFEST_DIR"));
        match device_of(target) {
            // Whatever the disk, it is one /sys/block knows.
            Some(dev) => {
                let disk = dev.split(' ').next().unwrap();
                assert!(Path::new("/sys/block").join(disk).exists(), "{dev}");
            }
            None => println!("SKIPPED — needs the build directory on a block device"),
        }
        if Path::new("/dev/shm").is_dir() && in_memory(Path::new("/dev/shm")) {
            assert_eq!(device_of(Path::new("/dev/shm")), None, "a tmpfs has no block device");
        }
    }

    #[test]
    fn a_device_or_a_file_is_refused() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let e = measure(&config(vec![f.path().into()], None), &AtomicBool::new(false), |_| {}).unwrap_err();
        assert!(matches!(e, DataError::NotADirectory(_)), "{e}");
    }

    #[test]
    fn training_input_reads_back_the_corpus_it_was_given_and_removes_it() {
        let d = tempfile::tempdir().unwrap();
        let batches: Vec<(Vec<u32>, Vec<u32>)> =
            (0..3).map(|s| crate::train::Corpus::new(256, s).batch(4, 16)).collect();
        let mut input = TrainInput::start(d.path(), 16, batches.clone().into_iter()).unwrap();
        assert_eq!(input.record_bytes, 4096, "4 × 17 tokens × 2 bytes, a 4 KiB block");
        for (inputs, targets) in &batches {
            let (i, t, waited) = input.next_batch().unwrap();
            assert_eq!((&i, &t), (inputs, targets));
            assert!(waited >= 0.0);
        }
        assert!(input.next_batch().is_err(), "three steps were written");
        drop(input);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        let big = vec![(vec![70_000u32; 16], vec![1u32; 16])];
        assert!(TrainInput::start(d.path(), 16, big.into_iter()).is_err(), "a token above 16 bits");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }

    #[test]
    fn stale_datasets_of_dead_kilns_go_and_live_ones_stay() {
        let d = tempfile::tempdir().unwrap();
        let dead = d.path().join(format!("{SCRATCH_PREFIX}999999999-0123456789abcdef"));
        let live = d.path().join(format!("{SCRATCH_PREFIX}{}-0123456789abcdef", std::process::id()));
        for p in [&dead, &live] {
            std::fs::create_dir(p).unwrap();
            std::fs::write(p.join("shard-00000.bin"), b"x").unwrap();
        }
        assert_eq!(remove_stale_scratch(d.path()), 1);
        assert!(!dead.exists() && live.exists());
    }
}
