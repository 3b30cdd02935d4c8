//! Reading the target's state, every probe in one batch, before anything is decided: the dpkg
//! status file once, the files the image declares or kiln owns, the repositories' keys (gpg), the
//! users and groups named, loaded modules and sysctl values (live only), venvs' installed
//! distributions, one `systemctl is-enabled` and one `is-active` for all units, the commands'
//! guards, and the record of the last apply. The planners then decide from this alone.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::{
    command_in, expand, modprobe_path, modules_load_path, preferences_path, sources_path, sysctl_path, unit_name,
    venv_distributions, Facts, PlanError, Target, MARKER_DIR,
};
use crate::dpkg;
use crate::exec::{armored_key, key_fingerprints, Cmd, Executor};
use crate::image::Image;

/// What is at a path of the target now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileState {
    /// Its bytes, when it is a readable file.
    pub content: Option<Vec<u8>>,
    /// (permission bits, uid, gid), when anything is there.
    pub meta: Option<(u32, u32, u32)>,
}

/// A repository's pinned key, read from its key file when the source needs writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyFile {
    /// The key file does not exist.
    Missing,
    /// gpg could not be run on it.
    Unreadable(String),
    /// The pinned key, ASCII-armored.
    Armored(String),
    /// The file holds these keys and not the pinned one.
    Others(Vec<String>),
}

/// A command's guard (`creates` or `unless`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// What `creates` names exists, or `unless` succeeded: nothing to do.
    Satisfied,
    /// The command must run.
    Unmet,
    /// `unless` could not run (why): the command runs, with a note.
    Unrunnable(String),
}

/// Everything a plan decides from.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// Installed packages from the dpkg status file.
    pub installed: BTreeMap<String, dpkg::Package>,
    /// Whether the target has a dpkg database at all.
    pub dpkg_db: bool,
    /// Files by absolute path on the target: apt sources and pins, the image's files, kiln's
    /// module and sysctl files.
    pub files: BTreeMap<String, FileState>,
    /// Per repository with a key: whether its source exists, points where the image says, and pins
    /// the key (`Signed-By` holds exactly it).
    pub sources_pinned: BTreeMap<String, bool>,
    /// Per repository whose source must be written from a key file: that key.
    pub key_files: BTreeMap<String, KeyFile>,
    /// The `source` files of `[[file]]` entries, as written in the spec: their bytes or why not.
    pub file_sources: BTreeMap<String, Result<Vec<u8>, String>>,
    /// User and group names the image's files name: (`/etc/passwd` or `/etc/group`, name) → id.
    pub ids: BTreeMap<(String, String), Option<u32>>,
    /// The image's modules that are loaded (live targets only).
    pub loaded_modules: BTreeSet<String>,
    /// The image's sysctl keys, as `/proc/sys` has them now, or why not (live targets only).
    pub sysctl: BTreeMap<String, Result<String, String>>,
    /// Per venv path: its installed distributions (normalised name → version), `None` when it is
    /// not a venv.
    pub venvs: BTreeMap<String, Option<BTreeMap<String, String>>>,
    /// `systemctl is-enabled` of the image's units, one line each (empty when it could not say).
    pub enabled: Vec<String>,
    /// `systemctl is-active` of the image's units (live targets with systemd running).
    pub active: Vec<String>,
    /// Per command name: its guard.
    pub guards: BTreeMap<String, Guard>,
    /// The hash the last successful apply recorded.
    pub recorded_hash: Option<String>,
}

impl State {
    /// Reads what `image` needs to know of `target`. Probes (gpg, systemctl, guards) go through
    /// `exec` and never change anything.
    ///
    /// # Errors
    /// An unreadable dpkg status file.
    pub fn read(image: &Image, target: &Target, facts: &Facts, exec: &mut dyn Executor) -> Result<State, PlanError> {
        let spec = &image.spec;
        let name = image.name();
        let mut state = State {
            installed: dpkg::installed(&target.root).map_err(|e| PlanError::State(e.to_string()))?,
            dpkg_db: target.path("/var/lib/dpkg/status").exists(),
            ..State::default()
        };
        state.read_sources(image, target, exec);
        // kiln's own files only where the image has the section that writes them.
        let mut kiln_files = Vec::new();
        if !spec.apt.packages.is_empty() {
            kiln_files.push(preferences_path(name));
        }
        if !spec.modules.is_empty() {
            kiln_files.extend([modules_load_path(name), modprobe_path(name)]);
        }
        if !spec.sysctl.is_empty() {
            kiln_files.push(sysctl_path(name));
        }
        kiln_files.extend(spec.files.iter().map(|f| f.get_ref().path.get_ref().clone()));
        for abs in kiln_files {
            state.files.insert(abs.clone(), file_state(&target.path(&abs)));
        }
        for f in &spec.files {
            let file = f.get_ref();
            if let Some(s) = &file.source {
                let path = image.resolve(s.get_ref());
                let read = std::fs::read(&path).map_err(|e| format!("cannot read source {}: {e}", path.display()));
                state.file_sources.insert(s.get_ref().clone(), read);
            }
            for (table, who) in [("/etc/passwd", &file.owner), ("/etc/group", &file.group)] {
                if let Some(who) = who {
                    let id = lookup_id(target, table, who.get_ref());
                    state.ids.insert((table.to_string(), who.get_ref().clone()), id);
                }
            }
        }
        if target.live() {
            state.read_live_kernel(image);
        }
        for v in &spec.venvs {
            let abs = v.get_ref().path.get_ref();
            state.venvs.insert(abs.clone(), venv_distributions(&target.path(abs)));
        }
        state.read_services(image, target, facts, exec);
        for c in &spec.commands {
            let cmd = c.get_ref();
            state.guards.insert(cmd.name.clone(), guard(cmd, target, facts, exec));
        }
        let marker: Option<serde_json::Value> = std::fs::read(target.path(&format!("{MARKER_DIR}/{name}.json")))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        state.recorded_hash = marker.as_ref().and_then(|m| m.get("hash")).and_then(|h| h.as_str()).map(str::to_string);
        Ok(state)
    }

    /// Each repository's source file; for a keyed one, whether it pins the key, and when it does
    /// not, the key from its key file.
    fn read_sources(&mut self, image: &Image, target: &Target, exec: &mut dyn Executor) {
        for r in &image.spec.apt.repositories {
            let repo = r.get_ref();
            let rname = repo.name.get_ref();
            let abs = sources_path(rname);
            let file = file_state(&target.path(&abs));
            if let Some(k) = &repo.key {
                let key = k.get_ref();
                let fingerprint = super::pinned_fingerprint(key);
                let header = super::source_header(repo);
                let pinned = match file.content.as_deref().map(String::from_utf8_lossy) {
                    Some(text) if text.starts_with(&header) => {
                        signed_by_holds(exec, &text[header.len()..], &fingerprint)
                    }
                    _ => false,
                };
                self.sources_pinned.insert(rname.clone(), pinned);
                if let (false, Some(kf)) = (pinned, &key.file) {
                    let from = image.resolve(kf.get_ref());
                    let key_file = if !from.is_file() {
                        KeyFile::Missing
                    } else {
                        match armored_key(exec, &from, &fingerprint) {
                            Err(e) => KeyFile::Unreadable(format!("cannot run gpg to read {}: {e}", from.display())),
                            Ok(Some(armored)) => KeyFile::Armored(armored),
                            Ok(None) => KeyFile::Others(key_fingerprints(exec, &from).unwrap_or_default()),
                        }
                    };
                    self.key_files.insert(rname.clone(), key_file);
                }
            }
            self.files.insert(abs, file);
        }
    }

    /// Loaded modules and current sysctl values of this running machine.
    fn read_live_kernel(&mut self, image: &Image) {
        let spec = &image.spec;
        if !spec.modules.is_empty() {
            let loaded: BTreeSet<String> = std::fs::read_to_string("/proc/modules")
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .collect();
            for m in &spec.modules {
                let key = m.get_ref().name.get_ref().replace('-', "_");
                if loaded.contains(&key) || Path::new("/sys/module").join(&key).is_dir() {
                    self.loaded_modules.insert(key);
                }
            }
        }
        for k in spec.sysctl.keys() {
            let key = k.get_ref();
            let file = Path::new("/proc/sys").join(key.replace('.', "/"));
            let value = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {e} (is {key} a sysctl of this kernel?)", file.display()));
            self.sysctl.insert(key.clone(), value);
        }
    }

    /// One `systemctl is-enabled` and (live, systemd running) one `is-active` for every unit.
    fn read_services(&mut self, image: &Image, target: &Target, facts: &Facts, exec: &mut dyn Executor) {
        let spec = &image.spec;
        if spec.services.is_empty() {
            return;
        }
        let units: Vec<String> = spec.services.iter().map(|s| unit_name(s.get_ref().name.get_ref())).collect();
        let mut query = vec!["systemctl".to_string()];
        if !target.live() {
            query.push(format!("--root={}", target.root_str()));
        }
        query.push("is-enabled".into());
        query.extend(units.iter().cloned());
        let lines = |out: std::io::Result<crate::exec::Probed>| {
            out.map(|o| o.stdout.lines().map(str::to_string).collect()).unwrap_or_default()
        };
        self.enabled = lines(exec.probe(&Cmd::new(query)));
        if facts.systemd_running {
            let mut q = vec!["systemctl".to_string(), "is-active".into()];
            q.extend(units);
            self.active = lines(exec.probe(&Cmd::new(q)));
        }
    }
}

/// What is at `path`: its content when readable, its mode and owner when anything is there.
pub fn file_state(path: &Path) -> FileState {
    let meta = std::fs::metadata(path).ok().map(|m| (m.permissions().mode() & 0o7777, m.uid(), m.gid()));
    FileState { content: meta.and_then(|_| std::fs::read(path).ok()), meta }
}

/// A command's guard, checked now.
fn guard(cmd: &crate::image::CommandSpec, target: &Target, facts: &Facts, exec: &mut dyn Executor) -> Guard {
    if let Some(creates) = &cmd.creates {
        if target.path(&expand(creates, target, facts)).exists() {
            return Guard::Satisfied;
        }
    }
    if let Some(unless) = &cmd.unless {
        return match exec.probe(&command_in(target, facts, unless.get_ref())) {
            Ok(o) if o.exit_code == Some(0) => Guard::Satisfied,
            Ok(_) => Guard::Unmet,
            Err(e) => Guard::Unrunnable(e.to_string()),
        };
    }
    Guard::Unmet
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
