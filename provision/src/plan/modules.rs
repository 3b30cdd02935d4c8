//! Kernel modules: kiln's modules-load.d and modprobe.d files, and loading (on this machine only).

use super::{modprobe_path, modules_load_path, Planner};
use crate::exec::{Action, Cmd};

pub(super) fn plan(p: &mut Planner) {
    let spec = &p.image.spec;
    if spec.modules.is_empty() {
        return;
    }
    let names: Vec<&str> = spec.modules.iter().map(|m| m.get_ref().name.get_ref().as_str()).collect();
    p.managed_file(&modules_load_path(p.name()), names.join("\n") + "\n", "modules to load at boot");
    let options: Vec<String> = spec
        .modules
        .iter()
        .filter(|m| !m.get_ref().options.is_empty())
        .map(|m| {
            let opts: Vec<String> = m.get_ref().options.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("options {} {}", m.get_ref().name.get_ref(), opts.join(" "))
        })
        .collect();
    let options_changed =
        !options.is_empty() && p.managed_file(&modprobe_path(p.name()), options.join("\n") + "\n", "module options");
    if !p.target.live() {
        p.notes.push(format!("modules are persisted in {} only: they load when it boots", p.target.root.display()));
        return;
    }
    for m in names {
        if p.state.loaded_modules.contains(&m.replace('-', "_")) {
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
                vec![Action::Run(Cmd::new(["modprobe", "--", m]))],
            );
        }
    }
}
