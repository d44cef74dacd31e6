//! `show RESOURCE`: one lease, as aligned fields or a JSON object.

use super::{read_lease, Ctx};
use crate::args::Output;
use crate::exit::Outcome;
use crate::render::{emit, human, payload, record_json, state, time};

pub async fn run(ctx: &Ctx, resource: &str, output: Output) -> Outcome {
    let r = read_lease(ctx, resource).await?;
    if output == Output::Json {
        emit(&format!("{}\n", record_json(&r)));
        return Ok(());
    }
    let left = if r.live {
        format!("{} (database clock)", human(r.remaining))
    } else {
        "-".to_owned()
    };
    emit(&format!(
        "resource     {}\nholder       {}\ntoken        {}\nstate        {}\ntime left    {left}\n\
         expires at   {} UTC\nacquired at  {} UTC\nrenewed at   {} UTC\npayload      {}\n",
        r.resource,
        r.holder,
        r.token,
        state(&r),
        time(r.expires_at),
        time(r.acquired_at),
        time(r.renewed_at),
        payload(&r),
    ));
    Ok(())
}
