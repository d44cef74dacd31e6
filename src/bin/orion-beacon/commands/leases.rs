//! `leases` (`ls`): every resource's lease as a table, a wide table or a JSON array.

use super::{store_failure, Ctx};
use crate::args::Output;
use crate::exit::Outcome;
use crate::render::{emit, left, record_json, state, table, time};

pub async fn run(ctx: &Ctx, output: Output, headers: bool) -> Outcome {
    let records = ctx.store.list().await.map_err(|e| store_failure(ctx, e))?;
    if output == Output::Json {
        let all: Vec<_> = records.iter().map(record_json).collect();
        emit(&format!("{}\n", serde_json::Value::Array(all)));
        return Ok(());
    }
    if records.is_empty() {
        if headers {
            emit(&format!("no leases in table {:?}\n", ctx.store.table()));
        }
        return Ok(());
    }
    let wide = output == Output::Wide;
    let mut header = vec!["RESOURCE", "HOLDER", "TOKEN", "STATE", "TIME LEFT"];
    if wide {
        header.push("EXPIRES (UTC)");
    }
    header.extend(["ACQUIRED (UTC)", "RENEWED (UTC)"]);
    let rows = records.iter().map(|r| {
        let mut row = vec![
            r.resource.clone(),
            r.holder.clone(),
            r.token.to_string(),
            state(r).to_owned(),
            left(r),
        ];
        if wide {
            row.push(time(r.expires_at));
        }
        row.extend([time(r.acquired_at), time(r.renewed_at)]);
        row
    });
    let mut text = table(headers.then_some(header), rows, &[2, 4]);
    if headers {
        let live = records.iter().filter(|r| r.live).count();
        text.push_str(&format!(
            "{} lease{}, {live} live (time left by the database clock)\n",
            records.len(),
            if records.len() == 1 { "" } else { "s" }
        ));
    }
    emit(&text);
    Ok(())
}
