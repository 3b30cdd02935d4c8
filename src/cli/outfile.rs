//! Where a command writes a file it was pointed at (`export -o`, `report --html/--markdown`): `-` is
//! standard output; an existing path that is not a regular file (a device such as `/dev/null`, a
//! FIFO) is written in place, never replaced; a symbolic link is refused, never replaced; a regular
//! file (or a new one) is written beside itself under a fresh name and renamed over the target only
//! when complete, so a failure leaves the old file as it was and nothing half-written.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// Writes what `body` produces to `path` (see the module's rules).
///
/// # Errors
/// A symbolic link, a missing directory, any I/O error (with the path), or `body`'s error — in
/// which case nothing is left behind.
pub fn write_output<T>(path: &Path, body: impl FnOnce(&mut dyn Write) -> Result<T>) -> Result<T> {
    let shown = path.display();
    if path.as_os_str() == "-" {
        let stdout = std::io::stdout();
        let mut w = std::io::BufWriter::new(stdout.lock());
        let out = body(&mut w)?;
        w.flush().context("writing standard output")?;
        return Ok(out);
    }
    let existing = std::fs::symlink_metadata(path).ok();
    match &existing {
        Some(m) if m.file_type().is_symlink() => {
            bail!("{shown}: a symbolic link; kiln never replaces one with a file: name its target instead")
        }
        Some(m) if !m.is_file() => {
            // A device or a FIFO: written in place, as a shell redirection would.
            let file =
                std::fs::OpenOptions::new().write(true).open(path).with_context(|| format!("opening {shown}"))?;
            let mut w = std::io::BufWriter::new(file);
            let out = body(&mut w)?;
            w.flush().with_context(|| format!("writing {shown}"))?;
            return Ok(out);
        }
        _ => {}
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        bail!("{}: no such directory (kiln does not create it)", dir.display());
    }
    let mut tmp = tempfile::Builder::new()
        .prefix(".kiln-")
        .suffix(".partial")
        .tempfile_in(dir)
        .with_context(|| format!("creating a file in {}", dir.display()))?;
    let out = {
        let mut w = std::io::BufWriter::new(tmp.as_file_mut());
        let out = body(&mut w)?;
        w.flush().with_context(|| format!("writing {shown}"))?;
        out
    };
    // The file keeps the mode of the one it replaces; a new one gets the usual 0644.
    let mode = existing.map_or(0o644, |m| m.permissions().mode() & 0o7777);
    tmp.as_file().set_permissions(std::fs::Permissions::from_mode(mode)).with_context(|| format!("writing {shown}"))?;
    tmp.as_file().sync_all().with_context(|| format!("writing {shown}"))?;
    tmp.persist(path).with_context(|| format!("renaming the finished file to {shown}"))?;
    Ok(out)
}
