//! `kiln provision …`: plan, apply, verify, status, lint and the journal.

use std::path::PathBuf;

use anyhow::Result;
use kiln_db::{ApplyRow, StepRow, StepStatus};
use kiln_provision::exec::System;
use kiln_provision::plan::Plan;
use kiln_provision::software::Software;
use serde::Serialize;

use super::args::{Provision, ProvisionTarget};
use super::bench::{catch_interrupts, INTERRUPTED};
use super::{Ctx, Exit, Output, View};
use crate::provisioning::{self as prov, ApplyReport, ApplyResult, Verification};

/// A plan, with what its steps would do (`to apply`, or a dry run's wording).
#[derive(Serialize)]
#[serde(transparent)]
pub struct PlanView {
    pub plan: Plan,
    #[serde(skip)]
    pub verb: &'static str,
}

impl View for PlanView {
    fn render(&self) -> String {
        prov::render_plan(&self.plan, self.verb)
    }
}

/// An apply's report, rendered with the image as the user named it.
#[derive(Serialize)]
#[serde(transparent)]
pub struct Applied {
    pub report: ApplyReport,
    #[serde(skip)]
    pub image_arg: String,
}

impl View for Applied {
    fn render(&self) -> String {
        prov::render_apply(&self.report, &self.image_arg)
    }
}

impl View for Verification {
    fn render(&self) -> String {
        prov::render_verification(self)
    }
}

/// `kiln provision status`.
#[derive(Serialize)]
#[serde(transparent)]
pub struct Status(pub Software);

impl View for Status {
    fn render(&self) -> String {
        prov::render_software(&self.0)
    }
}

/// `kiln provision lint`.
#[derive(Serialize)]
pub struct Lint {
    pub images: Vec<PathBuf>,
    pub findings: Vec<kiln_provision::spec::SpecError>,
}

impl View for Lint {
    fn render(&self) -> String {
        let mut text: String = self.findings.iter().map(|f| format!("{f}\n")).collect();
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        text += &format!(
            "{} image{} linted, {} finding{}",
            self.images.len(),
            plural(self.images.len()),
            self.findings.len(),
            plural(self.findings.len())
        );
        text
    }
}

/// `kiln provision log --apply ID`.
#[derive(Serialize)]
pub struct Journal {
    pub apply: ApplyRow,
    pub steps: Vec<StepRow>,
}

impl View for Journal {
    fn render(&self) -> String {
        let a = &self.apply;
        let mut text = format!(
            "apply {} of {} {} to {}{} — {} (started {}, finished {}, resumed {} time{})\n",
            a.id,
            a.image,
            a.image_version,
            a.root,
            a.hostname.as_deref().map(|h| format!(" on {h}")).unwrap_or_default(),
            a.status,
            a.started_at,
            a.finished_at.as_deref().unwrap_or("-"),
            a.resumes,
            if a.resumes == 1 { "" } else { "s" }
        );
        for s in &self.steps {
            text += &format!(
                "{:>3}  {:<11}  {:>8}  exit {:<4}  {}\n",
                s.seq,
                s.status,
                s.duration_ms.map_or("-".into(), |d| format!("{:.1} s", d as f64 / 1000.0)),
                s.exit_code.map_or("-".into(), |c| c.to_string()),
                s.summary
            );
            if s.status == StepStatus::Failed {
                let tail = s.output_tail.as_deref().unwrap_or("");
                let lines: Vec<&str> = tail.lines().rev().take(10).collect();
                for line in lines.into_iter().rev() {
                    text += &format!("       | {line}\n");
                }
            }
        }
        text
    }
}

/// `kiln provision log`.
#[derive(Serialize)]
pub struct Applies {
    pub applies: Vec<ApplyRow>,
    /// Where they were read: a database file, or "the fleet" (which adds each apply's host).
    #[serde(skip)]
    pub source: String,
    #[serde(skip)]
    pub fleet: bool,
}

impl View for Applies {
    fn render(&self) -> String {
        if self.applies.is_empty() {
            return format!("no applies journaled in {}", self.source);
        }
        let host = |a: &ApplyRow| {
            if self.fleet {
                format!("{:<20}  ", a.hostname.as_deref().unwrap_or("?"))
            } else {
                String::new()
            }
        };
        let head = if self.fleet { format!("{:<20}  ", "HOST") } else { String::new() };
        let mut text = format!("{:<8}  {head}{:<24}  {:<11}  {:<24}  ROOT\n", "APPLY", "STARTED", "STATUS", "IMAGE");
        for a in &self.applies {
            let image = format!("{} {}", a.image, a.image_version);
            text += &format!(
                "{:<8}  {}{:<24}  {:<11}  {:<24}  {}\n",
                &a.id[..8.min(a.id.len())],
                host(a),
                a.started_at,
                a.status,
                image,
                a.root
            );
        }
        text
    }
}

pub fn run(what: Provision, ctx: &Ctx) -> Result<Output> {
    match what {
        Provision::Plan { image, target } => {
            let image = prov::load(&image, target.images.as_deref())?;
            let (plan, _, _) = prov::make_plan(&image, &target.root, &mut System)?;
            ctx.output(&PlanView { plan, verb: "to apply" })
        }
        Provision::Apply { image, target, resume, verbose } => apply(&image, &target, resume, verbose, ctx),
        Provision::Verify { image, target } => {
            let image = prov::load(&image, target.images.as_deref())?;
            let v = prov::verify(&image, &target.root)?;
            Ok(ctx.output(&v)?.with_exit(Exit::check(!v.clean())))
        }
        Provision::Status { target } => {
            let t = kiln_provision::plan::Target::new(&target.root);
            ctx.output(&Status(kiln_provision::software::read(&t)?))
        }
        Provision::Lint { specs, target } => lint(&specs, &target, ctx),
        Provision::Log { image, apply, limit, target: _ } => match apply {
            Some(id) => {
                let (apply, steps) = ctx.with_store(async |store| store.apply_journal(&id).await)?;
                ctx.output(&Journal { apply, steps })
            }
            None => {
                let applies = ctx.with_store(async |store| store.applies(image.as_deref(), limit).await)?;
                ctx.output(&Applies { applies, source: ctx.db_path()?.display().to_string(), fleet: false })
            }
        },
    }
}

fn apply(image_arg: &str, target: &ProvisionTarget, resume: bool, verbose: bool, ctx: &Ctx) -> Result<Output> {
    let image = prov::load(image_arg, target.images.as_deref())?;
    if target.dry_run {
        let (plan, _, _) = prov::make_plan(&image, &target.root, &mut System)?;
        return ctx.output(&PlanView { plan, verb: "would run (dry run: nothing changed)" });
    }
    let _lock = prov::prepare_apply(&target.root)?;
    catch_interrupts();
    let opts = prov::ApplyOptions { image_arg, resume, json: ctx.json, verbose };
    let report =
        ctx.with_store_sync(|rt, store| prov::apply_image(&image, &target.root, &opts, &INTERRUPTED, rt, store))?;
    let status = report.status;
    let out = ctx.output(&Applied { report, image_arg: image_arg.to_string() })?;
    Ok(match status {
        ApplyResult::Succeeded | ApplyResult::Unchanged => out,
        // A failed or interrupted apply is an error (exit 2); its story goes to stderr.
        ApplyResult::Failed | ApplyResult::Interrupted if ctx.json => out.with_exit(Exit::Error),
        ApplyResult::Failed => out.on_stderr().with_exit(Exit::Error),
        ApplyResult::Interrupted => out.with_exit(Exit::Error),
    })
}

fn lint(specs: &[String], target: &ProvisionTarget, ctx: &Ctx) -> Result<Output> {
    let images: Vec<PathBuf> = if specs.is_empty() {
        let dirs = prov::image_dirs(target.images.as_deref());
        let found = dirs.iter().map(|d| prov::list_images(d)).find(|l| !l.is_empty()).unwrap_or_default();
        if found.is_empty() {
            let where_ = dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ");
            anyhow::bail!("no image specs found in {where_}");
        }
        found
    } else {
        specs.iter().map(|i| prov::find_image(i, target.images.as_deref())).collect::<Result<_>>()?
    };
    let mut findings = Vec::new();
    for p in &images {
        match kiln_provision::spec::load(p) {
            Ok(image) => findings.extend(kiln_provision::lint::lint(&image)),
            Err(e) => findings.extend(e.0),
        }
    }
    let failed = !findings.is_empty();
    Ok(ctx.output(&Lint { images, findings })?.with_exit(Exit::check(failed)))
}
