//! Named prepared statements in transaction and statement pooling mode.
//!
//! A client names its statements; servers are shared. Each statement a client prepares is
//! interned once for the whole process by its full text and parameter types (`defs`: no
//! short hash, collisions happen), the client keeps its own name -> statement map, and
//! each server keeps the set of statements it holds under Weir's own names (`server`, an
//! LRU bounded by max_prepared_statements). The relay rewrites the client's Parse, Bind,
//! Describe and Close to those names, prepares a statement on the server it is lent when
//! that server lacks it, and swallows or synthesizes the replies so that the client sees
//! exactly what a direct connection would send (`replies`).

pub mod answers;
pub mod check;
pub mod defs;
pub mod messages;
pub mod queries;
pub mod queued;
pub mod refusals;
pub mod replies;
pub mod retry;
pub mod rewrite;
pub mod server;

pub use replies::ClientStatements;
pub use server::ServerStatements;
