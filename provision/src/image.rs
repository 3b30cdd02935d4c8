//! Image specs (`images/*.toml`): a named, versioned software stack, declared, not scripted.
//!
//! Every error — TOML syntax, an unknown key, a wrong type, a missing field, a value that makes no
//! sense (an unguarded command, a mode that is not octal, a bad regex) — names the file, the line
//! and the column, as `images/x.toml:12:5: message`. The consistency of NVIDIA pins is `lint`'s.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use toml::Spanned;

/// A problem in a spec, at a place in it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SpecError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.column, self.message)
    }
}

/// All the errors of one spec (at least one).
#[derive(Debug, Clone)]
pub struct SpecErrors(pub Vec<SpecError>);

impl fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SpecErrors {}

/// The source text of a spec, to turn byte offsets into lines and columns.
pub struct SourceText<'a> {
    pub file: &'a str,
    pub text: &'a str,
}

impl SourceText<'_> {
    pub fn error_at(&self, offset: usize, message: impl Into<String>) -> SpecError {
        let offset = offset.min(self.text.len());
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
        let column = self.text[line_start..offset].chars().count() + 1;
        SpecError { file: self.file.to_string(), line, column, message: message.into() }
    }
    pub fn error<T>(&self, at: &Spanned<T>, message: impl Into<String>) -> SpecError {
        self.error_at(at.span().start, message)
    }
}

// ---------------------------------------------------------------------------------------------
// The document as written.

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub image: ImageMeta,
    #[serde(rename = "match", default)]
    pub matches: Option<MatchRule>,
    #[serde(default)]
    pub apt: Apt,
    #[serde(rename = "venv", default)]
    pub venvs: Vec<Spanned<Venv>>,
    #[serde(rename = "module", default)]
    pub modules: Vec<Spanned<Module>>,
    /// `key = "value"`; persisted to `/etc/sysctl.d/90-kiln-<image>.conf`.
    #[serde(default)]
    pub sysctl: BTreeMap<Spanned<String>, Spanned<SysctlValue>>,
    #[serde(rename = "file", default)]
    pub files: Vec<Spanned<FileSpec>>,
    #[serde(rename = "service", default)]
    pub services: Vec<Spanned<Service>>,
    #[serde(rename = "command", default)]
    pub commands: Vec<Spanned<CommandSpec>>,
    #[serde(rename = "check", default)]
    pub checks: Vec<Spanned<Check>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageMeta {
    pub name: Spanned<String>,
    pub version: String,
    #[serde(default)]
    pub description: Option<String>,
}

/// Which machines the image applies to; an absent list allows any.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchRule {
    /// `"<os-release ID> <VERSION_ID>"`, e.g. `"ubuntu 24.04"`, or just the ID.
    #[serde(default)]
    pub os: Vec<Spanned<String>>,
    /// `uname -m` names: `x86_64`, `aarch64`.
    #[serde(default)]
    pub arch: Vec<Spanned<String>>,
    /// `"nvidia"`: an NVIDIA GPU must be present; `"none"`: none may be.
    #[serde(default)]
    pub gpu: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Apt {
    #[serde(rename = "repository", default)]
    pub repositories: Vec<Spanned<AptRepository>>,
    /// `name = "version"`: exact (`"570.133.20-1"`), a glob (`"570.133.*"`), or `"*"` for any.
    /// `${kernel_release}` in a name becomes the target's kernel release.
    #[serde(default)]
    pub packages: BTreeMap<Spanned<String>, Spanned<String>>,
    /// Packages to hold at their version (`dpkg --set-selections`).
    #[serde(default)]
    pub hold: Vec<Spanned<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AptRepository {
    pub name: Spanned<String>,
    pub uri: Spanned<String>,
    /// A suite, or `"/"`-terminated path for a flat repository (`"./"`).
    pub suite: String,
    #[serde(default)]
    pub components: Vec<String>,
    #[serde(default)]
    pub key: Option<Spanned<RepositoryKey>>,
    /// Only for `file:` repositories built locally (tests, air-gapped mirrors): no signature.
    #[serde(default)]
    pub trusted: Option<Spanned<bool>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepositoryKey {
    /// A key file, relative to the spec's directory.
    #[serde(default)]
    pub file: Option<Spanned<String>>,
    /// Where to download the key from when no file is given.
    #[serde(default)]
    pub url: Option<Spanned<String>>,
    /// The primary key's fingerprint, 40 hex digits; the key is refused unless it matches.
    pub fingerprint: Spanned<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Venv {
    pub path: Spanned<String>,
    #[serde(default = "default_python")]
    pub python: String,
    /// `"name==version"` each.
    pub packages: Vec<Spanned<String>>,
    /// `name = ["sha256:…"]`: pip then runs with `--require-hashes`.
    #[serde(default)]
    pub hashes: BTreeMap<String, Vec<Spanned<String>>>,
    #[serde(default)]
    pub index_url: Option<String>,
    /// A directory of wheels (`pip install --no-index --find-links`), relative to the spec's directory.
    #[serde(default)]
    pub wheels: Option<Spanned<String>>,
}

fn default_python() -> String {
    "python3".to_string()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Module {
    pub name: Spanned<String>,
    #[serde(default)]
    pub options: BTreeMap<String, SysctlValue>,
}

/// A sysctl or module option value: TOML strings, integers and booleans are all accepted.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum SysctlValue {
    Text(String),
    Integer(i64),
    Bool(bool),
}

impl fmt::Display for SysctlValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SysctlValue::Text(s) => write!(f, "{s}"),
            SysctlValue::Integer(i) => write!(f, "{i}"),
            SysctlValue::Bool(b) => write!(f, "{}", u8::from(*b)),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    pub path: Spanned<String>,
    /// Octal, as a string: `"0644"`.
    #[serde(default)]
    pub mode: Option<Spanned<String>>,
    #[serde(default)]
    pub owner: Option<Spanned<String>>,
    #[serde(default)]
    pub group: Option<Spanned<String>>,
    #[serde(default)]
    pub content: Option<String>,
    /// A file relative to the spec's directory, with its pinned `sha256`.
    #[serde(default)]
    pub source: Option<Spanned<String>>,
    #[serde(default)]
    pub sha256: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    pub name: Spanned<String>,
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "yes")]
    pub started: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandSpec {
    pub name: String,
    /// The argument vector; never passed through a shell.
    pub run: Spanned<Vec<String>>,
    /// Skip when this path exists (below the target root).
    #[serde(default)]
    pub creates: Option<String>,
    /// Skip when this command exits 0.
    #[serde(default)]
    pub unless: Option<Spanned<Vec<String>>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    pub name: String,
    pub run: Spanned<Vec<String>>,
    #[serde(default)]
    pub contains: Option<String>,
    #[serde(default)]
    pub matches: Option<Spanned<String>>,
}

// ---------------------------------------------------------------------------------------------
// The loaded image: the spec, where it came from, and what it hashes to.

#[derive(Debug, Clone)]
pub struct Image {
    pub spec: Spec,
    pub path: PathBuf,
    /// The directory relative paths (`source`, `wheels`, key files) are read from.
    pub dir: PathBuf,
    /// sha256 of the spec file and every file it references by content (sources, key files).
    pub hash: String,
    pub text: String,
}

impl Image {
    pub fn name(&self) -> &str {
        self.spec.image.name.get_ref()
    }
    pub fn source(&self) -> SourceText<'_> {
        SourceText { file: path_str(&self.path), text: &self.text }
    }
    pub fn resolve(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }
    /// Pinned regexes of the checks, compiled (the spec was validated, so they compile).
    pub fn check_regex(&self, check: &Check) -> Option<regex::Regex> {
        check.matches.as_ref().and_then(|m| regex::Regex::new(m.get_ref()).ok())
    }
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap_or("<non-UTF-8 path>")
}

/// Reads, parses and validates a spec file.
pub fn load(path: &Path) -> Result<Image, SpecErrors> {
    let display = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| {
        SpecErrors(vec![SpecError {
            file: display.clone(),
            line: 0,
            column: 0,
            message: format!("cannot read the spec: {e}"),
        }])
    })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let s = String::from_utf8_lossy(valid);
        let src = SourceText { file: &display, text: &s };
        SpecErrors(vec![src.error_at(s.len(), "the file is not UTF-8 text")])
    })?;
    parse(path, text)
}

/// Parses and validates spec text that came from `path`.
pub fn parse(path: &Path, text: String) -> Result<Image, SpecErrors> {
    let display = path.display().to_string();
    let src = SourceText { file: &display, text: &text };
    let spec: Spec = toml::from_str(&text).map_err(|e| {
        let at = e.span().map(|s| s.start).unwrap_or(0);
        let message: Vec<&str> = e.message().lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        let mut message = message.join(": ");
        let mut at = at;
        if message.contains("expected a borrowed string") {
            at = text[..at.min(text.len())].rfind('\n').map_or(0, |i| i + 1);
            // A bare key with dots (`linux-headers-6.8.0 = …`) is a dotted key in TOML: nested tables.
            message = "a bare key with dots is a dotted key (nested tables) in TOML: quote names that contain dots, e.g. \"libpython3.12\" = \"*\"".into();
        }
        SpecErrors(vec![src.error_at(at, message)])
    })?;
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let errors = validate(&spec, &src, &dir);
    if !errors.is_empty() {
        return Err(SpecErrors(errors));
    }
    let mut hasher = Sha256::new();
    hasher.update(text.as_bytes());
    for f in &spec.files {
        if let Some(s) = &f.get_ref().source {
            hasher.update(std::fs::read(dir.join(s.get_ref())).unwrap_or_default());
        }
    }
    for r in &spec.apt.repositories {
        if let Some(file) = r.get_ref().key.as_ref().and_then(|k| k.get_ref().file.as_ref()) {
            hasher.update(std::fs::read(dir.join(file.get_ref())).unwrap_or_default());
        }
    }
    let hash = hex(&hasher.finalize());
    Ok(Image { spec, path: path.to_path_buf(), dir, hash, text })
}

const NAME_CHARS: &str = "lowercase letters, digits, '.', '-' and '_'";

/// Whether `s` starts with a letter or digit: no spec value that reaches a program's arguments may
/// start with `-`, where it would be read as an option (`"--allow-unauthenticated" = "*"`).
fn starts_alnum(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
}

fn is_name(s: &str) -> bool {
    starts_alnum(s)
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '_' | '+'))
}

/// Debian package names (Policy 5.6.1: lower case letters, digits, `+ - .`, at least two long,
/// starting with a letter or digit), with kiln's `${kernel_release}` variable.
fn is_package_name(s: &str) -> bool {
    let s = s.replace("${kernel_release}", "k");
    s.len() >= 2
        && starts_alnum(&s)
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '+'))
}

/// Debian versions (Policy 5.6.12: an optional epoch, an upstream version starting with a digit)
/// with `*` and `?` globs.
fn is_version_pattern(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_digit() || c == '*' || c == '?')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || ".+-~:*?".contains(c))
}

/// A path the spec names relative to its folder (`source`, key `file`, `wheels`): relative, without
/// `..`, and (where it exists) not reaching outside the folder through a symbolic link.
fn inside_image(dir: &Path, rel: &str) -> bool {
    let p = Path::new(rel);
    if rel.is_empty() || p.is_absolute() || p.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return false;
    }
    match (std::fs::canonicalize(dir), std::fs::canonicalize(dir.join(p))) {
        (Ok(d), Ok(target)) => target.starts_with(d),
        _ => true, // not there: said by the check that reads it
    }
}

const INSIDE_IMAGE: &str = "must be a path inside the image's folder (relative, without '..', no link out of it)";

/// PEP 503 normalised distribution name.
pub fn normalize_dist(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut dash = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !dash {
                out.push('-');
            }
            dash = true;
        } else {
            out.push(c.to_ascii_lowercase());
            dash = false;
        }
    }
    out
}

/// `"name==version"` → (name, version).
pub fn split_requirement(req: &str) -> Option<(&str, &str)> {
    let (name, version) = req.split_once("==")?;
    let (name, version) = (name.trim(), version.trim());
    // PEP 508 names start and end with a letter or digit; PEP 440 versions start with one.
    let name_ok = starts_alnum(name)
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let version_ok = starts_alnum(version)
        && version.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '!' | '-' | '_'));
    (name_ok && version_ok).then_some((name, version))
}

fn validate(spec: &Spec, src: &SourceText, dir: &Path) -> Vec<SpecError> {
    let mut errors = Vec::new();
    let sections: [fn(&Spec, &SourceText, &Path, &mut dyn FnMut(SpecError)); 7] = [
        validate_image,
        validate_repositories,
        validate_packages,
        validate_venvs,
        validate_kernel,
        validate_files,
        validate_commands,
    ];
    for section in sections {
        section(spec, src, dir, &mut |e| errors.push(e));
    }
    errors.sort_by_key(|e| (e.line, e.column));
    errors
}

/// The image's name and what machines it matches.
fn validate_image(spec: &Spec, src: &SourceText, _dir: &Path, err: &mut dyn FnMut(SpecError)) {
    let name = &spec.image.name;
    if !is_name(name.get_ref()) {
        err(src.error(name, format!("image name {:?} must be {NAME_CHARS}", name.get_ref())));
    }
    if let Some(m) = &spec.matches {
        if let Some(g) = &m.gpu {
            if !matches!(g.get_ref().as_str(), "nvidia" | "none") {
                err(src.error(g, format!("gpu must be \"nvidia\" or \"none\", not {:?}", g.get_ref())));
            }
        }
        for a in &m.arch {
            if !matches!(a.get_ref().as_str(), "x86_64" | "aarch64" | "ppc64le" | "s390x" | "riscv64") {
                err(src
                    .error(a, format!("unknown architecture {:?} (use uname -m names: x86_64, aarch64)", a.get_ref())));
            }
        }
        for o in &m.os {
            if o.get_ref().split_whitespace().count() > 2 || o.get_ref().trim().is_empty() {
                err(src.error(
                    o,
                    format!(
                        "os {:?} must be \"<ID> <VERSION_ID>\" as in /etc/os-release, e.g. \"ubuntu 24.04\"",
                        o.get_ref()
                    ),
                ));
            }
        }
    }
}

/// apt repositories: names, URIs, and a pinned signing key (or trust for a local one).
fn validate_repositories(spec: &Spec, src: &SourceText, dir: &Path, err: &mut dyn FnMut(SpecError)) {
    let mut repo_names = std::collections::BTreeSet::new();
    for r in &spec.apt.repositories {
        let repo = r.get_ref();
        if !is_name(repo.name.get_ref()) {
            err(src.error(&repo.name, format!("repository name {:?} must be {NAME_CHARS}", repo.name.get_ref())));
        } else if !repo_names.insert(repo.name.get_ref().clone()) {
            err(src.error(&repo.name, format!("repository {:?} is declared twice", repo.name.get_ref())));
        }
        let uri = repo.uri.get_ref();
        let local = uri.starts_with("file:");
        if !(local || uri.starts_with("https://") || uri.starts_with("http://")) {
            err(src.error(&repo.uri, format!("repository uri {uri:?} must start with https://, http:// or file:")));
        }
        match (&repo.key, repo.trusted.as_ref().map(|t| *t.get_ref())) {
            (Some(_), Some(true)) => {
                err(src
                    .error(repo.trusted.as_ref().unwrap(), "a repository is either signed (key) or trusted, not both"))
            }
            (None, Some(true)) if !local => err(src.error(
                repo.trusted.as_ref().unwrap(),
                "only a file: repository may be trusted without a key; pin the signing key with key.fingerprint",
            )),
            (None, Some(true)) => {}
            (None, _) => err(src.error(
                r,
                format!(
                    "repository {:?} has no signing key: add key = {{ file = …, fingerprint = … }}",
                    repo.name.get_ref()
                ),
            )),
            (Some(k), _) => {
                let key = k.get_ref();
                let fp = key.fingerprint.get_ref().replace(' ', "");
                if fp.len() != 40 || !fp.chars().all(|c| c.is_ascii_hexdigit()) {
                    err(src.error(&key.fingerprint, "key fingerprint must be 40 hexadecimal digits (spaces allowed)"));
                }
                match (&key.file, &key.url) {
                    (Some(f), None) if !inside_image(dir, f.get_ref()) => {
                        err(src.error(f, format!("key file {:?} {INSIDE_IMAGE}", f.get_ref())))
                    }
                    (None, None) => err(src.error(k, "the key needs a file or a url")),
                    (Some(f), Some(_)) => err(src.error(f, "give the key as a file or a url, not both")),
                    (None, Some(u)) if !u.get_ref().starts_with("https://") => {
                        err(src.error(u, "a key url must be https://"))
                    }
                    _ => {}
                }
            }
        }
    }
}

/// apt packages and holds: Debian names and versions.
fn validate_packages(spec: &Spec, src: &SourceText, _dir: &Path, err: &mut dyn FnMut(SpecError)) {
    for (pkg, version) in &spec.apt.packages {
        if !is_package_name(pkg.get_ref()) {
            err(src.error(pkg, format!("{:?} is not a Debian package name", pkg.get_ref())));
        }
        if !is_version_pattern(version.get_ref()) {
            err(src.error(
                version,
                format!(
                    "version {:?} of {} must be a Debian version, a glob such as \"570.*\", or \"*\"",
                    version.get_ref(),
                    pkg.get_ref()
                ),
            ));
        }
    }
    for h in &spec.apt.hold {
        if !spec.apt.packages.keys().any(|p| p.get_ref() == h.get_ref()) {
            err(src.error(h, format!("hold names {:?}, which [apt.packages] does not install", h.get_ref())));
        }
    }
}

/// Virtualenvs: absolute paths, `==` pins, hashes for every package or none, one source of wheels.
fn validate_venvs(spec: &Spec, src: &SourceText, dir: &Path, err: &mut dyn FnMut(SpecError)) {
    for v in &spec.venvs {
        let venv = v.get_ref();
        if !venv.path.get_ref().starts_with('/') {
            err(src.error(&venv.path, "a venv path must be absolute"));
        }
        if venv.packages.is_empty() {
            err(src.error(v, "a venv needs packages"));
        }
        for p in &venv.packages {
            if split_requirement(p.get_ref()).is_none() {
                err(src.error(p, format!("{:?} must pin an exact version: \"name==version\"", p.get_ref())));
            }
        }
        let names: Vec<String> = venv
            .packages
            .iter()
            .filter_map(|p| split_requirement(p.get_ref()))
            .map(|(n, _)| normalize_dist(n))
            .collect();
        for (name, hashes) in &venv.hashes {
            if !names.contains(&normalize_dist(name)) {
                if let Some(h) = hashes.first() {
                    err(src.error(h, format!("hashes given for {name:?}, which the venv does not install")));
                }
            }
            for h in hashes {
                let hex = h.get_ref().strip_prefix("sha256:").unwrap_or("");
                if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                    err(src.error(h, "a hash must be \"sha256:\" and 64 hexadecimal digits"));
                }
            }
        }
        if !venv.hashes.is_empty() && names.iter().any(|n| !venv.hashes.keys().any(|k| normalize_dist(k) == *n)) {
            err(src.error(v, "with hashes, pip requires a hash for every package: add the missing ones"));
        }
        match (&venv.index_url, &venv.wheels) {
            (Some(_), Some(w)) => err(src.error(w, "give an index_url or a wheels directory, not both")),
            (None, Some(w)) if !inside_image(dir, w.get_ref()) => {
                err(src.error(w, format!("wheel directory {:?} {INSIDE_IMAGE}", w.get_ref())))
            }
            (None, Some(w)) if !dir.join(w.get_ref()).is_dir() => {
                err(src.error(w, format!("wheel directory {} does not exist", dir.join(w.get_ref()).display())))
            }
            _ => {}
        }
    }
}

/// Kernel module names and sysctl names and values.
fn validate_kernel(spec: &Spec, src: &SourceText, _dir: &Path, err: &mut dyn FnMut(SpecError)) {
    for m in &spec.modules {
        let name = &m.get_ref().name;
        if !starts_alnum(name.get_ref())
            || !name.get_ref().chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            err(src.error(name, format!("{:?} is not a kernel module name", name.get_ref())));
        }
    }
    for (key, value) in &spec.sysctl {
        let k = key.get_ref();
        if !starts_alnum(k)
            || k.contains("..")
            || !k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
        {
            err(src.error(key, format!("{k:?} is not a sysctl name")));
        }
        if value.get_ref().to_string().contains('\n') {
            err(src.error(value, "a sysctl value is one line"));
        }
    }
}

/// Files: absolute paths declared once, octal modes, content or a source pinned by its sha256.
fn validate_files(spec: &Spec, src: &SourceText, dir: &Path, err: &mut dyn FnMut(SpecError)) {
    let mut paths = std::collections::BTreeSet::new();
    for f in &spec.files {
        let file = f.get_ref();
        let p = file.path.get_ref();
        if !p.starts_with('/') || p.split('/').any(|c| c == "..") {
            err(src.error(&file.path, "a file path must be absolute, without '..'"));
        } else if !paths.insert(p.clone()) {
            err(src.error(&file.path, format!("{p} is declared twice")));
        }
        if let Some(mode) = &file.mode {
            if parse_mode(mode.get_ref()).is_none() {
                err(src.error(mode, format!("mode {:?} must be octal, e.g. \"0644\"", mode.get_ref())));
            }
        }
        match (&file.content, &file.source, &file.sha256) {
            (Some(_), None, None) => {}
            (Some(_), Some(s), _) => err(src.error(s, "give content or a source, not both")),
            (None, None, _) => err(src.error(f, format!("file {p} needs content or a source"))),
            (None, Some(s), None) => err(src.error(s, "a source needs its sha256")),
            (_, None, Some(h)) => err(src.error(h, "sha256 pins a source; content needs none")),
            (None, Some(s), Some(_)) if !inside_image(dir, s.get_ref()) => {
                err(src.error(s, format!("source {:?} {INSIDE_IMAGE}", s.get_ref())))
            }
            (None, Some(s), Some(h)) => {
                let path = dir.join(s.get_ref());
                match std::fs::read(&path) {
                    Err(e) => err(src.error(s, format!("cannot read source {}: {e}", path.display()))),
                    Ok(bytes) => {
                        let actual = sha256_hex(&bytes);
                        if !actual.eq_ignore_ascii_case(h.get_ref()) {
                            err(src.error(
                                h,
                                format!("{} has sha256 {actual}, not the pinned {}", path.display(), h.get_ref()),
                            ));
                        }
                    }
                }
            }
        }
    }
}

/// Services, guarded commands and checks.
fn validate_commands(spec: &Spec, src: &SourceText, _dir: &Path, err: &mut dyn FnMut(SpecError)) {
    for s in &spec.services {
        let n = s.get_ref().name.get_ref();
        if !starts_alnum(n) || n.contains('/') || n.chars().any(char::is_whitespace) {
            err(src.error(&s.get_ref().name, format!("{n:?} is not a systemd unit name")));
        }
    }
    for c in &spec.commands {
        let cmd = c.get_ref();
        if cmd.run.get_ref().is_empty() || cmd.run.get_ref()[0].is_empty() {
            err(src.error(&cmd.run, "run needs a program: [\"program\", \"arg\", …]"));
        }
        if cmd.creates.is_none() && cmd.unless.is_none() {
            err(src.error(
                c,
                format!(
                    "command {:?} has no guard: give it `creates` or `unless`, so that applying twice is safe",
                    cmd.name
                ),
            ));
        }
        if let Some(u) = &cmd.unless {
            if u.get_ref().is_empty() {
                err(src.error(u, "unless needs a program"));
            }
        }
    }
    for c in &spec.checks {
        let check = c.get_ref();
        if check.run.get_ref().is_empty() {
            err(src.error(&check.run, "run needs a program"));
        }
        if check.contains.is_none() && check.matches.is_none() {
            err(src.error(c, format!("check {:?} needs `contains` or `matches`", check.name)));
        }
        if let Some(m) = &check.matches {
            if let Err(e) = regex::Regex::new(m.get_ref()) {
                let text = e.to_string();
                let last = text.lines().last().unwrap_or("").trim();
                let first = last.strip_prefix("error: ").unwrap_or(last).to_string();
                err(src.error(m, format!("bad regex: {first}")));
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

pub fn parse_mode(s: &str) -> Option<u32> {
    (!s.is_empty() && s.len() <= 5).then(|| u32::from_str_radix(s, 8).ok()).flatten().filter(|m| *m <= 0o7777)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        match parse(Path::new("images/t.toml"), text.to_string()) {
            Ok(_) => vec![],
            Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn positions_are_lines_and_columns() {
        let e = errors("[image]\nname = \"x\"\nversion = \"1\"\n\n[apt.packages]\nhwloc = \"*\"\n\n[[command]]\nname = \"c\"\nrun = [\"true\"]\n");
        assert_eq!(e, vec!["images/t.toml:8:1: command \"c\" has no guard: give it `creates` or `unless`, so that applying twice is safe"]);
    }

    #[test]
    fn requirements() {
        assert_eq!(split_requirement("torch==2.7.0+cu128"), Some(("torch", "2.7.0+cu128")));
        assert_eq!(split_requirement("torch>=2"), None);
        assert_eq!(normalize_dist("Typing_Extensions"), "typing-extensions");
        assert_eq!(parse_mode("0644"), Some(0o644));
        assert_eq!(parse_mode("rw"), None);
    }
}
