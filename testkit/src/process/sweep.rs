//! Finding and removing what killed test processes left behind.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use super::*;

/// True while `pid` is a live process (not gone, not a zombie).
pub(crate) fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Removes what crashed runs left behind: instance directories whose supervisor is gone
/// (a server still running in one is killed first) and half-built template directories.
pub(super) fn sweep_once() {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(sweep);
}

pub(crate) fn sweep() {
    for base in base_dirs() {
        let Ok(entries) = std::fs::read_dir(base) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // The template cache and the port locks belong to no one run.
            if !name.starts_with(DIR_PREFIX)
                || name.starts_with("orion-testkit-cache")
                || name.starts_with(super::dirs::PORTS_DIR_PREFIX)
            {
                continue;
            }
            let dir = entry.path();
            let dir_text = dir.display().to_string();
            let supervised = read_pid(&dir.join("supervisor.pid"))
                .is_some_and(|pid| alive(pid) && cmdline(pid).contains(&dir_text));
            if supervised {
                continue;
            }
            let age = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .unwrap_or_default();
            if !dir.join("supervisor.pid").exists() && age < Duration::from_secs(60) {
                continue; // being set up right now by another process
            }
            if dir.join("keep").exists() {
                continue; // kept on purpose (ORION_TESTKIT_KEEP)
            }
            if let Some(pid) = read_pid(&dir.join("server.pid")) {
                if alive(pid) && cmdline(pid).contains(&dir_text) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            if std::fs::remove_dir_all(&dir).is_ok() {
                crate::report(&format!("removed {dir_text}, left behind by a crashed run"));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The template cache.
