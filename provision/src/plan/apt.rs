//! apt: the dpkg skeleton of an empty root, sources with their pinned keys, pins, `apt-get update`,
//! `apt-get install` and holds.

use super::state::KeyFile;
use super::{
    apt_root_options, glob_match, is_glob, pinned_fingerprint, preferences_path, source_header, sources_path,
    PlanError, Planner,
};
use crate::exec::{signed_by_field, Action, Cmd};

pub(super) fn plan(p: &mut Planner) -> Result<(), PlanError> {
    skeleton(p);
    let sources_changed = sources(p)?;
    let kernel = p.facts.kernel_release.clone().unwrap_or_default();
    let packages: Vec<(String, String)> = p
        .image
        .spec
        .apt
        .packages
        .iter()
        .map(|(k, v)| (k.get_ref().replace("${kernel_release}", &kernel), v.get_ref().clone()))
        .collect();
    let pins: String = packages
        .iter()
        .filter(|(_, v)| v != "*")
        .map(|(n, v)| format!("Package: {n}\nPin: version {v}\nPin-Priority: 1001\n"))
        .collect::<Vec<_>>()
        .join("\n");
    let pins_changed = !pins.is_empty() && p.managed_file(&preferences_path(p.name()), pins, "apt pins");
    let install = install(p, &packages, sources_changed, pins_changed);
    hold(p, &kernel, &install);
    Ok(())
}

/// An empty root being built: give apt and dpkg the skeleton they expect.
fn skeleton(p: &mut Planner) {
    if p.image.spec.apt.packages.is_empty() || p.target.live() || p.state.dpkg_db {
        return;
    }
    let target = p.target;
    let mut actions =
        vec![Action::Write { path: target.path("/var/lib/dpkg/status"), content: vec![], mode: 0o644, owner: None }];
    for f in [
        "/var/lib/dpkg/available",
        "/var/lib/dpkg/info/.kiln",
        "/var/lib/dpkg/updates/.kiln",
        "/var/lib/apt/lists/partial/.kiln",
        "/var/cache/apt/archives/partial/.kiln",
        "/var/log/apt/.kiln",
        "/etc/apt/apt.conf.d/.kiln",
        "/etc/apt/preferences.d/.kiln",
        "/etc/apt/sources.list.d/.kiln",
    ] {
        actions.push(Action::Write { path: target.path(f), content: vec![], mode: 0o644, owner: None });
    }
    p.step(
        "apt:skeleton",
        format!("create the dpkg database and apt directories in {}", target.root.display()),
        "the target root has no dpkg database",
        actions,
    );
}

/// Each repository's source; returns whether any changes. The key travels inline in the source's
/// Signed-By (no keyring file to place or to resolve against the wrong root); a source matches
/// when its header is ours and its key is the pinned one.
fn sources(p: &mut Planner) -> Result<bool, PlanError> {
    let (image, state) = (p.image, p.state);
    let src = image.source();
    let mut changed = false;
    for r in &image.spec.apt.repositories {
        let repo = r.get_ref();
        let rname = repo.name.get_ref();
        let abs = sources_path(rname);
        let header = source_header(repo);
        let Some(k) = &repo.key else {
            changed |= p.managed_file(&abs, header + "Trusted: yes\n", &format!("apt source {rname}, trusted"));
            continue;
        };
        let key = k.get_ref();
        let fingerprint = pinned_fingerprint(key);
        let why = match state.files.get(&abs).and_then(|f| f.content.as_deref()) {
            None => format!("{abs} does not exist"),
            Some(text) if !text.starts_with(header.as_bytes()) => format!("{abs} points elsewhere"),
            Some(_) if state.sources_pinned.get(rname) == Some(&true) => {
                p.satisfied += 1;
                continue;
            }
            Some(_) => format!("{abs} does not pin key {fingerprint}"),
        };
        changed = true;
        let path = p.target.path(&abs);
        if let Some(file) = &key.file {
            let from = image.resolve(file.get_ref());
            let armored = match state.key_files.get(rname) {
                Some(KeyFile::Armored(armored)) => armored,
                Some(KeyFile::Unreadable(why)) => return Err(PlanError::State(why.clone())),
                None | Some(KeyFile::Missing) => {
                    let why = format!("key file {} does not exist", from.display());
                    return Err(PlanError::Spec(src.error(file, why)));
                }
                Some(KeyFile::Others(found)) => {
                    let holds = if found.is_empty() { "no OpenPGP key".to_string() } else { found.join(", ") };
                    let why = format!("key file {} holds {holds}, not the pinned {fingerprint}", from.display());
                    return Err(PlanError::Spec(src.error(&key.fingerprint, why)));
                }
            };
            let content = format!("{header}{}", signed_by_field(armored)).into_bytes();
            p.step(
                format!("apt-source:{rname}"),
                format!("write {abs} (apt source {rname}, key {fingerprint})"),
                why,
                vec![Action::Write { path, content, mode: 0o644, owner: None }],
            );
        } else if let Some(url) = &key.url {
            p.step(
                format!("apt-source:{rname}"),
                format!("fetch the key of {rname} and write {abs}"),
                why,
                vec![Action::FetchKey { url: url.get_ref().clone(), fingerprint, sources: path, header }],
            );
        }
    }
    Ok(changed)
}

/// `apt-get update` (when sources or pins changed, or before an install) and `apt-get install` of
/// what is missing or at another version; returns the install arguments.
fn install(p: &mut Planner, packages: &[(String, String)], sources_changed: bool, pins_changed: bool) -> Vec<String> {
    let mut install = Vec::new();
    let mut reasons = Vec::new();
    for (pkg, want) in packages {
        match p.state.installed.get(pkg) {
            Some(have) if glob_match(want, &have.version) => p.satisfied += 1,
            have => {
                reasons.push(match have {
                    Some(have) => format!("{pkg} is {} (want {want})", have.version),
                    None => format!("{pkg} is not installed"),
                });
                install.push(if is_glob(want) { pkg.clone() } else { format!("{pkg}={want}") });
            }
        }
    }
    let apt = || {
        let mut argv = vec!["apt-get".to_string()];
        argv.extend(apt_root_options(p.target));
        argv
    };
    if sources_changed || pins_changed || !install.is_empty() {
        let mut argv = apt();
        // Without --error-on=any, apt-get update exits 0 when a repository's signature fails and
        // quietly keeps the old index: the install would then see stale versions.
        argv.extend(["-q".into(), "update".into(), "--error-on=any".into()]);
        let why = if sources_changed { "apt sources changed" } else { "refresh the package lists before installing" };
        p.step(
            "apt:update",
            "apt-get update",
            why,
            vec![Action::Run(Cmd { argv, env: vec![], cwd: None, stdin: None })],
        );
    }
    if !install.is_empty() {
        let mut argv = apt();
        argv.extend(
            [
                "-q",
                "-y",
                "--no-install-recommends",
                "--allow-downgrades",
                "--allow-change-held-packages",
                "install",
                "--",
            ]
            .map(String::from),
        );
        argv.extend(install.iter().cloned());
        let cmd = Cmd::new(argv).env("DEBIAN_FRONTEND", "noninteractive");
        p.step("apt:install", format!("install {}", install.join(" ")), reasons.join("; "), vec![Action::Run(cmd)]);
    }
    install
}

/// Holds, set with `dpkg --set-selections`; apt-get releases the hold of a package it installs or
/// changes, so a package this plan installs is held again.
fn hold(p: &mut Planner, kernel: &str, install: &[String]) {
    let mut hold = String::new();
    let mut why = Vec::new();
    for h in &p.image.spec.apt.hold {
        let pkg = h.get_ref().replace("${kernel_release}", kernel);
        let reinstalled = install.iter().any(|i| i.split('=').next() == Some(pkg.as_str()));
        if p.state.installed.get(&pkg).is_some_and(|p| p.hold) && !reinstalled {
            p.satisfied += 1;
        } else {
            hold.push_str(&format!("{pkg} hold\n"));
            why.push(if reinstalled {
                format!("{pkg} is installed by this plan, which releases its hold")
            } else {
                format!("{pkg} is not held")
            });
        }
    }
    if hold.is_empty() {
        return;
    }
    let mut argv = vec!["dpkg".to_string()];
    if !p.target.live() {
        argv.push(format!("--root={}", p.target.root_str()));
    }
    argv.push("--set-selections".into());
    let held: Vec<&str> = hold.lines().filter_map(|l| l.split_whitespace().next()).collect();
    p.step(
        "apt:hold",
        format!("hold {}", held.join(" ")),
        why.join("; "),
        vec![Action::Run(Cmd::new(argv).stdin(hold.clone()))],
    );
}
