//! Storage: sequential read and write (1 MiB blocks) and 4 KiB random read and write at several
//! queue depths, with O_DIRECT where the filesystem allows it, reporting MB/s, IOPS and latency
//! percentiles. The queue depth is a number of threads each with one synchronous request in flight.
//!
//! Safety: a block device that holds a partition table or a filesystem is never written unless the
//! caller says it may be destroyed; in a directory, the test file is removed when the test ends,
//! also when it fails or is interrupted (the caller passes the interruption flag).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::stats::{percentile_sorted, splitmix64};

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{path}: {source}", path = .0.display(), source = .1)]
    Io(PathBuf, std::io::Error),
    #[error("{path}: holds {what}; writing would destroy it (pass --destructive if that is intended, or give a directory)", path = .0.display(), what = .1)]
    HoldsData(PathBuf, String),
    #[error("interrupted")]
    Interrupted,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    /// Bytes of the test file (or of the device region used).
    pub size_bytes: u64,
    /// Seconds per test.
    pub seconds: f64,
    pub queue_depths: Vec<usize>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestResult {
    /// "seq_write", "seq_read", "rand_read", "rand_write".
    pub test: String,
    pub block_bytes: usize,
    pub queue_depth: usize,
    pub mb_per_s: f64,
    pub iops: f64,
    pub requests: usize,
    pub latency_us: Latency,
}

/// Per-request latency percentiles, from every request (like fio's clat percentiles).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Latency {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

fn latency(mut lat: Vec<f64>) -> Latency {
    lat.sort_by(f64::total_cmp);
    let at = |q: f64| percentile_sorted(&lat, q);
    Latency {
        mean: if lat.is_empty() { 0.0 } else { lat.iter().sum::<f64>() / lat.len() as f64 },
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
        p999: at(0.999),
        max: lat.last().copied().unwrap_or(0.0),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub target: String,
    /// Whether O_DIRECT was used (tmpfs and some overlays refuse it).
    pub direct: bool,
    pub tests: Vec<TestResult>,
}

/// What a device's first bytes say it holds: a partition table or a filesystem.
pub fn signature(head: &[u8]) -> Option<&'static str> {
    let at = |off: usize, magic: &[u8]| head.get(off..off + magic.len()) == Some(magic);
    if at(512, b"EFI PART") {
        return Some("a GPT partition table");
    }
    if at(1080, &[0x53, 0xef]) {
        return Some("an ext2/3/4 filesystem");
    }
    if at(0, b"XFSB") {
        return Some("an XFS filesystem");
    }
    if at(65600, b"_BHRfS_M") {
        return Some("a btrfs filesystem");
    }
    if at(536, b"LVM2 001") || at(24, b"LVM2 001") {
        return Some("an LVM physical volume");
    }
    if at(0, b"\x4e\x53\x5a\x20") || at(3, b"NTFS    ") {
        return Some("an NTFS filesystem");
    }
    if at(0x1fe, &[0x55, 0xaa]) {
        return Some("an MBR partition table or boot sector");
    }
    None
}

/// A buffer aligned for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Aligned { ptr, layout }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr points at layout.size() initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in new().
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Removes the test file however the test ends.
struct TempFile(Option<PathBuf>);

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn open(path: &Path, direct: bool, create: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(create);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

fn run_test(
    file: &File,
    test: &str,
    block: usize,
    depth: usize,
    config: &Config,
    stop: &AtomicBool,
) -> Result<TestResult, DiskError> {
    let blocks = (config.size_bytes / block as u64).max(1);
    let write = test.ends_with("write");
    let sequential = test.starts_with("seq");
    let deadline = Instant::now() + Duration::from_secs_f64(config.seconds);
    let started = Instant::now();
    let results: Vec<std::io::Result<Vec<f64>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..depth)
            .map(|t| {
                s.spawn(move || -> std::io::Result<Vec<f64>> {
                    let mut buf = Aligned::new(block);
                    buf.as_mut().iter_mut().enumerate().for_each(|(i, b)| *b = (i * 31 + t) as u8);
                    let mut rng = 0x6b69_6c6e_u64 ^ t as u64;
                    let mut lat = Vec::new();
                    // Sequential streams each walk their own share of the file.
                    let mut pos = blocks * t as u64 / depth as u64;
                    loop {
                        // At least one request each, however late the thread starts.
                        if (!lat.is_empty() && Instant::now() >= deadline) || stop.load(Ordering::Relaxed) {
                            return Ok(lat);
                        }
                        let index = if sequential {
                            pos = (pos + 1) % blocks;
                            pos
                        } else {
                            splitmix64(&mut rng) % blocks
                        };
                        let offset = index * block as u64;
                        let t0 = Instant::now();
                        if write {
                            file.write_all_at(buf.as_mut(), offset)?;
                        } else {
                            file.read_exact_at(buf.as_mut(), offset)?;
                        }
                        lat.push(t0.elapsed().as_secs_f64() * 1e6);
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("worker panicked"))))
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    if stop.load(Ordering::Relaxed) {
        return Err(DiskError::Interrupted);
    }
    let mut lat = Vec::new();
    for r in results {
        lat.extend(r.map_err(|e| DiskError::Io(PathBuf::from(test), e))?);
    }
    if write {
        file.sync_data().map_err(|e| DiskError::Io(PathBuf::from(test), e))?;
    }
    let ops = lat.len() as f64;
    Ok(TestResult {
        test: test.to_string(),
        block_bytes: block,
        queue_depth: depth,
        mb_per_s: ops * block as f64 / elapsed / 1e6,
        iops: ops / elapsed,
        requests: lat.len(),
        latency_us: latency(lat),
    })
}

/// Runs the tests against `target`: a directory (a temporary file in it) or a block device.
///
/// # Errors
/// A device holding data without `destructive`, any I/O error (with the path), or `stop` set.
pub fn measure(
    target: &Path,
    config: &Config,
    destructive: bool,
    stop: &AtomicBool,
    mut progress: impl FnMut(&str),
) -> Result<Report, DiskError> {
    let io = |e| DiskError::Io(target.to_owned(), e);
    let meta = std::fs::metadata(target).map_err(io)?;
    let (path, _guard) = if meta.file_type().is_block_device() {
        let mut head = vec![0u8; 70_000];
        let n = File::open(target).and_then(|f| f.read_at(&mut head, 0)).map_err(io)?;
        if let Some(what) = signature(&head[..n]).filter(|_| !destructive) {
            return Err(DiskError::HoldsData(target.to_owned(), what.to_string()));
        }
        (target.to_owned(), TempFile(None))
    } else if meta.is_dir() {
        let p = target.join(format!(".kiln-disk-{}.tmp", std::process::id()));
        (p.clone(), TempFile(Some(p)))
    } else {
        return Err(DiskError::Io(target.to_owned(), std::io::Error::other("not a directory or a block device")));
    };
    let mut direct = true;
    let file = match open(&path, true, true) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            direct = false;
            open(&path, false, true).map_err(io)?
        }
        Err(e) => return Err(io(e)),
    };
    let mut tests = Vec::new();
    let plan: Vec<(&str, usize, usize)> = std::iter::once(("seq_write", 1 << 20, 1))
        .chain(std::iter::once(("seq_read", 1 << 20, 1)))
        .chain(config.queue_depths.iter().map(|&d| ("rand_read", 4096, d)))
        .chain(config.queue_depths.iter().map(|&d| ("rand_write", 4096, d)))
        .collect();
    // The reads need data: fill the file first (counts as the sequential write's warm-up).
    if !meta.file_type().is_block_device() {
        progress("filling the test file");
        let mut buf = Aligned::new(1 << 20);
        buf.as_mut().fill(0xa5);
        for i in 0..(config.size_bytes >> 20).max(1) {
            if stop.load(Ordering::Relaxed) {
                return Err(DiskError::Interrupted);
            }
            file.write_all_at(buf.as_mut(), i << 20).map_err(io)?;
        }
        file.sync_all().map_err(io)?;
    }
    for (i, (test, block, depth)) in plan.iter().enumerate() {
        progress(&format!("{test} {}K QD{depth} ({}/{})", block / 1024, i + 1, plan.len()));
        tests.push(run_test(&file, test, *block, *depth, config, stop)?);
    }
    Ok(Report { target: target.display().to_string(), direct, tests })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures() {
        let mut head = vec![0u8; 70_000];
        assert_eq!(signature(&head), None);
        head[1080] = 0x53;
        head[1081] = 0xef;
        assert_eq!(signature(&head), Some("an ext2/3/4 filesystem"));
        let mut gpt = vec![0u8; 1024];
        gpt[512..520].copy_from_slice(b"EFI PART");
        assert_eq!(signature(&gpt), Some("a GPT partition table"));
    }

    #[test]
    fn measures_in_a_directory_and_leaves_nothing_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let config = Config { size_bytes: 4 << 20, seconds: 0.05, queue_depths: vec![1, 4] };
        let stop = AtomicBool::new(false);
        let report = measure(&dir, &config, false, &stop, |_| {}).unwrap();
        assert_eq!(report.tests.len(), 6);
        assert!(report.tests.iter().all(|t| t.iops > 0.0));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the test file is removed");
        let stopped = AtomicBool::new(true);
        assert!(matches!(measure(&dir, &config, false, &stopped, |_| {}), Err(DiskError::Interrupted)));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "also when interrupted");
    }
}
