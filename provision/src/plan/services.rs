//! systemd units: enabled (any root) and started (this machine, with systemd running).

use super::{unit_name, Planner};
use crate::exec::{Action, Cmd};

pub(super) fn plan(p: &mut Planner) {
    let spec = &p.image.spec;
    let units: Vec<String> = spec.services.iter().map(|s| unit_name(s.get_ref().name.get_ref())).collect();
    let (target, facts, state) = (p.target, p.facts, p.state);
    for (i, s) in spec.services.iter().enumerate() {
        let svc = s.get_ref();
        let unit = &units[i];
        // is-enabled prints one line per unit it knows; an unknown unit prints nothing there.
        let state_of = if state.enabled.len() == units.len() { state.enabled[i].as_str() } else { "unknown" };
        if svc.enabled {
            if matches!(state_of, "enabled" | "static" | "alias" | "indirect" | "generated") {
                p.satisfied += 1;
            } else {
                let mut argv = vec!["systemctl".to_string()];
                if !target.live() {
                    argv.push(format!("--root={}", target.root_str()));
                }
                argv.extend(["enable".into(), "--".into(), unit.clone()]);
                p.step(
                    format!("service:{unit}:enable"),
                    format!("enable {unit}"),
                    format!("{unit} is {state_of}"),
                    vec![Action::Run(Cmd::new(argv))],
                );
            }
        }
        if !svc.started {
            continue;
        }
        if !target.live() {
            p.notes.push(format!("{unit} starts when {} boots", target.root.display()));
        } else if !facts.systemd_running {
            p.notes.push(format!("systemd is not running here: cannot check or start {unit}"));
        } else if state.active.get(i).map(String::as_str) == Some("active") {
            p.satisfied += 1;
        } else {
            let active = state.active.get(i).cloned().unwrap_or_else(|| "unknown".into());
            p.step(
                format!("service:{unit}:start"),
                format!("start {unit}"),
                format!("{unit} is {active}"),
                vec![Action::Run(Cmd::new(["systemctl", "start", "--", unit]))],
            );
        }
    }
}
