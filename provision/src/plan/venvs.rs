//! Python virtualenvs: created when missing, filled with `==` pins (and hashes) by pip.

use super::{normalize_dist, Planner};
use crate::exec::{Action, Cmd};
use crate::image::{split_requirement, Venv};

pub(super) fn plan(p: &mut Planner) {
    for v in &p.image.spec.venvs {
        venv(p, v.get_ref());
    }
}

fn venv(p: &mut Planner, venv: &Venv) {
    let abs = venv.path.get_ref();
    let dir = p.target.path(abs);
    let have = p.state.venvs.get(abs).cloned().flatten();
    if have.is_none() {
        let create = Cmd::new([venv.python.clone(), "-m".into(), "venv".into(), dir.display().to_string()]);
        p.step(
            format!("venv:{abs}"),
            format!("create the virtualenv {abs}"),
            "it does not exist",
            vec![Action::Run(create)],
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
    if missing.is_empty() {
        return;
    }
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
        argv.extend(["--no-index".into(), "--find-links".into(), p.image.resolve(w.get_ref()).display().to_string()]);
    } else if let Some(u) = &venv.index_url {
        argv.extend(["--index-url".into(), u.clone()]);
    }
    if !venv.hashes.is_empty() {
        argv.push("--require-hashes".into());
    }
    argv.extend(["-r".into(), req_file.display().to_string()]);
    let names: Vec<&str> = venv.packages.iter().map(|p| p.get_ref().as_str()).collect();
    p.step(
        format!("pip:{abs}"),
        format!("install {} into {abs}", names.join(" ")),
        missing.join("; "),
        vec![
            Action::Write { path: req_file, content: requirements.into_bytes(), mode: 0o644, owner: None },
            Action::Run(Cmd::new(argv)),
        ],
    );
}
