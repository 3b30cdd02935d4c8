//! `kiln provision …`: plan, apply, verify, status, lint and the journal.

use std::path::PathBuf;

use anyhow::Result;

use kiln_provision::exec::System;
use kiln_provision::plan::Plan;
use kiln_provision::software::Software;
use serde::Serialize;

use super::args::{Provision, ProvisionTarget};
use super::{catch_interrupts, Ctx, Exit, Output, View, INTERRUPTED};
use kiln_app::provisioning::{self as prov, ApplyReport, ApplyResult};
use kiln_db::Queries;

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
    pub findings: Vec<kiln_provision::image::SpecError>,
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
                ctx.output(&kiln_app::views::Journal { apply, steps })
            }
            None => {
                let applies = ctx.with_store(async |store| store.applies(image.as_deref(), limit).await)?;
                ctx.output(&kiln_app::views::Applies {
                    applies,
                    source: ctx.db_path()?.display().to_string(),
                    fleet: false,
                })
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
        match kiln_provision::image::load(p) {
            Ok(image) => findings.extend(kiln_provision::lint::lint(&image)),
            Err(e) => findings.extend(e.0),
        }
    }
    let failed = !findings.is_empty();
    Ok(ctx.output(&Lint { images, findings })?.with_exit(Exit::check(failed)))
}
