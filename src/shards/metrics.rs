//! Shard set metrics through the [`metrics`] facade (feature `metrics`). Nothing is exported
//! unless the application installs a recorder.

/// Gauge: resources a shard set node leads now, by `shard_set` and `member`.
pub const SHARDS_LED: &str = "orion_beacon_shards_led";
/// Gauge: a shard set node's share at its last round (0 while draining), by `shard_set` and
/// `member`.
pub const SHARD_SHARE: &str = "orion_beacon_shard_share";
