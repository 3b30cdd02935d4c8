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

mod apt;
mod commands;
mod files;
mod modules;
mod services;
pub mod state;
mod sysctl;
mod venvs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::exec::{Action, Cmd, Executor};
use crate::image::{normalize_dist, Image, SpecError};
pub use state::State;

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
    /// An absolute path of the target, as seen from here: for another root, its directories
    /// resolved inside that root (`crate::root`), so that a symlinked `etc/` cannot lead out.
    pub fn path(&self, abs: &str) -> PathBuf {
        if self.live() {
            return self.root.join(abs.trim_start_matches('/'));
        }
        crate::root::parent_in_root(&self.root, Path::new(abs))
    }
    pub(crate) fn root_str(&self) -> String {
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

/// A plan being decided: the image, the target, its facts and state, and the steps so far.
pub(crate) struct Planner<'a> {
    image: &'a Image,
    target: &'a Target,
    facts: &'a Facts,
    state: &'a State,
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

    /// A file kiln generates in full: a step when its content differs. Returns whether it does.
    fn managed_file(&mut self, abs: &str, content: String, what: &str) -> bool {
        let old = self.state.files.get(abs).and_then(|f| f.content.as_deref());
        if old == Some(content.as_bytes()) {
            self.satisfied += 1;
            return false;
        }
        let why = if old.is_some() {
            format!("{abs} differs from what the image declares")
        } else {
            format!("{abs} does not exist")
        };
        let path = self.target.path(abs);
        self.step(
            format!("file:{abs}"),
            format!("write {abs} ({what})"),
            why,
            vec![Action::Write { path, content: content.into_bytes(), mode: 0o644, owner: None }],
        );
        true
    }

    fn name(&self) -> &str {
        self.image.name()
    }
}

/// Plans `image` against `target`: reads its state ([`State::read`], probes through `exec`), then
/// decides ([`decide`]).
///
/// # Errors
/// The image does not apply here; the state cannot be read; the spec names something the target
/// or the image's folder lacks.
pub fn plan(image: &Image, target: &Target, facts: &Facts, exec: &mut dyn Executor) -> Result<Plan, PlanError> {
    if let Some(why) = facts.mismatch(image) {
        let target = if target.live() { "this machine".to_string() } else { target.root.display().to_string() };
        return Err(PlanError::Mismatch { image: image.name().to_string(), target, why });
    }
    let state = State::read(image, target, facts, exec)?;
    decide(image, target, facts, &state)
}

/// The steps that would make a target in `state` match `image`, in order: apt, files, kernel
/// modules, sysctl, venvs, services, commands, the record of the apply. Pure: no I/O.
///
/// # Errors
/// The spec names something the state says is missing (a key file, a user, a sysctl).
pub fn decide(image: &Image, target: &Target, facts: &Facts, state: &State) -> Result<Plan, PlanError> {
    let mut p = Planner { image, target, facts, state, steps: vec![], notes: vec![], satisfied: 0 };
    apt::plan(&mut p)?;
    files::plan(&mut p)?;
    modules::plan(&mut p);
    sysctl::plan(&mut p)?;
    venvs::plan(&mut p);
    services::plan(&mut p);
    commands::plan(&mut p);
    commands::record(&mut p);
    let spec = &image.spec;
    Ok(Plan {
        image: image.name().to_string(),
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

/// The part of a deb822 source kiln writes before its `Signed-By` (or `Trusted`) field.
pub(crate) fn source_header(repo: &crate::image::AptRepository) -> String {
    let mut header = format!("Types: deb\nURIs: {}\nSuites: {}\n", repo.uri.get_ref(), repo.suite);
    if !repo.components.is_empty() {
        header += &format!("Components: {}\n", repo.components.join(" "));
    }
    header
}

/// The pinned fingerprint as gpg prints it: no spaces, upper case.
pub(crate) fn pinned_fingerprint(key: &crate::image::RepositoryKey) -> String {
    key.fingerprint.get_ref().replace(' ', "").to_ascii_uppercase()
}

#[cfg(test)]
mod tests {
    use super::state::{FileState, Guard, KeyFile};
    use super::*;

    const HEAD: &str = "[image]\nname = \"t\"\nversion = \"1\"\n";

    /// Facts of this machine (`live`) or of another root, fixed.
    fn facts(live: bool) -> Facts {
        Facts {
            os_id: Some("debian".into()),
            os_version: Some("12".into()),
            arch: "x86_64".into(),
            kernel_release: Some("6.1.0-28-amd64".into()),
            nvidia_gpu: false,
            systemd_running: live,
            now: "2026-12-01T00:00:00Z".into(),
            live,
        }
    }

    /// Decides `spec` (after the image header) against `state`; returns each step's key and why,
    /// the notes, and how many items were satisfied.
    fn decided(spec: &str, state: &State, live: bool) -> Result<(Vec<(String, String)>, Vec<String>, usize), String> {
        let image = crate::image::parse(Path::new("t.toml"), format!("{HEAD}{spec}")).map_err(|e| e.to_string())?;
        let target = Target { root: PathBuf::from(if live { "/" } else { "/srv/root" }) };
        let mut state = state.clone();
        state.recorded_hash.get_or_insert_with(|| image.hash.clone());
        let plan = decide(&image, &target, &facts(live), &state).map_err(|e| e.to_string())?;
        Ok((plan.steps.into_iter().map(|s| (s.key, s.why)).collect(), plan.notes, plan.satisfied))
    }

    #[track_caller]
    fn check(spec: &str, state: State, live: bool, expected: &[(&str, &str)]) {
        let (steps, notes, _) = decided(spec, &state, live).unwrap();
        let steps: Vec<(&str, &str)> = steps.iter().map(|(k, w)| (k.as_str(), w.as_str())).collect();
        assert_eq!(steps, expected, "notes: {notes:?}");
    }

    fn file(content: &str, mode: u32) -> FileState {
        FileState { content: Some(content.as_bytes().to_vec()), meta: Some((mode, 0, 0)) }
    }

    fn package(name: &str, version: &str, hold: bool) -> (String, crate::dpkg::Package) {
        let p = crate::dpkg::Package { name: name.into(), version: version.into(), architecture: None, hold };
        (name.to_string(), p)
    }

    #[test]
    fn files() {
        let spec = "[[file]]\npath = \"/etc/x\"\ncontent = \"x\\n\"\nmode = \"0600\"\n";
        check(spec, State::default(), false, &[("file:/etc/x", "it does not exist")]);
        let mut s = State::default();
        s.files.insert("/etc/x".into(), file("x\n", 0o600));
        check(spec, s.clone(), false, &[]);
        s.files.insert("/etc/x".into(), file("x\n", 0o644));
        check(spec, s.clone(), false, &[("file:/etc/x", "mode is 0644, want 0600")]);
        s.files.insert("/etc/x".into(), file("y\n", 0o600));
        let (steps, _, _) = decided(spec, &s, false).unwrap();
        assert!(steps[0].1.starts_with("content differs (sha256 "), "{steps:?}");
        s.files.insert("/etc/x".into(), FileState { content: None, meta: Some((0o755, 0, 0)) });
        check(spec, s, false, &[("file:/etc/x", "it is not a readable file")]);
        let owned = "[[file]]\npath = \"/etc/x\"\ncontent = \"x\"\nowner = \"kiln\"\n";
        let err = decided(owned, &State::default(), false).unwrap_err();
        assert!(err.contains("no user \"kiln\" in /srv/root/etc/passwd"), "{err}");
    }

    #[test]
    fn apt() {
        let spec = "[apt.packages]\nhello = \"2.10-3\"\nworld = \"*\"\n\n[apt]\nhold = [\"hello\"]\n";
        let mut s = State { dpkg_db: true, ..State::default() };
        check(
            spec,
            s.clone(),
            false,
            &[
                ("file:/etc/apt/preferences.d/kiln-t.pref", "/etc/apt/preferences.d/kiln-t.pref does not exist"),
                ("apt:update", "refresh the package lists before installing"),
                ("apt:install", "hello is not installed; world is not installed"),
                ("apt:hold", "hello is installed by this plan, which releases its hold"),
            ],
        );
        s.files.insert(
            "/etc/apt/preferences.d/kiln-t.pref".into(),
            file("Package: hello\nPin: version 2.10-3\nPin-Priority: 1001\n", 0o644),
        );
        s.installed.extend([package("hello", "2.10-3", false), package("world", "1", false)]);
        check(spec, s.clone(), false, &[("apt:hold", "hello is not held")]);
        s.installed.extend([package("hello", "2.10-3", true)]);
        check(spec, s.clone(), false, &[]);
        s.installed.extend([package("hello", "2.10-2", true)]);
        let (steps, _, _) = decided(spec, &s, false).unwrap();
        let keys: Vec<&str> = steps.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(keys, ["apt:update", "apt:install", "apt:hold"]);
        assert_eq!(steps[1].1, "hello is 2.10-2 (want 2.10-3)");
        // An empty root gets the dpkg skeleton first.
        let (steps, _, _) = decided(spec, &State::default(), false).unwrap();
        assert_eq!(steps[0].0, "apt:skeleton");
    }

    #[test]
    fn signed_sources() {
        let spec = "[[apt.repository]]\nname = \"r\"\nuri = \"file:///repo\"\nsuite = \"./\"\n\
                    key = { file = \"k.asc\", fingerprint = \"ABCD 0000 0000 0000 0000  0000 0000 0000 0000 0000\" }\n";
        // The key file is missing: the spec is wrong, said with its position.
        let err = decided(spec, &State::default(), false).unwrap_err();
        assert!(err.contains("key file") && err.contains("does not exist"), "{err}");
        let mut s = State::default();
        s.key_files.insert("r".into(), KeyFile::Others(vec!["EEEE".into()]));
        let err = decided(spec, &s, false).unwrap_err();
        assert!(err.contains("holds EEEE, not the pinned ABCD000000000000000000000000000000000000"), "{err}");
        s.key_files.insert("r".into(), KeyFile::Armored("KEY".into()));
        check(
            spec,
            s.clone(),
            false,
            &[
                ("apt-source:r", "/etc/apt/sources.list.d/kiln-r.sources does not exist"),
                ("apt:update", "apt sources changed"),
            ],
        );
        s.files.insert(
            "/etc/apt/sources.list.d/kiln-r.sources".into(),
            file("Types: deb\nURIs: file:///repo\nSuites: ./\nSigned-By:\n x\n", 0o644),
        );
        s.sources_pinned.insert("r".into(), true);
        check(spec, s, false, &[]);
    }

    #[test]
    fn kernel_modules_and_sysctl() {
        let spec = "[[module]]\nname = \"nvidia-peermem\"\n\n[sysctl]\n\"vm.swappiness\" = 10\n";
        let mut s = State::default();
        s.files.insert("/etc/modules-load.d/kiln-t.conf".into(), file("nvidia-peermem\n", 0o644));
        s.files.insert("/etc/sysctl.d/90-kiln-t.conf".into(), file("vm.swappiness = 10\n", 0o644));
        s.sysctl.insert("vm.swappiness".into(), Ok("60\n".into()));
        check(
            spec,
            s.clone(),
            true,
            &[
                ("module:nvidia-peermem", "nvidia-peermem is not loaded"),
                ("sysctl:apply", "vm.swappiness is 60, want 10"),
            ],
        );
        s.loaded_modules.insert("nvidia_peermem".into());
        s.sysctl.insert("vm.swappiness".into(), Ok("10\n".into()));
        check(spec, s.clone(), true, &[]);
        // Another root: persisted only, and said so.
        let (steps, notes, _) = decided(spec, &s, false).unwrap();
        assert!(steps.is_empty() && notes.len() == 2, "{steps:?} {notes:?}");
        s.sysctl.insert("vm.swappiness".into(), Err("cannot read /proc/sys/vm/swappiness".into()));
        assert!(decided(spec, &s, true).unwrap_err().contains("cannot read /proc/sys/vm/swappiness"));
    }

    #[test]
    fn services_venvs_commands_and_the_record() {
        let spec = "[[service]]\nname = \"nvidia-persistenced\"\nenabled = true\nstarted = true\n\n\
                    [[venv]]\npath = \"/opt/v\"\npackages = [\"torch==2.5.1\"]\n\n\
                    [[command]]\nname = \"c\"\nrun = [\"true\"]\ncreates = \"/done\"\n";
        let mut s = State { enabled: vec!["disabled".into()], active: vec!["inactive".into()], ..State::default() };
        check(
            spec,
            s.clone(),
            true,
            &[
                ("venv:/opt/v", "it does not exist"),
                ("pip:/opt/v", "torch is not installed"),
                ("service:nvidia-persistenced.service:enable", "nvidia-persistenced.service is disabled"),
                ("service:nvidia-persistenced.service:start", "nvidia-persistenced.service is inactive"),
                ("command:c", "/done does not exist"),
            ],
        );
        s.enabled = vec!["enabled".into()];
        s.active = vec!["active".into()];
        s.venvs.insert("/opt/v".into(), Some([("torch".to_string(), "2.5.1".to_string())].into()));
        s.guards.insert("c".into(), Guard::Satisfied);
        check(spec, s.clone(), true, &[]);
        s.recorded_hash = Some("0123456789abcdef".into());
        let (steps, _, _) = decided(spec, &s, true).unwrap();
        assert_eq!(steps.len(), 1);
        assert!(steps[0].1.starts_with("the image changed since it was applied (hash 0123456789ab then"));
    }

    #[test]
    fn globs() {
        assert!(glob_match("570.*", "570.133.20-1"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("570.*", "575.51.03-1"));
        assert!(glob_match("2.?", "2.0"));
        assert!(glob_match("1.0", "1.0") && !glob_match("1.0", "1.0.1"));
    }
}
