//! The house's shape, checked on the source as it is: no file imports another that imports it
//! back (directly or round a longer circle), the fleet service never knows the command line, and
//! no crate holds anything near half of the code. A module's own children may use what it
//! declares (`super::…`): that is how a parent shares, not a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every crate of the workspace as code names it, and its root file.
const CRATES: &[(&str, &str)] = &[
    ("kiln", "src/main.rs"),
    ("kiln_text", "text/src/lib.rs"),
    ("kiln_inventory", "inventory/src/lib.rs"),
    ("kiln_sku", "sku/src/lib.rs"),
    ("kiln_cluster", "cluster/src/lib.rs"),
    ("kiln_app", "app/src/lib.rs"),
    ("kiln_serve", "serve/src/lib.rs"),
    ("kiln_bench", "bench/src/lib.rs"),
    ("kiln_db", "db/src/lib.rs"),
    ("kiln_provision", "provision/src/lib.rs"),
    ("kiln_gpu", "gpu/src/lib.rs"),
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The code of a file without comments or its unit tests (a test module may use anything).
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text,
    };
    text.lines().map(|l| l.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

/// Every module of the workspace (crate, then the path below it) and its file, read from the
/// `mod` declarations (with their `#[path]`).
fn modules() -> BTreeMap<Vec<String>, PathBuf> {
    fn walk(path: Vec<String>, file: PathBuf, out: &mut BTreeMap<Vec<String>, PathBuf>) {
        let text = code(&file);
        let dir = file.parent().unwrap().to_path_buf();
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        let below = if ["lib", "main", "mod"].contains(&stem.as_str()) { dir.clone() } else { dir.join(&stem) };
        let mut explicit: Option<String> = None;
        for line in text.lines().map(str::trim) {
            if let Some(p) = line.strip_prefix("#[path = \"").and_then(|r| r.strip_suffix("\"]")) {
                explicit = Some(p.to_string());
                continue;
            }
            let decl =
                line.trim_start_matches("pub(crate) ").trim_start_matches("pub(super) ").trim_start_matches("pub ");
            if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                let child = match explicit.take() {
                    Some(p) => dir.join(p),
                    None if below.join(format!("{name}.rs")).exists() => below.join(format!("{name}.rs")),
                    None => below.join(name).join("mod.rs"),
                };
                let mut p = path.clone();
                p.push(name.to_string());
                walk(p, child, out);
            } else if !line.starts_with("#[") {
                explicit = None;
            }
        }
        out.insert(path, file);
    }
    let mut out = BTreeMap::new();
    for (name, file) in CRATES {
        walk(vec![name.to_string()], root().join(file), &mut out);
    }
    out
}

/// Every path a file names (`a::b::c`, as written; a group `a::{…}` as `a`, `{`).
fn paths(text: &str) -> Vec<Vec<String>> {
    let bytes = text.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !ident(bytes[i]) || (i > 0 && (ident(bytes[i - 1]) || bytes[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let mut segments = Vec::new();
        let mut j = i;
        loop {
            let start = j;
            while j < bytes.len() && ident(bytes[j]) {
                j += 1;
            }
            segments.push(text[start..j].to_string());
            if text[j..].starts_with("::") && j + 2 < bytes.len() && ident(bytes[j + 2]) {
                j += 2;
            } else {
                // `a::{b, c}`: a group below `a` (its members are not followed).
                if text[j..].starts_with("::{") {
                    segments.push("{".to_string());
                }
                break;
            }
        }
        out.push(segments);
        i = j.max(i + 1);
    }
    out
}

/// Which files each file uses: the module a path names (its longest known prefix), and the
/// children it names by their own name; never the file itself or one of its ancestors.
fn imports(modules: &BTreeMap<Vec<String>, PathBuf>) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let crates: BTreeSet<&str> = CRATES.iter().map(|(c, _)| *c).collect();
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for (module, file) in modules {
        let text = code(file);
        let mut used = BTreeSet::new();
        for segments in paths(&text).into_iter().filter(|s| s.len() > 1) {
            let first = segments[0].as_str();
            let mut absolute: Vec<String> = match first {
                "crate" => vec![module[0].clone()],
                "self" | "super" => module.clone(),
                c if crates.contains(c) => vec![c.to_string()],
                // A child named by its own name.
                name => {
                    let mut child = module.clone();
                    child.push(name.to_string());
                    if modules.contains_key(&child) {
                        used.insert(child);
                    }
                    continue;
                }
            };
            let mut rest = &segments[if first == "crate" || crates.contains(first) { 1 } else { 0 }..];
            while let Some(s) = rest.first().filter(|s| *s == "self" || *s == "super") {
                if s == "super" {
                    absolute.pop();
                }
                rest = &rest[1..];
            }
            absolute.extend(rest.iter().cloned());
            while !absolute.is_empty() && !modules.contains_key(&absolute) {
                absolute.pop();
            }
            if !absolute.is_empty() {
                used.insert(absolute);
            }
        }
        let targets = used
            .into_iter()
            // A module's use of what its ancestors declare is no circle.
            .filter(|m| !(m.len() <= module.len() && module[..m.len()] == m[..]))
            .map(|m| modules[&m].clone())
            .filter(|f| f != file)
            .collect();
        edges.insert(file.clone(), targets);
    }
    edges
}

/// The circles among `edges`: each strongly connected set of more than one file (Tarjan).
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct State<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a PathBuf) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        for w in s.edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.stack.contains(&w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut set = Vec::new();
            while let Some(w) = s.stack.pop() {
                set.push(w.clone());
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                set.sort();
                s.found.push(set);
            }
        }
    }
    let mut s = State { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

fn shown(files: &[PathBuf]) -> String {
    files.iter().map(|f| f.strip_prefix(root()).unwrap_or(f).display().to_string()).collect::<Vec<_>>().join(" ↔ ")
}

#[test]
fn no_file_imports_one_that_imports_it_back() {
    let modules = modules();
    assert!(modules.len() > 120, "only {} modules found: is the walk broken?", modules.len());
    let found: Vec<String> = circles(&imports(&modules)).iter().map(|c| shown(c)).collect();
    assert!(found.is_empty(), "files that import each other, directly or round a circle:\n{}", found.join("\n"));
}

/// The checker itself, on a made-up crate: a circle between siblings is found, a child's use of
/// its parent is not one.
#[test]
fn the_circle_check_finds_what_it_should() {
    let (a, b, c) = (PathBuf::from("a.rs"), PathBuf::from("b.rs"), PathBuf::from("c.rs"));
    let mut edges = BTreeMap::new();
    edges.insert(a.clone(), BTreeSet::from([b.clone()]));
    edges.insert(b.clone(), BTreeSet::from([c.clone()]));
    edges.insert(c.clone(), BTreeSet::from([a.clone()]));
    assert_eq!(circles(&edges), [vec![a.clone(), b.clone(), c.clone()]]);
    edges.insert(c.clone(), BTreeSet::new());
    assert!(circles(&edges).is_empty());
    assert_eq!(
        paths("use super::state::KeyFile; let x = crate::fleet::f(y::z);"),
        [
            vec!["use"],
            vec!["super", "state", "KeyFile"],
            vec!["let"],
            vec!["x"],
            vec!["crate", "fleet", "f"],
            vec!["y", "z"]
        ]
    );
}

/// The fleet service answers with the application layer's views: it never reaches into the
/// command line, or knows clap.
#[test]
fn the_fleet_service_never_names_the_command_line() {
    let mut named = Vec::new();
    for (module, file) in modules().iter().filter(|(m, _)| m[0] == "kiln_serve") {
        let text = code(file);
        for word in ["clap", "crate::cli", "kiln::cli"] {
            if paths(&text).iter().any(|p| p.join("::").starts_with(word)) {
                named.push(format!("{} names {word}", module.join("::")));
            }
        }
    }
    assert!(named.is_empty(), "{named:?}");
    let manifest = std::fs::read_to_string(root().join("serve/Cargo.toml")).unwrap();
    assert!(!manifest.lines().any(|l| l.starts_with("clap")), "serve/Cargo.toml depends on clap");
}

/// A room a newcomer can hold in their head: no crate holds a third of the code.
#[test]
fn no_crate_holds_a_third_of_the_code() {
    let mut lines: BTreeMap<&str, usize> = BTreeMap::new();
    for (module, file) in modules() {
        let crate_name = CRATES.iter().find(|(c, _)| *c == module[0]).unwrap().0;
        *lines.entry(crate_name).or_default() += std::fs::read_to_string(file).unwrap().lines().count();
    }
    let total: usize = lines.values().sum();
    let (largest, most) = lines.iter().max_by_key(|(_, n)| **n).unwrap();
    assert!(most * 3 < total, "{largest} holds {most} of {total} lines: {lines:?}");
}
