//! The OS user a server runs as, and running its programs.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::Error;

/// The OS user a server runs as when the tests run as root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

/// `None` when not root (servers run as the current user); the service user otherwise.
pub(crate) fn run_as(user: &str, package: &str) -> Result<Option<RunAs>, Error> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => Ok(Some(RunAs {
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
        })),
        _ => Err(Error::new(format!(
            "the tests run as root, so the server must run as the `{user}` OS user, which does \
             not exist: install Debian's {package} package (`apt-get install -y {package}`), \
             which creates it, or run the tests as a normal user"
        ))),
    }
}

/// A command for a helper program (initdb, pg_basebackup, ...) run as the service user.
pub(crate) fn command(program: impl AsRef<std::ffi::OsStr>, who: Option<RunAs>) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir("/")
        .stdin(Stdio::null())
        .env_remove("LD_PRELOAD")
        .env_remove("FAKETIME");
    if let Some(r) = who {
        cmd.uid(r.uid).gid(r.gid);
    }
    cmd
}

/// Runs `cmd`, failing with its output when it fails.
pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<String, Error> {
    let out = cmd
        .output()
        .map_err(|e| Error::io(format!("cannot run {what}"), e))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(Error::new(format!(
            "{what} failed ({}):\n{text}",
            out.status
        )))
    }
}

/// Changes the owner of a whole tree (no-op when not root).
pub(crate) fn chown_tree(path: &Path, who: Option<RunAs>) -> Result<(), Error> {
    let Some(r) = who else { return Ok(()) };
    std::os::unix::fs::lchown(path, Some(r.uid), Some(r.gid))
        .map_err(|e| Error::io(format!("chown {}", path.display()), e))?;
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
    if meta.is_dir() {
        let entries = std::fs::read_dir(path)
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(format!("read {}", path.display()), e))?;
            chown_tree(&entry.path(), who)?;
        }
    }
    Ok(())
}

/// `cp -a` (with reflinks where the file system has them): keeps modes and owners.
pub(crate) fn copy_tree(from: &Path, to: &Path) -> Result<(), Error> {
    run(
        Command::new("cp")
            .arg("-a")
            .arg("--reflink=auto")
            .arg(from)
            .arg(to),
        &format!("copying {} to {}", from.display(), to.display()),
    )
    .map(|_| ())
}
