//! From an image and a machine's state to the ordered steps that would make the machine match.
//!
//! The state is read in batches: the dpkg status database in one read (what `dpkg-query -W` reads),
//! each venv's installed distributions from its `*.dist-info` directories in one directory listing
//! (what `pip freeze` reads, without starting Python), `/proc/modules`, `/proc/sys`, the files, and
//! systemd in one `systemctl is-enabled` and one `systemctl is-active` for all units. Only `unless`
//! guards run one program each.
//!
//! Order: apt keys and sources, apt pins, `apt-get update`, `apt-get install`, holds, files, kernel
//! modules, sysctl, venvs, services, then commands in the spec's order. A plan lists only what would
//! change, and why; an empty plan means the machine already matches.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::dpkg;
use crate::exec::{armored_key, key_fingerprints, signed_by_field, Action, Cmd, Executor};
use crate::spec::{normalize_dist, sha256_hex, split_requirement, Image, SpecError};

/// The machine, or root, that a plan targets.
#[derive(Debug, Clone)]
pub struct Target {
    /// `/` for this machine; another directory for a chroot or an image being built.
    pub root: PathBuf,
}

impl Target {
    /// The root as an absolute path (apt, dpkg and commands run with other working directories).
    pub fn new(root: &Path) -> Target {
        Target { root: std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf()) }
    }
    /// Is this the running system (programs run here, modules load here, sysctls apply here)?
    pub fn live(&self) -> bool {
        self.root == Path::new("/")
    }
    /// An absolute path of the target, as seen from here.
    pub fn path(&self, abs: &str) -> PathBuf {
        self.root.join(abs.trim_start_matches('/'))
    }
    fn root_str(&self) -> String {
        self.root.display().to_string()
    }
}

/// Facts that decide whether an image applies and fill its variables.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Facts {
    pub os_id: Option<String>,
    pub os_version: Option<String>,
    pub arch: String,
    pub kernel_release: Option<String>,
    pub nvidia_gpu: bool,
    pub systemd_running: bool,
    /// The time of the plan (RFC 3339), recorded in the image's marker when applied.
    pub now: String,
    /// Whether the target is this running machine.
    pub live: bool,
}

impl Facts {
    pub fn read(target: &Target, now: String) -> Facts {
        let os = std::fs::read_to_string(target.path("/etc/os-release"))
            .or_else(|_| std::fs::read_to_string(target.path("/usr/lib/os-release")))
            .unwrap_or_default();
        let field = |k: &str| {
            os.lines().find_map(|l| l.strip_prefix(&format!("{k}="))).map(|v| v.trim().trim_matches('"').to_string())
        };
        // The kernel the target boots: the running one for this machine; for another root, its only
        // installed kernel, else the running one.
        let running = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string());
        let kernel_release = if target.live() {
            running
        } else {
            let mut kernels: Vec<String> = std::fs::read_dir(target.path("/lib/modules"))
                .map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
                .unwrap_or_default();
            kernels.sort();
            if kernels.len() == 1 {
                kernels.pop()
            } else {
                running
            }
        };
        Facts {
            os_id: field("ID"),
            os_version: field("VERSION_ID"),
            arch: std::env::consts::ARCH.to_string(),
            kernel_release,
            nvidia_gpu: nvidia_gpu_present(Path::new("/sys/bus/pci/devices")),
            systemd_running: target.live() && Path::new("/run/systemd/system").is_dir(),
            now,
            live: target.live(),
        }
    }

    /// Why the image does not apply here, if it does not.
    pub fn mismatch(&self, image: &Image) -> Option<String> {
        let m = image.spec.matches.as_ref()?;
        let here =
            format!("{} {}", self.os_id.as_deref().unwrap_or("unknown"), self.os_version.as_deref().unwrap_or(""));
        if !m.os.is_empty()
            && !m.os.iter().any(|o| {
                let mut parts = o.get_ref().split_whitespace();
                let id = parts.next();
                let version = parts.next();
                id == self.os_id.as_deref() && (version.is_none() || version == self.os_version.as_deref())
            })
        {
            let wanted: Vec<&str> = m.os.iter().map(|o| o.get_ref().as_str()).collect();
            return Some(format!("it is for {}; this is {}", wanted.join(" or "), here.trim()));
        }
        if !m.arch.is_empty() && !m.arch.iter().any(|a| a.get_ref() == &self.arch) {
            let wanted: Vec<&str> = m.arch.iter().map(|a| a.get_ref().as_str()).collect();
            return Some(format!("it is for {}; this machine is {}", wanted.join(" or "), self.arch));
        }
        // Another root (an image being built) boots on a machine we cannot see: its GPUs are unknown.
        if !self.live {
            return None;
        }
        match m.gpu.as_ref().map(|g| g.get_ref().as_str()) {
            Some("nvidia") if !self.nvidia_gpu => Some("it needs an NVIDIA GPU; none is on the PCI bus".to_string()),
            Some("none") if self.nvidia_gpu => {
                Some("it is for machines without an NVIDIA GPU; this one has one".to_string())
            }
            _ => None,
        }
    }

    pub fn deb_arch(&self) -> &str {
        match self.arch.as_str() {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "powerpc64" => "ppc64el",
            other => other,
        }
    }
}

/// Does the `Signed-By` field at the start of `rest` (a deb822 source after its header) hold the key
/// `fingerprint`?
fn signed_by_holds(exec: &mut dyn Executor, rest: &str, fingerprint: &str) -> bool {
    let mut lines = rest.lines();
    if lines.next().map(str::trim_end) != Some("Signed-By:") {
        return false;
    }
    let mut key = String::new();
    for line in lines.take_while(|l| l.starts_with(' ')) {
        let l = &line[1..];
        key.push_str(if l == "." { "" } else { l });
        key.push('\n');
    }
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = std::env::temp_dir().join(format!("kiln-signed-by-{}-{n}.asc", std::process::id()));
    if std::fs::write(&tmp, key).is_err() {
        return false;
    }
    let found = key_fingerprints(exec, &tmp).unwrap_or_default();
    let _ = std::fs::remove_file(&tmp);
    found.len() == 1 && found[0] == fingerprint
}

/// An NVIDIA display or 3D controller on the PCI bus.
pub fn nvidia_gpu_present(devices: &Path) -> bool {
    let Ok(dir) = std::fs::read_dir(devices) else { return false };
    dir.flatten().any(|d| {
        let read = |f: &str| std::fs::read_to_string(d.path().join(f)).unwrap_or_default();
        read("vendor").trim() == "0x10de" && read("class").trim().starts_with("0x03")
    })
}

/// One step of a plan: what it changes, why, and the actions that do it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Step {
    /// Stable identity across plans: `apt:install`, `file:/etc/x`, `command:name`.
    pub key: String,
    pub summary: String,
    pub why: String,
    pub actions: Vec<Action>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Plan {
    pub image: String,
    pub image_version: String,
    pub image_hash: String,
    pub root: PathBuf,
    pub steps: Vec<Step>,
    /// Things the plan cannot do or check here (a live-only action on another root, systemd not
    /// running, a module whose options changed while loaded).
    pub notes: Vec<String>,
    /// How many declared items already match.
    pub satisfied: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{0}")]
    Spec(SpecError),
    #[error("{image} does not apply to {target}: {why}")]
    Mismatch { image: String, target: String, why: String },
    #[error("{0}")]
    State(String),
}

/// `*` and `?` globs, as apt pins them.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    fn go(p: &[u8], t: &[u8]) -> bool {
        match (p.first(), t.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], t) || (!t.is_empty() && go(p, &t[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &t[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &t[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), text.as_bytes())
}

fn is_glob(v: &str) -> bool {
    v.contains('*') || v.contains('?')
}

/// Installed distributions of a venv: normalised name → version, from `site-packages/*.dist-info`.
pub fn venv_distributions(venv: &Path) -> Option<BTreeMap<String, String>> {
    if !venv.join("pyvenv.cfg").is_file() {
        return None;
    }
    let mut out = BTreeMap::new();
    for lib in ["lib", "lib64"] {
        let Ok(pythons) = std::fs::read_dir(venv.join(lib)) else { continue };
        for py in pythons.flatten() {
            let Ok(entries) = std::fs::read_dir(py.path().join("site-packages")) else { continue };
            for e in entries.flatten() {
                let name = e.file_name();
                let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".dist-info")) else { continue };
                // `name-version`: the name's own dashes are escaped to underscores.
                if let Some((dist, version)) = stem.split_once('-') {
                    out.insert(normalize_dist(dist), version.to_string());
                }
            }
        }
    }
    Some(out)
}

/// A user or group name (or number) as the target's passwd/group files know it.
fn lookup_id(target: &Target, file: &str, name: &str) -> Option<u32> {
    if let Ok(n) = name.parse() {
        return Some(n);
    }
    let text = std::fs::read_to_string(target.path(file)).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next() == Some(name)).then(|| f.nth(1).and_then(|id| id.parse().ok())).flatten()
    })
}

/// The options apt-get and dpkg need to work on another root.
pub fn apt_root_options(target: &Target) -> Vec<String> {
    if target.live() {
        return vec![];
    }
    let r = target.root_str();
    vec![
        "-o".into(),
        format!("Dir={r}"),
        "-o".into(),
        format!("Dir::State::status={r}/var/lib/dpkg/status"),
        "-o".into(),
        format!("DPkg::Options::=--root={r}"),
        "-o".into(),
        "DPkg::Options::=--force-script-chrootless".into(),
    ]
}

/// Files kiln owns on the target, named after the image.
pub fn sources_path(repo: &str) -> String {
    format!("/etc/apt/sources.list.d/kiln-{repo}.sources")
}
pub fn preferences_path(image: &str) -> String {
    format!("/etc/apt/preferences.d/kiln-{image}.pref")
}
pub fn modules_load_path(image: &str) -> String {
    format!("/etc/modules-load.d/kiln-{image}.conf")
}
pub fn modprobe_path(image: &str) -> String {
    format!("/etc/modprobe.d/kiln-{image}.conf")
}
pub fn sysctl_path(image: &str) -> String {
    format!("/etc/sysctl.d/90-kiln-{image}.conf")
}
/// What the last successful apply of an image left on the target: its name, version and hash.
pub const MARKER_DIR: &str = "/var/lib/kiln/images";

struct Planner<'a> {
    target: &'a Target,
    exec: &'a mut dyn Executor,
    steps: Vec<Step>,
    notes: Vec<String>,
    satisfied: usize,
}

impl Planner<'_> {
    fn step(
        &mut self,
        key: impl Into<String>,
        summary: impl Into<String>,
        why: impl Into<String>,
        actions: Vec<Action>,
    ) {
        self.steps.push(Step { key: key.into(), summary: summary.into(), why: why.into(), actions });
    }

    /// A file kiln generates in full: a step when its content differs.
    fn managed_file(&mut self, abs: &str, content: String, what: &str) {
        let path = self.target.path(abs);
        match std::fs::read(&path) {
            Ok(old) if old == content.as_bytes() => self.satisfied += 1,
            old => {
                let why = if old.is_ok() {
                    format!("{abs} differs from what the image declares")
                } else {
                    format!("{abs} does not exist")
                };
                self.step(
                    format!("file:{abs}"),
                    format!("write {abs} ({what})"),
                    why,
                    vec![Action::Write { path, content: content.into_bytes(), mode: 0o644, owner: None }],
                );
            }
        }
    }
}

/// Plans `image` against `target`. Probes (guards, systemd) go through `exec`.
pub fn plan(image: &Image, target: &Target, facts: &Facts, exec: &mut dyn Executor) -> Result<Plan, PlanError> {
    if let Some(why) = facts.mismatch(image) {
        let target = if target.live() { "this machine".to_string() } else { target.root.display().to_string() };
        return Err(PlanError::Mismatch { image: image.name().to_string(), target, why });
    }
    let mut p = Planner { target, exec, steps: vec![], notes: vec![], satisfied: 0 };
    let name = image.name().to_string();
    let spec = &image.spec;
    let src = image.source();

    // --- apt -------------------------------------------------------------------------------
    let installed = dpkg::installed(&target.root).map_err(|e| PlanError::State(e.to_string()))?;
    let kernel = facts.kernel_release.clone().unwrap_or_default();
    let mut sources_changed = false;
    let dpkg_db = target.path("/var/lib/dpkg/status");
    if !spec.apt.packages.is_empty() && !target.live() && !dpkg_db.exists() {
        // An empty root being built: give apt and dpkg the skeleton they expect.
        let mut actions = vec![Action::Write { path: dpkg_db.clone(), content: vec![], mode: 0o644, owner: None }];
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
    for r in &spec.apt.repositories {
        let repo = r.get_ref();
        let rname = repo.name.get_ref();
        let abs = sources_path(rname);
        let mut header = format!("Types: deb\nURIs: {}\nSuites: {}\n", repo.uri.get_ref(), repo.suite);
        if !repo.components.is_empty() {
            header += &format!("Components: {}\n", repo.components.join(" "));
        }
        let Some(k) = &repo.key else {
            let before = p.steps.len();
            p.managed_file(&abs, header + "Trusted: yes\n", &format!("apt source {rname}, trusted"));
            sources_changed |= p.steps.len() > before;
            continue;
        };
        // The key travels inline in the source's Signed-By (no keyring file to place or to resolve
        // against the wrong root); the source matches when its header is ours and its key is the pinned one.
        let key = k.get_ref();
        let fingerprint = key.fingerprint.get_ref().replace(' ', "").to_ascii_uppercase();
        let path = target.path(&abs);
        let why = match std::fs::read_to_string(&path) {
            Err(_) => format!("{abs} does not exist"),
            Ok(text) if !text.starts_with(&header) => format!("{abs} points elsewhere"),
            Ok(text) => {
                if signed_by_holds(p.exec, &text[header.len()..], &fingerprint) {
                    p.satisfied += 1;
                    continue;
                }
                format!("{abs} does not pin key {fingerprint}")
            }
        };
        sources_changed = true;
        if let Some(file) = &key.file {
            let from = image.resolve(file.get_ref());
            if !from.is_file() {
                return Err(PlanError::Spec(src.error(file, format!("key file {} does not exist", from.display()))));
            }
            let armored = armored_key(p.exec, &from, &fingerprint)
                .map_err(|e| PlanError::State(format!("cannot run gpg to read {}: {e}", from.display())))?;
            let Some(armored) = armored else {
                let found = key_fingerprints(p.exec, &from).unwrap_or_default();
                return Err(PlanError::Spec(src.error(
                    &key.fingerprint,
                    format!(
                        "key file {} holds {}, not the pinned {fingerprint}",
                        from.display(),
                        if found.is_empty() { "no OpenPGP key".to_string() } else { found.join(", ") }
                    ),
                )));
            };
            p.step(
                format!("apt-source:{rname}"),
                format!("write {abs} (apt source {rname}, key {fingerprint})"),
                why,
                vec![Action::Write {
                    path,
                    content: format!("{header}{}", signed_by_field(&armored)).into_bytes(),
                    mode: 0o644,
                    owner: None,
                }],
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

    let packages: Vec<(String, String)> = spec
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
    let pins_before = p.steps.len();
    if !pins.is_empty() {
        p.managed_file(&preferences_path(&name), pins, "apt pins");
    }
    let pins_changed = p.steps.len() > pins_before;

    let mut install = Vec::new();
    let mut reasons = Vec::new();
    for (pkg, want) in &packages {
        match installed.get(pkg) {
            Some(have) if glob_match(want, &have.version) => p.satisfied += 1,
            Some(have) => {
                reasons.push(format!("{pkg} is {} (want {want})", have.version));
                install.push(if is_glob(want) { pkg.clone() } else { format!("{pkg}={want}") });
            }
            None => {
                reasons.push(format!("{pkg} is not installed"));
                install.push(if is_glob(want) { pkg.clone() } else { format!("{pkg}={want}") });
            }
        }
    }
    let apt_opts = apt_root_options(target);
    if sources_changed || pins_changed || !install.is_empty() {
        let mut argv = vec!["apt-get".to_string()];
        argv.extend(apt_opts.iter().cloned());
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
        let mut argv = vec!["apt-get".to_string()];
        argv.extend(apt_opts.iter().cloned());
        argv.extend(
            ["-q", "-y", "--no-install-recommends", "--allow-downgrades", "--allow-change-held-packages", "install"]
                .map(String::from),
        );
        argv.extend(install.iter().cloned());
        let cmd = Cmd::new(argv).env("DEBIAN_FRONTEND", "noninteractive");
        p.step("apt:install", format!("install {}", install.join(" ")), reasons.join("; "), vec![Action::Run(cmd)]);
    }
    let mut hold = String::new();
    let mut hold_why = Vec::new();
    for h in &spec.apt.hold {
        let pkg = h.get_ref().replace("${kernel_release}", &kernel);
        let reinstalled = install.iter().any(|i| i.split('=').next() == Some(pkg.as_str()));
        if installed.get(&pkg).is_some_and(|p| p.hold) && !reinstalled {
            p.satisfied += 1;
        } else {
            hold.push_str(&format!("{pkg} hold\n"));
            // apt-get releases the hold of a package it installs or changes.
            hold_why.push(if reinstalled {
                format!("{pkg} is installed by this plan, which releases its hold")
            } else {
                format!("{pkg} is not held")
            });
        }
    }
    if !hold.is_empty() {
        let mut argv = vec!["dpkg".to_string()];
        if !target.live() {
            argv.push(format!("--root={}", target.root_str()));
        }
        argv.push("--set-selections".into());
        let held: Vec<&str> = hold.lines().filter_map(|l| l.split_whitespace().next()).collect();
        p.step(
            "apt:hold",
            format!("hold {}", held.join(" ")),
            hold_why.join("; "),
            vec![Action::Run(Cmd::new(argv).stdin(hold.clone()))],
        );
    }

    // --- files -----------------------------------------------------------------------------
    for f in &spec.files {
        let file = f.get_ref();
        let abs = file.path.get_ref();
        let path = target.path(abs);
        let content = match (&file.content, &file.source) {
            (Some(c), _) => c.clone().into_bytes(),
            (None, Some(s)) => std::fs::read(image.resolve(s.get_ref())).map_err(|e| {
                PlanError::Spec(
                    src.error(s, format!("cannot read source {}: {e}", image.resolve(s.get_ref()).display())),
                )
            })?,
            (None, None) => unreachable!("validated"),
        };
        let mode = file.mode.as_ref().and_then(|m| crate::spec::parse_mode(m.get_ref()));
        let uid = match &file.owner {
            Some(o) => Some(lookup_id(target, "/etc/passwd", o.get_ref()).ok_or_else(|| {
                PlanError::Spec(
                    src.error(o, format!("no user {:?} in {}", o.get_ref(), target.path("/etc/passwd").display())),
                )
            })?),
            None => None,
        };
        let gid = match &file.group {
            Some(g) => Some(lookup_id(target, "/etc/group", g.get_ref()).ok_or_else(|| {
                PlanError::Spec(
                    src.error(g, format!("no group {:?} in {}", g.get_ref(), target.path("/etc/group").display())),
                )
            })?),
            None => None,
        };
        let meta = std::fs::metadata(&path).ok();
        let owner = (uid.is_some() || gid.is_some()).then(|| {
            (
                uid.unwrap_or_else(|| meta.as_ref().map_or(0, |m| m.uid())),
                gid.unwrap_or_else(|| meta.as_ref().map_or(0, |m| m.gid())),
            )
        });
        let old = std::fs::read(&path).ok();
        match (&meta, old) {
            (Some(_), Some(old)) if old == content => {
                let m = meta.unwrap();
                let mut diffs = Vec::new();
                if let Some(want) = mode.filter(|w| *w != m.permissions().mode() & 0o7777) {
                    diffs.push(format!("mode is {:04o}, want {want:04o}", m.permissions().mode() & 0o7777));
                }
                if let Some((u, g)) = owner.filter(|(u, g)| (*u, *g) != (m.uid(), m.gid())) {
                    diffs.push(format!("owner is {}:{}, want {u}:{g}", m.uid(), m.gid()));
                }
                if diffs.is_empty() {
                    p.satisfied += 1;
                } else {
                    p.step(
                        format!("file:{abs}"),
                        format!("set the attributes of {abs}"),
                        diffs.join("; "),
                        vec![Action::Attributes {
                            path,
                            mode: diffs.iter().any(|d| d.starts_with("mode")).then_some(mode).flatten(),
                            owner: diffs.iter().any(|d| d.starts_with("owner")).then_some(owner).flatten(),
                        }],
                    );
                }
            }
            (m, old) => {
                let why = match old {
                    Some(old) => format!(
                        "content differs (sha256 {} on disk, {} declared)",
                        &sha256_hex(&old)[..12],
                        &sha256_hex(&content)[..12]
                    ),
                    None if m.is_some() => "it is not a readable file".to_string(),
                    None => "it does not exist".to_string(),
                };
                let mode = mode.unwrap_or_else(|| m.as_ref().map_or(0o644, |m| m.permissions().mode() & 0o7777));
                p.step(
                    format!("file:{abs}"),
                    format!("write {abs}"),
                    why,
                    vec![Action::Write { path, content, mode, owner }],
                );
            }
        }
    }

    // --- kernel modules ----------------------------------------------------------------------
    if !spec.modules.is_empty() {
        let names: Vec<&str> = spec.modules.iter().map(|m| m.get_ref().name.get_ref().as_str()).collect();
        p.managed_file(&modules_load_path(&name), names.join("\n") + "\n", "modules to load at boot");
        let options: Vec<String> = spec
            .modules
            .iter()
            .filter(|m| !m.get_ref().options.is_empty())
            .map(|m| {
                let opts: Vec<String> = m.get_ref().options.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("options {} {}", m.get_ref().name.get_ref(), opts.join(" "))
            })
            .collect();
        let options_before = p.steps.len();
        if !options.is_empty() {
            p.managed_file(&modprobe_path(&name), options.join("\n") + "\n", "module options");
        }
        let options_changed = p.steps.len() > options_before;
        if target.live() {
            let loaded: BTreeSet<String> = std::fs::read_to_string("/proc/modules")
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .collect();
            for m in &names {
                let key = m.replace('-', "_");
                if loaded.contains(&key) || Path::new("/sys/module").join(&key).is_dir() {
                    p.satisfied += 1;
                    if options_changed {
                        p.notes.push(format!(
                            "module {m} is loaded: its new options take effect when it is reloaded or at the next boot"
                        ));
                    }
                } else {
                    p.step(
                        format!("module:{m}"),
                        format!("load module {m}"),
                        format!("{m} is not loaded"),
                        vec![Action::Run(Cmd::new(["modprobe", m]))],
                    );
                }
            }
        } else {
            p.notes.push(format!("modules are persisted in {} only: they load when it boots", target.root.display()));
        }
    }

    // --- sysctl ----------------------------------------------------------------------------
    if !spec.sysctl.is_empty() {
        let lines: Vec<String> =
            spec.sysctl.iter().map(|(k, v)| format!("{} = {}", k.get_ref(), v.get_ref())).collect();
        p.managed_file(&sysctl_path(&name), lines.join("\n") + "\n", "sysctl settings");
        if target.live() {
            let mut set = Vec::new();
            let mut why = Vec::new();
            for (k, v) in &spec.sysctl {
                let key = k.get_ref();
                let want = v.get_ref().to_string();
                let file = Path::new("/proc/sys").join(key.replace('.', "/"));
                match std::fs::read_to_string(&file) {
                    Ok(have) if have.split_whitespace().eq(want.split_whitespace()) => p.satisfied += 1,
                    Ok(have) => {
                        why.push(format!(
                            "{key} is {}, want {want}",
                            have.split_whitespace().collect::<Vec<_>>().join(" ")
                        ));
                        set.push(format!("{key}={want}"));
                    }
                    Err(e) => {
                        return Err(PlanError::Spec(src.error(
                            k,
                            format!("cannot read {}: {e} (is {key} a sysctl of this kernel?)", file.display()),
                        )));
                    }
                }
            }
            if !set.is_empty() {
                let mut argv = vec!["sysctl".to_string(), "-w".into()];
                argv.extend(set.iter().cloned());
                p.step(
                    "sysctl:apply",
                    format!("set {}", set.join(" ")),
                    why.join("; "),
                    vec![Action::Run(Cmd::new(argv))],
                );
            }
        } else {
            p.notes.push(format!(
                "sysctl settings are persisted in {} only: they apply when it boots",
                target.root.display()
            ));
        }
    }

    // --- venvs -----------------------------------------------------------------------------
    for v in &spec.venvs {
        let venv = v.get_ref();
        let abs = venv.path.get_ref();
        let dir = target.path(abs);
        let have = venv_distributions(&dir);
        if have.is_none() {
            p.step(
                format!("venv:{abs}"),
                format!("create the virtualenv {abs}"),
                "it does not exist",
                vec![Action::Run(Cmd::new([
                    venv.python.clone(),
                    "-m".into(),
                    "venv".into(),
                    dir.display().to_string(),
                ]))],
            );
        }
        let have = have.unwrap_or_default();
        let mut missing = Vec::new();
        for req in &venv.packages {
            let (n, want) = split_requirement(req.get_ref()).expect("validated");
            match have.get(&normalize_dist(n)) {
                Some(v) if v.eq_ignore_ascii_case(want) => p.satisfied += 1,
                Some(v) => missing.push(format!("{n} is {v} (want {want})")),
                None => missing.push(format!("{n} is not installed")),
            }
        }
        if !missing.is_empty() {
            let mut requirements = String::new();
            for req in &venv.packages {
                let (n, _) = split_requirement(req.get_ref()).expect("validated");
                requirements.push_str(req.get_ref());
                if let Some((_, hashes)) = venv.hashes.iter().find(|(k, _)| normalize_dist(k) == normalize_dist(n)) {
                    for h in hashes {
                        requirements.push_str(&format!(" --hash={}", h.get_ref()));
                    }
                }
                requirements.push('\n');
            }
            let req_file = dir.join("kiln-requirements.txt");
            let mut argv: Vec<String> = vec![
                dir.join("bin/python").display().to_string(),
                "-m".into(),
                "pip".into(),
                "install".into(),
                "--disable-pip-version-check".into(),
                "--no-input".into(),
            ];
            if let Some(w) = &venv.wheels {
                argv.extend([
                    "--no-index".into(),
                    "--find-links".into(),
                    image.resolve(w.get_ref()).display().to_string(),
                ]);
            } else if let Some(u) = &venv.index_url {
                argv.extend(["--index-url".into(), u.clone()]);
            }
            if !venv.hashes.is_empty() {
                argv.push("--require-hashes".into());
            }
            argv.extend(["-r".into(), req_file.display().to_string()]);
            p.step(
                format!("pip:{abs}"),
                format!(
                    "install {} into {abs}",
                    venv.packages.iter().map(|p| p.get_ref().as_str()).collect::<Vec<_>>().join(" ")
                ),
                missing.join("; "),
                vec![
                    Action::Write { path: req_file, content: requirements.into_bytes(), mode: 0o644, owner: None },
                    Action::Run(Cmd::new(argv)),
                ],
            );
        }
    }

    // --- services --------------------------------------------------------------------------
    if !spec.services.is_empty() {
        let units: Vec<String> = spec.services.iter().map(|s| unit_name(s.get_ref().name.get_ref())).collect();
        let mut query = vec!["systemctl".to_string()];
        if !target.live() {
            query.push(format!("--root={}", target.root_str()));
        }
        query.push("is-enabled".into());
        query.extend(units.iter().cloned());
        let enabled = p.exec.probe(&Cmd::new(query.clone())).map(|o| o.stdout).unwrap_or_default();
        let enabled: Vec<&str> = enabled.lines().collect();
        let active: Vec<String> = if facts.systemd_running {
            let mut q = vec!["systemctl".to_string(), "is-active".into()];
            q.extend(units.iter().cloned());
            p.exec.probe(&Cmd::new(q)).map(|o| o.stdout.lines().map(str::to_string).collect()).unwrap_or_default()
        } else {
            vec![]
        };
        for (i, s) in spec.services.iter().enumerate() {
            let svc = s.get_ref();
            let unit = &units[i];
            let mut root_arg = vec![];
            if !target.live() {
                root_arg.push(format!("--root={}", target.root_str()));
            }
            // is-enabled prints one line per unit it knows; an unknown unit prints nothing there.
            let state = if enabled.len() == units.len() { enabled[i] } else { "unknown" };
            if svc.enabled {
                if matches!(state, "enabled" | "static" | "alias" | "indirect" | "generated") {
                    p.satisfied += 1;
                } else {
                    let mut argv = vec!["systemctl".to_string()];
                    argv.extend(root_arg.iter().cloned());
                    argv.extend(["enable".into(), unit.clone()]);
                    p.step(
                        format!("service:{unit}:enable"),
                        format!("enable {unit}"),
                        format!("{unit} is {state}"),
                        vec![Action::Run(Cmd::new(argv))],
                    );
                }
            }
            if svc.started {
                if !target.live() {
                    p.notes.push(format!("{unit} starts when {} boots", target.root.display()));
                } else if !facts.systemd_running {
                    p.notes.push(format!("systemd is not running here: cannot check or start {unit}"));
                } else if active.get(i).map(String::as_str) == Some("active") {
                    p.satisfied += 1;
                } else {
                    let state = active.get(i).cloned().unwrap_or_else(|| "unknown".into());
                    p.step(
                        format!("service:{unit}:start"),
                        format!("start {unit}"),
                        format!("{unit} is {state}"),
                        vec![Action::Run(Cmd::new(["systemctl", "start", unit]))],
                    );
                }
            }
        }
    }

    // --- commands --------------------------------------------------------------------------
    for c in &spec.commands {
        let cmd = c.get_ref();
        if let Some(creates) = &cmd.creates {
            if target.path(&expand(creates, target, facts)).exists() {
                p.satisfied += 1;
                continue;
            }
        }
        if let Some(unless) = &cmd.unless {
            let probe = command_in(target, facts, unless.get_ref());
            match p.exec.probe(&probe) {
                Ok(o) if o.exit_code == Some(0) => {
                    p.satisfied += 1;
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    p.notes.push(format!("guard of command {:?} could not run ({e}): the command will run", cmd.name))
                }
            }
        }
        let why = match (&cmd.creates, &cmd.unless) {
            (Some(c), _) => format!("{c} does not exist"),
            (None, Some(u)) => format!("`{}` did not succeed", Cmd::new(u.get_ref().clone()).display()),
            (None, None) => unreachable!("validated"),
        };
        let run = command_in(target, facts, cmd.run.get_ref());
        p.step(format!("command:{}", cmd.name), format!("run {}", run.display()), why, vec![Action::Run(run)]);
    }

    // --- the record of what was applied ----------------------------------------------------
    let marker_path = target.path(&format!("{MARKER_DIR}/{name}.json"));
    let recorded: Option<serde_json::Value> =
        std::fs::read(&marker_path).ok().and_then(|b| serde_json::from_slice(&b).ok());
    let recorded_hash = recorded.as_ref().and_then(|m| m.get("hash")).and_then(|h| h.as_str()).map(str::to_string);
    if recorded_hash.as_deref() == Some(image.hash.as_str()) {
        p.satisfied += 1;
    } else {
        let why = match recorded_hash {
            Some(h) => format!(
                "the image changed since it was applied (hash {} then, {} now)",
                &h[..h.len().min(12)],
                &image.hash[..12]
            ),
            None => format!("{name} has not been applied here"),
        };
        let venvs: Vec<&String> = spec.venvs.iter().map(|v| v.get_ref().path.get_ref()).collect();
        let doc = serde_json::json!({
            "image": name, "version": spec.image.version, "hash": image.hash, "applied_at": facts.now, "venvs": venvs,
        });
        let record = Action::Write {
            path: marker_path,
            content: (serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n").into_bytes(),
            mode: 0o644,
            owner: None,
        };
        p.step("image:record", format!("record {name} {} as applied", spec.image.version), why, vec![record]);
    }

    Ok(Plan {
        image: name,
        image_version: spec.image.version.clone(),
        image_hash: image.hash.clone(),
        root: target.root.clone(),
        steps: p.steps,
        notes: p.notes,
        satisfied: p.satisfied,
    })
}

/// A spec's command as it runs: on this host, in the target root, with `KILN_ROOT` naming it and
/// `${root}` and `${kernel_release}` replaced in its arguments (as whole values, never re-parsed).
pub fn command_in(target: &Target, facts: &Facts, argv: &[String]) -> Cmd {
    Cmd::new(argv.iter().map(|a| expand(a, target, facts)).collect::<Vec<_>>())
        .env("KILN_ROOT", &target.root_str())
        .cwd(target.root.clone())
}

/// Replaces kiln's variables: `${root}` (the target root, without a trailing slash, so that
/// `${root}/etc` is right for `/` too) and `${kernel_release}`.
pub fn expand(text: &str, target: &Target, facts: &Facts) -> String {
    let root = target.root_str();
    let root = if root == "/" { "" } else { root.trim_end_matches('/') };
    text.replace("${root}", root).replace("${kernel_release}", facts.kernel_release.as_deref().unwrap_or(""))
}

pub fn unit_name(name: &str) -> String {
    if name.contains('.') {
        name.to_string()
    } else {
        format!("{name}.service")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("570.*", "570.133.20-1"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("570.*", "575.51.03-1"));
        assert!(glob_match("2.?", "2.0"));
        assert!(glob_match("1.0", "1.0") && !glob_match("1.0", "1.0.1"));
    }
}
