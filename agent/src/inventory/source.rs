//! The thin I/O layer under the parsers: reads files below a root directory (`/` or a snapshot)
//! and turns every failure into a [`Problem`] instead of an error.

use std::cell::RefCell;
use std::io;
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

/// Reads below a root and collects problems. Not `Sync`: one inventory is taken on one thread.
pub struct Source {
    root: PathBuf,
    problems: RefCell<Vec<Problem>>,
}

impl Source {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Source { root: root.into(), problems: RefCell::new(Vec::new()) }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the root is the live system rather than a snapshot.
    pub fn is_live(&self) -> bool {
        self.root == Path::new("/")
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub fn exists(&self, rel: &str) -> bool {
        self.path(rel).exists()
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

    pub fn read_bytes(&self, rel: &str, required: bool) -> Option<Vec<u8>> {
        // Not fs::read or read_to_end: their size hints cost a statx and an lseek per file, and
        // sysfs sizes are fictional anyway.
        let read = || -> io::Result<Vec<u8>> {
            use std::io::Read;
            let mut file = std::fs::File::open(self.path(rel))?;
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                match file.read(&mut chunk) {
                    Ok(0) => return Ok(buf),
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
        let mut names: Vec<String> = match std::fs::read_dir(self.path(rel)) {
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
        std::fs::read_link(self.path(rel)).ok()
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
