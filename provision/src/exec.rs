//! What a plan does to a machine, and who does it.
//!
//! A step is a list of `Action`s: run a program (an argument vector, never a shell string, so no
//! spec value can inject a command), write a file atomically, set a file's mode and owner, fetch a
//! signing key and check its fingerprint. An `Executor` carries them out: `System` for real,
//! `Recording` for tests (it records, and optionally passes through to `System`).

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A program and its arguments, environment additions, working directory and standard input.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Cmd {
    pub argv: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
}

impl Cmd {
    pub fn new<I, S>(argv: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Cmd { argv: argv.into_iter().map(Into::into).collect(), env: vec![], cwd: None, stdin: None }
    }
    pub fn env(mut self, key: &str, value: &str) -> Cmd {
        self.env.push((key.to_string(), value.to_string()));
        self
    }
    pub fn stdin(mut self, input: String) -> Cmd {
        self.stdin = Some(input);
        self
    }
    pub fn cwd(mut self, dir: PathBuf) -> Cmd {
        self.cwd = Some(dir);
        self
    }
    /// The command as a shell would show it, quoted where needed: for people, never executed.
    pub fn display(&self) -> String {
        self.argv.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" ")
    }
}

pub fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%^".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    Run(Cmd),
    /// Write `content` to `path` (temporary file + rename), creating parent directories.
    Write {
        path: PathBuf,
        #[serde(skip)]
        content: Vec<u8>,
        mode: u32,
        owner: Option<(u32, u32)>,
    },
    /// Set the mode and owner of an existing file.
    Attributes {
        path: PathBuf,
        mode: Option<u32>,
        owner: Option<(u32, u32)>,
    },
    /// Download a signing key, refuse it unless it holds the key `fingerprint`, then write the apt
    /// source `sources`: `header` and the key (that key alone, armored) inline as its `Signed-By`.
    FetchKey {
        url: String,
        fingerprint: String,
        sources: PathBuf,
        header: String,
    },
}

impl Action {
    pub fn display(&self) -> String {
        match self {
            Action::Run(cmd) => cmd.display(),
            Action::Write { path, content, mode, .. } => {
                format!("write {} ({} bytes, mode {mode:04o})", path.display(), content.len())
            }
            Action::Attributes { path, mode, owner } => {
                let mut s = format!("set attributes of {}", path.display());
                if let Some(m) = mode {
                    s += &format!(" mode {m:04o}");
                }
                if let Some((u, g)) = owner {
                    s += &format!(" owner {u}:{g}");
                }
                s
            }
            Action::FetchKey { url, fingerprint, sources, .. } => {
                format!("fetch key {url}, check fingerprint {fingerprint}, write {} with it", sources.display())
            }
        }
    }
}

/// How an action ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The program's exit status; `None` when a signal ended it. Actions kiln performs itself: 0.
    pub exit_code: Option<i32>,
    /// The last `TAIL_BYTES` of standard output and error together.
    pub output_tail: String,
}

impl Finished {
    pub fn ok(&self) -> bool {
        self.exit_code == Some(0)
    }
    fn done() -> Finished {
        Finished { exit_code: Some(0), output_tail: String::new() }
    }
    fn failed(message: String) -> Finished {
        Finished { exit_code: Some(1), output_tail: message }
    }
}

/// The output of a read-only probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probed {
    pub exit_code: Option<i32>,
    pub stdout: String,
}

pub const TAIL_BYTES: usize = 4096;

pub trait Executor {
    /// Runs a read-only probe (a guard's `unless`, a systemctl query, a verification check). Plans
    /// and dry runs call this; it must not change the machine.
    fn probe(&mut self, cmd: &Cmd) -> std::io::Result<Probed>;
    /// Carries out one action. `output` receives the program's output as it comes.
    fn perform(&mut self, action: &Action, output: &mut dyn FnMut(&[u8])) -> Finished;
}

/// The real executor.
#[derive(Debug, Default)]
pub struct System;

impl Executor for System {
    fn probe(&mut self, cmd: &Cmd) -> std::io::Result<Probed> {
        let mut c = command(cmd);
        c.stdin(Stdio::null()).stderr(Stdio::null());
        let out = c.output()?;
        Ok(Probed { exit_code: out.status.code(), stdout: String::from_utf8_lossy(&out.stdout).into_owned() })
    }

    fn perform(&mut self, action: &Action, output: &mut dyn FnMut(&[u8])) -> Finished {
        match action {
            Action::Run(cmd) => run(cmd, output),
            Action::Write { path, content, mode, owner } => match write_atomic(path, content, *mode, *owner) {
                Ok(()) => Finished::done(),
                Err(e) => Finished::failed(format!("cannot write {}: {e}", path.display())),
            },
            Action::Attributes { path, mode, owner } => match set_attributes(path, *mode, *owner) {
                Ok(()) => Finished::done(),
                Err(e) => Finished::failed(format!("cannot set the attributes of {}: {e}", path.display())),
            },
            Action::FetchKey { url, fingerprint, sources, header } => {
                fetch_key(url, fingerprint, sources, header, output)
            }
        }
    }
}

fn command(cmd: &Cmd) -> Command {
    let mut c = Command::new(&cmd.argv[0]);
    c.args(&cmd.argv[1..]);
    for (k, v) in &cmd.env {
        c.env(k, v);
    }
    if let Some(dir) = &cmd.cwd {
        c.current_dir(dir);
    }
    c
}

/// Runs a command with standard output and error on one pipe, streaming it to `output` and keeping
/// the tail.
fn run(cmd: &Cmd, output: &mut dyn FnMut(&[u8])) -> Finished {
    let spawn = || -> std::io::Result<(std::process::Child, std::io::PipeReader)> {
        let (reader, writer) = std::io::pipe()?;
        let mut c = command(cmd);
        c.stdout(writer.try_clone()?).stderr(writer);
        c.stdin(if cmd.stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let child = c.spawn()?;
        Ok((child, reader))
    };
    let (mut child, mut reader) = match spawn() {
        Ok(x) => x,
        Err(e) => return Finished { exit_code: None, output_tail: format!("cannot start {}: {e}", cmd.argv[0]) },
    };
    if let (Some(input), Some(mut stdin)) = (&cmd.stdin, child.stdin.take()) {
        let input = input.clone();
        // A writer thread, so that a child that fills its output pipe before reading all its input
        // cannot deadlock us.
        std::thread::spawn(move || {
            let _ = stdin.write_all(input.as_bytes());
        });
    }
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                output(&buf[..n]);
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > 2 * TAIL_BYTES {
                    tail.drain(..tail.len() - TAIL_BYTES);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let status = child.wait();
    if tail.len() > TAIL_BYTES {
        tail.drain(..tail.len() - TAIL_BYTES);
    }
    let text = String::from_utf8_lossy(&tail).into_owned();
    match status {
        Ok(s) => Finished { exit_code: s.code(), output_tail: text },
        Err(e) => Finished { exit_code: None, output_tail: format!("{text}\nwaiting for {} failed: {e}", cmd.argv[0]) },
    }
}

/// Writes through a temporary file in the same directory and renames it over the target, so that a
/// crash leaves the old file or the new one, never half of one.
pub fn write_atomic(path: &Path, content: &[u8], mode: u32, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("no parent directory"))?;
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(".{name}.kiln-{}-{nanos:08x}", std::process::id()));
    let result = (|| {
        // A fresh file, never one planted at that name (a link to a victim, say).
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(content)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
        }
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn set_attributes(path: &Path, mode: Option<u32>, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    // chown and chmod follow a link: the attributes would land on whatever it points at.
    if std::fs::symlink_metadata(path)?.file_type().is_symlink() {
        return Err(std::io::Error::other(format!(
            "{} is a symbolic link; kiln sets no attributes through one",
            path.display()
        )));
    }
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
    }
    if let Some(m) = mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(m))?;
    }
    Ok(())
}

/// A scratch GnuPG home, removed when dropped: key checks never touch root's keyrings.
struct GpgHome(PathBuf);

impl GpgHome {
    fn new() -> std::io::Result<GpgHome> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let home = std::env::temp_dir().join(format!("kiln-gnupg-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&home)?;
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700))?;
        Ok(GpgHome(home))
    }
    fn cmd(&self, args: &[&str]) -> Cmd {
        let mut argv = vec![
            "gpg".to_string(),
            "--batch".into(),
            "--quiet".into(),
            "--homedir".into(),
            self.0.display().to_string(),
        ];
        argv.extend(args.iter().map(|a| a.to_string()));
        Cmd::new(argv)
    }
}

impl Drop for GpgHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The fingerprints of the primary keys in a key file (armored or binary), as `gpg --show-keys` lists them.
pub fn key_fingerprints(exec: &mut dyn Executor, file: &Path) -> std::io::Result<Vec<String>> {
    let home = GpgHome::new()?;
    let out =
        exec.probe(&home.cmd(&["--show-keys", "--with-colons", "--with-fingerprint", &file.display().to_string()]))?;
    Ok(parse_fingerprints(&out.stdout))
}

/// The key `fingerprint` alone, armored, from a key file that may hold others: what apt is told to
/// trust. `Ok(None)` when the file does not hold that key.
pub fn armored_key(exec: &mut dyn Executor, file: &Path, fingerprint: &str) -> std::io::Result<Option<String>> {
    let home = GpgHome::new()?;
    exec.probe(&home.cmd(&["--import", &file.display().to_string()]))?;
    let out = exec.probe(&home.cmd(&["--armor", "--export", fingerprint]))?;
    Ok(out.stdout.contains("BEGIN PGP PUBLIC KEY BLOCK").then_some(out.stdout))
}

/// A deb822 `Signed-By` field holding the key itself, so that the source needs no keyring file and
/// works the same below another root.
pub fn signed_by_field(armored: &str) -> String {
    let mut field = String::from("Signed-By:\n");
    for line in armored.trim_end().lines() {
        field.push(' ');
        field.push_str(if line.trim().is_empty() { "." } else { line });
        field.push('\n');
    }
    field
}

/// Primary-key fingerprints from `gpg --with-colons` output: the `fpr` record after each `pub`.
pub fn parse_fingerprints(colons: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut want = false;
    for line in colons.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        match fields.first() {
            Some(&"pub") => want = true,
            Some(&"sub") => want = false,
            Some(&"fpr") if want => {
                if let Some(f) = fields.get(9) {
                    out.push(f.to_ascii_uppercase());
                }
                want = false;
            }
            _ => {}
        }
    }
    out
}

fn fetch_key(url: &str, fingerprint: &str, sources: &Path, header: &str, output: &mut dyn FnMut(&[u8])) -> Finished {
    let tmp = std::env::temp_dir().join(format!("kiln-key-{}.asc", std::process::id()));
    let fetched = run(&Cmd::new(["curl", "-fsSL", "--max-time", "60", "-o", &tmp.display().to_string(), url]), output);
    if !fetched.ok() {
        return fetched;
    }
    let mut sys = System;
    let result = match armored_key(&mut sys, &tmp, fingerprint) {
        Ok(Some(key)) => {
            match write_atomic(sources, format!("{header}{}", signed_by_field(&key)).as_bytes(), 0o644, None) {
                Ok(()) => Finished::done(),
                Err(e) => Finished::failed(format!("cannot write {}: {e}", sources.display())),
            }
        }
        Ok(None) => {
            let found = key_fingerprints(&mut sys, &tmp).unwrap_or_default();
            Finished::failed(format!(
                "the key at {url} has fingerprint {}, not the pinned {fingerprint}: refusing it",
                if found.is_empty() { "(none: not an OpenPGP key)".to_string() } else { found.join(", ") }
            ))
        }
        Err(e) => Finished::failed(format!("cannot run gpg to check the key: {e}")),
    };
    let _ = std::fs::remove_file(&tmp);
    result
}

/// Records every probe and action; passes them to `System` when `live`, else answers probes with
/// "exit 1, no output" and pretends actions succeed.
#[derive(Debug, Default)]
pub struct Recording {
    pub live: bool,
    pub probes: Vec<Cmd>,
    pub actions: Vec<Action>,
}

impl Executor for Recording {
    fn probe(&mut self, cmd: &Cmd) -> std::io::Result<Probed> {
        self.probes.push(cmd.clone());
        if self.live {
            System.probe(cmd)
        } else {
            Ok(Probed { exit_code: Some(1), stdout: String::new() })
        }
    }
    fn perform(&mut self, action: &Action, output: &mut dyn FnMut(&[u8])) -> Finished {
        self.actions.push(action.clone());
        if self.live {
            System.perform(action, output)
        } else {
            Finished::done()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_of_both_streams_and_exit_code() {
        let mut seen = Vec::new();
        let f = System.perform(&Action::Run(Cmd::new(["sh", "-c", "echo out; echo err >&2; exit 3"])), &mut |b| {
            seen.extend_from_slice(b)
        });
        assert_eq!(f.exit_code, Some(3));
        assert!(f.output_tail.contains("out") && f.output_tail.contains("err"), "{f:?}");
        assert_eq!(String::from_utf8_lossy(&seen), f.output_tail);
    }

    #[test]
    fn arguments_are_not_interpreted_by_a_shell() {
        let f = System.perform(&Action::Run(Cmd::new(["echo", "$(id); rm -rf /"])), &mut |_| {});
        assert_eq!(f.output_tail, "$(id); rm -rf /\n");
        assert_eq!(shell_quote("a b'c"), r"'a b'\''c'");
    }

    #[test]
    fn missing_program_is_reported() {
        let f = System.perform(&Action::Run(Cmd::new(["/nonexistent/kiln-test"])), &mut |_| {});
        assert_eq!(f.exit_code, None);
        assert!(f.output_tail.contains("cannot start /nonexistent/kiln-test"), "{f:?}");
    }

    #[test]
    fn gpg_colons() {
        let text = "pub:-:4096:1:A4B469963BF863CC:1:::-:::scESC::::::23::0:\nfpr:::::::::EB693B3035CD5710E231E123A4B469963BF863CC:\nuid:-::::1::x::NVIDIA::::::::::0:\nsub:-:4096:1:X:1:::::e::::::23:\nfpr:::::::::1111111111111111111111111111111111111111:\n";
        assert_eq!(parse_fingerprints(text), vec!["EB693B3035CD5710E231E123A4B469963BF863CC"]);
    }
}
