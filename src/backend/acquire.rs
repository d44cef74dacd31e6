//! One acquire-or-renew, from the store's call to its answer: a slot among the store's attempts,
//! the backend's one statement (with the takeover past a stalled holder running while it
//! waits, where the backend has one), and what the answer says this process now holds.

use std::sync::Arc;
use std::time::Duration;

use super::driver::Takeover;
use super::engine::Engine;
use crate::error::StoreError;
use crate::lease::LeaseOutcome;

/// Acquires or renews `resource` for `candidate` for `lease` (`millis`, validated), writing
/// `payload` with the grant. The backend's statement is made here only: the takeover asks for
/// it again through `ask` rather than calling into the backend itself.
pub(crate) async fn acquire_or_renew(
    engine: &Arc<Engine>,
    resource: &str,
    candidate: &str,
    lease: Duration,
    millis: i64,
    payload: Option<&str>,
) -> Result<LeaseOutcome, StoreError> {
    engine.ready().await?;
    // Sent once the attempt has a slot; the answer noted.
    let answer = async {
        // The backend's one statement; where the backend has a takeover past a stalled
        // holder, the takeover runs while it waits and asks for it again, reading the row
        // as it stands when the wait runs out.
        let ask = || {
            engine
                .backend
                .acquire_or_renew(&engine.cx, resource, candidate, millis, payload)
        };
        let read = || engine.backend.read_row(&engine.cx, resource);
        match engine.backend.takeover() {
            Takeover::None => ask().await,
            _ => super::takeover::acquiring(engine, resource, candidate, lease, &ask, &read).await,
        }
    };
    engine.attempted(resource, candidate, answer).await
}
