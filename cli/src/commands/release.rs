//! `release RESOURCE --holder ID`: the normal guarded release, refused unless ID holds the
//! lease live.

use orion_beacon::LeaseStore;

use super::{read_lease, store_failure, Ctx};
use crate::exit::{CliError, Outcome};
use crate::render::{emit, human};

pub async fn run(ctx: &Ctx, resource: &str, holder: &str) -> Outcome {
    let released = ctx
        .store
        .release(resource, holder)
        .await
        .map_err(|e| store_failure(ctx, e))?;
    let r = read_lease(ctx, resource).await?;
    if released {
        emit(&format!(
            "released {resource:?}: {holder}'s lease (token {}) ended; the next candidate to ask \
             takes over with token {}\n",
            r.token,
            r.token.get().saturating_add(1)
        ));
        return Ok(());
    }
    let why = if r.live && r.holder != holder {
        format!(
            "{resource:?} is held by {:?} (token {}, {} left), not by {holder:?}",
            r.holder,
            r.token,
            human(r.remaining)
        )
    } else {
        format!(
            "the lease of {resource:?} already ended (last holder {:?}, token {})",
            r.holder, r.token
        )
    };
    Err(CliError::NothingChanged(format!("nothing released: {why}")))
}
