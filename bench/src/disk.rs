//! Storage: sequential read and write (1 MiB blocks) and 4 KiB random read and write at several
//! queue depths, with O_DIRECT where the filesystem allows it, reporting MB/s, IOPS and latency
//! percentiles. The queue depth is a number of threads each with one synchronous request in flight.
//!
//! Safety: a block device is never written unless the caller says it may be destroyed
//! (`destructive`); without it only the read tests run, on a read-only descriptor. With it the
//! device is opened `O_EXCL`, which the kernel refuses while it is mounted or used by md, dm, LVM or
//! swap, and what its signature says it holds is reported. The caller checks mounts, swaps and
//! holders first (this crate reads no /proc or /sys). In a directory the test file has an
//! unpredictable name, is created `O_CREAT|O_EXCL|O_NOFOLLOW`, is removed when the test ends (also
//! when it fails or is interrupted), and one a killed kiln left behind is removed by the next run.

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
    #[error("{path}: the kernel says the device is in use (mounted, swap, or a member of md, dm or LVM); nothing was written", path = .0.display())]
    InUse(PathBuf),
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
    /// Only the read tests ran: a block device without `--destructive`.
    #[serde(default)]
    pub read_only: bool,
    /// What the block device held by its signature (destroyed when `read_only` is false).
    #[serde(default)]
    pub held: Option<String>,
    pub tests: Vec<TestResult>,
}

/// Where a signature sits: from the device's start, or (md 0.90 and 1.0 superblocks) its end.
#[derive(Clone, Copy)]
enum At {
    Start(usize),
    /// md 0.90: the last 64 KiB-aligned 64 KiB block.
    Md090,
    /// md 1.0: 8 KiB before the end, rounded down to 4 KiB.
    Md10,
}

/// blkid's magic numbers for what commonly sits on a server's disks (libblkid's superblocks/*.c),
/// most specific first; an MBR boot signature last, since many of the others carry one too.
const SIGNATURES: &[(At, &[u8], &str)] = &[
    (At::Start(512), b"EFI PART", "a GPT partition table"),
    (At::Start(4096), b"EFI PART", "a GPT partition table (4 KiB sectors)"),
    (At::Start(0), b"LUKS\xba\xbe", "a LUKS encrypted volume"),
    (At::Start(0), b"SKUL\xba\xbe", "a LUKS2 encrypted volume (secondary header)"),
    (At::Start(4086), b"SWAPSPACE2", "a swap area"),
    (At::Start(4086), b"SWAP-SPACE", "a swap area"),
    (At::Start(65526), b"SWAPSPACE2", "a swap area (64 KiB pages)"),
    (At::Start(0), b"\xfc\x4e\x2b\xa9", "an md RAID member (superblock 1.1)"),
    (At::Start(4096), b"\xfc\x4e\x2b\xa9", "an md RAID member (superblock 1.2)"),
    (At::Md090, b"\xfc\x4e\x2b\xa9", "an md RAID member (superblock 0.90)"),
    (At::Md10, b"\xfc\x4e\x2b\xa9", "an md RAID member (superblock 1.0)"),
    (At::Start(536), b"LVM2 001", "an LVM physical volume"),
    (At::Start(24), b"LVM2 001", "an LVM physical volume"),
    (At::Start(0), b"bluestore block device", "a Ceph BlueStore OSD"),
    (At::Start(0), b"ceph disk volume v026", "a Ceph disk"),
    (At::Start(131072), b"\x0c\xb1\xba\x00\x00\x00\x00\x00", "a ZFS pool member"),
    (At::Start(131072), b"\x00\x00\x00\x00\x00\xba\xb1\x0c", "a ZFS pool member"),
    (At::Start(4120), b"\xc6\x85\x73\xf6\x4e\x1a\x45\xca\x82\x65\xf5\x7f\x48\xba\x6d\x81", "a bcache device"),
    (At::Start(1080), b"\x53\xef", "an ext2/3/4 filesystem"),
    (At::Start(0), b"XFSB", "an XFS filesystem"),
    (At::Start(65600), b"_BHRfS_M", "a btrfs filesystem"),
    (At::Start(1024), b"\x10\x20\xf5\xf2", "an F2FS filesystem"),
    (At::Start(32768), b"JFS1", "a JFS filesystem"),
    (At::Start(65588), b"ReIsEr2Fs", "a ReiserFS filesystem"),
    (At::Start(65588), b"ReIsEr3Fs", "a ReiserFS filesystem"),
    (At::Start(0), b"hsqs", "a squashfs image"),
    (At::Start(32769), b"CD001", "an ISO 9660 image"),
    (At::Start(3), b"NTFS    ", "an NTFS filesystem"),
    (At::Start(3), b"EXFAT   ", "an exFAT filesystem"),
    (At::Start(82), b"FAT32   ", "a FAT32 filesystem"),
    (At::Start(54), b"FAT16   ", "a FAT16 filesystem"),
    (At::Start(54), b"FAT12   ", "a FAT12 filesystem"),
    (At::Start(0x1fe), b"\x55\xaa", "an MBR partition table or boot sector"),
];

/// How many bytes of a device's start and end [`signature`] looks at.
pub const PROBE_BYTES: usize = 1 << 20;

/// What a device holds by its signature. `head`: its first bytes (up to [`PROBE_BYTES`]); `tail`:
/// its last bytes, of a device `size` bytes long.
pub fn signature(head: &[u8], tail: &[u8], size: u64) -> Option<&'static str> {
    let tail_start = size.saturating_sub(tail.len() as u64);
    let at_end = |abs: u64, magic: &[u8]| {
        let off = abs.checked_sub(tail_start)? as usize;
        Some(tail.get(off..off + magic.len())? == magic)
    };
    SIGNATURES.iter().find_map(|&(at, magic, what)| {
        let found = match at {
            At::Start(off) => head.get(off..off + magic.len()) == Some(magic),
            At::Md090 => size >= 131_072 && at_end((size & !65_535) - 65_536, magic) == Some(true),
            At::Md10 => size >= 8_192 && at_end((size - 8_192) & !4_095, magic) == Some(true),
        };
        found.then_some(what)
    })
}

/// Reads a device's first and last [`PROBE_BYTES`] and says what it holds.
fn probe(device: &Path) -> std::io::Result<Option<&'static str>> {
    use std::io::{Seek, SeekFrom};
    let mut f = File::open(device)?;
    let size = f.seek(SeekFrom::End(0))?;
    let mut head = vec![0u8; PROBE_BYTES.min(size as usize)];
    f.read_exact_at(&mut head, 0)?;
    let tail_len = PROBE_BYTES.min(size as usize);
    let mut tail = vec![0u8; tail_len];
    f.read_exact_at(&mut tail, size - tail_len as u64)?;
    Ok(signature(&head, &tail, size))
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

/// The prefix of scratch files: `.kiln-disk-<pid>-<random>.tmp`.
const SCRATCH_PREFIX: &str = ".kiln-disk-";

/// Removes the test file however the test ends.
struct TempFile(Option<PathBuf>);

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Creates the scratch file in `dir` under an unpredictable name, `O_CREAT|O_EXCL|O_NOFOLLOW` (a
/// name someone planted, a symbolic link too, is never opened), with O_DIRECT where the filesystem
/// takes it. Returns the file, its guard and whether O_DIRECT is on.
fn scratch(dir: &Path) -> std::io::Result<(File, TempFile, bool)> {
    let mut seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(32);
    for _ in 0..16 {
        let name = format!("{SCRATCH_PREFIX}{}-{:016x}.tmp", std::process::id(), splitmix64(&mut seed));
        let path = dir.join(name);
        let mut o = OpenOptions::new();
        o.read(true).write(true).create_new(true).mode(0o600);
        match open_direct(&path, &o, libc::O_NOFOLLOW) {
            Ok((f, direct)) => return Ok((f, TempFile(Some(path)), direct)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("could not create a scratch file under a fresh name"))
}

/// Removes the scratch files of kilns that no longer run (killed before they could clean up);
/// returns how many. Files of a live process, and anything not named like a scratch file, stay.
pub fn remove_stale_scratch(dir: &Path) -> usize {
    orphans(dir, SCRATCH_PREFIX)
        .into_iter()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()) && std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// The entries of `dir` named `<prefix><pid>-…` whose process is gone: what a killed kiln left.
pub(crate) fn orphans(dir: &Path, prefix: &str) -> Vec<std::fs::DirEntry> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let pid = name.to_str().and_then(|n| n.strip_prefix(prefix)).and_then(|rest| rest.split_once('-'));
            let Some(pid) = pid.and_then(|(p, _)| p.parse::<i32>().ok()) else { return false };
            pid > 0 && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) == Err(nix::errno::Errno::ESRCH)
        })
        .collect()
}

/// Opens a block device: read-only, or for writing with `O_EXCL` (refused while the kernel has it
/// in use); O_DIRECT where it is taken. Returns the file and whether O_DIRECT is on.
fn open_device(path: &Path, write: bool) -> std::io::Result<(File, bool)> {
    let mut o = OpenOptions::new();
    o.read(true).write(write);
    open_direct(path, &o, if write { libc::O_EXCL } else { 0 })
}

/// Opens `path` as `options` and `flags` say, with O_DIRECT where the filesystem takes it and
/// buffered where it refuses (EINVAL: tmpfs, some overlays). The file and whether O_DIRECT is on.
pub(crate) fn open_direct(path: &Path, options: &OpenOptions, flags: i32) -> std::io::Result<(File, bool)> {
    for direct in [true, false] {
        let mut o = options.clone();
        o.custom_flags(flags | if direct { libc::O_DIRECT } else { 0 });
        match o.open(path) {
            Ok(f) => return Ok((f, direct)),
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("the buffered open returns")
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

/// Runs the tests against `target`: a directory (a scratch file in it) or a block device (the
/// read tests only, unless `destructive`).
///
/// # Errors
/// A device in use (with `destructive`), any I/O error (with the path), or `stop` set.
pub fn measure(
    target: &Path,
    config: &Config,
    destructive: bool,
    stop: &AtomicBool,
    mut progress: impl FnMut(&str),
) -> Result<Report, DiskError> {
    let io = |e| DiskError::Io(target.to_owned(), e);
    let meta = std::fs::metadata(target).map_err(io)?;
    let device = meta.file_type().is_block_device();
    let (file, _guard, direct, held) = if device {
        let held = probe(target).map_err(io)?;
        let (file, direct) = open_device(target, destructive).map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => DiskError::InUse(target.to_owned()),
            _ => io(e),
        })?;
        (file, TempFile(None), direct, held)
    } else if meta.is_dir() {
        let stale = remove_stale_scratch(target);
        if stale > 0 {
            progress(&format!("removed {stale} scratch file(s) a killed kiln left in {}", target.display()));
        }
        let (file, guard, direct) = scratch(target).map_err(io)?;
        (file, guard, direct, None)
    } else {
        return Err(DiskError::Io(target.to_owned(), std::io::Error::other("not a directory or a block device")));
    };
    let read_only = device && !destructive;
    let writes = |test: &&str| !read_only || !test.ends_with("write");
    let plan: Vec<(&str, usize, usize)> = std::iter::once(("seq_write", 1 << 20, 1))
        .chain(std::iter::once(("seq_read", 1 << 20, 1)))
        .chain(config.queue_depths.iter().map(|&d| ("rand_read", 4096, d)))
        .chain(config.queue_depths.iter().map(|&d| ("rand_write", 4096, d)))
        .filter(|(test, _, _)| writes(test))
        .collect();
    // The reads need data: fill the file first (counts as the sequential write's warm-up).
    if !device {
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
    let mut tests = Vec::new();
    for (i, (test, block, depth)) in plan.iter().enumerate() {
        progress(&format!("{test} {}K QD{depth} ({}/{})", block / 1024, i + 1, plan.len()));
        tests.push(run_test(&file, test, *block, *depth, config, stop)?);
    }
    Ok(Report { target: target.display().to_string(), direct, read_only, held: held.map(str::to_string), tests })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device of `size` bytes with `magic` written at `offset`, probed as `measure` probes it.
    fn probed(size: u64, offset: u64, magic: &[u8]) -> Option<&'static str> {
        let mut disk = vec![0u8; size as usize];
        disk[offset as usize..offset as usize + magic.len()].copy_from_slice(magic);
        let n = PROBE_BYTES.min(disk.len());
        signature(&disk[..n], &disk[disk.len() - n..], size)
    }

    /// Input → what it is said to hold: one row per kind of data a server's disk may carry.
    #[test]
    fn signatures() {
        let mib = 1u64 << 20;
        let size = 8 * mib + 12_345; // not a multiple of 64 KiB: the end-of-device offsets must round
        let table: &[(u64, &[u8], Option<&str>)] = &[
            (0, b"", None),
            (512, b"EFI PART", Some("a GPT partition table")),
            (0, b"LUKS\xba\xbe\x00\x02", Some("a LUKS encrypted volume")),
            (4086, b"SWAPSPACE2", Some("a swap area")),
            (4096, b"\xfc\x4e\x2b\xa9", Some("an md RAID member (superblock 1.2)")),
            ((size & !65_535) - 65_536, b"\xfc\x4e\x2b\xa9", Some("an md RAID member (superblock 0.90)")),
            ((size - 8_192) & !4_095, b"\xfc\x4e\x2b\xa9", Some("an md RAID member (superblock 1.0)")),
            (536, b"LVM2 001", Some("an LVM physical volume")),
            (0, b"bluestore block device\nab12", Some("a Ceph BlueStore OSD")),
            (131_072, b"\x0c\xb1\xba\x00\x00\x00\x00\x00", Some("a ZFS pool member")),
            (1080, b"\x53\xef", Some("an ext2/3/4 filesystem")),
            (0, b"XFSB", Some("an XFS filesystem")),
            (65_600, b"_BHRfS_M", Some("a btrfs filesystem")),
            (82, b"FAT32   ", Some("a FAT32 filesystem")),
            (32_769, b"CD001", Some("an ISO 9660 image")),
            (0x1fe, b"\x55\xaa", Some("an MBR partition table or boot sector")),
        ];
        for &(offset, magic, want) in table {
            assert_eq!(probed(size, offset, magic), want, "magic {magic:?} at {offset}");
        }
        // A device smaller than the probe, and one too small for an end superblock.
        assert_eq!(probed(4096, 1080, b"\x53\xef"), Some("an ext2/3/4 filesystem"));
        assert_eq!(probed(100, 0, b"XFSB"), Some("an XFS filesystem"));
    }

    /// Scratch files: never a planted name or link, and only dead kilns' are cleaned up.
    #[test]
    fn scratch_files_are_fresh_and_stale_ones_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let (_f, guard, _) = scratch(dir).unwrap();
        let name = guard.0.as_ref().unwrap().file_name().unwrap().to_str().unwrap().to_string();
        assert!(name.starts_with(&format!(".kiln-disk-{}-", std::process::id())) && name.len() > 30, "{name}");
        drop(guard);
        // A dead process's scratch file goes; a live one's, a planted link and other files stay.
        let dead = dir.join(".kiln-disk-2147483646-0123456789abcdef.tmp");
        let alive = dir.join(format!(".kiln-disk-{}-0123456789abcdef.tmp", std::process::id()));
        let link = dir.join(".kiln-disk-2147483645-0123456789abcdef.tmp");
        std::fs::write(&dead, "x").unwrap();
        std::fs::write(&alive, "x").unwrap();
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert_eq!(remove_stale_scratch(dir), 1);
        assert!(!dead.exists() && alive.exists() && link.symlink_metadata().is_ok());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
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
