//! sysctl: kiln's sysctl.d file, and the running values (on this machine only).

use super::{sysctl_path, PlanError, Planner};
use crate::exec::{Action, Cmd};

pub(super) fn plan(p: &mut Planner) -> Result<(), PlanError> {
    let spec = &p.image.spec;
    if spec.sysctl.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = spec.sysctl.iter().map(|(k, v)| format!("{} = {}", k.get_ref(), v.get_ref())).collect();
    p.managed_file(&sysctl_path(p.name()), lines.join("\n") + "\n", "sysctl settings");
    if !p.target.live() {
        let root = p.target.root.display();
        p.notes.push(format!("sysctl settings are persisted in {root} only: they apply when it boots"));
        return Ok(());
    }
    let mut set = Vec::new();
    let mut why = Vec::new();
    for (k, v) in &spec.sysctl {
        let key = k.get_ref();
        let want = v.get_ref().to_string();
        match p.state.sysctl.get(key) {
            Some(Ok(have)) if have.split_whitespace().eq(want.split_whitespace()) => p.satisfied += 1,
            Some(Ok(have)) => {
                why.push(format!("{key} is {}, want {want}", have.split_whitespace().collect::<Vec<_>>().join(" ")));
                set.push(format!("{key}={want}"));
            }
            Some(Err(e)) => return Err(PlanError::Spec(p.image.source().error(k, e.clone()))),
            None => return Err(PlanError::State(format!("sysctl {key} was not read"))),
        }
    }
    if !set.is_empty() {
        let mut argv = vec!["sysctl".to_string(), "-w".into(), "--".into()];
        argv.extend(set.iter().cloned());
        p.step("sysctl:apply", format!("set {}", set.join(" ")), why.join("; "), vec![Action::Run(Cmd::new(argv))]);
    }
    Ok(())
}
