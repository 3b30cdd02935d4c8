//! The thin I/O layer under the parsers: reads files below a root directory (`/` or a snapshot)
//! and turns every failure into a [`Problem`] instead of an error.
//!
//! A snapshot root is a boundary: every path is resolved as if the root were `/` (an absolute
//! link, or `..` past the top, stays inside it), files are opened `O_NOFOLLOW|O_NONBLOCK` (a FIFO
//! cannot hang a read), only regular files are read, and no read takes more than
//! [`MAX_FILE_BYTES`] (a link to `/dev/zero` cannot exhaust memory).

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Why a datum is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// The file exists but only root may read it.
    PermissionDenied,
    /// The file is absent: this kernel, firmware or machine does not provide it.
    NotPresent,
    /// The file was read but its content could not be understood.
    Malformed,
    /// Any other I/O error.
    Unreadable,
}

/// One datum that could not be read, with where and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// The file or directory involved, as a path on this machine.
    pub path: String,
    pub kind: ProblemKind,
    /// What the reader was after and what went wrong, for a person.
    pub message: String,
}

/// The most a single file read takes: far above any `/proc` or `/sys` file of a real machine
/// (`/proc/cpuinfo` of a 1,024-thread box is ~1.5 MB).
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// How many open directories [`Source`] keeps for `openat`.
const OPEN_DIRS: usize = 8;

/// Reads below a root and collects problems. Not `Sync`: each thread of an inventory (the
/// processors' and the devices') reads through a `Source` of its own.
pub struct Source {
    root: PathBuf,
    problems: RefCell<Vec<Problem>>,
    /// Directories held open, most recent first: readers take several files from one directory
    /// in a row (a PCI function's attributes, a cache index), and `openat` from an open directory
    /// skips the walk from `/` (and through `/sys/bus`'s links) that costs most of a sysfs open.
    dirs: RefCell<Vec<(String, OwnedFd)>>,
    /// The parent of the last file read: a directory is opened on its second use in a row.
    last_parent: RefCell<String>,
}

impl Source {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Source {
            root: root.into(),
            problems: RefCell::new(Vec::new()),
            dirs: RefCell::new(Vec::new()),
            last_parent: RefCell::new(String::new()),
        }
    }

    /// Runs `f` on the open directory holding `rel` and the name of `rel` in it; `None` where no
    /// directory is open for it (the caller then goes by path, which reports errors the same way).
    fn in_dir<T>(&self, rel: &str, f: impl FnOnce(BorrowedFd<'_>, &str) -> nix::Result<T>) -> Option<io::Result<T>> {
        let (parent, leaf) = rel.rsplit_once('/')?;
        if leaf.is_empty() || leaf == "." || leaf == ".." {
            return None;
        }
        if let Some(at) = self.dirs.borrow().iter().position(|(p, _)| p == parent) {
            let dirs = self.dirs.borrow();
            return Some(f(dirs[at].1.as_fd(), leaf).map_err(io::Error::from));
        }
        if *self.last_parent.borrow() != parent {
            *self.last_parent.borrow_mut() = parent.to_string();
            return None;
        }
        use nix::fcntl::OFlag;
        let mut flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        if !self.is_live() {
            flags |= OFlag::O_NOFOLLOW;
        }
        let fd = nix::fcntl::open(&self.resolved(parent), flags, nix::sys::stat::Mode::empty()).ok()?;
        let result = f(fd.as_fd(), leaf).map_err(io::Error::from);
        let mut dirs = self.dirs.borrow_mut();
        dirs.insert(0, (parent.to_string(), fd));
        dirs.truncate(OPEN_DIRS);
        Some(result)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the root is the live system rather than a snapshot.
    pub fn is_live(&self) -> bool {
        self.root == Path::new("/")
    }

    /// Where `rel` is on this machine: for a snapshot, its directories resolved inside the root
    /// (the last component is left as it is, so that a link can be read as a link).
    pub fn path(&self, rel: &str) -> PathBuf {
        if self.is_live() {
            return self.root.join(rel);
        }
        kiln_provision::root::parent_in_root(&self.root, Path::new(rel))
    }

    /// `rel` with every symbolic link followed as if the root were `/` (`kiln_provision::root`);
    /// on the live system, simply below `/`.
    fn resolved(&self, rel: &str) -> PathBuf {
        if self.is_live() {
            return self.root.join(rel);
        }
        kiln_provision::root::resolve_in_root(&self.root, Path::new(rel))
    }

    /// Opens a regular file below the root for reading: resolved inside the root, never through a
    /// final link, never blocking on a FIFO, and never a device, FIFO or socket.
    pub fn open(&self, rel: &str) -> io::Result<std::fs::File> {
        use nix::fcntl::OFlag;
        use std::os::unix::fs::OpenOptionsExt;
        let nofollow = if self.is_live() { OFlag::empty() } else { OFlag::O_NOFOLLOW };
        let at = self.in_dir(rel, |dir, leaf| {
            let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | nofollow;
            nix::fcntl::openat(dir, leaf, flags, nix::sys::stat::Mode::empty())
        });
        let file = match at {
            Some(Ok(fd)) => std::fs::File::from(fd),
            // In a snapshot the last component is a link: resolved inside the root, by path.
            Some(Err(e)) if e.raw_os_error() != Some(libc::ELOOP) || self.is_live() => return Err(e),
            _ => {
                let flags = if self.is_live() { libc::O_NONBLOCK } else { libc::O_NONBLOCK | libc::O_NOFOLLOW };
                std::fs::OpenOptions::new().read(true).custom_flags(flags).open(self.resolved(rel))?
            }
        };
        // The live /proc and /sys hold no FIFOs or devices: the extra fstat is for snapshots only.
        if !self.is_live() && !file.metadata()?.is_file() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
        }
        Ok(file)
    }

    pub fn exists(&self, rel: &str) -> bool {
        use nix::fcntl::AtFlags;
        let follow = if self.is_live() { AtFlags::empty() } else { AtFlags::AT_SYMLINK_NOFOLLOW };
        if let Some(found) = self.in_dir(rel, |dir, leaf| nix::sys::stat::fstatat(dir, leaf, follow)) {
            // A link in a snapshot is looked at by path, resolved inside the root.
            let link = found.as_ref().is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK);
            if !link {
                return found.is_ok();
            }
        }
        let path = self.resolved(rel);
        // In a snapshot a link left unresolved (a loop) is not followed out of the root.
        if self.is_live() {
            path.exists()
        } else {
            path.symlink_metadata().is_ok()
        }
    }

    /// Reads a file that may legitimately be absent: absence is silent, other failures are problems.
    pub fn read_optional(&self, rel: &str) -> Option<String> {
        self.read_inner(rel, false)
    }

    /// Reads a file that should be there: absence is a problem too.
    pub fn read(&self, rel: &str) -> Option<String> {
        self.read_inner(rel, true)
    }

    /// Reads a one-line attribute (sysfs style), trimmed of whitespace and of the NUL padding
    /// some firmware and snapshot tools leave; empty values are `None`.
    pub fn attr(&self, rel: &str) -> Option<String> {
        self.read_optional(rel)
            .map(|s| s.trim_matches(|c: char| c.is_whitespace() || c == '\0').to_string())
            .filter(|s| !s.is_empty())
    }

    /// Reads and parses a one-line attribute; a value that does not parse is a problem.
    pub fn attr_parse<T: std::str::FromStr>(&self, rel: &str) -> Option<T> {
        let text = self.attr(rel)?;
        match text.parse() {
            Ok(v) => Some(v),
            Err(_) => {
                self.problem(rel, ProblemKind::Malformed, format!("cannot parse {text:?}"));
                None
            }
        }
    }

    /// Reads a one-line attribute and parses it with `parse`; a value that does not parse is a
    /// problem naming the file and `what` was expected, unless it is one of `none` — the texts
    /// the kernel writes for "no value" (`-1` for a NUMA node, `Unknown` for a link speed).
    pub fn attr_with<T>(
        &self,
        rel: &str,
        what: &str,
        none: &[&str],
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Option<T> {
        let text = self.attr(rel)?;
        if none.contains(&text.as_str()) {
            return None;
        }
        let value = parse(&text);
        if value.is_none() {
            let shown: String = text.chars().take(80).collect();
            self.problem(rel, ProblemKind::Malformed, format!("{what} expected, found {shown:?}"));
        }
        value
    }

    pub fn read_bytes(&self, rel: &str, required: bool) -> Option<Vec<u8>> {
        // Not fs::read or read_to_end: their size hints cost a statx and an lseek per file, and
        // sysfs sizes are fictional anyway.
        let read = || -> io::Result<Vec<u8>> {
            use std::io::Read;
            let mut file = self.open(rel)?;
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            // A sysfs attribute comes whole in its first read (at most a page): a short first
            // read is the end, and the read that would return 0 is saved.
            let whole_in_one = rel.starts_with("sys/");
            loop {
                if buf.len() as u64 > MAX_FILE_BYTES {
                    return Err(io::Error::new(
                        io::ErrorKind::FileTooLarge,
                        format!("larger than {} MiB: not a /proc or /sys file of a real machine", MAX_FILE_BYTES >> 20),
                    ));
                }
                match file.read(&mut chunk) {
                    Ok(0) => return Ok(buf),
                    Ok(n) if whole_in_one && buf.is_empty() && n < chunk.len() => return Ok(chunk[..n].to_vec()),
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        };
        match read() {
            Ok(bytes) => Some(bytes),
            Err(e) => {
                self.io_problem(rel, &e, required);
                None
            }
        }
    }

    /// Lists the entry names of a directory, sorted; absence is silent.
    pub fn list_dir(&self, rel: &str) -> Vec<String> {
        let dir = self.resolved(rel);
        let mut names: Vec<String> = match std::fs::read_dir(dir) {
            Ok(entries) => entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect(),
            Err(e) => {
                self.io_problem(rel, &e, false);
                Vec::new()
            }
        };
        names.sort();
        names
    }

    /// The target of a symbolic link (sysfs links are relative); absence is silent.
    pub fn link_target(&self, rel: &str) -> Option<std::path::PathBuf> {
        match self.in_dir(rel, |dir, leaf| nix::fcntl::readlinkat(dir, leaf)) {
            Some(target) => target.ok().map(PathBuf::from),
            None => std::fs::read_link(self.path(rel)).ok(),
        }
    }

    /// The last component of a link's target: the driver or IOMMU group a sysfs link points at.
    pub fn link_name(&self, rel: &str) -> Option<String> {
        self.link_target(rel)?.file_name()?.to_str().map(str::to_string)
    }

    pub fn problem(&self, rel: &str, kind: ProblemKind, message: impl Into<String>) {
        let path = self.path(rel).display().to_string();
        self.problems.borrow_mut().push(Problem { path, kind, message: message.into() });
    }

    /// A problem with something that is not a file under the root (a library, a device node).
    pub fn problem_at(&self, what: impl Into<String>, kind: ProblemKind, message: impl Into<String>) {
        self.problems.borrow_mut().push(Problem { path: what.into(), kind, message: message.into() });
    }

    pub fn take_problems(&self) -> Vec<Problem> {
        std::mem::take(&mut self.problems.borrow_mut())
    }

    fn read_inner(&self, rel: &str, required: bool) -> Option<String> {
        let bytes = self.read_bytes(rel, required)?;
        match String::from_utf8(bytes) {
            Ok(text) => Some(text),
            Err(e) => {
                self.problem(rel, ProblemKind::Malformed, "non-UTF-8 bytes replaced with U+FFFD");
                Some(String::from_utf8_lossy(e.as_bytes()).into_owned())
            }
        }
    }

    fn io_problem(&self, rel: &str, e: &io::Error, required: bool) {
        let (kind, message) = match e.kind() {
            io::ErrorKind::NotFound if !required => return,
            io::ErrorKind::NotFound => (ProblemKind::NotPresent, "not present".to_string()),
            io::ErrorKind::PermissionDenied => {
                (ProblemKind::PermissionDenied, "permission denied: readable by root only".to_string())
            }
            _ => (ProblemKind::Unreadable, e.to_string()),
        };
        self.problem(rel, kind, message);
    }
}
