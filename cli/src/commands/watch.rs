//! `watch RESOURCE`: polls the lease and prints a line per change of holder, token or
//! liveness, until a limit or Ctrl-C.

use std::time::Duration;

use orion_beacon::{LeaseRecord, LeaseStore};
use serde_json::json;
use tokio::time::Instant;

use super::{store_failure, unknown_resource, Ctx};
use crate::exit::{chain, CliError, Outcome};
use crate::render::{emit, human, record_json};

/// What a change of the watched lease was.
fn change(before: Option<&LeaseRecord>, now: &LeaseRecord) -> Option<&'static str> {
    let Some(before) = before else {
        return Some("now");
    };
    if before.token != now.token {
        Some("new term")
    } else if before.holder != now.holder {
        Some("new holder")
    } else if before.live && !now.live {
        Some("ended")
    } else if !before.live && now.live {
        Some("live again")
    } else {
        None
    }
}

fn watch_line(elapsed: Duration, what: &str, r: &LeaseRecord, json: bool) -> String {
    if json {
        let mut value = record_json(r);
        if let Some(obj) = value.as_object_mut() {
            obj.insert(
                "elapsed_ms".to_owned(),
                json!(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)),
            );
            obj.insert("change".to_owned(), json!(what));
        }
        return format!("{value}\n");
    }
    let left = if r.live {
        format!("live, {} left", human(r.remaining))
    } else {
        "expired".to_owned()
    };
    format!(
        "[{:>8.2}s] {}  holder {}  token {}  {left}  ({what})\n",
        elapsed.as_secs_f64(),
        r.resource,
        r.holder,
        r.token
    )
}

pub async fn run(
    ctx: &Ctx,
    resource: &str,
    interval: Duration,
    max_changes: Option<u64>,
    run_for: Option<Duration>,
    json: bool,
) -> Outcome {
    let start = Instant::now();
    let until = run_for.map(|d| start + d);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut last: Option<LeaseRecord> = None;
    let mut changes: u64 = 0;
    loop {
        match ctx.store.current(resource).await {
            Ok(Some(now)) => {
                if let Some(what) = change(last.as_ref(), &now) {
                    if !emit(&watch_line(start.elapsed(), what, &now, json)) {
                        return Ok(());
                    }
                    if last.is_some() {
                        changes += 1;
                    }
                    last = Some(now);
                    if max_changes.is_some_and(|max| changes >= max) {
                        return Ok(());
                    }
                }
            }
            Ok(None) if last.is_none() => return Err(unknown_resource(ctx, resource).await),
            Ok(None) => {
                return Err(CliError::UnknownResource(format!(
                    "the lease row of {resource:?} was deleted"
                )))
            }
            Err(err) if err.is_retryable() => {
                eprintln!("warning: {} (still watching)", chain(&err));
            }
            Err(err) => return Err(store_failure(ctx, err)),
        }
        let next = Instant::now() + interval;
        let wake = until.map_or(next, |u| u.min(next));
        tokio::select! {
            _ = &mut ctrl_c => return Err(CliError::Interrupted),
            () = tokio::time::sleep_until(wake) => {}
        }
        if until.is_some_and(|u| Instant::now() >= u) {
            return Ok(());
        }
    }
}
