//! `members`: the live members of shard sets (all of them, or one set's) as a table, a wide
//! table or a JSON array.

use orion_beacon::{Member, MembershipStore};

use super::{store_failure_in, Ctx, Table};
use crate::args::Output;
use crate::exit::Outcome;
use crate::render::{emit, human, table, time};

pub async fn run(ctx: &Ctx, shard_set: Option<&str>, output: Output, headers: bool) -> Outcome {
    let members = match shard_set {
        // One statement filtered by the set, in the database.
        Some(set) => ctx.store.members(set).await,
        None => ctx.store.list_members().await,
    }
    .map_err(|e| store_failure_in(ctx, Table::Members, e))?;
    if output == Output::Json {
        let all: Vec<_> = members.iter().map(member_json).collect();
        emit(&format!("{}\n", serde_json::Value::Array(all)));
        return Ok(());
    }
    if members.is_empty() {
        if headers {
            let of = match shard_set {
                Some(set) => format!(" of shard set {set:?}"),
                None => String::new(),
            };
            emit(&format!(
                "no live members{of} in table {:?}\n",
                ctx.store.member_table()
            ));
        }
        return Ok(());
    }
    // Wide has no more columns: a member row has nothing else to show (its expiry is the time
    // left, by the database clock).
    let header = vec![
        "SHARD SET",
        "MEMBER",
        "STATE",
        "TIME LEFT",
        "JOINED (UTC)",
        "HEARTBEAT (UTC)",
    ];
    let rows = members.iter().map(|m| {
        vec![
            m.shard_set.clone(),
            m.member.clone(),
            if m.draining { "draining" } else { "active" }.to_owned(),
            human(m.remaining),
            time(m.joined_at),
            time(m.heartbeat_at),
        ]
    });
    let mut text = table(headers.then_some(header), rows, &[3]);
    if headers {
        let mut sets: Vec<&str> = members.iter().map(|m| m.shard_set.as_str()).collect();
        sets.dedup();
        let draining = members.iter().filter(|m| m.draining).count();
        text.push_str(&format!(
            "{} live member{} in {} shard set{}, {draining} draining (time left by the database clock)\n",
            members.len(),
            if members.len() == 1 { "" } else { "s" },
            sets.len(),
            if sets.len() == 1 { "" } else { "s" },
        ));
    }
    emit(&text);
    Ok(())
}

/// The member as JSON: its `serde` form (times RFC 3339, `remaining_ms`).
fn member_json(m: &Member) -> serde_json::Value {
    serde_json::to_value(m).unwrap_or(serde_json::Value::Null)
}
