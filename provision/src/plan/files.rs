//! `[[file]]`: content (inline or from the image's folder), mode and owner.

use super::{PlanError, Planner};
use crate::exec::Action;
use crate::image::{sha256_hex, FileSpec};

pub(super) fn plan(p: &mut Planner) -> Result<(), PlanError> {
    for f in &p.image.spec.files {
        file(p, f.get_ref())?;
    }
    Ok(())
}

fn file(p: &mut Planner, file: &FileSpec) -> Result<(), PlanError> {
    let (image, state, target) = (p.image, p.state, p.target);
    let src = image.source();
    let abs = file.path.get_ref();
    let path = target.path(abs);
    let content = match (&file.content, &file.source) {
        (Some(c), _) => c.clone().into_bytes(),
        (None, Some(s)) => match state.file_sources.get(s.get_ref()) {
            Some(Ok(bytes)) => bytes.clone(),
            Some(Err(why)) => return Err(PlanError::Spec(src.error(s, why.clone()))),
            None => return Err(PlanError::State(format!("{} was not read", s.get_ref()))),
        },
        (None, None) => unreachable!("validated"),
    };
    let mode = file.mode.as_ref().and_then(|m| crate::image::parse_mode(m.get_ref()));
    let id = |table: &str, who: &Option<toml::Spanned<String>>, what: &str| match who {
        None => Ok(None),
        Some(w) => match state.ids.get(&(table.to_string(), w.get_ref().clone())) {
            Some(Some(id)) => Ok(Some(*id)),
            _ => Err(PlanError::Spec(
                src.error(w, format!("no {what} {:?} in {}", w.get_ref(), target.path(table).display())),
            )),
        },
    };
    let uid = id("/etc/passwd", &file.owner, "user")?;
    let gid = id("/etc/group", &file.group, "group")?;
    let now = state.files.get(abs).cloned().unwrap_or_default();
    let owner = (uid.is_some() || gid.is_some()).then(|| {
        (uid.unwrap_or_else(|| now.meta.map_or(0, |m| m.1)), gid.unwrap_or_else(|| now.meta.map_or(0, |m| m.2)))
    });
    match (now.meta, now.content) {
        (Some((have_mode, have_uid, have_gid)), Some(old)) if old == content => {
            let mut diffs = Vec::new();
            if let Some(want) = mode.filter(|w| *w != have_mode) {
                diffs.push(format!("mode is {have_mode:04o}, want {want:04o}"));
            }
            if let Some((u, g)) = owner.filter(|o| *o != (have_uid, have_gid)) {
                diffs.push(format!("owner is {have_uid}:{have_gid}, want {u}:{g}"));
            }
            if diffs.is_empty() {
                p.satisfied += 1;
                return Ok(());
            }
            p.step(
                format!("file:{abs}"),
                format!("set the attributes of {abs}"),
                diffs.join("; "),
                vec![Action::Attributes {
                    path,
                    mode: diffs.iter().any(|d| d.starts_with("mode")).then_some(mode).flatten(),
                    owner: diffs.iter().any(|d| d.starts_with("owner")).then_some(owner).flatten(),
                }],
            );
        }
        (meta, old) => {
            let why = match old {
                Some(old) => format!(
                    "content differs (sha256 {} on disk, {} declared)",
                    &sha256_hex(&old)[..12],
                    &sha256_hex(&content)[..12]
                ),
                None if meta.is_some() => "it is not a readable file".to_string(),
                None => "it does not exist".to_string(),
            };
            let mode = mode.unwrap_or_else(|| meta.map_or(0o644, |m| m.0));
            p.step(
                format!("file:{abs}"),
                format!("write {abs}"),
                why,
                vec![Action::Write { path, content, mode, owner }],
            );
        }
    }
    Ok(())
}
