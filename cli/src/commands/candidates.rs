//! `candidates`: the live candidates of a ranked election (electors built with a rank), highest
//! rank first, and which of them leads, as a table or a JSON array.

use orion_beacon::{Candidate, LeaseStore, MembershipStore};

use super::{store_failure, store_failure_in, Ctx, Table};
use crate::args::Output;
use crate::exit::Outcome;
use crate::render::{emit, human, table};

pub async fn run(ctx: &Ctx, resource: &str, output: Output, headers: bool) -> Outcome {
    let mut candidates = ctx
        .store
        .candidates(resource)
        .await
        .map_err(|e| store_failure_in(ctx, Table::Members, e))?;
    // The leader as the lease has it (a live holder), whether or not it is a candidate.
    let lease = ctx
        .store
        .current(resource)
        .await
        .map_err(|e| store_failure(ctx, e))?;
    let leader = lease.filter(|r| r.live).map(|r| r.holder);
    // Highest rank first, the smallest id among equals: the order leaders prefer them in.
    candidates.sort_by(|a, b| {
        b.rank
            .cmp(&a.rank)
            .then_with(|| a.candidate.cmp(&b.candidate))
    });
    let leads = |c: &Candidate| leader.as_deref() == Some(c.candidate.as_str());
    if output == Output::Json {
        let all: Vec<_> = candidates
            .iter()
            .map(|c| {
                let mut value = serde_json::to_value(c).unwrap_or(serde_json::Value::Null);
                if let Some(object) = value.as_object_mut() {
                    object.insert("leader".to_owned(), serde_json::Value::Bool(leads(c)));
                }
                value
            })
            .collect();
        emit(&format!("{}\n", serde_json::Value::Array(all)));
        return Ok(());
    }
    if candidates.is_empty() {
        if headers {
            emit(&format!(
                "no live candidates of {resource:?} in table {:?}{}\n",
                ctx.store.member_table(),
                leader
                    .map(|l| format!(" (leader: {l})"))
                    .unwrap_or_default()
            ));
        }
        return Ok(());
    }
    let header = vec!["CANDIDATE", "RANK", "LEADER", "LIVE FOR", "TIME LEFT"];
    let rows = candidates.iter().map(|c| {
        vec![
            c.candidate.clone(),
            c.rank.to_string(),
            if leads(c) { "yes" } else { "" }.to_owned(),
            human(c.live_for),
            human(c.remaining),
        ]
    });
    let mut text = table(headers.then_some(header), rows, &[1, 3, 4]);
    if headers {
        let who = match (&leader, candidates.iter().any(leads)) {
            (Some(l), true) => format!("led by {l}"),
            (Some(l), false) => format!("led by {l}, which is not a live candidate"),
            (None, _) => "no leader".to_owned(),
        };
        text.push_str(&format!(
            "{} live candidate{}, {who} (times by the database clock)\n",
            candidates.len(),
            if candidates.len() == 1 { "" } else { "s" },
        ));
    }
    emit(&text);
    Ok(())
}
