//! House rules the compiler does not check, on every Rust file of the workspace: each module opens
//! with a `//!` line saying what it is for, and no function runs past 120 lines unless a
//! `// Long: <why>` comment stands right above it (among its docs and attributes).

use std::path::{Path, PathBuf};

/// Files exempt from the `//!` rule, with the reason.
const NO_MODULE_DOC: &[(&str, &str)] =
    &[("inventory/src/pciids_index.rs", "include!d into build.rs and pciids.rs, where `//!` cannot stand")];

const MAX_FN_LINES: usize = 120;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() && name != "target" && !name.to_string_lossy().starts_with('.') {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn workspace_files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [
        "src",
        "text",
        "inventory",
        "sku",
        "cluster",
        "app",
        "serve",
        "bench",
        "db",
        "gpu",
        "provision",
        "tests",
        "benches",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            (rel, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// Functions (name, first line, length in lines) longer than `max` with no `// Long:` reason.
/// rustfmt puts a function's closing brace at its own indentation, which is what ends it here.
fn long_functions(text: &str, max: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let head = trimmed
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub ")
            .trim_start_matches("const ")
            .trim_start_matches("async ")
            .trim_start_matches("unsafe ")
            .trim_start_matches("extern \"C\" ");
        let Some(rest) = head.strip_prefix("fn ") else { continue };
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let close = format!("{indent}}}");
        let Some(end) = lines[i + 1..].iter().position(|l| *l == close) else { continue };
        let length = end + 2;
        if length <= max {
            continue;
        }
        let above = lines[..i].iter().rev().take_while(|l| {
            let t = l.trim_start();
            t.starts_with("#[") || t.starts_with("//")
        });
        if !above.into_iter().any(|l| l.trim_start().starts_with("// Long:")) {
            found.push((name, i + 1, length));
        }
    }
    found
}

#[test]
fn every_module_says_what_it_is_for() {
    let missing: Vec<String> = workspace_files()
        .into_iter()
        .filter(|(path, text)| !text.starts_with("//!") && !NO_MODULE_DOC.iter().any(|(p, _)| p == path))
        .map(|(path, _)| path)
        .collect();
    assert!(missing.is_empty(), "these files do not open with a `//!` line: {missing:?}");
}

#[test]
fn no_function_over_120_lines_without_a_reason() {
    let mut long = Vec::new();
    for (path, text) in workspace_files() {
        for (name, line, length) in long_functions(&text, MAX_FN_LINES) {
            long.push(format!("{path}:{line}: fn {name} is {length} lines"));
        }
    }
    assert!(long.is_empty(), "split these, or write `// Long: <why>` above them:\n{}", long.join("\n"));
}

/// The checker itself: it finds a long function, honours a reason, and ignores short ones.
#[test]
fn the_length_check_finds_what_it_should() {
    let body = |n: usize| "    let x = 1;\n".repeat(n);
    let long = format!("/// Doc.\npub fn big() {{\n{}}}\n", body(130));
    assert_eq!(long_functions(&long, MAX_FN_LINES), [("big".to_string(), 2, 132)]);
    let excused = format!("// Long: a table.\n#[allow(dead_code)]\nfn big() {{\n{}}}\n", body(130));
    assert!(long_functions(&excused, MAX_FN_LINES).is_empty());
    let nested = format!("impl X {{\n    async fn small() {{\n{}    }}\n}}\n", body(10));
    assert!(long_functions(&nested, MAX_FN_LINES).is_empty());
}
