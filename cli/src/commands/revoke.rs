//! `revoke RESOURCE --force`: the operator's override that ends a live lease whoever holds
//! it, after a confirmation on stdin unless `--yes`.

use std::io::Write as _;

use orion_beacon::LeaseRecord;

use super::{read_lease, store_failure, unknown_resource, Ctx};
use crate::exit::{CliError, Outcome};
use crate::render::{emit, human};

pub async fn run(ctx: &Ctx, resource: &str, yes: bool) -> Outcome {
    let before = read_lease(ctx, resource).await?;
    if !before.live {
        emit(&format!(
            "nothing to revoke: the lease of {resource:?} already ended (last holder {:?}, token {})\n",
            before.holder, before.token
        ));
        return Ok(());
    }
    if !yes && !confirm(resource, &before) {
        return Err(CliError::NothingChanged(
            "not revoked: no confirmation (answer y, or pass --yes)".to_owned(),
        ));
    }
    match ctx.store.revoke(resource).await {
        Ok(Some(r)) if r.live => {
            emit(&format!(
                "revoked {resource:?}: the lease of {:?} (token {}, {} left) has ended; the next \
                 candidate to ask takes over with token {}\n",
                r.holder,
                r.token,
                human(r.remaining),
                r.token.get().saturating_add(1)
            ));
            Ok(())
        }
        Ok(Some(r)) => {
            emit(&format!(
                "nothing to revoke: the lease of {resource:?} ended meanwhile (last holder {:?}, token {})\n",
                r.holder, r.token
            ));
            Ok(())
        }
        Ok(None) => Err(unknown_resource(ctx, resource).await),
        Err(err) => Err(store_failure(ctx, err)),
    }
}

/// Asks on stderr, reads one line from stdin: only `y` or `yes` confirms.
fn confirm(resource: &str, r: &LeaseRecord) -> bool {
    eprint!(
        "revoke the lease of {resource:?} held by {:?} (token {}, {} left)? The next candidate to \
         ask takes over with token {}. The holder is not told: it may act as leader until its \
         next renew; only fenced writes stop at once. [y/N] ",
        r.holder,
        r.token,
        human(r.remaining),
        r.token.get().saturating_add(1)
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let stdin = std::io::stdin();
    let read = stdin.read_line(&mut answer);
    if !std::io::IsTerminal::is_terminal(&stdin) {
        // The answer came from a pipe and was not echoed: end the prompt's line.
        eprintln!();
    }
    match read {
        Ok(_) => matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"),
        Err(_) => false,
    }
}
