//! Guarded commands, in the spec's order, and the record of the apply (the image's marker).

use super::state::Guard;
use super::{command_in, Planner, MARKER_DIR};
use crate::exec::{Action, Cmd};

pub(super) fn plan(p: &mut Planner) {
    for c in &p.image.spec.commands {
        let cmd = c.get_ref();
        match p.state.guards.get(&cmd.name) {
            Some(Guard::Satisfied) => {
                p.satisfied += 1;
                continue;
            }
            Some(Guard::Unrunnable(e)) => {
                p.notes.push(format!("guard of command {:?} could not run ({e}): the command will run", cmd.name));
            }
            Some(Guard::Unmet) | None => {}
        }
        let why = match (&cmd.creates, &cmd.unless) {
            (Some(c), _) => format!("{c} does not exist"),
            (None, Some(u)) => format!("`{}` did not succeed", Cmd::new(u.get_ref().clone()).display()),
            (None, None) => unreachable!("validated"),
        };
        let run = command_in(p.target, p.facts, cmd.run.get_ref());
        p.step(format!("command:{}", cmd.name), format!("run {}", run.display()), why, vec![Action::Run(run)]);
    }
}

/// The marker of the last successful apply: written when the image (its hash) changed.
pub(super) fn record(p: &mut Planner) {
    let (image, spec) = (p.image, &p.image.spec);
    let name = image.name();
    if p.state.recorded_hash.as_deref() == Some(image.hash.as_str()) {
        p.satisfied += 1;
        return;
    }
    let why = match &p.state.recorded_hash {
        Some(h) => format!(
            "the image changed since it was applied (hash {} then, {} now)",
            &h[..h.len().min(12)],
            &image.hash[..12]
        ),
        None => format!("{name} has not been applied here"),
    };
    let venvs: Vec<&String> = spec.venvs.iter().map(|v| v.get_ref().path.get_ref()).collect();
    let doc = serde_json::json!({
        "image": name, "version": spec.image.version, "hash": image.hash, "applied_at": p.facts.now, "venvs": venvs,
    });
    let record = Action::Write {
        path: p.target.path(&format!("{MARKER_DIR}/{name}.json")),
        content: (serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n").into_bytes(),
        mode: 0o644,
        owner: None,
    };
    p.step("image:record", format!("record {name} {} as applied", spec.image.version), why, vec![record]);
}
