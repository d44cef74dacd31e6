//! Names for what a set of backend features provides, so code shared by the backends asks for
//! a capability (`#[cfg(sqlx_driver)]`) instead of listing backends; a new backend is added
//! here, not in every shared file.
use cfg_aliases::cfg_aliases;

fn main() {
    cfg_aliases! {
        // A sqlx driver is compiled in (SeaORM's sqlx errors and connection types exist).
        sqlx_driver: { any(feature = "sqlite", feature = "postgres", feature = "mysql") },
        // A server backend whose pooled connections can be handed out inside a transaction
        // nobody finished: its statements run on checked connections (`backend::sessions`).
        checked_pool: { any(feature = "postgres", feature = "mysql") },
    }
}
