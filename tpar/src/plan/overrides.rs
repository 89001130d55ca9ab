//! The plan's settings checked against the fabric: [`Overrides::validate`]. Parsing lives in
//! `crate::settings` (every `TPAR_*` variable in one place); this file says which settings
//! this fabric can honour.
//!
//! Owns: the refusal at init of a setting the plan would have to ignore. Must never parse the
//! environment.

use super::feasibility::{check, natural_transport, transport_usable, Fabric};
use crate::error::{Error, Result};
use crate::kinds::{Algorithm, Backend};
pub use crate::settings::{HostProtocol, Overrides, MAX_KERNEL_BLOCKS};
use crate::topology::Topology;

impl Overrides {
    /// Reads the `TPAR_*` variables of this process (`crate::settings`).
    pub fn from_env() -> Result<Overrides> {
        Ok(crate::settings::Settings::from_env()?.overrides)
    }

    /// Parses (name, value) pairs (`crate::settings::Settings::from_pairs`).
    pub fn from_pairs<I, K, V>(pairs: I) -> Result<Overrides>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        Ok(crate::settings::Settings::from_pairs(pairs)?.overrides)
    }

    /// Refuses overrides that cannot run correctly on this fabric, naming the variable and
    /// why. Call at init: [`plan`] itself ignores such overrides (it must return something),
    /// but a forced setting that is silently ignored would be a lie.
    pub fn validate(&self, topology: &Topology, world: usize, backend: Backend) -> Result<()> {
        let world = world.max(1);
        let fabric = Fabric::of(topology, world, backend);
        match backend {
            Backend::Cpu => {
                if self.disable {
                    return Err(unsupported("TPAR_DISABLE=1", "the CPU backend has no NCCL to fall back to"));
                }
                if let Some(m) = self.max_bytes {
                    return Err(unsupported(&format!("TPAR_MAX_BYTES={m}"), "the CPU backend has no NCCL to send larger messages to"));
                }
            }
            Backend::Cuda => {}
        }
        if self.disable && self.algorithm.is_some_and(|a| a != Algorithm::Nccl) {
            return Err(unsupported("TPAR_DISABLE=1 with TPAR_ALGO", "TPAR_DISABLE forces NCCL; unset one of them"));
        }
        if let Some(w) = self.wire.filter(|w| w.is_lossy() && self.exact) {
            return Err(unsupported(&format!("TPAR_WIRE={w} with TPAR_EXACT=1"), "the wire format is lossy and exact results were asked for; unset one of them"));
        }
        if let Some(t) = self.transport {
            transport_usable(t, &fabric).map_err(|why| unsupported(&format!("TPAR_TRANSPORT={t}"), &why))?;
        }
        if let Some(a) = self.algorithm {
            let t = self.transport.unwrap_or_else(|| natural_transport(a, &fabric));
            check(a, t, &fabric).map_err(|why| unsupported(&format!("TPAR_ALGO={a} over {t}"), &why))?;
        }
        Ok(())
    }
}

fn unsupported(what: &str, why: &str) -> Error {
    Error::Unsupported { what: what.to_string(), reason: why.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_protocol_parses_and_is_in_the_digest_only_when_set() {
        assert_eq!(HostProtocol::parse("flags").unwrap(), Some(HostProtocol::Flags));
        assert_eq!(HostProtocol::parse(" Sentinel ").unwrap(), Some(HostProtocol::Sentinel));
        assert_eq!(HostProtocol::parse("auto").unwrap(), None);
        assert!(HostProtocol::parse("lamport").is_err());
        let o = Overrides::from_pairs([("TPAR_HOST_PROTOCOL", "flags")]).unwrap();
        assert_eq!(o.host_protocol, Some(HostProtocol::Flags));
        assert!(Overrides::from_pairs([("TPAR_HOST_PROTOCOL", "x")]).is_err());
        // Serialised (the plan digest) only when set, so existing digests are unchanged.
        let unset = serde_json::to_string(&Overrides::default()).unwrap();
        assert!(!unset.contains("host_protocol"), "{unset}");
        assert!(serde_json::to_string(&o).unwrap().contains("\"host_protocol\":\"flags\""));
        assert_eq!(HostProtocol::auto(2), HostProtocol::Sentinel);
        assert_eq!(HostProtocol::auto(3), HostProtocol::Flags);
        assert_eq!(HostProtocol::auto(4), HostProtocol::Flags);
        assert_eq!(HostProtocol::auto(8), HostProtocol::Flags);
    }

    #[test]
    fn fused_setting_is_in_the_digest_only_when_set() {
        let unset = serde_json::to_string(&Overrides::default()).unwrap();
        assert!(!unset.contains("fused"), "{unset}");
        let on = Overrides::from_pairs([("TPAR_FUSED", "1")]).unwrap();
        let off = Overrides::from_pairs([("TPAR_FUSED", "0")]).unwrap();
        assert_eq!((on.fused, off.fused), (Some(true), Some(false)));
        assert_eq!(Overrides::from_pairs([("TPAR_FUSED", "auto")]).unwrap().fused, None);
        // Ranks that disagree get different plan digests (refused at init).
        let (a, b) = (serde_json::to_string(&on).unwrap(), serde_json::to_string(&off).unwrap());
        assert!(a.contains("\"fused\":true") && b.contains("\"fused\":false"), "{a} {b}");
    }
}
