//! Flow-level simulator of a host's GPU fabric (in progress: the flow engine first).
//!
//! Owns: the max-min flow engine ([`flows`]). Must never do I/O.

pub mod flows;
