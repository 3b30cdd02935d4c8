//! kiln's side of running this program: finding it, starting it once per argument list under a
//! deadline (each in a process group of its own, its output read on threads so that a full pipe
//! never stalls it), and reading how each run ended — a document, the program's own refusal, or
//! the loader's words about a missing driver or CUDA library — as typed values. kiln's benchmark
//! adapters and its cluster commands both launch kiln-gpu through this one module.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What went wrong with one run of `kiln-gpu`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChildError {
    #[error("did not finish within {0} s (a hung kernel or a lost GPU: look for Xid events in the kernel log)")]
    TimedOut(u64),
    #[error("stopped: kiln was interrupted")]
    Interrupted,
    #[error(
        "cannot start: the NVIDIA driver's CUDA library (libcuda.so.1) is not installed or not on the loader's \
         path; provision the driver first ({0})"
    )]
    NoDriver(String),
    #[error(
        "cannot start: {lib}, one of the CUDA 13.0 libraries kiln-gpu links, is not installed or not on the \
         loader's path; install the kiln-gpu package with its dependencies, provision an image with CUDA 13.0 \
         (images/nvidia-cuda13.0-*.toml), or point LD_LIBRARY_PATH at them ({line})"
    )]
    NoRuntime { lib: String, line: String },
    #[error(
        "cannot start: the NVIDIA driver lacks an entry point kiln-gpu's CUDA 13.0 needs, so it is older than \
         CUDA 13.0's minimum (580.65.06); provision a newer driver (images/nvidia-cuda13.0-*.toml) ({0})"
    )]
    OldDriver(String),
    #[error("killed by signal {signal}{}", tail(.stderr))]
    Signal { signal: i32, stderr: String },
    /// The program's own `{"error": …}`.
    #[error("{0}")]
    Refused(String),
    #[error("exited with status {status:?} without a document{}", tail(.stderr))]
    Garbled { status: Option<i32>, stderr: String },
}

fn tail(stderr: &str) -> String {
    match stderr.lines().rev().find(|l| !l.trim().is_empty()) {
        Some(line) => format!(": {}", line.trim()),
        None => String::new(),
    }
}

/// How one run of the program ended, as it ended.
#[derive(Debug, Clone, Default)]
pub struct Ended {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
    pub interrupted: bool,
}

/// The document a run printed, or why there is none (pure: what the process left behind).
pub fn interpret(ended: &Ended, timeout: Duration) -> Result<serde_json::Value, ChildError> {
    if ended.interrupted {
        return Err(ChildError::Interrupted);
    }
    if ended.timed_out {
        return Err(ChildError::TimedOut(timeout.as_secs()));
    }
    let doc: Option<serde_json::Value> = serde_json::from_str(ended.stdout.trim()).ok();
    if let Some(doc) = doc.filter(serde_json::Value::is_object) {
        if let Some(error) = doc.get("error") {
            return Err(ChildError::Refused(error.as_str().map_or_else(|| error.to_string(), str::to_string)));
        }
        if ended.code == Some(0) {
            return Ok(doc);
        }
    }
    if ended.code == Some(127) {
        if let Some(e) = loader_error(&ended.stderr) {
            return Err(e);
        }
    }
    if let Some(signal) = ended.signal {
        return Err(ChildError::Signal { signal, stderr: ended.stderr.clone() });
    }
    Err(ChildError::Garbled { status: ended.code, stderr: ended.stderr.clone() })
}

/// What the dynamic loader said when it could not start `kiln-gpu` (exit status 127): a missing
/// driver, a missing CUDA 13.0 library, or a driver too old for CUDA 13.0.
fn loader_error(stderr: &str) -> Option<ChildError> {
    let line = stderr
        .lines()
        .find(|l| l.contains("error while loading shared libraries") || l.contains("symbol lookup error"))?;
    let line = line.trim().to_string();
    if line.contains("symbol lookup error") {
        // `undefined symbol: cuXxx` from libcuda.so.1: the driver predates an entry point.
        let symbol = line.rsplit("undefined symbol: ").next().unwrap_or_default();
        return Some(if symbol.starts_with("cu") && !symbol.starts_with("cublas") && !symbol.starts_with("curand") {
            ChildError::OldDriver(line)
        } else {
            ChildError::NoRuntime { lib: format!("the library that defines {}", symbol.trim()), line }
        });
    }
    let lib = line.split("shared libraries: ").nth(1)?.split(':').next()?.trim().to_string();
    Some(if lib.starts_with("libcuda.so") { ChildError::NoDriver(line) } else { ChildError::NoRuntime { lib, line } })
}

/// A run's document read as `T` (`what` names it in the error), or why there is none: the pair a
/// result keeps (`run`, `error`).
pub fn read_document<T: serde::de::DeserializeOwned>(
    doc: Result<serde_json::Value, ChildError>,
    what: &str,
) -> (Option<T>, Option<String>) {
    let read = doc.map_err(|e| e.to_string()).and_then(|d| {
        serde_json::from_value::<T>(d).map_err(|e| format!("a document kiln does not read as {what}: {e}"))
    });
    match read {
        Ok(t) => (Some(t), None),
        Err(e) => (None, Some(e)),
    }
}

/// A root for an NCCL job's bootstrap, `HOST:PORT`: `host` as the other ranks reach this machine
/// (bound as `bind`), and a port the kernel hands out free now. Rank 0's kiln-gpu binds it
/// moments later, inside `ncclCommInitRank` (see `request::NcclJob`).
///
/// # Errors
/// No port can be had.
pub fn nccl_root(bind: std::net::IpAddr, host: &str) -> std::io::Result<String> {
    let listener = std::net::TcpListener::bind((bind, 0))?;
    Ok(format!("{host}:{}", listener.local_addr()?.port()))
}

/// Why kiln-gpu cannot be found: what was looked at, and what to do.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct NotFound(pub String);

/// `kiln-gpu`: `KILN_GPU` when set, else the one beside this kiln, else the first on `PATH`.
pub fn locate() -> Result<PathBuf, NotFound> {
    if let Some(path) = std::env::var_os("KILN_GPU").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(NotFound(format!("KILN_GPU names {}, which is not a file", path.display())))
        };
    }
    let mut looked = Vec::new();
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) {
        looked.push(dir.join("kiln-gpu"));
    }
    if let Some(path) = std::env::var_os("PATH") {
        looked.extend(std::env::split_paths(&path).map(|d| d.join("kiln-gpu")));
    }
    looked.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        NotFound(format!(
            "kiln-gpu, the program that runs kiln's GPU benchmarks, is not installed (looked beside kiln and on \
             PATH: {}); build it with deploy/cuda/cuda-root.sh and `cargo build --release -p kiln-gpu --features \
             cuda,nccl` and put it beside kiln, or name it with KILN_GPU",
            looked.first().map_or_else(|| "-".to_string(), |p| p.display().to_string())
        ))
    })
}

/// A running `kiln-gpu`, its output read on threads of its own so that a full pipe never stalls it.
struct Running {
    child: Child,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
}

fn spawn(program: &Path, args: &[String], visible: Visible) -> std::io::Result<Running> {
    let mut command = Command::new(program);
    command
        .args(args)
        // CUDA numbers devices fastest first unless told otherwise; NVML (and so kiln's GPU
        // indices and telemetry) numbers them by PCI address.
        .env("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
    if visible == Visible::All {
        command.env_remove("CUDA_VISIBLE_DEVICES");
    }
    let mut child = command
        // A group of its own: a hung run is killed with whatever it started, so that no leftover
        // process holds its output open.
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let reader = |mut from: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = from.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let stdout = reader(Box::new(child.stdout.take().expect("piped")));
    let stderr = reader(Box::new(child.stderr.take().expect("piped")));
    Ok(Running { child, stdout, stderr })
}

/// Which GPUs a run of `kiln-gpu` sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visible {
    /// Every GPU, numbered as NVML numbers them (a benchmark of this box).
    All,
    /// What the launcher gave this process (`CUDA_VISIBLE_DEVICES` kept: a rank of a job).
    Launcher,
}

/// Runs `kiln-gpu` once per argument list, all at once, and waits for every one: a run past
/// `timeout`, or every run once `interrupted` is set, is killed.
pub fn run_all(program: &Path, runs: &[Vec<String>], timeout: Duration, interrupted: &AtomicBool) -> Vec<Ended> {
    run_all_seeing(program, runs, timeout, interrupted, Visible::All)
}

/// [`run_all`], the runs seeing the GPUs `visible` says.
pub fn run_all_seeing(
    program: &Path,
    runs: &[Vec<String>],
    timeout: Duration,
    interrupted: &AtomicBool,
    visible: Visible,
) -> Vec<Ended> {
    let started = Instant::now();
    let mut running: Vec<Result<Running, Ended>> = runs
        .iter()
        .map(|args| {
            spawn(program, args, visible).map_err(|e| Ended {
                code: None,
                stderr: format!("cannot run {}: {e}", program.display()),
                ..Ended::default()
            })
        })
        .collect();
    let mut ended: Vec<Option<Ended>> = running.iter().map(|_| None).collect();
    loop {
        let stop = interrupted.load(Ordering::Relaxed);
        let late = started.elapsed() > timeout;
        for (slot, run) in ended.iter_mut().zip(running.iter_mut()) {
            if slot.is_some() {
                continue;
            }
            let r = match run {
                Err(e) => {
                    *slot = Some(e.clone());
                    continue;
                }
                Ok(r) => r,
            };
            use std::os::unix::process::ExitStatusExt;
            let (status, killed) = match r.child.try_wait() {
                Ok(Some(status)) => (Some(status), false),
                Ok(None) if stop || late => {
                    let group = nix::unistd::Pid::from_raw(r.child.id() as i32);
                    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
                    let _ = r.child.kill();
                    (r.child.wait().ok(), true)
                }
                Ok(None) => continue,
                Err(_) => (None, false),
            };
            *slot = Some(Ended {
                code: status.and_then(|s| s.code()),
                signal: status.and_then(|s| s.signal()),
                stdout: String::new(),
                stderr: String::new(),
                timed_out: killed && late,
                interrupted: killed && !late,
            });
        }
        if ended.iter().all(Option::is_some) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    ended
        .into_iter()
        .zip(running)
        .map(|(e, r)| {
            let mut e = e.expect("every run ended");
            if let Ok(r) = r {
                e.stdout = r.stdout.join().unwrap_or_default();
                e.stderr = r.stderr.join().unwrap_or_default();
            }
            e
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(code: Option<i32>, stdout: &str, stderr: &str) -> Ended {
        Ended { code, stdout: stdout.into(), stderr: stderr.into(), ..Ended::default() }
    }

    #[test]
    fn how_a_run_ended_is_told_plainly() {
        let t = Duration::from_secs(30);
        assert_eq!(interpret(&ended(Some(0), "{\"a\":1}\n", ""), t).unwrap()["a"], 1);
        assert_eq!(
            interpret(&ended(Some(2), "{\"schema_version\":1,\"error\":\"out of memory\"}", ""), t),
            Err(ChildError::Refused("out of memory".into()))
        );
        let no_driver = ended(
            Some(127),
            "",
            "kiln-gpu: error while loading shared libraries: libcuda.so.1: cannot open shared object file\n",
        );
        let e = interpret(&no_driver, t).unwrap_err();
        assert!(matches!(e, ChildError::NoDriver(_)) && e.to_string().contains("provision the driver"), "{e}");
        // The driver is there, CUDA 13.0's libraries are not (a box still on the CUDA 12.8 image).
        let no_cublas = ended(
            Some(127),
            "",
            "/usr/bin/kiln-gpu: error while loading shared libraries: libcublas.so.13: cannot open shared object \
             file: No such file or directory\n",
        );
        let e = interpret(&no_cublas, t).unwrap_err();
        assert!(matches!(&e, ChildError::NoRuntime { lib, .. } if lib == "libcublas.so.13"), "{e:?}");
        assert!(e.to_string().starts_with("cannot start: libcublas.so.13, one of the CUDA 13.0 libraries"), "{e}");
        // A 570 driver under a CUDA 13 program that binds an entry point the driver predates.
        let old = ended(
            Some(127),
            "",
            "/usr/bin/kiln-gpu: symbol lookup error: /usr/bin/kiln-gpu: undefined symbol: cuCtxCreate_v4\n",
        );
        let e = interpret(&old, t).unwrap_err();
        assert!(matches!(e, ChildError::OldDriver(_)) && e.to_string().contains("580.65.06"), "{e}");
        // Exit status 127 from the program itself, with no loader message, is no loader error.
        assert!(matches!(interpret(&ended(Some(127), "", "lost\n"), t), Err(ChildError::Garbled { .. })));
        let killed = Ended { signal: Some(11), stderr: "fault\n".into(), ..Ended::default() };
        assert_eq!(interpret(&killed, t).unwrap_err().to_string(), "killed by signal 11: fault");
        let late = Ended { timed_out: true, signal: Some(9), ..Ended::default() };
        assert!(interpret(&late, t).unwrap_err().to_string().starts_with("did not finish within 30 s"));
        // Half a document, or a success status with nothing printed, is no result.
        assert!(matches!(interpret(&ended(Some(0), "{\"a\":", ""), t), Err(ChildError::Garbled { .. })));
        assert!(matches!(interpret(&ended(Some(0), "[1]", ""), t), Err(ChildError::Garbled { .. })));
    }
}
