//! The template cache: a server's initialized data directory, made once and copied.

use std::path::{Path, PathBuf};

use crate::Error;

use super::*;

/// Where templates live: `ORION_TESTKIT_CACHE`, else `<cargo target dir>/testkit` (found from
/// the running executable), else the temporary directory.
fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("ORION_TESTKIT_CACHE") {
        return PathBuf::from(dir);
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1) {
            if dir.join("CACHEDIR.TAG").is_file() {
                return dir.join("testkit");
            }
        }
    }
    std::env::temp_dir().join(format!(
        "orion-testkit-cache-{}",
        nix::unistd::geteuid().as_raw()
    ))
}

/// Fills `dest` (which must not exist yet) from the cached template `key`; on a miss, `build`
/// creates `dest` from scratch and the result is published to the cache (atomically, by
/// rename, so concurrent test binaries never see half a template). Returns whether the
/// template was cached.
pub(crate) fn from_template(
    cache: Option<&Path>,
    key: &str,
    dest: &Path,
    build: impl FnOnce(&Path) -> Result<(), Error>,
) -> Result<bool, Error> {
    let root = cache.map(Path::to_path_buf).unwrap_or_else(cache_root);
    let key = format!("{key}-u{}", nix::unistd::geteuid().as_raw());
    let cached = root.join(&key);
    if cached.join("READY").is_file() {
        if copy_tree(&cached.join("data"), dest).is_ok() {
            return Ok(true);
        }
        // A damaged template: rebuild it below.
        let _ = std::fs::remove_dir_all(dest);
        let _ = std::fs::remove_dir_all(&cached);
    }
    build(dest)?;
    let publish = || -> Result<(), Error> {
        std::fs::create_dir_all(&root)
            .map_err(|e| Error::io(format!("cannot create {}", root.display()), e))?;
        // Half-built templates of processes that died.
        if let Ok(entries) = std::fs::read_dir(&root) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                // `.{key}.{pid}.{nanos}`; the key has dots of its own (versions).
                let pid = name.strip_prefix('.').and_then(|n| {
                    let mut parts = n.rsplitn(3, '.');
                    parts.next()?;
                    parts.next()?.parse::<u32>().ok()
                });
                if pid.is_some_and(|p| !alive(p)) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let staging = root.join(format!(".{key}.{}.{:x}", std::process::id(), nanos()));
        std::fs::create_dir(&staging)
            .map_err(|e| Error::io(format!("cannot create {}", staging.display()), e))?;
        let result = copy_tree(dest, &staging.join("data")).and_then(|()| {
            std::fs::write(staging.join("READY"), b"")
                .map_err(|e| Error::io("cannot write READY", e))
        });
        if result.is_err() || std::fs::rename(&staging, &cached).is_err() {
            // Another process published the same template first (or the cache is not
            // writable): ours is not needed.
            let _ = std::fs::remove_dir_all(&staging);
        }
        result
    };
    if let Err(e) = publish() {
        crate::report(&format!("template not cached ({e})"));
    }
    Ok(false)
}

// ---------------------------------------------------------------------------------------------
// The supervisor and the instance.
