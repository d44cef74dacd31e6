//! `leases` (`ls`): every resource's lease as a table, a wide table or a JSON array; with
//! `--by-holder`, one row per holder.

use std::collections::BTreeMap;

use super::{store_failure, Ctx};
use crate::args::Output;
use crate::exit::Outcome;
use crate::render::{emit, left, payload, record_json, state, table, time};

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
    if wide {
        header.push("PAYLOAD");
    }
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
        if wide {
            row.push(payload(r));
        }
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

/// One holder's leases: the resources it holds live, and those whose last term was its and
/// lapsed.
#[derive(Default)]
struct Holder<'a> {
    live: Vec<&'a str>,
    expired: Vec<&'a str>,
}

/// `leases --by-holder`: one row per holder (byte order), with the number of live leases it
/// holds (and expired ones whose last term was its); `wide` and JSON name the resources. A
/// holder whose leases all lapsed has a row with 0 live: after a crash that is the node to look
/// at.
pub async fn by_holder(ctx: &Ctx, output: Output, headers: bool) -> Outcome {
    let records = ctx.store.list().await.map_err(|e| store_failure(ctx, e))?;
    let mut holders: BTreeMap<&str, Holder<'_>> = BTreeMap::new();
    for r in &records {
        let holder = holders.entry(r.holder.as_str()).or_default();
        if r.live {
            holder.live.push(&r.resource);
        } else {
            holder.expired.push(&r.resource);
        }
    }
    // Byte order, whatever the database's collation ordered the rows by.
    for h in holders.values_mut() {
        h.live.sort_unstable();
        h.expired.sort_unstable();
    }
    if output == Output::Json {
        let all: Vec<_> = holders
            .iter()
            .map(|(holder, h)| {
                serde_json::json!({
                    "holder": holder,
                    "live_leases": h.live.len(),
                    "expired_leases": h.expired.len(),
                    "resources": h.live,
                    "expired_resources": h.expired,
                })
            })
            .collect();
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
    let mut header = vec!["HOLDER", "LIVE", "EXPIRED"];
    if wide {
        header.push("RESOURCES (LIVE)");
    }
    let rows = holders.iter().map(|(holder, h)| {
        let mut row = vec![
            (*holder).to_owned(),
            h.live.len().to_string(),
            h.expired.len().to_string(),
        ];
        if wide {
            row.push(if h.live.is_empty() {
                "-".to_owned()
            } else {
                h.live.join(",")
            });
        }
        row
    });
    let mut text = table(headers.then_some(header), rows, &[1, 2]);
    if headers {
        let live = records.iter().filter(|r| r.live).count();
        let leading = holders.values().filter(|h| !h.live.is_empty()).count();
        text.push_str(&format!(
            "{} holder{}, {leading} with live leases; {} lease{}, {live} live (by the database clock)\n",
            holders.len(),
            if holders.len() == 1 { "" } else { "s" },
            records.len(),
            if records.len() == 1 { "" } else { "s" },
        ));
    }
    emit(&text);
    Ok(())
}
