//! `kiln provision`: finding images, printing plans, applying them with the journal in the results
//! database, verifying, linting, and the software fingerprint. The command line (`cli::provision`)
//! parses arguments, owns the runtime and the store, and maps the outcomes below to exit codes.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use anyhow::{bail, Context, Result};
use kiln_db::{ApplyStatus, NewApply, Store};

use kiln_provision::apply::{self, Applied, Event, Journal, JournalError, StepResult};
use kiln_provision::exec::{Executor, System};
use kiln_provision::image::Image;
use kiln_provision::plan::{self, Facts, Plan, Step, Target};
use kiln_text::progress;

/// Where image names are looked up, in order.
pub fn image_dirs(explicit: Option<&Path>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = explicit {
        dirs.push(d.to_path_buf());
        return dirs;
    }
    dirs.push(PathBuf::from("images"));
    if let Ok(exe) = std::env::current_exe() {
        if let Some(prefix) = exe.parent().and_then(Path::parent) {
            dirs.push(prefix.join("share/kiln/images"));
        }
    }
    dirs.push(PathBuf::from("/usr/share/kiln/images"));
    dirs.push(PathBuf::from("/etc/kiln/images"));
    dirs
}

/// An image argument: a path to a `.toml` file, or a name in the image directories.
pub fn find_image(arg: &str, images: Option<&Path>) -> Result<PathBuf> {
    if arg.ends_with(".toml") || arg.contains('/') {
        let p = PathBuf::from(arg);
        if !p.is_file() {
            bail!("{arg}: no such image spec file");
        }
        return Ok(p);
    }
    let dirs = image_dirs(images);
    for d in &dirs {
        let p = d.join(format!("{arg}.toml"));
        if p.is_file() {
            return Ok(p);
        }
    }
    let known: Vec<String> = dirs
        .iter()
        .flat_map(|d| list_images(d))
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    bail!(
        "no image named {arg:?} in {} (known: {}); give a path to a .toml file or --images DIR",
        searched.join(", "),
        if known.is_empty() { "none".to_string() } else { known.join(", ") }
    )
}

pub fn list_images(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "toml")).collect())
        .unwrap_or_default();
    out.sort();
    out
}

pub fn load(arg: &str, images: Option<&Path>) -> Result<Image> {
    let path = find_image(arg, images)?;
    kiln_provision::image::load(&path).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Plans `image` for `root`.
pub fn make_plan(image: &Image, root: &Path, exec: &mut dyn Executor) -> Result<(Plan, Facts, Target)> {
    if !root.is_dir() {
        bail!("{}: the target root is not a directory", root.display());
    }
    let target = Target::new(root);
    let facts = Facts::read(&target, kiln_text::timefmt::now_rfc3339());
    let plan = plan::plan(image, &target, &facts, exec)?;
    Ok((plan, facts, target))
}

/// The plan for people.
pub fn render_plan(plan: &Plan, verb: &str) -> String {
    let mut out = String::new();
    let target = if plan.root == Path::new("/") { "this machine".to_string() } else { plan.root.display().to_string() };
    if plan.steps.is_empty() {
        out += &format!(
            "{} {} is applied to {target}: nothing to change ({} items checked)\n",
            plan.image, plan.image_version, plan.satisfied
        );
    } else {
        out += &format!(
            "{} {} on {target}: {} step{} {verb} ({} items already as declared)\n",
            plan.image,
            plan.image_version,
            plan.steps.len(),
            if plan.steps.len() == 1 { "" } else { "s" },
            plan.satisfied
        );
        for (i, s) in plan.steps.iter().enumerate() {
            out += &format!("{:>3}. {}\n       why: {}\n", i + 1, s.summary, s.why);
            for a in &s.actions {
                out += &format!("       $ {}\n", a.display());
            }
        }
    }
    for n in &plan.notes {
        out += &format!("note: {n}\n");
    }
    out
}

/// The journal of one apply, over the results database.
struct DbJournal<'a> {
    rt: &'a tokio::runtime::Runtime,
    store: &'a mut Store,
    apply_id: String,
    image_hash: String,
}

impl Journal for DbJournal<'_> {
    fn started(&mut self, seq: usize, step: &Step) -> Result<i64, JournalError> {
        let command: Vec<String> = step.actions.iter().map(|a| a.display()).collect();
        self.rt
            .block_on(self.store.step_started(
                &self.apply_id,
                seq as i64,
                &step.key,
                &step.summary,
                &command.join("\n"),
                &self.image_hash,
            ))
            .map_err(|e| JournalError { what: format!("step {seq} ({})", step.summary), cause: e.to_string() })
    }
    fn finished(&mut self, id: i64, r: &StepResult) -> Result<(), JournalError> {
        self.rt
            .block_on(self.store.step_finished(
                id,
                r.ok,
                r.exit_code.map(i64::from),
                r.duration.as_millis() as i64,
                &r.output_tail,
            ))
            .map_err(|e| JournalError { what: "the end of a step".into(), cause: e.to_string() })
    }
}

/// An exclusive lock on provisioning a root, released when dropped (or when kiln dies).
pub struct RootLock(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

pub fn lock_root(target: &Target) -> Result<RootLock> {
    let path = target.path("/var/lib/kiln/provision.lock");
    std::fs::create_dir_all(path.parent().unwrap())
        .with_context(|| format!("creating {}", path.parent().unwrap().display()))?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let Ok(file) = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) else {
        bail!(
            "another kiln is provisioning {} (it holds {}); wait for it to finish",
            target.root.display(),
            path.display()
        );
    };
    Ok(RootLock(file))
}

pub struct ApplyOptions<'a> {
    /// The image as the user named it, for the commands we suggest.
    pub image_arg: &'a str,
    pub resume: bool,
    pub json: bool,
    pub verbose: bool,
}

/// How an apply ended: as journaled, or unchanged (nothing to do, nothing journaled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ApplyResult {
    Unchanged,
    Succeeded,
    Failed,
    Interrupted,
}

impl ApplyResult {
    /// The journal's word for it (an unchanged apply is never journaled).
    fn journaled(self) -> ApplyStatus {
        match self {
            ApplyResult::Unchanged | ApplyResult::Succeeded => ApplyStatus::Succeeded,
            ApplyResult::Failed => ApplyStatus::Failed,
            ApplyResult::Interrupted => ApplyStatus::Interrupted,
        }
    }
}

#[derive(serde::Serialize)]
pub struct ApplyReport {
    pub apply_id: Option<String>,
    pub image: String,
    pub root: PathBuf,
    pub status: ApplyResult,
    pub steps_done: usize,
    pub steps_planned: usize,
    pub resumed: bool,
    pub interrupted_steps: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_step: Option<FailedStep>,
    /// For an apply that had nothing to do: the plan that says so, for people.
    #[serde(skip)]
    pub unchanged_plan: Option<String>,
}

#[derive(serde::Serialize)]
pub struct FailedStep {
    pub summary: String,
    pub command: String,
    pub exit_code: Option<i32>,
    pub output_tail: String,
}

/// What must hold before an apply touches anything: root, a target directory, and the lock on it
/// (held until the returned guard drops).
///
/// # Errors
/// Not root, no such directory, another kiln provisioning the same root.
pub fn prepare_apply(root: &Path) -> Result<RootLock> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "kiln provision apply needs root: it installs packages and writes below {}. Run it with sudo, or add \
             --dry-run to see what it would do",
            root.display()
        );
    }
    if !root.is_dir() {
        bail!("{}: the target root is not a directory", root.display());
    }
    lock_root(&Target::new(root))
}

/// Applies an image for real, one step at a time, journaled in `store`; call [`prepare_apply`]
/// first and hold its lock.
pub fn apply_image(
    image: &Image,
    root: &Path,
    opts: &ApplyOptions,
    interrupted: &AtomicBool,
    rt: &tokio::runtime::Runtime,
    store: &mut Store,
) -> Result<ApplyReport> {
    let root_key = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf()).display().to_string();
    let unfinished = rt.block_on(store.unfinished_apply(image.name(), &root_key))?;
    // A 'running' apply whose kiln is gone (we hold the lock, so it is) crashed.
    if let Some(u) = &unfinished {
        if !opts.resume && matches!(u.status, ApplyStatus::Running | ApplyStatus::Interrupted) {
            bail!(
                "the last apply of {} to {} (started {}, journal {}) did not finish: kiln was killed or interrupted. \
                 Run `kiln provision apply {}{} --resume` to continue it (steps already done are not repeated)",
                image.name(),
                root.display(),
                u.started_at,
                &u.id[..8],
                opts.image_arg,
                root_arg(root),
            );
        }
    }
    let mut exec = System;
    let (plan, _facts, _) = make_plan(image, root, &mut exec)?;
    let mut report = ApplyReport {
        apply_id: None,
        image: plan.image.clone(),
        root: root.to_path_buf(),
        status: ApplyResult::Unchanged,
        steps_done: 0,
        steps_planned: plan.steps.len(),
        resumed: false,
        interrupted_steps: vec![],
        failed_step: None,
        unchanged_plan: None,
    };
    let resuming = opts.resume && unfinished.is_some();
    if plan.steps.is_empty() && !resuming {
        report.unchanged_plan = Some(render_plan(&plan, "to apply"));
        return Ok(report);
    }
    let (apply_id, first_seq) = match unfinished.as_ref().filter(|_| opts.resume) {
        Some(u) => {
            let (dangling, next) = rt.block_on(store.resume_apply(&u.id, &image.hash))?;
            report.resumed = true;
            report.interrupted_steps = dangling.iter().map(|s| s.summary.clone()).collect();
            if !opts.json {
                for s in &dangling {
                    progress(&format!(
                        "step {} ({}) was interrupted when kiln stopped; it runs again if still needed",
                        s.seq, s.summary
                    ));
                }
            }
            (u.id.clone(), next as usize)
        }
        None => {
            if opts.resume && !opts.json {
                progress(&format!("nothing to resume for {}: starting a new apply", image.name()));
            }
            let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|s| s.trim().to_string());
            let id = rt.block_on(store.begin_apply(&NewApply {
                image: plan.image.clone(),
                image_version: plan.image_version.clone(),
                image_hash: plan.image_hash.clone(),
                root: root_key.clone(),
                hostname,
            }))?;
            (id, 1)
        }
    };
    report.apply_id = Some(apply_id.clone());
    let mut journal = DbJournal { rt, store, apply_id: apply_id.clone(), image_hash: image.hash.clone() };
    let outcome = apply::apply(&plan, first_seq, &mut exec, &mut journal, interrupted, &mut step_events(opts));
    let (status, done) = match &outcome {
        Ok(Applied::Done { steps }) => (ApplyResult::Succeeded, *steps),
        Ok(Applied::Failed { done, step, result }) => {
            report.failed_step = Some(FailedStep {
                summary: step.summary.clone(),
                command: step.actions.iter().map(|a| a.display()).collect::<Vec<_>>().join("\n"),
                exit_code: result.exit_code,
                output_tail: result.output_tail.clone(),
            });
            (ApplyResult::Failed, *done)
        }
        Ok(Applied::Interrupted { done }) => (ApplyResult::Interrupted, *done),
        Err(_) => (ApplyResult::Failed, 0),
    };
    let closed = rt.block_on(store.finish_apply(&apply_id, status.journaled()));
    outcome.map_err(|e| anyhow::anyhow!("{e}; the apply stopped (journal {})", &apply_id[..8]))?;
    closed?;
    report.status = status;
    report.steps_done = done;
    Ok(report)
}

/// What people see while steps run: each step's name on a terminal (or with `-v`), and with `-v`
/// its output as it comes.
fn step_events(opts: &ApplyOptions) -> impl FnMut(Event) {
    let terminal = std::io::stderr().is_terminal() && !opts.json;
    let verbose = opts.verbose && !opts.json;
    move |event| match event {
        Event::Starting { index, total, step } => {
            if terminal || verbose {
                eprintln!("kiln: [{}/{total}] {}", index + 1, step.summary);
            }
        }
        Event::Output(bytes) => {
            if verbose {
                let _ = std::io::stderr().write_all(bytes);
            }
        }
        Event::Finished { result, .. } => {
            if (terminal || verbose) && result.ok && result.duration.as_secs() >= 1 {
                eprintln!("kiln:        done in {:.1} s", result.duration.as_secs_f64());
            }
        }
    }
}

fn root_arg(root: &Path) -> String {
    if root == Path::new("/") {
        String::new()
    } else {
        format!(" --root {}", root.display())
    }
}

pub fn render_apply(report: &ApplyReport, image_arg: &str) -> String {
    let again = format!("kiln provision apply {image_arg}{} --resume", root_arg(&report.root));
    let journal = report.apply_id.as_deref().map(|id| &id[..8]).unwrap_or("-");
    match report.status {
        ApplyResult::Succeeded => format!(
            "{}: applied {} step{} to {}{} (journal {journal})\n",
            report.image,
            report.steps_done,
            if report.steps_done == 1 { "" } else { "s" },
            report.root.display(),
            if report.resumed { ", resuming the interrupted apply" } else { "" }
        ),
        ApplyResult::Failed => {
            let mut s = format!(
                "{}: step {} of {} failed; the steps before it are applied (journal {journal})\n",
                report.image,
                report.steps_done + 1,
                report.steps_planned
            );
            if let Some(f) = &report.failed_step {
                s += &format!(
                    "  step:      {}\n  command:   {}\n  exit code: {}\n  output (last lines):\n",
                    f.summary,
                    f.command,
                    f.exit_code.map_or("killed by a signal".into(), |c| c.to_string())
                );
                for line in f.output_tail.lines().rev().take(25).collect::<Vec<_>>().into_iter().rev() {
                    s += &format!("    {line}\n");
                }
                s += &format!("Fix the cause, then run `{again}`.\n");
            }
            s
        }
        ApplyResult::Interrupted => format!(
            "{}: interrupted after {} of {} steps (journal {journal}); run `{again}` to finish\n",
            report.image, report.steps_done, report.steps_planned
        ),
        ApplyResult::Unchanged => report.unchanged_plan.clone().unwrap_or_default(),
    }
}

/// Drift and failed checks: what `verify` reports.
#[derive(serde::Serialize)]
pub struct Verification {
    pub image: String,
    pub root: PathBuf,
    pub drift: Vec<Drift>,
    pub checks: Vec<CheckResult>,
    pub notes: Vec<String>,
}

#[derive(serde::Serialize)]
pub struct Drift {
    pub key: String,
    pub summary: String,
    pub why: String,
}

#[derive(serde::Serialize)]
pub struct CheckResult {
    pub name: String,
    pub command: String,
    pub ok: bool,
    pub detail: String,
}

impl Verification {
    pub fn clean(&self) -> bool {
        self.drift.is_empty() && self.checks.iter().all(|c| c.ok)
    }
}

pub fn verify(image: &Image, root: &Path) -> Result<Verification> {
    let mut exec = System;
    let (plan, facts, target) = make_plan(image, root, &mut exec)?;
    // `apt-get update` is a means, not a difference.
    let drift = plan
        .steps
        .iter()
        .filter(|s| s.key != "apt:update")
        .map(|s| Drift { key: s.key.clone(), summary: s.summary.clone(), why: s.why.clone() })
        .collect();
    let mut checks = Vec::new();
    for c in &image.spec.checks {
        let check = c.get_ref();
        let cmd = plan::command_in(&target, &facts, check.run.get_ref());
        let (ok, detail) = match exec.probe(&cmd) {
            Err(e) => (false, format!("cannot run {}: {e}", cmd.argv.first().map_or("", String::as_str))),
            Ok(out) => {
                let first = out.stdout.lines().next().unwrap_or("").to_string();
                if let Some(want) = &check.contains {
                    if out.stdout.contains(want.as_str()) {
                        (true, first)
                    } else {
                        (false, format!("output does not contain {want:?}: {:?}", tail(&out.stdout)))
                    }
                } else if let Some(re) = image.check_regex(check) {
                    if re.is_match(&out.stdout) {
                        (true, first)
                    } else {
                        (false, format!("output does not match /{}/: {:?}", re.as_str(), tail(&out.stdout)))
                    }
                } else {
                    (out.exit_code == Some(0), first)
                }
            }
        };
        checks.push(CheckResult { name: check.name.clone(), command: cmd.display(), ok, detail });
    }
    Ok(Verification { image: plan.image, root: plan.root, drift, checks, notes: plan.notes })
}

fn tail(s: &str) -> String {
    let t = s.trim_end();
    if t.len() > 200 {
        let mut cut = t.len() - 200;
        while !t.is_char_boundary(cut) {
            cut += 1;
        }
        format!("…{}", &t[cut..])
    } else {
        t.to_string()
    }
}

pub fn render_verification(v: &Verification) -> String {
    let mut out = String::new();
    if v.clean() {
        out += &format!(
            "{}: no drift on {}; {} check{} passed\n",
            v.image,
            v.root.display(),
            v.checks.len(),
            if v.checks.len() == 1 { "" } else { "s" }
        );
    } else {
        out += &format!(
            "{}: {} drift item{} on {}\n",
            v.image,
            v.drift.len(),
            if v.drift.len() == 1 { "" } else { "s" },
            v.root.display()
        );
        for d in &v.drift {
            out += &format!("  drift: {} — {}\n", d.summary, d.why);
        }
    }
    for c in &v.checks {
        out += &format!("  check {}: {} ({})\n", if c.ok { "ok    " } else { "FAILED" }, c.name, c.detail);
    }
    for n in &v.notes {
        out += &format!("note: {n}\n");
    }
    out
}

pub fn render_software(s: &kiln_provision::software::Software) -> String {
    let mut out = String::new();
    let row =
        |out: &mut String, k: &str, v: &Option<String>| *out += &format!("{k:<15} {}\n", v.as_deref().unwrap_or("-"));
    row(&mut out, "kernel", &s.kernel);
    row(&mut out, "nvidia driver", &s.nvidia_driver);
    row(&mut out, "fabric manager", &s.fabric_manager);
    row(&mut out, "cuda", &s.cuda);
    row(&mut out, "nccl", &s.nccl);
    row(&mut out, "cudnn", &s.cudnn);
    for (venv, fw) in &s.python {
        let list: Vec<String> = fw.iter().map(|(k, v)| format!("{k} {v}")).collect();
        out += &format!(
            "{:<15} {}: {}\n",
            "python",
            venv,
            if list.is_empty() { "no frameworks".into() } else { list.join(", ") }
        );
    }
    if s.images.is_empty() {
        out += &format!("{:<15} none applied by kiln\n", "images");
    }
    for i in &s.images {
        out += &format!(
            "{:<15} {} {} (hash {}, applied {})\n",
            "image",
            i.image,
            i.version,
            &i.hash[..i.hash.len().min(12)],
            i.applied_at
        );
    }
    out
}
