//! Names on SQL Server: `nvarchar(255)` counts UTF-16 code units, so a name the common checks
//! accept can still be too long here; such a name is refused before any SQL runs.

use orion_beacon::membership::validate_shard_set;
use orion_beacon::store::{validate_candidate, validate_resource, MAX_NAME_LEN};
use orion_beacon::StoreError;

/// SQL Server counts `nvarchar(255)` in UTF-16 code units: a character outside the Basic
/// Multilingual Plane takes two. `stored` (the form `name` is kept under) that would not fit is
/// refused, before any SQL runs, with the error `invalid` makes of `name` and the reason.
fn fits(
    name: &str,
    stored: &str,
    invalid: fn(String, &'static str) -> StoreError,
) -> Result<(), StoreError> {
    if stored.encode_utf16().count() > MAX_NAME_LEN {
        return Err(invalid(
            name.to_owned(),
            "must be at most 255 UTF-16 code units on SQL Server (characters outside the Basic Multilingual Plane count twice)",
        ));
    }
    Ok(())
}

pub(super) fn check_resource(resource: &str) -> Result<(), StoreError> {
    validate_resource(resource)?;
    fits(resource, resource, |name, reason| {
        StoreError::InvalidResource { name, reason }
    })
}

pub(super) fn check_candidate(candidate: &str) -> Result<(), StoreError> {
    validate_candidate(candidate)?;
    fits(candidate, candidate, |name, reason| {
        StoreError::InvalidCandidate { name, reason }
    })
}

pub(super) fn check_shard_set(shard_set: &str) -> Result<(), StoreError> {
    validate_shard_set(shard_set)?;
    check_stored_set(shard_set, shard_set)
}

/// Checks that `stored`, the form `shard_set` is kept under
/// ([`stored_set`](orion_beacon::membership::stored_set)), fits `nvarchar(255)`.
pub(super) fn check_stored_set(shard_set: &str, stored: &str) -> Result<(), StoreError> {
    fits(shard_set, stored, |name, reason| {
        StoreError::InvalidShardSet { name, reason }
    })
}

/// Checks that `stored`, the form the candidates of `resource`'s ranked election are kept
/// under ([`stored_candidates`](orion_beacon::membership::stored_candidates): the lease table's
/// name and the resource), fits `nvarchar(255)`.
pub(super) fn check_stored_candidates(resource: &str, stored: &str) -> Result<(), StoreError> {
    fits(resource, stored, |name, reason| {
        StoreError::InvalidResource { name, reason }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_set_name_must_fit_nvarchar_255() {
        let set = "𝄞".repeat(127);
        let stored = orion_beacon::membership::stored_set(&set, "t").unwrap();
        assert!(matches!(
            check_stored_set(&set, &stored),
            Err(StoreError::InvalidShardSet { name, .. }) if name == set
        ));
        let stored = orion_beacon::membership::stored_set(&"é".repeat(252), "t").unwrap();
        assert!(check_stored_set("é", &stored).is_ok());
    }

    #[test]
    fn an_election_stored_name_must_fit_nvarchar_255() {
        let stored = |resource: &str| {
            orion_beacon::membership::stored_candidates(resource, "orionbeacon_leases").unwrap()
        };
        // 21 characters around the resource (" =orionbeacon_leases/"): 234 of 𝄞 pass the
        // common check, by characters, and take 489 UTF-16 code units.
        for resource in ["𝄞".repeat(234), "𝄞".repeat(118)] {
            assert!(matches!(
                check_stored_candidates(&resource, &stored(&resource)),
                Err(StoreError::InvalidResource { name, .. }) if name == resource
            ));
        }
        let resource = "𝄞".repeat(117);
        assert_eq!(stored(&resource).encode_utf16().count(), 255);
        assert!(check_stored_candidates(&resource, &stored(&resource)).is_ok());
        let resource = "é".repeat(234);
        assert!(check_stored_candidates(&resource, &stored(&resource)).is_ok());
    }

    #[test]
    fn shard_set_names_must_fit_nvarchar_255() {
        assert!(check_shard_set(&"é".repeat(255)).is_ok());
        assert!(matches!(
            check_shard_set(&"𝄞".repeat(128)),
            Err(StoreError::InvalidShardSet { .. })
        ));
        assert!(matches!(
            check_shard_set(" orders"),
            Err(StoreError::InvalidShardSet { .. })
        ));
        assert!(check_shard_set(&"𝄞".repeat(127)).is_ok());
    }

    #[test]
    fn names_must_fit_nvarchar_255() {
        assert!(check_resource(&"é".repeat(255)).is_ok());
        // 255 characters, 510 UTF-16 code units.
        let wide = "𝄞".repeat(255);
        assert!(validate_resource(&wide).is_ok());
        assert!(matches!(
            check_resource(&wide),
            Err(StoreError::InvalidResource { .. })
        ));
        assert!(matches!(
            check_candidate(&"𝄞".repeat(128)),
            Err(StoreError::InvalidCandidate { .. })
        ));
        assert!(check_candidate(&"𝄞".repeat(127)).is_ok());
    }
}
