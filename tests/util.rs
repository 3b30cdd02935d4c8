//! Helpers for the integration tests: run the real `kiln` binary, find and unpack the fixtures
//! (`tests/fixtures`, real machines' data with their origin in its README), and report a failing
//! command in full.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

/// `tests/fixtures` in the repository: what a plain clone needs to pass its own tests.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

static UNPACK: Mutex<()> = Mutex::new(());

/// Unpacks a fixture tarball once into the target directory and returns the unpacked folder.
/// Safe across threads and across test processes (unpack aside, then rename).
pub fn unpack(tarball: &Path) -> PathBuf {
    let _guard = UNPACK.lock().unwrap_or_else(|e| e.into_inner());
    let name = tarball.file_name().unwrap().to_string_lossy().replace(".tar.bz2", "").replace(".tar.gz", "");
    let dest = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fixtures").join(&name);
    if dest.is_dir() {
        return dest;
    }
    let staging = dest.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).unwrap();
    let file = std::fs::File::open(tarball).unwrap_or_else(|e| panic!("{}: {e}", tarball.display()));
    let reader: Box<dyn std::io::Read> = if tarball.to_string_lossy().ends_with(".bz2") {
        Box::new(bzip2::read::BzDecoder::new(file))
    } else {
        Box::new(flate2::read::GzDecoder::new(file))
    };
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().unwrap_or_else(|e| panic!("{}: {e}", tarball.display())) {
        let mut entry = entry.unwrap_or_else(|e| panic!("{}: {e}", tarball.display()));
        // hwloc's tarballs hold a few device nodes and FIFOs, which a user cannot recreate and no
        // reader needs: what matters here is proc and sys text files, directories and links.
        use tar::EntryType::{Directory, Regular, Symlink};
        if matches!(entry.header().entry_type(), Regular | Directory | Symlink) {
            let _ = entry.unpack_in(&staging);
        }
    }
    assert!(std::fs::read_dir(&staging).unwrap().next().is_some(), "unpacking {} gave nothing", tarball.display());
    if std::fs::rename(&staging, &dest).is_err() {
        let _ = std::fs::remove_dir_all(&staging); // another process won the race
    }
    dest
}

/// `unwrap` that prints the command and its output on failure.
pub trait UnwrapDescribing<T> {
    fn unwrap_or_while_describing(self, run: &Run) -> T;
}

impl<T, E: std::fmt::Display> UnwrapDescribing<T> for Result<T, E> {
    #[track_caller]
    fn unwrap_or_while_describing(self, run: &Run) -> T {
        self.unwrap_or_else(|e| panic!("{e}\n{}", run.describe()))
    }
}

/// `text` whole when it has at most `keep` characters; else its first and last parts around a
/// line saying how much was cut.
pub fn cut_middle(text: &str, keep: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= keep {
        return text.to_string();
    }
    let (head, tail) = (keep / 4, keep - keep / 4);
    format!(
        "{}\n[… {} characters cut …]\n{}",
        chars[..head].iter().collect::<String>(),
        chars.len() - keep,
        chars[chars.len() - tail..].iter().collect::<String>()
    )
}

pub struct Run {
    pub cmdline: String,
    pub output: Output,
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }
    pub fn code(&self) -> Option<i32> {
        self.output.status.code()
    }
    /// Describes the run for an assertion message: standard error first (where the reason is),
    /// then standard output, its middle cut when it is long (a log shows only so much).
    pub fn describe(&self) -> String {
        format!(
            "command: {}\nexit: {:?}\n--- stderr\n{}\n--- stdout\n{}",
            self.cmdline,
            self.code(),
            self.stderr(),
            cut_middle(&self.stdout(), 6000)
        )
    }
    #[track_caller]
    pub fn success(self) -> Self {
        assert_eq!(self.code(), Some(0), "expected success\n{}", self.describe());
        self
    }
    /// The `--json` document, as this kiln's output schema (version 1) has it; an inventory
    /// carries its own document version instead.
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        let value = self.any_json();
        let want = if value.get("collected_at").is_some() { kiln_inventory::SCHEMA_VERSION } else { 1 };
        assert_eq!(value["schema_version"], want, "--json document with the wrong schema_version\n{}", self.describe());
        value
    }
    /// The report of a benchmark's `--json`, as the typed report the benchmark emits: a renamed or
    /// missing field fails here.
    #[track_caller]
    pub fn report<T: serde::de::DeserializeOwned>(&self) -> T {
        serde_json::from_value(self.json()["report"].clone()).unwrap_or_while_describing(self)
    }
    #[track_caller]
    pub fn any_json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout()).unwrap_or_else(|e| panic!("stdout is not JSON: {e}\n{}", self.describe()))
    }
}

/// Runs `kiln` with arguments and the given environment (the database is never the user's).
pub fn kiln(args: &[&str], env: &[(&str, &Path)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args(args).env_remove("KILN_DB").env_remove("KILN_LOG");
    // Never this machine's fleet service: uploads only where a test names a server.
    for var in ["KILN_SERVER", "KILN_TOKEN", "KILN_CA_CERT"] {
        cmd.env_remove(var);
    }
    cmd.env("KILN_AGENT_CONFIG", "/nonexistent/kiln-agent.toml");
    // The tests run in parallel, each kiln beside the others: a benchmark here always shares the
    // CPUs, so its run would be `disturbed`. The contention test sets its own limit.
    cmd.env("KILN_MAX_CONTENTION", "100");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let cmdline = format!("kiln {}", args.join(" "));
    let output = cmd.output().expect("running kiln");
    Run { cmdline, output }
}

/// A kernel CPU list ("0-3,8") as a set; the tests' own reading, independent of kiln's parser.
pub fn cpu_set(text: &str) -> std::collections::BTreeSet<u64> {
    let mut out = std::collections::BTreeSet::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u64>().unwrap()..=b.parse().unwrap()),
            None => {
                out.insert(part.parse().unwrap());
            }
        }
    }
    out
}

/// hwloc's expected results per test case (`tests/fixtures/hwloc/expected.json`), by case name.
pub fn hwloc_expected() -> std::collections::BTreeMap<String, serde_json::Value> {
    let path = fixtures().join("hwloc/expected.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// The inventory of one hwloc case's snapshot (its tarball, unpacked, at its top directory).
pub fn hwloc_case_inventory(case: &serde_json::Value) -> serde_json::Value {
    let tarball = fixtures().join("hwloc").join(case["tarball"].as_str().unwrap());
    inventory_json(&unpack(&tarball).join(case["raw_sysfs_facts"]["topdir"].as_str().unwrap()))
}

/// The inventory of a root, as the binary prints it with `--json`.
pub fn inventory_json(root: &Path) -> serde_json::Value {
    kiln(&["inventory", "--json", "--root", root.to_str().unwrap()], &[]).success().json()
}

/// Copies a snapshot so a test can damage it; symbolic links stay links.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().unwrap();
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
        } else if kind.is_dir() {
            copy_tree(&src, &dst);
        } else if kind.is_file() {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// Builds the fake NVML library (`tests/fake-nvml/fake_nvml.c`) once with the system C compiler
/// and returns its path. The library serves the fixture named by `KILN_FAKE_NVML_FIXTURE`.
pub fn fake_nvml() -> PathBuf {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(path) = built.as_ref() {
        return path.clone();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fake-nvml");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("libnvidia-ml.so.1");
    let staging = dir.join(format!("libnvidia-ml.so.1.{}", std::process::id()));
    crate::synthetic::compile_fake_nvml(&staging).unwrap_or_else(|e| panic!("{e}"));
    std::fs::rename(&staging, &out).unwrap();
    *built = Some(out.clone());
    out
}

/// Unpacks a ttar text archive (prometheus/procfs's fixture format) below `dest`.
/// Blocks are separated by `# ttar - - -` lines: `Directory:`, or `Path:` with `Lines: N` and the
/// content (`NULLBYTE` for NUL, a trailing `EOF` for no final newline), or `SymlinkTo:`.
pub fn unpack_ttar(archive: &Path, dest: &Path) {
    let text = std::fs::read_to_string(archive).unwrap();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if let Some(dir) = line.strip_prefix("Directory: ") {
            std::fs::create_dir_all(dest.join(dir)).unwrap();
        } else if let Some(path) = line.strip_prefix("Path: ") {
            let target = dest.join(path);
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            let next = lines.next().unwrap_or("");
            if let Some(link) = next.strip_prefix("SymlinkTo: ") {
                let _ = std::os::unix::fs::symlink(link, &target);
            } else if let Some(n) = next.strip_prefix("Lines: ") {
                let n: usize = n.trim().parse().unwrap();
                let mut content = String::new();
                for i in 0..n {
                    let l = lines.next().unwrap_or("").replace("NULLBYTE", "\0");
                    match l.strip_suffix("EOF") {
                        Some(last) if i + 1 == n => content.push_str(last),
                        _ => {
                            content.push_str(&l);
                            content.push('\n');
                        }
                    }
                }
                std::fs::write(&target, content).unwrap();
            }
        }
    }
}

/// Whether a test may run: `missing` lists what it needs and this machine lacks (system programs,
/// root). Where something is missing the test says what it skipped and why, and passes — unless
/// `KILN_TEST_REQUIRE_ALL=1` (set by `.ci/run` after installing everything), where it fails.
#[track_caller]
pub fn needs(test: &str, missing: &[String]) -> bool {
    if missing.is_empty() {
        return true;
    }
    let what = missing.join(", ");
    assert!(
        std::env::var_os("KILN_TEST_REQUIRE_ALL").is_none_or(|v| v != "1"),
        "{test}: needs {what} (KILN_TEST_REQUIRE_ALL=1 forbids skipping)"
    );
    // Straight to the process's stderr, past the test harness's capture: a skip must be seen.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{test}: SKIPPED — needs {what}");
    false
}

/// `program` unless it is on the PATH: for [`needs`].
pub fn program(program: &str, package: &str) -> Option<String> {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()));
    (!found).then(|| format!("{program} (Debian package {package})"))
}

/// "root" unless the tests run as root: for [`needs`].
pub fn root(why: &str) -> Option<String> {
    (!nix::unistd::geteuid().is_root()).then(|| format!("root ({why})"))
}

/// The machine to one test at a time, for the tests that load every core (the MPI jobs, which
/// oversubscribe this host's CPUs) and those that measure it and judge the figures (`commission`,
/// whose benchmarks must settle): beside each other, each makes the other's timings the scheduler's.
pub fn machine_to_itself() -> std::sync::MutexGuard<'static, ()> {
    static MACHINE: Mutex<()> = Mutex::new(());
    MACHINE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
